// bench_optimizer: the master's optimizer step against LibTorch's, and both
// against the machine's copy bandwidth, measured in one run.
//
//   bazel run //tools:bench_optimizer -- --params=1170000,10000000 --json
//
// One fp32 Adam step reads p, g, m, v and writes p, m, v: 28 bytes per
// parameter. The floor for a step is therefore 28 B x params / copy
// bandwidth, where the copy bandwidth is measured here (memcpy: bytes read +
// bytes written per second). floor_ratio = step time / floor time.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/core/update/benchmark_tensors.h"
#include "server/core/update/cuda/cuda_engine.h"
#include "server/core/update/optimizer.h"
#include "server/core/update/optimizer_config.h"

ABSL_FLAG(std::string, params, "1170000,10000000,100000000",
          "Comma-separated parameter counts to measure.");
ABSL_FLAG(std::string, optimizer, "adam",
          "Optimizer to measure (LibTorch comparison is for adam).");
ABSL_FLAG(int, threads, 0,
          "CPU threads for both MPI Learn and LibTorch; 0 = all cores.");
ABSL_FLAG(std::string, device, "all", "cpu, cuda, or all (those present).");
ABSL_FLAG(int, steps, 20, "Timed steps per measurement (median reported).");
ABSL_FLAG(bool, json, false, "Print one JSON object instead of a table.");

namespace mpilearn::tools {
namespace {

using server::CreateOptimizer;
using server::EngineOptions;
using server::ModelLikeSizes;
using server::OptimizerConfig;
using server::RandomTensors;

constexpr double kBytesPerParam = 28.0;  // Adam: read p,g,m,v; write p,m,v

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times `fn` `steps` times after two warm-up calls; returns the median ms.
template <typename Fn>
double MedianMs(int steps, Fn fn) {
  fn();
  fn();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const absl::Time start = absl::Now();
    fn();
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  return Median(ms);
}

// Copy bandwidth over buffers far larger than the caches, counting bytes
// read plus bytes written, as the optimizer's 28 B/param does. Copies run on
// `threads` threads, each on its own slice, like the optimizer. The best of
// glibc's memcpy (non-temporal stores for large sizes) and a plain
// vectorised copy loop (ordinary stores, like the optimizer's) is reported:
// the floor is what the machine can do, whichever way.
double CpuCopyGBps(int threads) {
  const size_t count = size_t{128} << 20;  // floats: 512 MiB per buffer
  std::vector<float> a(count, 1.0f), b(count, 2.0f);
  auto run = [&](bool use_memcpy) {
    std::vector<std::thread> pool;
    const size_t slice = count / threads;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const float* __restrict src = a.data() + t * slice;
        float* __restrict dst = b.data() + t * slice;
        if (use_memcpy) {
          std::memcpy(dst, src, slice * sizeof(float));
        } else {
          for (size_t i = 0; i < slice; ++i) dst[i] = src[i];
        }
      });
    }
    for (auto& th : pool) th.join();
  };
  const double memcpy_ms = MedianMs(7, [&] { run(true); });
  const double loop_ms = MedianMs(7, [&] { run(false); });
  return 2.0 * count * sizeof(float) / (std::min(memcpy_ms, loop_ms) * 1e6);
}


struct Result {
  std::string device;
  std::string optimizer;
  size_t params = 0;
  int threads = 0;
  double step_ms = 0;
  double libtorch_step_ms = 0;  // 0 = not measured
  double copy_gbps = 0;
  // cuda: the master's whole update (gradient upload, kernel, weights
  // download); step_ms is then the kernel alone.
  double with_transfers_ms = 0;
};

double Gbps(const Result& r) {
  return kBytesPerParam * r.params / (r.step_ms * 1e6);
}
double FloorRatio(const Result& r) {
  const double floor_ms = kBytesPerParam * r.params / (r.copy_gbps * 1e6);
  return r.step_ms / floor_ms;
}

