// The CUDA optimizer engine (cuda_engine.h). Over ~500 lines because it is
// one unit that must stay together: device selection, the pinned staging
// buffers and stream, state save/restore by device copies, and the kernel
// launches all share the engine's device-resident layout; splitting them
// would spread that layout's invariants over several files.
#include "server/core/update/cuda/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "server/core/update/cuda/optimizer_kernels.h"
#include "server/core/update/optimizer_config.h"
#include "server/core/update/optimizer_interface.h"
#include "server/core/update/optimizer_step.h"

namespace mpilearn::server {
namespace {

// Number of kernel state slots (StepArrays::state0..state2).
constexpr int kStateSlots = 3;
// Host<->device copies go in chunks of at least this many floats (4 MiB),
// and at most kMaxChunks chunks, so the DMA of one chunk overlaps the host
// copy of the next.
constexpr size_t kMinChunkFloats = size_t{1} << 20;
constexpr size_t kMaxChunks = 32;
// Threads that copy chunks between the caller's tensors and the pinned
// staging buffers. With one thread, a 100M-parameter update on an H100
// machine took ~137 ms against ~15 ms for its PCIe transfers alone
// (docs/gpu.md): the host copies, not PCIe, bound it.
constexpr size_t kMaxCopyThreads = 8;
// Grid cap per SM: 2048 resident threads / 256 per block.
constexpr int kBlocksPerSm = 8;

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

#define MPILEARN_CUDA_RETURN_IF_ERROR(expr, what)    \
  do {                                               \
    const cudaError_t mpilearn_cuda_error_ = (expr); \
    if (mpilearn_cuda_error_ != cudaSuccess) {       \
      return CudaError(mpilearn_cuda_error_, what);  \
    }                                                \
  } while (false)

absl::Status CheckDevice(int device) {
  const int count = CudaEngine::DeviceCount();
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device ", device, " (found ", count, ")"));
  }
  return absl::OkStatus();
}

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct HostFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using DeviceFloats = std::unique_ptr<float, DeviceFree>;
using PinnedFloats = std::unique_ptr<float, HostFree>;

absl::StatusOr<DeviceFloats> AllocateDevice(size_t count) {
  if (count == 0) return DeviceFloats();
  void* p = nullptr;
  MPILEARN_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&p, count * sizeof(float)),
      absl::StrCat("cudaMalloc of ", count * sizeof(float), " bytes"));
  return DeviceFloats(static_cast<float*>(p));
}

absl::StatusOr<PinnedFloats> AllocatePinned(size_t count) {
  if (count == 0) return PinnedFloats();
  void* p = nullptr;
  MPILEARN_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(&p, count * sizeof(float)),
      absl::StrCat("cudaMallocHost of ", count * sizeof(float), " bytes"));
  return PinnedFloats(static_cast<float*>(p));
}

struct StreamDestroy {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct EventDestroy {
  void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};
using Stream = std::unique_ptr<CUstream_st, StreamDestroy>;
using Event = std::unique_ptr<CUevent_st, EventDestroy>;

// A non-blocking stream on the current device.
absl::StatusOr<Stream> NewStream() {
  cudaStream_t stream = nullptr;
  MPILEARN_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
      "cudaStreamCreate");
  return Stream(stream);
}

// Copies of `bytes` to time for a bandwidth figure: about 1 GiB in all,
// and at least a few.
int CopyTimingIterations(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((size_t{1} << 30) / bytes, 5, 1000));
}

// Copies flat elements [begin, end) of the concatenation of `tensors`
// (tensor i starting at offsets[i]) to or from `flat`.
template <typename T>
void CopyToFlat(absl::Span<const absl::Span<T>> tensors,
                const std::vector<size_t>& offsets, size_t begin, size_t end,
                float* flat) {
  size_t i = std::upper_bound(offsets.begin(), offsets.end(), begin) -
             offsets.begin() - 1;
  for (; i < tensors.size() && offsets[i] < end; ++i) {
    const size_t from = std::max(begin, offsets[i]);
    const size_t to = std::min(end, offsets[i + 1]);
    if (from < to) {
      std::memcpy(flat + from, tensors[i].data() + (from - offsets[i]),
                  (to - from) * sizeof(float));
    }
  }
}

