// Where a rank trains: mpilearn-worker's --device, resolved against the
// LibTorch the worker was built with and the node's GPUs.
//
//   MPILEARN_ASSIGN_OR_RETURN(
//       DeviceChoice choice,
//       ResolveDevice(flag, mpi->local_rank(), CudaDeviceCount()));
//   if (!choice.note.empty()) LOG(INFO) << choice.note;
//
//   "cpu"     the CPU.
//   "auto"    a GPU when this LibTorch has CUDA and the node has a GPU
//             (as "cuda"), else the CPU with a note saying why.
//   "cuda"    GPU (node-local rank mod the node's GPUs), as mpi_learn
//             spread a node's ranks over its GPUs.
//   "cuda:N"  GPU N, whatever the rank (the override).
// Debian's LibTorch is a CPU build: there "cuda" and "cuda:N" are
// FailedPrecondition with what to do instead (docs/gpu.md).
//
// Thread safety: pure functions.
#ifndef MPILEARN_WORKER_MODEL_DEVICE_H_
#define MPILEARN_WORKER_MODEL_DEVICE_H_

#include <string>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mpilearn::worker {

struct DeviceChoice {
  torch::Device device = torch::kCPU;
  // Non-empty when "auto" fell back to the CPU: one line for the log.
  std::string note;
};

// `cuda_devices`: the GPUs this process can use (CudaDeviceCount()).
// InvalidArgument for a malformed flag or a GPU index past the node's.
absl::StatusOr<DeviceChoice> ResolveDevice(absl::string_view flag,
                                           int local_rank, int cuda_devices);

// The GPUs LibTorch can use: 0 without CUDA support or without a GPU.
int CudaDeviceCount();

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_MODEL_DEVICE_H_