absl::StatusOr<double> TimeMpiLearn(const OptimizerConfig& config,
                                    const std::vector<size_t>& sizes,
                                    const EngineOptions& engine, int steps) {
  auto optimizer = CreateOptimizer(config, sizes, engine);
  if (!optimizer.ok()) return optimizer.status();
  auto params = RandomTensors(sizes, 1);
  const auto grads = RandomTensors(sizes, 2);
  std::vector<absl::Span<float>> p(params.begin(), params.end());
  std::vector<absl::Span<const float>> g(grads.begin(), grads.end());
  return MedianMs(steps, [&] { (void)(*optimizer)->Step(p, g); });
}

double TimeLibTorchAdam(const OptimizerConfig& config,
                        const std::vector<size_t>& sizes, int steps) {
  std::vector<torch::Tensor> params;
  for (size_t n : sizes) {
    torch::Tensor p = torch::randn({static_cast<int64_t>(n)}) * 0.01;
    p.set_requires_grad(true);
    p.mutable_grad() = torch::randn({static_cast<int64_t>(n)}) * 0.01;
    params.push_back(p);
  }
  torch::optim::Adam adam(params, torch::optim::AdamOptions(config.learning_rate)
                                      .betas({config.beta1, config.beta2})
                                      .eps(config.epsilon));
  return MedianMs(steps, [&] { adam.step(); });
}