void CopyFromFlat(const float* flat, const std::vector<size_t>& offsets,
                  size_t begin, size_t end,
                  absl::Span<const absl::Span<float>> tensors) {
  size_t i = std::upper_bound(offsets.begin(), offsets.end(), begin) -
             offsets.begin() - 1;
  for (; i < tensors.size() && offsets[i] < end; ++i) {
    const size_t from = std::max(begin, offsets[i]);
    const size_t to = std::min(end, offsets[i + 1]);
    if (from < to) {
      std::memcpy(tensors[i].data() + (from - offsets[i]), flat + from,
                  (to - from) * sizeof(float));
    }
  }
}

template <typename T>
absl::Status CheckShapes(absl::string_view what,
                         absl::Span<const absl::Span<T>> tensors,
                         const std::vector<size_t>& sizes) {
  if (tensors.size() != sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("got ", tensors.size(), " ",
                                                   what, " tensors, expected ",
                                                   sizes.size()));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (tensors[i].size() != sizes[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " tensor ", i, " has ", tensors[i].size(),
                       " elements, expected ", sizes[i]));
    }
  }
  return absl::OkStatus();
}

// (name, kernel slot) of each state buffer of `config`, in
// StateBufferNames order: buffer b is operand s<slot> of the rule, the slot k
// with StateOperands(config)[k] == b. InternalError if a buffer has no slot
// (the two functions disagree).
absl::StatusOr<std::vector<std::pair<std::string, int>>> BufferSlots(
    const OptimizerConfig& config) {
  const std::array<int, kStateSlots> operands = StateOperands(config);
  std::vector<std::pair<std::string, int>> buffers;
  for (std::string& name : StateBufferNames(config)) {
    const int b = static_cast<int>(buffers.size());
    const auto slot = std::find(operands.begin(), operands.end(), b);
    if (slot == operands.end()) {
      return absl::InternalError(
          absl::StrCat("the CUDA kernels have no operand for state buffer ",
                       name, " of ", OptimizerKindName(config.kind)));
    }
    buffers.emplace_back(std::move(name),
                         static_cast<int>(slot - operands.begin()));
  }
  return buffers;
}

}  // namespace

struct CudaEngine::Impl {
  OptimizerConfig config;
  int device = 0;
  int max_blocks = 1;
  std::vector<size_t> sizes;
  // offsets[i]: where tensor i starts in every flat array; offsets.back() ==
  // total.
  std::vector<size_t> offsets;
  size_t total = 0;
  // Chunk length for host<->device copies; a multiple of 4 floats.
  size_t chunk = 1;
  // Number of chunks of `total`, and the threads that share their host
  // copies (ForEachChunkGroup).
  size_t chunks = 0;
  size_t copy_threads = 1;
  // (name, kernel slot) of each state buffer, in StateBufferNames order.
  std::vector<std::pair<std::string, int>> buffers;

  // The engine's only stream: every copy and kernel runs on it, and every
  // public call returns with it idle.
  Stream stream;
  // One per chunk, recorded after that chunk's device-to-host copy.
  std::vector<Event> chunk_done;
  // Flat device arrays of `total` floats (null when total == 0); state
  // slots the rule does not use stay null.
  DeviceFloats params;
  DeviceFloats grads;
  DeviceFloats state[kStateSlots];
  // Pinned host staging, `total` floats each.
  PinnedFloats staged_params;
  PinnedFloats staged_grads;

  int64_t steps = 0;
  // False until the device holds the caller's current parameters.
  bool params_on_device = false;
  // The first CUDA failure of a state-changing call; every later call
  // returns it.
  absl::Status broken;

  // Fails with `broken` once a CUDA call has failed; sets the device.
  absl::Status Begin() {
    MPILEARN_RETURN_IF_ERROR(broken);
    MPILEARN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
    return absl::OkStatus();
  }

  absl::Status Poison(absl::Status status) {
    if (!status.ok() && broken.ok()) {
      broken = absl::InternalError(absl::StrCat(
          "this CUDA engine failed earlier and can no longer be used: ",
          status.message()));
    }
    return status;
  }

