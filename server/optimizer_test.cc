#include "server/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::server {
namespace {

using ::mpilearn::v1::OptimizerSpec;

// Sizes that exercise empty tensors, scalar tails shorter than a vector, and a
// long main loop with a remainder.
const std::vector<size_t> kSizes = {1, 7, 1000, 0, 33};
constexpr int kSteps = 6;

// ---------------------------------------------------------------------------
// Double-precision references, written from the PyTorch update rules and
// sharing no code with the optimizer under test.

struct AdamReference {
  AdamReference(double lr, double beta1, double beta2, double eps,
                double weight_decay)
      : lr(lr), beta1(beta1), beta2(beta2), eps(eps),
        weight_decay(weight_decay) {}

  double lr, beta1, beta2, eps, weight_decay;
  int t = 0;
  std::vector<std::vector<double>> m, v;

  void Step(std::vector<std::vector<double>>& params,
            const std::vector<std::vector<double>>& grads) {
    ++t;
    if (m.empty()) {
      for (const auto& p : params) {
        m.emplace_back(p.size(), 0.0);
        v.emplace_back(p.size(), 0.0);
      }
    }
    const double bc1 = 1.0 - std::pow(beta1, t);
    const double bc2 = 1.0 - std::pow(beta2, t);
    for (size_t k = 0; k < params.size(); ++k) {
      for (size_t i = 0; i < params[k].size(); ++i) {
        double& p = params[k][i];
        const double g = grads[k][i] + weight_decay * p;
        m[k][i] = beta1 * m[k][i] + (1 - beta1) * g;
        v[k][i] = beta2 * v[k][i] + (1 - beta2) * g * g;
        p -= lr / bc1 * m[k][i] / (std::sqrt(v[k][i]) / std::sqrt(bc2) + eps);
      }
    }
  }
};

struct SgdReference {
  SgdReference(double lr, double momentum, double weight_decay, bool nesterov)
      : lr(lr), momentum(momentum), weight_decay(weight_decay),
        nesterov(nesterov) {}

  double lr, momentum, weight_decay;
  bool nesterov;
  int t = 0;
  std::vector<std::vector<double>> buf;

  void Step(std::vector<std::vector<double>>& params,
            const std::vector<std::vector<double>>& grads) {
    ++t;
    if (buf.empty()) {
      for (const auto& p : params) buf.emplace_back(p.size(), 0.0);
    }
    for (size_t k = 0; k < params.size(); ++k) {
      for (size_t i = 0; i < params[k].size(); ++i) {
        double& p = params[k][i];
        double g = grads[k][i] + weight_decay * p;
        if (momentum != 0) {
          buf[k][i] = t == 1 ? g : momentum * buf[k][i] + g;
          g = nesterov ? g + momentum * buf[k][i] : buf[k][i];
        }
        p -= lr * g;
      }
    }
  }
};

// ---------------------------------------------------------------------------
// Harness: random fp32 parameters and gradients, exactly representable in
// double, stepped through the optimizer and the reference side by side.

// With `tiny_last`, the last tensor is scaled down by 1e-7 so that Adam's
// epsilon is comparable to sqrt(v) there.
std::vector<std::vector<double>> RandomTensors(std::mt19937& rng, double scale,
                                               bool tiny_last) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<double>> tensors;
  for (size_t k = 0; k < kSizes.size(); ++k) {
    const bool tiny = tiny_last && k + 1 == kSizes.size();
    const double tensor_scale = tiny ? scale * 1e-7 : scale;
    std::vector<double> t(kSizes[k]);
    for (double& x : t) {
      x = static_cast<float>(tensor_scale * normal(rng));
    }
    tensors.push_back(std::move(t));
  }
  return tensors;
}

std::vector<std::vector<float>> ToFloat(
    const std::vector<std::vector<double>>& tensors) {
  std::vector<std::vector<float>> out;
  for (const auto& t : tensors) out.emplace_back(t.begin(), t.end());
  return out;
}

double MaxAbs(absl::Span<const double> tensor) {
  double max_abs = 0;
  for (const double x : tensor) max_abs = std::max(max_abs, std::abs(x));
  return max_abs;
}

// Relative tolerance 1e-5, plus an absolute floor of 1e-6 times the tensor's
// largest magnitude: an element that ends near zero by cancellation carries
// the fp32 rounding error (~6e-8 relative) of the larger terms it came from.
void ExpectTensorClose(absl::Span<const float> actual,
                       absl::Span<const double> expected,
                       const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  const double floor = 1e-6 * MaxAbs(expected);
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tolerance = 1e-5 * std::abs(expected[i]) + floor;
    ASSERT_NEAR(actual[i], expected[i], tolerance)
        << what << " element " << i;
  }
}

void ExpectClose(const std::vector<std::vector<float>>& actual,
                 const std::vector<std::vector<double>>& expected,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t k = 0; k < actual.size(); ++k) {
    ExpectTensorClose(actual[k], expected[k],
                      what + " tensor " + std::to_string(k));
  }
}

