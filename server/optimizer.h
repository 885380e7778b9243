// The master's optimizers: they apply a job's gradients to its parameters.
//
// A job's parameters are a list of flat fp32 tensors. An `Optimizer` owns the
// per-tensor state (Adam's moments, SGD's momentum buffers) for one job and
// updates the parameters in place, with the semantics of PyTorch's
// `torch.optim.Adam` (amsgrad=False) and `torch.optim.SGD` (dampening 0).
//
//   MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
//                             CreateOptimizer(job.optimizer(), sizes));
//   ...
//   optimizer->Step(params, grads);  // once per accepted update
//
// The interface is the seam between the master and the device that does the
// arithmetic; this file has the CPU backend.
#ifndef MPILEARN_SERVER_OPTIMIZER_H_
#define MPILEARN_SERVER_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::server {

// Applies optimizer steps to the parameters of one job.
//
// Threading: not thread-safe. The caller (the job) serialises every call,
// including the const ones, against Step.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Applies one step: tensor i of `params` is updated in place with gradient
  // i of `grads`.
  //
  // Precondition (not checked, this is the hot path): `params.size()` and
  // `grads.size()` equal the number of tensors given at creation, and
  // `params[i].size() == grads[i].size()` equals tensor size i given at
  // creation. No params tensor overlaps another tensor or any gradient.
  virtual void Step(absl::Span<const absl::Span<float>> params,
                    absl::Span<const absl::Span<const float>> grads) = 0;

  // Number of steps applied so far.
  virtual int64_t steps() const = 0;

  // "adam" or "sgd".
  virtual std::string name() const = 0;
};

// Adam hyper-parameters; the defaults are PyTorch's.
struct AdamOptions {
  double learning_rate = 0.001;  // > 0, finite
  double beta1 = 0.9;            // in [0, 1)
  double beta2 = 0.999;          // in [0, 1)
  double epsilon = 1e-8;         // > 0, finite
  double weight_decay = 0;       // >= 0, finite; L2 added to the gradient
};

// SGD hyper-parameters; the defaults are PyTorch's except the learning rate,
// which PyTorch requires and MPI Learn defaults to 0.01.
struct SgdOptions {
  double learning_rate = 0.01;  // > 0, finite
  double momentum = 0;          // >= 0, finite; 0 means no momentum buffer
  bool nesterov = false;        // requires momentum > 0
  double weight_decay = 0;      // >= 0, finite; L2 added to the gradient
};

// InvalidArgumentError naming the offending field ("optimizer.beta1 must be in
// [0, 1), got 1.5") unless every option is in range. Backends share these.
absl::Status ValidateAdamOptions(const AdamOptions& options);
absl::Status ValidateSgdOptions(const SgdOptions& options);

// Builds the CPU optimizer that `spec` names ("adam" or "sgd") for tensors of
// `tensor_sizes` elements. Fields absent from `spec` take the defaults above;
// fields that the named optimizer does not use are ignored. Returns
// InvalidArgumentError for an unknown name or an out-of-range field.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    const mpilearn::v1::OptimizerSpec& spec,
    const std::vector<size_t>& tensor_sizes);

// Adam on the CPU. Each tensor is updated in one fused pass:
//   g = grad + wd * p
//   m = b1 * m + (1 - b1) * g
//   v = b2 * v + (1 - b2) * g * g
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
class CpuAdamOptimizer final : public Optimizer {
 public:
  // Validates `options` and allocates zeroed moments for each tensor.
  static absl::StatusOr<std::unique_ptr<CpuAdamOptimizer>> Create(
      const AdamOptions& options, const std::vector<size_t>& tensor_sizes);

  void Step(absl::Span<const absl::Span<float>> params,
            absl::Span<const absl::Span<const float>> grads) override;
  int64_t steps() const override { return steps_; }
  std::string name() const override { return "adam"; }

  const AdamOptions& options() const { return options_; }
  // First and second moments of tensor i (PyTorch's exp_avg, exp_avg_sq).
  absl::Span<const float> exp_avg(size_t i) const { return exp_avg_[i]; }
  absl::Span<const float> exp_avg_sq(size_t i) const { return exp_avg_sq_[i]; }

 private:
  CpuAdamOptimizer(const AdamOptions& options,
                   const std::vector<size_t>& tensor_sizes);

  const AdamOptions options_;
  int64_t steps_ = 0;
  // One entry per tensor, each as long as that tensor.
  std::vector<std::vector<float>> exp_avg_;
  std::vector<std::vector<float>> exp_avg_sq_;
};

// SGD on the CPU, with optional momentum (dampening 0), Nesterov momentum and
// weight decay. Each tensor is updated in one fused pass:
//   g = grad + wd * p
//   buf = (t == 1) ? g : momentum * buf + g      (only if momentum != 0)
//   g = nesterov ? g + momentum * buf : buf      (only if momentum != 0)
//   p -= lr * g
class CpuSgdOptimizer final : public Optimizer {
 public:
  // Validates `options` and, if momentum is used, allocates a buffer for each
  // tensor.
  static absl::StatusOr<std::unique_ptr<CpuSgdOptimizer>> Create(
      const SgdOptions& options, const std::vector<size_t>& tensor_sizes);

  void Step(absl::Span<const absl::Span<float>> params,
            absl::Span<const absl::Span<const float>> grads) override;
  int64_t steps() const override { return steps_; }
  std::string name() const override { return "sgd"; }

  const SgdOptions& options() const { return options_; }
  // Momentum buffer of tensor i; empty when momentum is 0.
  absl::Span<const float> momentum_buffer(size_t i) const {
    return momentum_buffer_.empty() ? absl::Span<const float>()
                                    : absl::Span<const float>(
                                          momentum_buffer_[i]);
  }

 private:
  CpuSgdOptimizer(const SgdOptions& options,
                  const std::vector<size_t>& tensor_sizes);

  const SgdOptions options_;
  int64_t steps_ = 0;
  // Empty when momentum is 0; otherwise one entry per tensor, each as long as
  // that tensor.
  std::vector<std::vector<float>> momentum_buffer_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_OPTIMIZER_H_
