// What one optimizer step needs besides the arrays: the per-step scalars
// (bias corrections, adagrad's decayed learning rate, ...) and the flags that
// pick the optional terms of a rule. Computed once per step, in double and
// rounded to fp32, by ComputeStepScalars (optimizer_config.h); read by the
// update rules of optimizer_rules.h on both backends.
//
// A plain header (no Abseil, no protobuf, no OptimizerConfig) so that nvcc
// can compile it into the CUDA kernels, which take a StepScalars by value.
#ifndef MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_STEP_H_
#define MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_STEP_H_

namespace mpilearn::server {

// Every field is uniform across the elements of a step. Each rule in
// optimizer_rules.h names the fields it reads; the others mean nothing.
struct StepScalars {
  // Flags: which optional terms of the rule apply this step.
  bool l2_decay = false;         // g += weight_decay * p (not adamw)
  bool decoupled_decay = false;  // adamw: p *= weight_scale
  bool has_momentum = false;     // sgd, rmsprop: momentum > 0
  bool first_step = false;       // t == 1 (sgd's buffer starts as g)
  bool nesterov = false;         // sgd
  bool centered = false;         // rmsprop

  float learning_rate = 0;  // adagrad: the decayed clr
  float weight_decay = 0;   // L2 coefficient added to the gradient
  float momentum = 0;
  float decay = 0;            // beta1 (adam), alpha (rmsprop), rho (adadelta)
  float one_minus_decay = 0;  // 1 - decay
  float beta2 = 0;            // adam
  float one_minus_beta2 = 0;  // adam
  float step_size = 0;        // adam: lr / (1 - beta1^t)
  float inv_bias_correction2_sqrt = 0;  // adam: 1 / sqrt(1 - beta2^t)
  float weight_scale = 0;               // adamw: 1 - lr * wd
  float epsilon = 0;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_STEP_H_
