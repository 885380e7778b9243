// A double-precision reference for the master's optimizers, for tests: the
// update rules of server/optimizer_config.h written from the formulas and
// sharing no code with any backend under test (CPU or CUDA). State buffers
// are kept by PyTorch's names; every name is allocated, whether or not the
// optimizer uses it.
#ifndef MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_REFERENCE_H_
#define MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_REFERENCE_H_

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "server/core/update/optimizer_config.h"

namespace mpilearn::server {

class ReferenceOptimizer {
 public:
  using Tensors = std::vector<std::vector<double>>;

  ReferenceOptimizer(const OptimizerConfig& config, const std::vector<size_t>& sizes)
      : c_(config) {
    const double initial = config.kind == OptimizerKind::kAdagrad
                               ? config.initial_accumulator_value
                               : 0.0;
    for (const char* name : {"momentum_buffer", "exp_avg", "exp_avg_sq",
                             "square_avg", "grad_avg", "acc_delta", "sum"}) {
      for (size_t size : sizes) state_[name].emplace_back(size, initial);
    }
  }

  // State buffer `name` (PyTorch's name), one vector per tensor.
  const Tensors& buffer(const std::string& name) const { return state_.at(name); }

  void Step(Tensors& params, const Tensors& grads) {
    ++t_;
    for (size_t k = 0; k < params.size(); ++k) {
      for (size_t i = 0; i < params[k].size(); ++i) {
        StepElement(params[k][i], grads[k][i], k, i);
      }
    }
  }

 private:
  double& S(const std::string& name, size_t k, size_t i) {
    return state_.at(name)[k][i];
  }

  void StepElement(double& p, double g, size_t k, size_t i) {
    const double lr = c_.learning_rate;
    const double wd = c_.weight_decay;
    switch (c_.kind) {
      case OptimizerKind::kSgd: {
        g += wd * p;
        if (c_.momentum > 0) {
          double& buf = S("momentum_buffer", k, i);
          buf = t_ == 1 ? g : c_.momentum * buf + g;
          g = c_.nesterov ? g + c_.momentum * buf : buf;
        }
        p -= lr * g;
        break;
      }
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        if (c_.kind == OptimizerKind::kAdamW) {
          p *= 1 - lr * wd;
        } else {
          g += wd * p;
        }
        double& m = S("exp_avg", k, i);
        double& v = S("exp_avg_sq", k, i);
        m = c_.beta1 * m + (1 - c_.beta1) * g;
        v = c_.beta2 * v + (1 - c_.beta2) * g * g;
        const double bc1 = 1 - std::pow(c_.beta1, t_);
        const double bc2 = 1 - std::pow(c_.beta2, t_);
        p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + c_.epsilon);
        break;
      }
      case OptimizerKind::kRmsprop: {
        g += wd * p;
        double& sq = S("square_avg", k, i);
        sq = c_.alpha * sq + (1 - c_.alpha) * g * g;
        double avg;
        if (c_.centered) {
          double& ga = S("grad_avg", k, i);
          ga = c_.alpha * ga + (1 - c_.alpha) * g;
          avg = std::sqrt(sq - ga * ga) + c_.epsilon;
        } else {
          avg = std::sqrt(sq) + c_.epsilon;
        }
        if (c_.momentum > 0) {
          double& buf = S("momentum_buffer", k, i);
          buf = c_.momentum * buf + g / avg;
          p -= lr * buf;
        } else {
          p -= lr * g / avg;
        }
        break;
      }
      case OptimizerKind::kAdadelta: {
        g += wd * p;
        double& sq = S("square_avg", k, i);
        double& acc = S("acc_delta", k, i);
        sq = c_.rho * sq + (1 - c_.rho) * g * g;
        const double delta =
            std::sqrt(acc + c_.epsilon) / std::sqrt(sq + c_.epsilon) * g;
        acc = c_.rho * acc + (1 - c_.rho) * delta * delta;
        p -= lr * delta;
        break;
      }
      case OptimizerKind::kAdagrad: {
        g += wd * p;
        const double clr = lr / (1 + (t_ - 1) * c_.lr_decay);
        double& sum = S("sum", k, i);
        sum += g * g;
        p -= clr * g / (std::sqrt(sum) + c_.epsilon);
        break;
      }
    }
  }

  const OptimizerConfig c_;
  int t_ = 0;
  std::map<std::string, Tensors> state_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_REFERENCE_H_