  // Runs body(begin, end) for every chunk [begin, end) of the flat range,
  // the chunks split into copy_threads contiguous groups: the first group on
  // the calling thread, each other on a thread of its own (with the engine's
  // device set). Returns the first error of any group.
  absl::Status ForEachChunkGroup(
      const std::function<absl::Status(size_t begin, size_t end)>& body) {
    const auto run_group = [&](size_t group) -> absl::Status {
      const size_t first = chunks * group / copy_threads;
      const size_t last = chunks * (group + 1) / copy_threads;
      for (size_t k = first; k < last; ++k) {
        MPILEARN_RETURN_IF_ERROR(
            body(k * chunk, std::min(total, (k + 1) * chunk)));
      }
      return absl::OkStatus();
    };
    std::vector<absl::Status> results(copy_threads);
    std::vector<std::thread> threads;
    for (size_t group = 1; group < copy_threads; ++group) {
      threads.emplace_back([&, group] {
        const cudaError_t error = cudaSetDevice(device);
        results[group] = error == cudaSuccess
                             ? run_group(group)
                             : CudaError(error, "cudaSetDevice");
      });
    }
    results[0] = run_group(0);
    for (std::thread& thread : threads) thread.join();
    for (absl::Status& result : results) MPILEARN_RETURN_IF_ERROR(result);
    return absl::OkStatus();
  }

  // Enqueues the upload of `tensors` (sizes checked) into `device_flat`
  // through `staging`, chunk by chunk: each chunk's DMA starts as soon as
  // its host copy is done, while the copy threads go on with later chunks.
  // The enqueue order of the chunks does not matter: the stream runs the
  // kernel only after all of them.
  template <typename T>
  absl::Status EnqueueUpload(absl::Span<const absl::Span<T>> tensors,
                             float* staging, float* device_flat) {
    return ForEachChunkGroup([&](size_t begin, size_t end) -> absl::Status {
      CopyToFlat(tensors, offsets, begin, end, staging);
      MPILEARN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(device_flat + begin, staging + begin,
                          (end - begin) * sizeof(float), cudaMemcpyHostToDevice,
                          stream.get()),
          "copying to the GPU");
      return absl::OkStatus();
    });
  }

  absl::Status LaunchStep() {
    cuda::StepArrays arrays;
    arrays.param = params.get();
    arrays.grad = grads.get();
    arrays.state0 = state[0].get();
    arrays.state1 = state[1].get();
    arrays.state2 = state[2].get();
    arrays.n = static_cast<int64_t>(total);
    const StepScalars s = ComputeStepScalars(config, steps + 1);
    cudaError_t error = cudaSuccess;
    switch (config.kind) {
      case OptimizerKind::kSgd:
        error = cuda::LaunchSgdStep(arrays, s, max_blocks, stream.get());
        break;
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW:
        error = cuda::LaunchAdamStep(arrays, s, max_blocks, stream.get());
        break;
      case OptimizerKind::kRmsprop:
        error = cuda::LaunchRmspropStep(arrays, s, max_blocks, stream.get());
        break;
      case OptimizerKind::kAdadelta:
        error = cuda::LaunchAdadeltaStep(arrays, s, max_blocks, stream.get());
        break;
      case OptimizerKind::kAdagrad:
        error = cuda::LaunchAdagradStep(arrays, s, max_blocks, stream.get());
        break;
    }
    MPILEARN_CUDA_RETURN_IF_ERROR(error, "launching the optimizer kernel");
    return absl::OkStatus();
  }

  absl::Status DoStep(absl::Span<const absl::Span<float>> host_params,
                      absl::Span<const absl::Span<const float>> host_grads) {
    if (!params_on_device) {
      MPILEARN_RETURN_IF_ERROR(
          EnqueueUpload(host_params, staged_params.get(), params.get()));
    }
    MPILEARN_RETURN_IF_ERROR(
        EnqueueUpload(host_grads, staged_grads.get(), grads.get()));
    MPILEARN_RETURN_IF_ERROR(LaunchStep());
    for (size_t begin = 0, k = 0; begin < total; begin += chunk, ++k) {
      const size_t end = std::min(total, begin + chunk);
      MPILEARN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(staged_params.get() + begin, params.get() + begin,
                          (end - begin) * sizeof(float), cudaMemcpyDeviceToHost,
                          stream.get()),
          "copying parameters from the GPU");
      MPILEARN_CUDA_RETURN_IF_ERROR(
          cudaEventRecord(chunk_done[k].get(), stream.get()),
          "cudaEventRecord");
    }
    // Copy each chunk out as soon as it lands, while later ones are in
    // flight. The first wait also reports errors of the kernel itself.
    MPILEARN_RETURN_IF_ERROR(
        ForEachChunkGroup([&](size_t begin, size_t end) -> absl::Status {
          MPILEARN_CUDA_RETURN_IF_ERROR(
              cudaEventSynchronize(chunk_done[begin / chunk].get()),
              "optimizer step on the GPU");
          CopyFromFlat(staged_params.get(), offsets, begin, end, host_params);
          return absl::OkStatus();
        }));
    MPILEARN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream.get()),
                                  "optimizer step on the GPU");
    params_on_device = true;
    ++steps;
    return absl::OkStatus();
  }
};

