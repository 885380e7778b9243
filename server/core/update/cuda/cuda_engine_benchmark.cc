// cuda_engine_benchmark: the master's CUDA optimizer engine on one GPU,
// against the device's own copy bandwidth, with no LibTorch in the binary so
// that it runs on a GPU machine without one (//tools:bench_optimizer links
// LibTorch for its CPU peer). tools/bench/gpu_adam_reference.py measures PyTorch's
// fused and foreach optimizers on the same sizes, for the peer comparison.
//
//   bazel build -c opt --dynamic_mode=off
//   //server/core/update/cuda:cuda_engine_benchmark cuda_engine_benchmark
//   --params=1170000,10000000,100000000 --json
//
// Per size and optimizer it reports:
//  - kernel_ms: one fused step with everything already on the GPU
//    (CudaEngine::TimeKernelMs), the median of --repeats timings, each the
//    mean of enough back-to-back steps to move about 4 GB;
//  - gbps: the bytes the step must move (read p, g and each state buffer,
//    write p and each state buffer: 4 * (3 + 2 * buffers) bytes per
//    parameter) over kernel_ms, and copy_fraction = gbps / the device's
//    device-to-device copy bandwidth (read + written, as gbps counts);
//  - update_ms: the master's whole update as CudaEngine::Step runs it
//    (gradients staged through pinned memory to the GPU, the kernel, the
//    weights back into the caller's tensors), median wall time of --steps;
//    transfer_floor_ms is what the two PCIe copies alone would take at the
//    measured pinned host<->device bandwidth.
//
// Tensors are split like a model's (a few large ones and small biases), as
// in //tools:bench_optimizer, so per-tensor costs count as in real jobs.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "proto/mpilearn.pb.h"
#include "server/core/update/benchmark_tensors.h"
#include "server/core/update/cuda/cuda_engine.h"
#include "server/core/update/optimizer_config.h"

ABSL_FLAG(std::string, params, "1170000,10000000,100000000",
          "Comma-separated parameter counts to measure.");
ABSL_FLAG(std::string, optimizers,
          "adam,adamw,sgd,sgd_momentum,rmsprop,adadelta,adagrad",
          "Comma-separated optimizers: the OptimizerSpec names, plus "
          "sgd_momentum (sgd with momentum 0.9).");
ABSL_FLAG(int, steps, 20, "Timed whole updates per measurement (median).");
ABSL_FLAG(int, repeats, 7, "Kernel timings per measurement (median).");
ABSL_FLAG(int, device, 0, "CUDA device index.");
ABSL_FLAG(bool, json, false, "Print one JSON object instead of a table.");

namespace mpilearn::server {
namespace {

// Bytes one kernel timing moves in all (steps x bytes per step), so each
// timing lasts about 1-2 ms on an H100 and the launch overhead is averaged.
constexpr double kTargetBytesPerTiming = 4e9;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}


absl::StatusOr<OptimizerConfig> ConfigFor(const std::string& name) {
  v1::OptimizerSpec spec;
  if (name == "sgd_momentum") {
    spec.set_name("sgd");
    spec.set_momentum(0.9);
  } else {
    spec.set_name(name);
  }
  return ResolveOptimizerConfig(spec);
}

struct Result {
  std::string optimizer;
  size_t params = 0;
  double bytes_per_param = 0;
  int kernel_iterations = 0;
  std::vector<double> kernel_ms;  // one per repeat
  double update_ms = 0;           // median whole update
  double update_min_ms = 0;
  double update_max_ms = 0;
};

absl::StatusOr<Result> Measure(const std::string& name,
                               const std::vector<size_t>& sizes,
                               std::vector<std::vector<float>>& params,
                               const std::vector<std::vector<float>>& grads,
                               int device, int steps, int repeats) {
  MPILEARN_ASSIGN_OR_RETURN(const OptimizerConfig config, ConfigFor(name));
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<CudaEngine> engine,
                            CudaEngine::Create(config, sizes, device));
  Result r;
  r.optimizer = name;
  for (size_t n : sizes) r.params += n;
  r.bytes_per_param = 4.0 * (3 + 2 * StateBufferNames(config).size());
  std::vector<absl::Span<float>> p(params.begin(), params.end());
  std::vector<absl::Span<const float>> g(grads.begin(), grads.end());

