// The resolved hyperparameters of one job's optimizer: what every backend
// (CPU in optimizer.cc, CUDA in cuda/) computes from. Resolving a spec fills
// in defaults and validates once; backends never see an OptimizerSpec.
//
// The update rules are PyTorch's (torch.optim, maximize=False, amsgrad=False,
// dampening=0), with t the 1-based step count, g the incoming gradient and p
// the parameter, all elementwise. Every backend implements exactly these:
//
//   sgd:      g += wd*p
//             if momentum > 0: buf = (t == 1) ? g : momentum*buf + g
//                              g = nesterov ? g + momentum*buf : buf
//             p -= lr*g
//   adam:     g += wd*p
//             m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//             p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
//   adamw:    p *= 1 - lr*wd   (decoupled decay), then adam with wd = 0
//   rmsprop:  g += wd*p
//             sq = alpha*sq + (1-alpha)*g*g
//             if centered: ga = alpha*ga + (1-alpha)*g;  avg = sqrt(sq - ga*ga) + eps
//             else:        avg = sqrt(sq) + eps
//             if momentum > 0: buf = momentum*buf + g/avg;  p -= lr*buf
//             else:            p -= lr*g/avg
//   adadelta: g += wd*p
//             sq = rho*sq + (1-rho)*g*g
//             delta = sqrt(acc + eps) / sqrt(sq + eps) * g
//             acc = rho*acc + (1-rho)*delta*delta
//             p -= lr*delta
//   adagrad:  g += wd*p
//             clr = lr / (1 + (t-1)*lr_decay)
//             sum += g*g        (sum starts at initial_accumulator_value)
//             p -= clr * g / (sqrt(sum) + eps)
//
// Per-step scalars (bias corrections, clr) are computed in double once per
// step (ComputeStepScalars); the elementwise arithmetic is fp32, written once
// for every backend in optimizer_rules.h.
#ifndef MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_CONFIG_H_
#define MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_CONFIG_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/mpilearn.pb.h"
#include "server/core/update/optimizer_step.h"

namespace mpilearn::server {

enum class OptimizerKind { kSgd, kAdam, kAdamW, kRmsprop, kAdadelta, kAdagrad };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdam;
  double learning_rate = 1e-3;
  double weight_decay = 0.0;
  // sgd, rmsprop
  double momentum = 0.0;
  bool nesterov = false;  // sgd
  // adam, adamw
  double beta1 = 0.9;
  double beta2 = 0.999;
  // adam/adamw/rmsprop/adadelta/adagrad (defaults differ per optimizer)
  double epsilon = 1e-8;
  // rmsprop
  double alpha = 0.99;
  bool centered = false;
  // adadelta
  double rho = 0.9;
  // adagrad
  double lr_decay = 0.0;
  double initial_accumulator_value = 0.0;
};

// "sgd", "adam", ...
std::string OptimizerKindName(OptimizerKind kind);

// Names of the per-tensor state buffers `kind` keeps, in a fixed order (the
// order backends store and checkpoints list them), e.g. adam:
// {"exp_avg", "exp_avg_sq"}; sgd without momentum: {}.
std::vector<std::string> StateBufferNames(const OptimizerConfig& config);

// The scalars and flags of step `t` (1-based: the step about to be applied)
// of the optimizer `config` describes, computed in double and rounded to
// fp32. Every backend computes its steps from this.
StepScalars ComputeStepScalars(const OptimizerConfig& config, int64_t t);

// Which state buffer (index into StateBufferNames(config)) is operand s0, s1
// and s2 of the rule in optimizer_rules.h, in the order of its state
// arguments; -1 where the rule with this configuration keeps none. E.g.
// rmsprop centered without momentum: {0 (square_avg), 1 (grad_avg), -1}.
std::array<int, 3> StateOperands(const OptimizerConfig& config);

// Defaults (PyTorch's; sgd's learning rate defaults to 0.01) and validation.
// Errors are InvalidArgument and name the field: "optimizer.beta1 must be in
// [0, 1), got 1.5".
absl::StatusOr<OptimizerConfig> ResolveOptimizerConfig(
    const mpilearn::v1::OptimizerSpec& spec);

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_CONFIG_H_