CudaEngine::CudaEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaEngine::~CudaEngine() {
  // Frees on the engine's device, whichever thread destroys it.
  cudaSetDevice(impl_->device);
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(
    const OptimizerConfig& config, const std::vector<size_t>& tensor_sizes,
    int device_index) {
  MPILEARN_RETURN_IF_ERROR(CheckDevice(device_index));
  MPILEARN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index), "cudaSetDevice");

  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->device = device_index;
  impl->sizes = tensor_sizes;
  impl->offsets.reserve(tensor_sizes.size() + 1);
  impl->offsets.push_back(0);
  for (size_t size : tensor_sizes) {
    impl->total += size;
    impl->offsets.push_back(impl->total);
  }
  MPILEARN_ASSIGN_OR_RETURN(impl->buffers, BufferSlots(config));
  const size_t wanted_chunk =
      std::max(kMinChunkFloats, (impl->total + kMaxChunks - 1) / kMaxChunks);
  impl->chunk = (wanted_chunk + 3) / 4 * 4;

  int sms = 0;
  MPILEARN_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                             device_index),
      "cudaDeviceGetAttribute");
  impl->max_blocks = std::max(1, sms * kBlocksPerSm);

  MPILEARN_ASSIGN_OR_RETURN(impl->stream, NewStream());
  impl->chunks = (impl->total + impl->chunk - 1) / impl->chunk;
  impl->copy_threads = std::max<size_t>(
      1, std::min({impl->chunks, kMaxCopyThreads,
                   static_cast<size_t>(std::thread::hardware_concurrency())}));
  for (size_t k = 0; k < impl->chunks; ++k) {
    cudaEvent_t event = nullptr;
    MPILEARN_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
        "cudaEventCreate");
    impl->chunk_done.emplace_back(event);
  }

  MPILEARN_ASSIGN_OR_RETURN(impl->params, AllocateDevice(impl->total));
  MPILEARN_ASSIGN_OR_RETURN(impl->grads, AllocateDevice(impl->total));
  MPILEARN_ASSIGN_OR_RETURN(impl->staged_params, AllocatePinned(impl->total));
  MPILEARN_ASSIGN_OR_RETURN(impl->staged_grads, AllocatePinned(impl->total));
  const bool adagrad = config.kind == OptimizerKind::kAdagrad;
  const float initial_sum =
      static_cast<float>(config.initial_accumulator_value);
  if (adagrad && impl->total > 0 && initial_sum != 0.0f) {
    std::fill_n(impl->staged_grads.get(), impl->total, initial_sum);
  }
  for (const auto& [name, slot] : impl->buffers) {
    MPILEARN_ASSIGN_OR_RETURN(impl->state[slot], AllocateDevice(impl->total));
    if (impl->total == 0) continue;
    const size_t bytes = impl->total * sizeof(float);
    if (adagrad && initial_sum != 0.0f) {
      MPILEARN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(impl->state[slot].get(), impl->staged_grads.get(),
                          bytes, cudaMemcpyHostToDevice, impl->stream.get()),
          "initialising the optimizer state");
    } else {
      MPILEARN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(impl->state[slot].get(), 0,
                                                    bytes, impl->stream.get()),
                                    "initialising the optimizer state");
    }
  }
  MPILEARN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl->stream.get()),
                                "initialising the optimizer state");
  return absl::WrapUnique(new CudaEngine(std::move(impl)));
}

absl::Status CudaEngine::UploadParams(
    absl::Span<const absl::Span<const float>> params) {
  MPILEARN_RETURN_IF_ERROR(impl_->Begin());
  MPILEARN_RETURN_IF_ERROR(CheckShapes("parameter", params, impl_->sizes));
  impl_->params_on_device = false;
  absl::Status status = impl_->EnqueueUpload(params, impl_->staged_params.get(),
                                             impl_->params.get());
  if (status.ok()) {
    const cudaError_t error = cudaStreamSynchronize(impl_->stream.get());
    if (error != cudaSuccess) status = CudaError(error, "uploading parameters");
  }
  MPILEARN_RETURN_IF_ERROR(impl_->Poison(std::move(status)));
  impl_->params_on_device = true;
  return absl::OkStatus();
}

