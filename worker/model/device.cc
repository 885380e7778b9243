#include "worker/model/device.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mpilearn::worker {

int CudaDeviceCount() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count())
                                     : 0;
}

absl::StatusOr<DeviceChoice> ResolveDevice(absl::string_view flag,
                                           int local_rank, int cuda_devices) {
  DeviceChoice choice;
  if (flag == "cpu") return choice;
  if (flag == "auto") {
    if (cuda_devices == 0) {
      choice.note =
          "--device auto: no usable GPU (this worker's LibTorch has no CUDA "
          "support, or the node has no GPU): training on the CPU";
      return choice;
    }
    flag = "cuda";
  }
  int index = -1;
  if (flag == "cuda") {
    index = cuda_devices > 0 ? local_rank % cuda_devices : 0;
  } else if (!absl::StartsWith(flag, "cuda:") ||
             !absl::SimpleAtoi(flag.substr(5), &index) || index < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device: expected auto, cpu, cuda or cuda:N, got '", flag, "'"));
  }
  if (cuda_devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device ", flag,
        ": this worker's LibTorch has no CUDA support or sees no GPU "
        "(Debian's libtorch is a CPU build). Use --device cpu or auto, or "
        "build the worker against a CUDA LibTorch (docs/gpu.md)."));
  }
  if (index >= cuda_devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", flag, ": this node has ", cuda_devices, " GPU(s), 0 to ",
        cuda_devices - 1));
  }
  choice.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  return choice;
}

}  // namespace mpilearn::worker