  // The whole update, two warm-ups first (the first also uploads params).
  std::vector<double> update_ms;
  for (int i = 0; i < steps + 2; ++i) {
    const absl::Time start = absl::Now();
    MPILEARN_RETURN_IF_ERROR(engine->Step(p, g));
    if (i >= 2) {
      update_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
  }
  r.update_ms = Median(update_ms);
  r.update_min_ms = *std::min_element(update_ms.begin(), update_ms.end());
  r.update_max_ms = *std::max_element(update_ms.begin(), update_ms.end());

  const double step_bytes = r.bytes_per_param * r.params;
  r.kernel_iterations = static_cast<int>(
      std::clamp(kTargetBytesPerTiming / step_bytes, 10.0, 2000.0));
  MPILEARN_RETURN_IF_ERROR(engine->TimeKernelMs(r.kernel_iterations).status());
  for (int i = 0; i < repeats; ++i) {
    MPILEARN_ASSIGN_OR_RETURN(const double ms,
                              engine->TimeKernelMs(r.kernel_iterations));
    r.kernel_ms.push_back(ms);
  }
  return r;
}

std::string JsonList(const std::vector<double>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times the CUDA optimizer engine's fused kernels and whole updates "
      "against the GPU's copy bandwidth.\n  cuda_engine_benchmark "
      "--params=1170000,10000000 --optimizers=adam --json");
  absl::ParseCommandLine(argc, argv);
  const int device = absl::GetFlag(FLAGS_device);
  const int steps = std::max(3, absl::GetFlag(FLAGS_steps));
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  if (CudaEngine::DeviceCount() <= device) {
    std::fprintf(stderr,
                 "cuda_engine_benchmark: no CUDA device %d (found %d%s)\n",
                 device, CudaEngine::DeviceCount(),
                 CudaEngine::BuiltWithCuda() ? "" : "; built without CUDA");
    return 1;
  }
  std::vector<size_t> counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_params), ',')) {
    size_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n == 0) {
      std::fprintf(stderr, "cuda_engine_benchmark: bad --params entry '%s'\n",
                   std::string(s).c_str());
      return 2;
    }
    counts.push_back(n);
  }
  const std::vector<std::string> names =
      absl::StrSplit(absl::GetFlag(FLAGS_optimizers), ',');
  for (const std::string& name : names) {
    if (!ConfigFor(name).ok()) {
      std::fprintf(stderr, "cuda_engine_benchmark: unknown optimizer '%s'\n",
                   name.c_str());
      return 2;
    }
  }

  // Large enough to miss the L2 cache (50 MB on an H100).
  const size_t probe_bytes = size_t{512} << 20;
  absl::StatusOr<double> copy =
      CudaEngine::MeasureCopyBandwidthGBps(probe_bytes, device);
  absl::StatusOr<CudaEngine::HostTransferGBps> pcie =
      CudaEngine::MeasureHostTransferGBps(probe_bytes, device);
  if (!copy.ok() || !pcie.ok()) {
    std::fprintf(
        stderr, "cuda_engine_benchmark: %s\n",
        std::string((copy.ok() ? pcie.status() : copy.status()).message())
            .c_str());
    return 1;
  }

  std::vector<Result> results;
  for (size_t n : counts) {
    const std::vector<size_t> sizes = ModelLikeSizes(n);
    auto params = RandomTensors(sizes, 1);
    const auto grads = RandomTensors(sizes, 2);
    for (const std::string& name : names) {
      absl::StatusOr<Result> r =
          Measure(name, sizes, params, grads, device, steps, repeats);
      if (!r.ok()) {
        std::fprintf(stderr, "cuda_engine_benchmark: %s at %zu: %s\n",
                     name.c_str(), n,
                     std::string(r.status().message()).c_str());
        return 1;
      }
      std::fprintf(stderr, "measured %s at %zu params\n", name.c_str(), n);
      results.push_back(*std::move(r));
    }
  }

  // Each direction moves 4 bytes per parameter once per update.
  const auto transfer_floor_ms = [&](const Result& r) {
    return 4.0 * r.params / (pcie->to_device * 1e6) +
           4.0 * r.params / (pcie->to_host * 1e6);
  };
  if (absl::GetFlag(FLAGS_json)) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    std::vector<std::string> rows;
    for (const Result& r : results) {
      const double kernel_ms = Median(r.kernel_ms);
      const double gbps = r.bytes_per_param * r.params / (kernel_ms * 1e6);
      rows.push_back(absl::StrCat(
          "{\"optimizer\": \"", r.optimizer, "\", \"params\": ", r.params,
          ", \"bytes_per_param\": ", r.bytes_per_param,
          ", \"kernel_iterations\": ", r.kernel_iterations, ", \"kernel_ms\": ",
          kernel_ms, ", \"kernel_ms_repeats\": ", JsonList(r.kernel_ms),
          ", \"gbps\": ", gbps, ", \"copy_fraction\": ", gbps / *copy,
          ", \"update_ms\": ", r.update_ms, ", \"update_ms_range\": [",
          r.update_min_ms, ", ", r.update_max_ms,
          "], \"transfer_floor_ms\": ", transfer_floor_ms(r), "}"));
    }
    std::printf(
        "{\"host\": \"%s\", \"device\": %d, \"copy_gbps\": %g, "
        "\"h2d_gbps\": %g, \"d2h_gbps\": %g, \"results\": [%s]}\n",
        host, device, *copy, pcie->to_device, pcie->to_host,
        absl::StrJoin(rows, ", ").c_str());
    return 0;
  }
  std::printf(
      "device %d: copy %.0f GB/s (read + written), pinned host->device %.1f "
      "GB/s, device->host %.1f GB/s\n",
      device, *copy, pcie->to_device, pcie->to_host);
  std::printf("%-13s %11s %4s %10s %8s %6s %10s %10s\n", "optimizer", "params",
              "B/p", "kernel_ms", "GB/s", "copy%", "update_ms", "pcie_ms");
  for (const Result& r : results) {
    const double kernel_ms = Median(r.kernel_ms);
    const double gbps = r.bytes_per_param * r.params / (kernel_ms * 1e6);
    std::printf("%-13s %11zu %4.0f %10.4f %8.0f %5.0f%% %10.3f %10.3f\n",
                r.optimizer.c_str(), r.params, r.bytes_per_param, kernel_ms,
                gbps, 100 * gbps / *copy, r.update_ms, transfer_floor_ms(r));
  }
  return 0;
}

}  // namespace
}  // namespace mpilearn::server

int main(int argc, char** argv) { return mpilearn::server::Main(argc, argv); }