void CudaEngine::MarkHostParamsChanged() { impl_->params_on_device = false; }

absl::Status CudaEngine::Step(absl::Span<const absl::Span<float>> params,
                              absl::Span<const absl::Span<const float>> grads) {
  MPILEARN_RETURN_IF_ERROR(impl_->Begin());
  MPILEARN_RETURN_IF_ERROR(CheckShapes("parameter", params, impl_->sizes));
  MPILEARN_RETURN_IF_ERROR(CheckShapes("gradient", grads, impl_->sizes));
  return impl_->Poison(impl_->DoStep(params, grads));
}

absl::StatusOr<double> CudaEngine::TimeKernelMs(int iterations) {
  MPILEARN_RETURN_IF_ERROR(impl_->Begin());
  if (!impl_->params_on_device || impl_->steps == 0) {
    return absl::FailedPreconditionError(
        "TimeKernelMs needs one Step first (weights and gradients on the GPU)");
  }
  if (iterations < 1) {
    return absl::InvalidArgumentError("iterations must be >= 1");
  }
  cudaEvent_t start_raw = nullptr;
  cudaEvent_t stop_raw = nullptr;
  MPILEARN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_raw), "cudaEventCreate");
  Event start(start_raw);
  MPILEARN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop_raw), "cudaEventCreate");
  Event stop(stop_raw);
  auto run = [&]() -> absl::Status {
    MPILEARN_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), impl_->stream.get()),
                                  "cudaEventRecord");
    for (int i = 0; i < iterations; ++i) {
      MPILEARN_RETURN_IF_ERROR(impl_->LaunchStep());
    }
    MPILEARN_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), impl_->stream.get()),
                                  "cudaEventRecord");
    MPILEARN_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()),
                                  "waiting for the timed kernels");
    return absl::OkStatus();
  };
  MPILEARN_RETURN_IF_ERROR(impl_->Poison(run()));
  float milliseconds = 0;
  MPILEARN_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(&milliseconds, start.get(), stop.get()),
      "cudaEventElapsedTime");
  return static_cast<double>(milliseconds) / iterations;
}

int64_t CudaEngine::steps() const { return impl_->steps; }

std::string CudaEngine::name() const {
  return OptimizerKindName(impl_->config.kind);
}

const OptimizerConfig& CudaEngine::config() const { return impl_->config; }

// LaunchStep computes each step's scalars from the config.
void CudaEngine::SetLearningRate(double rate) { impl_->config.learning_rate = rate; }

int CudaEngine::device_index() const { return impl_->device; }

absl::StatusOr<OptimizerState> CudaEngine::SaveState() const {
  MPILEARN_RETURN_IF_ERROR(impl_->Begin());
  OptimizerState saved;
  saved.steps = impl_->steps;
  saved.buffers.resize(impl_->buffers.size());
  for (size_t b = 0; b < impl_->buffers.size(); ++b) {
    const float* device_flat = impl_->state[impl_->buffers[b].second].get();
    saved.buffers[b].resize(impl_->sizes.size());
    for (size_t i = 0; i < impl_->sizes.size(); ++i) {
      std::vector<float>& tensor = saved.buffers[b][i];
      tensor.resize(impl_->sizes[i]);
      if (tensor.empty()) continue;
      MPILEARN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(tensor.data(), device_flat + impl_->offsets[i],
                          tensor.size() * sizeof(float), cudaMemcpyDeviceToHost,
                          impl_->stream.get()),
          "copying optimizer state from the GPU");
    }
  }
  MPILEARN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream.get()),
                                "copying optimizer state from the GPU");
  return saved;
}