std::string MachineJson(int threads) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string cpu_model = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu_model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return absl::StrCat("{\"host\": \"", host, "\", \"cpu\": \"", cpu_model,
                      "\", \"cores\": ", std::thread::hardware_concurrency(),
                      ", \"threads\": ", threads, ", \"cuda_devices\": ",
                      server::CudaEngine::DeviceCount(), "}");
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Measures the master's optimizer step vs LibTorch and the copy-bandwidth "
      "floor.\n  bazel run //tools:bench_optimizer -- --params=1170000 --json");
  absl::ParseCommandLine(argc, argv);
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(threads);
  const int steps = std::max(3, absl::GetFlag(FLAGS_steps));
  const std::string device = absl::GetFlag(FLAGS_device);

  std::vector<size_t> counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_params), ',')) {
    size_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n == 0) {
      std::fprintf(stderr, "bench_optimizer: bad --params entry '%s'\n",
                   std::string(s).c_str());
      return 2;
    }
    counts.push_back(n);
  }
  v1::OptimizerSpec spec;
  spec.set_name(absl::GetFlag(FLAGS_optimizer));
  absl::StatusOr<OptimizerConfig> config = server::ResolveOptimizerConfig(spec);
  if (!config.ok()) {
    std::fprintf(stderr, "bench_optimizer: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  const bool adam = config->kind == server::OptimizerKind::kAdam;

  std::vector<Result> results;
  const bool want_cpu = device == "all" || device == "cpu";
  const bool want_cuda = (device == "all" || device == "cuda") &&
                         server::CudaEngine::DeviceCount() > 0;
  const double cpu_copy = want_cpu ? CpuCopyGBps(threads) : 0.0;
  double cuda_copy = 0.0;
  if (want_cuda) {
    cuda_copy = server::CudaEngine::MeasureCopyBandwidthGBps(size_t{512} << 20, 0)
                    .value_or(0.0);
  }
  for (size_t n : counts) {
    const std::vector<size_t> sizes = ModelLikeSizes(n);
    if (want_cpu) {
      Result r{"cpu", spec.name(), n, threads};
      EngineOptions engine;
      engine.threads = threads;
      auto ms = TimeMpiLearn(*config, sizes, engine, steps);
      if (!ms.ok()) {
        std::fprintf(stderr, "bench_optimizer: %s\n",
                     std::string(ms.status().message()).c_str());
        return 1;
      }
      r.step_ms = *ms;
      if (adam) r.libtorch_step_ms = TimeLibTorchAdam(*config, sizes, steps);
      r.copy_gbps = cpu_copy;
      results.push_back(r);
    }
    if (want_cuda) {
      Result r{"cuda:0", spec.name(), n, 0};
      absl::Status measured = [&]() -> absl::Status {
        MPILEARN_ASSIGN_OR_RETURN(auto engine,
                                  server::CudaEngine::Create(*config, sizes, 0));
        auto params = RandomTensors(sizes, 1);
        const auto grads = RandomTensors(sizes, 2);
        std::vector<absl::Span<float>> p(params.begin(), params.end());
        std::vector<absl::Span<const float>> g(grads.begin(), grads.end());
        r.with_transfers_ms = MedianMs(steps, [&] { (void)engine->Step(p, g); });
        MPILEARN_ASSIGN_OR_RETURN(r.step_ms, engine->TimeKernelMs(steps));
        return absl::OkStatus();
      }();
      if (measured.ok()) {
        r.copy_gbps = cuda_copy;
        results.push_back(r);
      } else {
        std::fprintf(stderr, "bench_optimizer: cuda: %s\n",
                     std::string(measured.message()).c_str());
      }
    }
  }

  if (absl::GetFlag(FLAGS_json)) {
    std::vector<std::string> rows;
    for (const Result& r : results) {
      std::string row = absl::StrCat(
          "{\"device\": \"", r.device, "\", \"optimizer\": \"", r.optimizer,
          "\", \"params\": ", r.params, ", \"threads\": ", r.threads,
          ", \"step_ms\": ", r.step_ms, ", \"gbps\": ", Gbps(r),
          ", \"copy_gbps\": ", r.copy_gbps, ", \"floor_ratio\": ", FloorRatio(r));
      if (r.with_transfers_ms > 0) {
        absl::StrAppend(&row, ", \"step_with_transfers_ms\": ",
                        r.with_transfers_ms);
      }
      if (r.libtorch_step_ms > 0) {
        absl::StrAppend(&row, ", \"libtorch_step_ms\": ", r.libtorch_step_ms,
                        ", \"speedup_vs_libtorch\": ",
                        r.libtorch_step_ms / r.step_ms);
      } else {
        absl::StrAppend(&row, ", \"libtorch_step_ms\": null, ",
                        "\"speedup_vs_libtorch\": null");
      }
      rows.push_back(row + "}");
    }
    std::printf("{\"machine\": %s, \"copy_gbps\": %g, \"cuda_copy_gbps\": %g, "
                "\"bytes_per_param\": %g, \"results\": [%s]}\n",
                MachineJson(threads).c_str(), cpu_copy, cuda_copy, kBytesPerParam,
                absl::StrJoin(rows, ", ").c_str());
    return 0;
  }
  std::printf("copy bandwidth: cpu %.1f GB/s (%d threads)%s\n", cpu_copy, threads,
              want_cuda ? absl::StrCat(", cuda ", cuda_copy, " GB/s").c_str() : "");
  std::printf("%-7s %-9s %11s %10s %8s %12s %9s %11s\n", "device", "optimizer",
              "params", "step_ms", "GB/s", "libtorch_ms", "speedup", "floor_ratio");
  for (const Result& r : results) {
    std::printf("%-7s %-9s %11zu %10.3f %8.1f %12s %9s %11.2f\n", r.device.c_str(),
                r.optimizer.c_str(), r.params, r.step_ms, Gbps(r),
                r.libtorch_step_ms > 0 ? absl::StrCat(r.libtorch_step_ms).c_str() : "-",
                r.libtorch_step_ms > 0
                    ? absl::StrCat(r.libtorch_step_ms / r.step_ms, "x").c_str()
                    : "-",
                FloorRatio(r));
  }
  for (const Result& r : results) {
    if (r.with_transfers_ms > 0) {
      std::printf("%s: step_ms is the kernel alone; with the gradient upload "
                  "and weights download: %.3f ms at %zu params\n",
                  r.device.c_str(), r.with_transfers_ms, r.params);
    }
  }
  if (!want_cuda) std::printf("cuda: no device present; GPU figures not measured\n");
  return 0;
}

}  // namespace
}  // namespace mpilearn::tools

int main(int argc, char** argv) { return mpilearn::tools::Main(argc, argv); }