// Runs kSteps steps of `optimizer` and `reference` on the same data and
// compares the parameters after each step.
template <typename Reference>
void RunAgainstReference(Optimizer& optimizer, Reference& reference) {
  std::mt19937 rng(20240611);
  std::vector<std::vector<double>> expected =
      RandomTensors(rng, 0.1, /*tiny_last=*/false);
  std::vector<std::vector<float>> params = ToFloat(expected);
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<std::vector<double>> grads =
        RandomTensors(rng, 1.0, /*tiny_last=*/true);
    const std::vector<std::vector<float>> grads_f = ToFloat(grads);
    std::vector<absl::Span<float>> param_spans;
    std::vector<absl::Span<const float>> grad_spans;
    for (size_t k = 0; k < params.size(); ++k) {
      param_spans.emplace_back(params[k]);
      grad_spans.emplace_back(grads_f[k]);
    }
    optimizer.Step(param_spans, grad_spans);
    reference.Step(expected, grads);
    EXPECT_EQ(optimizer.steps(), step);
    ExpectClose(params, expected, "step " + std::to_string(step));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

std::unique_ptr<Optimizer> MustCreate(const OptimizerSpec& spec) {
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      CreateOptimizer(spec, kSizes);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return optimizer.ok() ? std::move(optimizer).value() : nullptr;
}

TEST(OptimizerTest, AdamDefaultsMatchReference) {
  OptimizerSpec spec;
  spec.set_name("adam");
  std::unique_ptr<Optimizer> optimizer = MustCreate(spec);
  ASSERT_NE(optimizer, nullptr);
  EXPECT_EQ(optimizer->name(), "adam");
  EXPECT_EQ(optimizer->steps(), 0);
  AdamReference reference(0.001, 0.9, 0.999, 1e-8, 0.0);
  RunAgainstReference(*optimizer, reference);
}

TEST(OptimizerTest, AdamWithWeightDecayMatchesReference) {
  OptimizerSpec spec;
  spec.set_name("adam");
  spec.set_learning_rate(0.01);
  spec.set_beta1(0.8);
  spec.set_beta2(0.99);
  spec.set_epsilon(1e-6);
  spec.set_weight_decay(0.1);
  std::unique_ptr<Optimizer> optimizer = MustCreate(spec);
  ASSERT_NE(optimizer, nullptr);
  AdamReference reference(0.01, 0.8, 0.99, 1e-6, 0.1);
  RunAgainstReference(*optimizer, reference);
}

TEST(OptimizerTest, AdamMomentsMatchReference) {
  auto optimizer = CpuAdamOptimizer::Create(AdamOptions(), kSizes);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  AdamReference reference(0.001, 0.9, 0.999, 1e-8, 0.0);
  RunAgainstReference(**optimizer, reference);
  for (size_t k = 0; k < kSizes.size(); ++k) {
    const std::string tensor = " tensor " + std::to_string(k);
    ExpectTensorClose((*optimizer)->exp_avg(k), reference.m[k],
                      "exp_avg" + tensor);
    ExpectTensorClose((*optimizer)->exp_avg_sq(k), reference.v[k],
                      "exp_avg_sq" + tensor);
  }
}

TEST(OptimizerTest, SgdPlainMatchesReference) {
  OptimizerSpec spec;
  spec.set_name("sgd");
  std::unique_ptr<Optimizer> optimizer = MustCreate(spec);
  ASSERT_NE(optimizer, nullptr);
  EXPECT_EQ(optimizer->name(), "sgd");
  SgdReference reference(0.01, 0.0, 0.0, false);
  RunAgainstReference(*optimizer, reference);
}

TEST(OptimizerTest, SgdMomentumMatchesReference) {
  OptimizerSpec spec;
  spec.set_name("sgd");
  spec.set_learning_rate(0.05);
  spec.set_momentum(0.9);
  std::unique_ptr<Optimizer> optimizer = MustCreate(spec);
  ASSERT_NE(optimizer, nullptr);
  SgdReference reference(0.05, 0.9, 0.0, false);
  RunAgainstReference(*optimizer, reference);
}

TEST(OptimizerTest, SgdNesterovWithWeightDecayMatchesReference) {
  OptimizerSpec spec;
  spec.set_name("sgd");
  spec.set_learning_rate(0.05);
  spec.set_momentum(0.9);
  spec.set_nesterov(true);
  spec.set_weight_decay(0.01);
  std::unique_ptr<Optimizer> optimizer = MustCreate(spec);
  ASSERT_NE(optimizer, nullptr);
  SgdReference reference(0.05, 0.9, 0.01, true);
  RunAgainstReference(*optimizer, reference);
}

TEST(OptimizerTest, SgdWithWeightDecayNoMomentumMatchesReference) {
  OptimizerSpec spec;
  spec.set_name("sgd");
  spec.set_weight_decay(0.5);
  std::unique_ptr<Optimizer> optimizer = MustCreate(spec);
  ASSERT_NE(optimizer, nullptr);
  SgdReference reference(0.01, 0.0, 0.5, false);
  RunAgainstReference(*optimizer, reference);
}

TEST(OptimizerTest, SgdMomentumBufferOnlyWithMomentum) {
  auto plain = CpuSgdOptimizer::Create(SgdOptions(), kSizes);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE((*plain)->momentum_buffer(2).empty());
  SgdOptions options;
  options.momentum = 0.5;
  auto with_momentum = CpuSgdOptimizer::Create(options, kSizes);
  ASSERT_TRUE(with_momentum.ok());
  EXPECT_EQ((*with_momentum)->momentum_buffer(2).size(), kSizes[2]);
}

// ---------------------------------------------------------------------------
// Validation.

struct RejectCase {
  std::string label;
  OptimizerSpec spec;
  std::string field;  // must appear in the message
};

OptimizerSpec Spec(const std::string& name) {
  OptimizerSpec spec;
  spec.set_name(name);
  return spec;
}

std::vector<RejectCase> RejectCases() {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<RejectCase> cases;
  auto add = [&cases](std::string label, OptimizerSpec spec,
                      std::string field) {
    cases.push_back({std::move(label), std::move(spec), std::move(field)});
  };
  add("empty name", Spec(""), "optimizer.name");
  add("unknown name", Spec("rmsprop"), "optimizer.name");
  add("wrong case", Spec("Adam"), "optimizer.name");
  for (const char* optimizer_name : {"adam", "sgd"}) {
    const std::string name = optimizer_name;
    for (double lr : {0.0, -0.1, inf, nan}) {
      OptimizerSpec spec = Spec(name);
      spec.set_learning_rate(lr);
      add(name + " lr " + std::to_string(lr), spec, "optimizer.learning_rate");
    }
    for (double wd : {-1e-4, inf, nan}) {
      OptimizerSpec spec = Spec(name);
      spec.set_weight_decay(wd);
      add(name + " wd " + std::to_string(wd), spec, "optimizer.weight_decay");
    }
  }
  for (double beta : {-0.1, 1.0, 1.5, nan}) {
    OptimizerSpec spec1 = Spec("adam");
    spec1.set_beta1(beta);
    add("beta1 " + std::to_string(beta), spec1, "optimizer.beta1");
    OptimizerSpec spec2 = Spec("adam");
    spec2.set_beta2(beta);
    add("beta2 " + std::to_string(beta), spec2, "optimizer.beta2");
  }
  for (double eps : {0.0, -1e-8, inf, nan}) {
    OptimizerSpec spec = Spec("adam");
    spec.set_epsilon(eps);
    add("epsilon " + std::to_string(eps), spec, "optimizer.epsilon");
  }
  for (double momentum : {-0.9, inf, nan}) {
    OptimizerSpec spec = Spec("sgd");
    spec.set_momentum(momentum);
    add("momentum " + std::to_string(momentum), spec, "optimizer.momentum");
  }
  OptimizerSpec nesterov = Spec("sgd");
  nesterov.set_nesterov(true);
  add("nesterov without momentum", nesterov, "optimizer.nesterov");
  return cases;
}

TEST(OptimizerTest, RejectsInvalidSpecs) {
  for (const RejectCase& c : RejectCases()) {
    absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
        CreateOptimizer(c.spec, kSizes);
    ASSERT_FALSE(optimizer.ok()) << c.label;
    EXPECT_EQ(optimizer.status().code(), absl::StatusCode::kInvalidArgument)
        << c.label;
    EXPECT_NE(optimizer.status().message().find(c.field), std::string::npos)
        << c.label << ": " << optimizer.status();
  }
}

TEST(OptimizerTest, MessagesStateRangeAndValue) {
  OptimizerSpec spec = Spec("adam");
  spec.set_beta1(1.5);
  EXPECT_EQ(CreateOptimizer(spec, kSizes).status().message(),
            "optimizer.beta1 must be in [0, 1), got 1.5");
  const std::string message =
      std::string(CreateOptimizer(Spec("lamb"), kSizes).status().message());
  EXPECT_NE(message.find("\"adam\""), std::string::npos) << message;
  EXPECT_NE(message.find("\"sgd\""), std::string::npos) << message;
  EXPECT_NE(message.find("lamb"), std::string::npos) << message;
}

TEST(OptimizerTest, IgnoresFieldsTheOptimizerDoesNotUse) {
  OptimizerSpec sgd = Spec("sgd");
  sgd.set_beta1(7.0);
  EXPECT_TRUE(CreateOptimizer(sgd, kSizes).ok());
  OptimizerSpec adam = Spec("adam");
  adam.set_momentum(-1.0);
  EXPECT_TRUE(CreateOptimizer(adam, kSizes).ok());
}

TEST(OptimizerTest, AcceptsBoundaryValues) {
  OptimizerSpec adam = Spec("adam");
  adam.set_beta1(0.0);
  adam.set_beta2(0.0);
  adam.set_weight_decay(0.0);
  EXPECT_TRUE(CreateOptimizer(adam, kSizes).ok());
  OptimizerSpec sgd = Spec("sgd");
  sgd.set_momentum(0.0);
  EXPECT_TRUE(CreateOptimizer(sgd, {}).ok());
}

}  // namespace
}  // namespace mpilearn::server