absl::Status CudaEngine::RestoreState(const OptimizerState& state) {
  MPILEARN_RETURN_IF_ERROR(impl_->Begin());
  if (state.steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state has ", state.steps, " steps"));
  }
  if (state.buffers.size() != impl_->buffers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state has ", state.buffers.size(), " buffers, ",
                     impl_->buffers.size(), " expected"));
  }
  for (size_t b = 0; b < state.buffers.size(); ++b) {
    const std::string& name = impl_->buffers[b].first;
    if (state.buffers[b].size() != impl_->sizes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state buffer ", name, " has ", state.buffers[b].size(),
          " tensors, expected ", impl_->sizes.size()));
    }
    for (size_t i = 0; i < impl_->sizes.size(); ++i) {
      if (state.buffers[b][i].size() != impl_->sizes[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state buffer ", name, " of tensor ", i,
                         " has ", state.buffers[b][i].size(),
                         " elements, expected ", impl_->sizes[i]));
      }
    }
  }
  // From here on a failure leaves the state half-written.
  impl_->params_on_device = false;
  const auto upload = [&]() -> absl::Status {
    for (size_t b = 0; b < state.buffers.size(); ++b) {
      float* device_flat = impl_->state[impl_->buffers[b].second].get();
      for (size_t i = 0; i < impl_->sizes.size(); ++i) {
        const std::vector<float>& tensor = state.buffers[b][i];
        if (tensor.empty()) continue;
        MPILEARN_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(device_flat + impl_->offsets[i], tensor.data(),
                            tensor.size() * sizeof(float),
                            cudaMemcpyHostToDevice, impl_->stream.get()),
            "copying optimizer state to the GPU");
      }
    }
    MPILEARN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream.get()),
                                  "copying optimizer state to the GPU");
    return absl::OkStatus();
  };
  MPILEARN_RETURN_IF_ERROR(impl_->Poison(upload()));
  impl_->steps = state.steps;
  return absl::OkStatus();
}

bool CudaEngine::BuiltWithCuda() { return true; }

int CudaEngine::DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the non-sticky "no device" error
    return 0;
  }
  return count;
}

absl::StatusOr<double> CudaEngine::MeasureCopyBandwidthGBps(size_t bytes,
                                                            int device) {
  if (bytes == 0) return absl::InvalidArgumentError("bytes must be positive");
  MPILEARN_RETURN_IF_ERROR(CheckDevice(device));
  MPILEARN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  const size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
  MPILEARN_ASSIGN_OR_RETURN(DeviceFloats src, AllocateDevice(floats));
  MPILEARN_ASSIGN_OR_RETURN(DeviceFloats dst, AllocateDevice(floats));
  MPILEARN_CUDA_RETURN_IF_ERROR(cudaMemset(src.get(), 0, bytes), "cudaMemset");
  MPILEARN_ASSIGN_OR_RETURN(const Stream stream, NewStream());
  const int iterations = CopyTimingIterations(bytes);
  float milliseconds = 0;
  MPILEARN_CUDA_RETURN_IF_ERROR(
      cuda::TimeCopies(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice,
                       iterations, stream.get(), &milliseconds),
      "timing device-to-device copies");
  if (!(milliseconds > 0)) {
    return absl::InternalError("device-to-device copies took no time");
  }
  return 2.0 * static_cast<double>(bytes) * iterations / (milliseconds * 1e-3) /
         1e9;
}

absl::StatusOr<CudaEngine::HostTransferGBps>
CudaEngine::MeasureHostTransferGBps(size_t bytes, int device) {
  if (bytes == 0) return absl::InvalidArgumentError("bytes must be positive");
  MPILEARN_RETURN_IF_ERROR(CheckDevice(device));
  MPILEARN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  const size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
  MPILEARN_ASSIGN_OR_RETURN(DeviceFloats on_device, AllocateDevice(floats));
  MPILEARN_ASSIGN_OR_RETURN(PinnedFloats on_host, AllocatePinned(floats));
  std::memset(on_host.get(), 0, bytes);
  MPILEARN_ASSIGN_OR_RETURN(const Stream stream, NewStream());
  const int iterations = CopyTimingIterations(bytes);  // each way
  HostTransferGBps result;
  for (const bool to_device : {true, false}) {
    float milliseconds = 0;
    MPILEARN_CUDA_RETURN_IF_ERROR(
        cuda::TimeCopies(
            to_device ? static_cast<void*>(on_device.get()) : on_host.get(),
            to_device ? static_cast<void*>(on_host.get()) : on_device.get(),
            bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
            iterations, stream.get(), &milliseconds),
        "timing host<->device copies");
    if (!(milliseconds > 0)) {
      return absl::InternalError("host<->device copies took no time");
    }
    const double gbps = static_cast<double>(bytes) * iterations /
                        (milliseconds * 1e-3) / 1e9;
    (to_device ? result.to_device : result.to_host) = gbps;
  }
  return result;
}

}  // namespace mpilearn::server
