// CudaEngine for builds without nvcc (see //server/core/update/cuda:BUILD):
// no engine can be created and no device is ever reported, so callers take
// their CPU path.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/core/update/cuda/cuda_engine.h"
#include "server/core/update/optimizer_config.h"
#include "server/core/update/optimizer_interface.h"

namespace mpilearn::server {
namespace {

absl::Status WithoutCuda() {
  return absl::UnimplementedError(
      "this master was built without CUDA (nvcc not found at build time)");
}

}  // namespace

// Never instantiated: Create always fails, so the members below are only
// there to link.
struct CudaEngine::Impl {
  OptimizerConfig config;
};

CudaEngine::CudaEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaEngine::~CudaEngine() = default;

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(
    const OptimizerConfig&, const std::vector<size_t>&, int) {
  return WithoutCuda();
}

absl::Status CudaEngine::UploadParams(
    absl::Span<const absl::Span<const float>>) {
  return WithoutCuda();
}

void CudaEngine::MarkHostParamsChanged() {}

absl::Status CudaEngine::Step(absl::Span<const absl::Span<float>>,
                              absl::Span<const absl::Span<const float>>) {
  return WithoutCuda();
}

int64_t CudaEngine::steps() const { return 0; }

std::string CudaEngine::name() const {
  return OptimizerKindName(impl_->config.kind);
}

const OptimizerConfig& CudaEngine::config() const { return impl_->config; }

void CudaEngine::SetLearningRate(double rate) { impl_->config.learning_rate = rate; }

int CudaEngine::device_index() const { return -1; }

absl::StatusOr<OptimizerState> CudaEngine::SaveState() const {
  return WithoutCuda();
}

absl::Status CudaEngine::RestoreState(const OptimizerState&) {
  return WithoutCuda();
}

int CudaEngine::DeviceCount() { return 0; }

bool CudaEngine::BuiltWithCuda() { return false; }

absl::StatusOr<double> CudaEngine::TimeKernelMs(int) { return WithoutCuda(); }

absl::StatusOr<double> CudaEngine::MeasureCopyBandwidthGBps(size_t, int) {
  return WithoutCuda();
}

absl::StatusOr<CudaEngine::HostTransferGBps>
CudaEngine::MeasureHostTransferGBps(size_t, int) {
  return WithoutCuda();
}

}  // namespace mpilearn::server
