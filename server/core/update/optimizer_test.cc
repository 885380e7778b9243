// The CPU optimizers against the double-precision reference
// (optimizer_reference.h): every optimizer and option, threading, state
// save/restore. Long (over ~500 lines) because it is one table of cases per
// optimizer rule; each case is short and independent.
#include "server/core/update/optimizer.h"
#include "server/core/update/optimizer_reference.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/spec/job_spec.h"
#include "gtest/gtest.h"
#include "server/core/update/cuda/cuda_engine.h"
#include "proto/mpilearn.pb.h"
#include "server/core/update/optimizer_config.h"

namespace mpilearn::server {
namespace {

using ::mpilearn::v1::OptimizerSpec;

// Sizes that exercise empty tensors, scalar tails shorter than a vector, and a
// long main loop with a remainder.
const std::vector<size_t> kSmallSizes = {1, 7, 1000, 0, 33};
// Over the 64K elements from which the CPU optimizer uses its threads. With 3
// threads the slice boundaries fall inside tensors 5 and 7, and slice 1 spans
// the end of tensor 5, all of tensor 6 and the start of tensor 7.
const std::vector<size_t> kLargeSizes = {1, 7, 1000, 0, 33, 40000, 5, 30011, 0};
// Its gradients are scaled down by 1e-7, so that epsilon is comparable to the
// square-root terms there.
constexpr size_t kTinyTensor = 4;
constexpr int kSteps = 6;

using Tensors = std::vector<std::vector<double>>;


// ---------------------------------------------------------------------------
// Harness: random fp32 parameters and gradients, exactly representable in
// double, stepped through the optimizer and the reference side by side.

Tensors RandomTensors(std::mt19937& rng, const std::vector<size_t>& sizes,
                      double scale, bool tiny) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensors tensors;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const double tensor_scale = tiny && k == kTinyTensor ? scale * 1e-7 : scale;
    std::vector<double> t(sizes[k]);
    for (double& x : t) x = static_cast<float>(tensor_scale * normal(rng));
    tensors.push_back(std::move(t));
  }
  return tensors;
}

std::vector<std::vector<float>> ToFloat(const Tensors& tensors) {
  std::vector<std::vector<float>> out;
  for (const auto& t : tensors) out.emplace_back(t.begin(), t.end());
  return out;
}

void StepOnce(Optimizer& optimizer, std::vector<std::vector<float>>& params,
              const std::vector<std::vector<float>>& grads) {
  std::vector<absl::Span<float>> param_spans;
  std::vector<absl::Span<const float>> grad_spans;
  for (size_t k = 0; k < params.size(); ++k) {
    param_spans.emplace_back(params[k]);
    grad_spans.emplace_back(grads[k]);
  }
  ASSERT_TRUE(optimizer.Step(param_spans, grad_spans).ok());
}

// Relative tolerance 1e-5, plus an absolute floor of 1e-6 times the tensor's
// largest magnitude: an element that ends near zero by cancellation carries
// the fp32 rounding error (~6e-8 relative) of the larger terms it came from.
void ExpectTensorClose(absl::Span<const float> actual,
                       absl::Span<const double> expected,
                       const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double max_abs = 0;
  for (const double x : expected) max_abs = std::max(max_abs, std::abs(x));
  const double floor = 1e-6 * max_abs;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tolerance = 1e-5 * std::abs(expected[i]) + floor;
    // Written so that NaN fails.
    if (!(std::abs(actual[i] - expected[i]) <= tolerance)) {
      FAIL() << what << " element " << i << ": got " << actual[i]
             << ", expected " << expected[i] << " +- " << tolerance;
    }
  }
}

void ExpectClose(const std::vector<std::vector<float>>& actual,
                 const Tensors& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t k = 0; k < actual.size(); ++k) {
    ExpectTensorClose(actual[k], expected[k],
                      absl::StrCat(what, " tensor ", k));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Same bits, element for element (so NaN == NaN and 0 != -0).
bool BitwiseEqual(const std::vector<std::vector<float>>& a,
                  const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].size() != b[k].size()) return false;
    if (!a[k].empty() && std::memcmp(a[k].data(), b[k].data(),
                                     a[k].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

std::unique_ptr<Optimizer> MustCreate(const OptimizerSpec& spec,
                                      const std::vector<size_t>& sizes,
                                      int threads) {
  EngineOptions engine;
  engine.threads = threads;
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      CreateOptimizer(spec, sizes, engine);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return optimizer.ok() ? std::move(optimizer).value() : nullptr;
}

// The parameters after each of kSteps steps, and the final state.
struct RunResult {
  std::vector<std::vector<std::vector<float>>> params_per_step;
  OptimizerState state;
};

// Steps an optimizer built from `spec` and a reference built from `expected`
// on the same data, and checks the parameters after every step and the state
// buffers after the last against the reference.
RunResult RunAgainstReference(const OptimizerSpec& spec,
                              const OptimizerConfig& expected,
                              const std::vector<size_t>& sizes, int threads) {
  RunResult run;
  const std::string what = absl::StrCat(spec.ShortDebugString(), " threads ",
                                        threads, " tensors ", sizes.size());
  std::unique_ptr<Optimizer> optimizer = MustCreate(spec, sizes, threads);
  if (optimizer == nullptr) return run;
  EXPECT_EQ(optimizer->steps(), 0);
  ReferenceOptimizer reference(expected, sizes);
  std::mt19937 rng(20240611);
  Tensors expected_params = RandomTensors(rng, sizes, 0.1, /*tiny=*/false);
  std::vector<std::vector<float>> params = ToFloat(expected_params);
  for (int step = 1; step <= kSteps; ++step) {
    const Tensors grads = RandomTensors(rng, sizes, 1.0, /*tiny=*/true);
    StepOnce(*optimizer, params, ToFloat(grads));
    reference.Step(expected_params, grads);
    EXPECT_EQ(optimizer->steps(), step);
    ExpectClose(params, expected_params, absl::StrCat(what, " step ", step));
    if (::testing::Test::HasFatalFailure()) return run;
    run.params_per_step.push_back(params);
  }
  run.state = optimizer->SaveState().value();
  EXPECT_EQ(run.state.steps, kSteps);
  const std::vector<std::string> names = StateBufferNames(optimizer->config());
  EXPECT_EQ(run.state.buffers.size(), names.size()) << what;
  for (size_t b = 0; b < names.size() && b < run.state.buffers.size(); ++b) {
    ExpectClose(run.state.buffers[b], reference.buffer(names[b]),
                absl::StrCat(what, " state ", names[b]));
    if (::testing::Test::HasFatalFailure()) return run;
  }
  return run;
}

void ExpectConfigEq(const OptimizerConfig& actual,
                    const OptimizerConfig& expected, const std::string& what) {
  EXPECT_EQ(actual.kind, expected.kind) << what;
  EXPECT_EQ(actual.learning_rate, expected.learning_rate) << what;
  EXPECT_EQ(actual.weight_decay, expected.weight_decay) << what;
  EXPECT_EQ(actual.momentum, expected.momentum) << what;
  EXPECT_EQ(actual.nesterov, expected.nesterov) << what;
  EXPECT_EQ(actual.beta1, expected.beta1) << what;
  EXPECT_EQ(actual.beta2, expected.beta2) << what;
  EXPECT_EQ(actual.epsilon, expected.epsilon) << what;
  EXPECT_EQ(actual.alpha, expected.alpha) << what;
  EXPECT_EQ(actual.centered, expected.centered) << what;
  EXPECT_EQ(actual.rho, expected.rho) << what;
  EXPECT_EQ(actual.lr_decay, expected.lr_decay) << what;
  EXPECT_EQ(actual.initial_accumulator_value,
            expected.initial_accumulator_value)
      << what;
}

// ---------------------------------------------------------------------------
// One case per optimizer configuration: the spec, and the resolved values
// written out by hand (PyTorch's defaults where the spec is silent).

struct Case {
  std::string label;
  OptimizerSpec spec;
  OptimizerConfig expected;
};

OptimizerSpec Spec(const std::string& name) {
  OptimizerSpec spec;
  spec.set_name(name);
  return spec;
}

OptimizerConfig Config(OptimizerKind kind, double lr) {
  OptimizerConfig c;
  c.kind = kind;
  c.learning_rate = lr;
  return c;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  {
    cases.push_back(
        {"SgdDefaults", Spec("sgd"), Config(OptimizerKind::kSgd, 0.01)});
  }
  {
    OptimizerSpec s = Spec("sgd");
    s.set_learning_rate(0.05);
    s.set_momentum(0.9);
    OptimizerConfig c = Config(OptimizerKind::kSgd, 0.05);
    c.momentum = 0.9;
    cases.push_back({"SgdMomentum", s, c});
  }
  {
    OptimizerSpec s = Spec("sgd");
    s.set_learning_rate(0.05);
    s.set_momentum(0.9);
    s.set_nesterov(true);
    s.set_weight_decay(0.01);
    OptimizerConfig c = Config(OptimizerKind::kSgd, 0.05);
    c.momentum = 0.9;
    c.nesterov = true;
    c.weight_decay = 0.01;
    cases.push_back({"SgdNesterovWeightDecay", s, c});
  }
  {
    OptimizerSpec s = Spec("sgd");
    s.set_weight_decay(0.5);
    OptimizerConfig c = Config(OptimizerKind::kSgd, 0.01);
    c.weight_decay = 0.5;
    cases.push_back({"SgdWeightDecayNoMomentum", s, c});
  }
  {
    cases.push_back(
        {"AdamDefaults", Spec("adam"), Config(OptimizerKind::kAdam, 1e-3)});
  }
  {
    OptimizerSpec s = Spec("adam");
    s.set_learning_rate(0.01);
    s.set_beta1(0.8);
    s.set_beta2(0.99);
    s.set_epsilon(1e-6);
    s.set_weight_decay(0.1);
    OptimizerConfig c = Config(OptimizerKind::kAdam, 0.01);
    c.beta1 = 0.8;
    c.beta2 = 0.99;
    c.epsilon = 1e-6;
    c.weight_decay = 0.1;
    cases.push_back({"AdamAllFields", s, c});
  }
  {
    OptimizerConfig c = Config(OptimizerKind::kAdamW, 1e-3);
    c.weight_decay = 0.01;
    cases.push_back({"AdamWDefaults", Spec("adamw"), c});
  }
  {
    OptimizerSpec s = Spec("adamw");
    s.set_learning_rate(0.01);
    s.set_beta1(0.85);
    s.set_weight_decay(0.5);
    OptimizerConfig c = Config(OptimizerKind::kAdamW, 0.01);
    c.beta1 = 0.85;
    c.weight_decay = 0.5;
    cases.push_back({"AdamWStrongDecay", s, c});
  }
  {
    OptimizerSpec s = Spec("adamw");
    s.set_weight_decay(0);
    cases.push_back({"AdamWNoDecay", s, Config(OptimizerKind::kAdamW, 1e-3)});
  }
  {
    cases.push_back({"RmspropDefaults", Spec("rmsprop"),
                     Config(OptimizerKind::kRmsprop, 0.01)});
  }
  {
    OptimizerSpec s = Spec("rmsprop");
    s.set_learning_rate(0.001);
    s.set_alpha(0.9);
    s.set_centered(true);
    s.set_momentum(0.9);
    s.set_weight_decay(0.01);
    OptimizerConfig c = Config(OptimizerKind::kRmsprop, 0.001);
    c.alpha = 0.9;
    c.centered = true;
    c.momentum = 0.9;
    c.weight_decay = 0.01;
    cases.push_back({"RmspropCenteredMomentumWeightDecay", s, c});
  }
  {
    OptimizerSpec s = Spec("rmsprop");
    s.set_centered(true);
    s.set_epsilon(1e-6);
    OptimizerConfig c = Config(OptimizerKind::kRmsprop, 0.01);
    c.centered = true;
    c.epsilon = 1e-6;
    cases.push_back({"RmspropCentered", s, c});
  }
  {
    OptimizerSpec s = Spec("rmsprop");
    s.set_momentum(0.5);
    OptimizerConfig c = Config(OptimizerKind::kRmsprop, 0.01);
    c.momentum = 0.5;
    cases.push_back({"RmspropMomentum", s, c});
  }
  {
    OptimizerConfig c = Config(OptimizerKind::kAdadelta, 1.0);
    c.epsilon = 1e-6;
    cases.push_back({"AdadeltaDefaults", Spec("adadelta"), c});
  }
  {
    OptimizerSpec s = Spec("adadelta");
    s.set_learning_rate(0.5);
    s.set_rho(0.95);
    s.set_epsilon(1e-5);
    s.set_weight_decay(0.01);
    OptimizerConfig c = Config(OptimizerKind::kAdadelta, 0.5);
    c.rho = 0.95;
    c.epsilon = 1e-5;
    c.weight_decay = 0.01;
    cases.push_back({"AdadeltaAllFields", s, c});
  }
  {
    OptimizerConfig c = Config(OptimizerKind::kAdagrad, 0.01);
    c.epsilon = 1e-10;
    cases.push_back({"AdagradDefaults", Spec("adagrad"), c});
  }
  {
    OptimizerSpec s = Spec("adagrad");
    s.set_learning_rate(0.1);
    s.set_lr_decay(0.1);
    s.set_initial_accumulator_value(0.1);
    s.set_epsilon(1e-8);
    s.set_weight_decay(0.01);
    OptimizerConfig c = Config(OptimizerKind::kAdagrad, 0.1);
    c.lr_decay = 0.1;
    c.initial_accumulator_value = 0.1;
    c.epsilon = 1e-8;
    c.weight_decay = 0.01;
    cases.push_back({"AdagradAllFields", s, c});
  }
  return cases;
}

class OptimizerCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerCaseTest, ResolvesToTheExpectedConfig) {
  const Case& c = GetParam();
  absl::StatusOr<OptimizerConfig> config = ResolveOptimizerConfig(c.spec);
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectConfigEq(*config, c.expected, c.label);
  std::unique_ptr<Optimizer> optimizer = MustCreate(c.spec, kSmallSizes, 1);
  ASSERT_NE(optimizer, nullptr);
  EXPECT_EQ(optimizer->name(), c.spec.name());
  ExpectConfigEq(optimizer->config(), c.expected, c.label);
}

TEST_P(OptimizerCaseTest, SmallModelMatchesReference) {
  const Case& c = GetParam();
  for (const int threads : {1, 3}) {
    RunAgainstReference(c.spec, c.expected, kSmallSizes, threads);
    if (HasFatalFailure()) return;
  }
}

TEST_P(OptimizerCaseTest, ThreadedLargeModelMatchesReferenceBitForBit) {
  const Case& c = GetParam();
  const RunResult single =
      RunAgainstReference(c.spec, c.expected, kLargeSizes, 1);
  if (HasFatalFailure()) return;
  const RunResult threaded =
      RunAgainstReference(c.spec, c.expected, kLargeSizes, 3);
  if (HasFatalFailure()) return;
  ASSERT_EQ(single.params_per_step.size(), threaded.params_per_step.size());
  for (size_t step = 0; step < single.params_per_step.size(); ++step) {
    EXPECT_TRUE(BitwiseEqual(single.params_per_step[step],
                             threaded.params_per_step[step]))
        << "step " << step + 1;
  }
  ASSERT_EQ(single.state.buffers.size(), threaded.state.buffers.size());
  for (size_t b = 0; b < single.state.buffers.size(); ++b) {
    EXPECT_TRUE(
        BitwiseEqual(single.state.buffers[b], threaded.state.buffers[b]))
        << "buffer " << b;
  }
}

// 3 steps, save, restore into a fresh optimizer (with a different thread
// count: the state does not depend on it), 1 more step: the same bits as 4
// steps without interruption.
TEST_P(OptimizerCaseTest, SaveAndRestoreContinueExactly) {
  const Case& c = GetParam();
  std::mt19937 rng(7);
  const std::vector<std::vector<float>> initial =
      ToFloat(RandomTensors(rng, kLargeSizes, 0.1, false));
  std::vector<std::vector<std::vector<float>>> grads;
  for (int step = 0; step < 4; ++step) {
    grads.push_back(ToFloat(RandomTensors(rng, kLargeSizes, 1.0, true)));
  }

  std::unique_ptr<Optimizer> uninterrupted = MustCreate(c.spec, kLargeSizes, 1);
  ASSERT_NE(uninterrupted, nullptr);
  std::vector<std::vector<float>> expected = initial;
  for (int step = 0; step < 4; ++step) {
    StepOnce(*uninterrupted, expected, grads[step]);
  }

  std::unique_ptr<Optimizer> first = MustCreate(c.spec, kLargeSizes, 1);
  ASSERT_NE(first, nullptr);
  std::vector<std::vector<float>> params = initial;
  for (int step = 0; step < 3; ++step) StepOnce(*first, params, grads[step]);
  const OptimizerState saved = first->SaveState().value();
  EXPECT_EQ(saved.steps, 3);
  EXPECT_EQ(saved.buffers.size(), StateBufferNames(c.expected).size());

  std::unique_ptr<Optimizer> resumed = MustCreate(c.spec, kLargeSizes, 3);
  ASSERT_NE(resumed, nullptr);
  ASSERT_TRUE(resumed->RestoreState(saved).ok());
  EXPECT_EQ(resumed->steps(), 3);
  std::vector<std::vector<float>> resumed_params = params;
  StepOnce(*resumed, resumed_params, grads[3]);
  StepOnce(*first, params, grads[3]);
  EXPECT_EQ(resumed->steps(), 4);
  EXPECT_TRUE(BitwiseEqual(resumed_params, expected));
  EXPECT_TRUE(BitwiseEqual(params, expected));
  const OptimizerState after = resumed->SaveState().value();
  const OptimizerState after_uninterrupted = uninterrupted->SaveState().value();
  ASSERT_EQ(after.buffers.size(), after_uninterrupted.buffers.size());
  for (size_t b = 0; b < after.buffers.size(); ++b) {
    EXPECT_TRUE(BitwiseEqual(after.buffers[b], after_uninterrupted.buffers[b]))
        << "buffer " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, OptimizerCaseTest,
                         ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.label;
                         });

// ---------------------------------------------------------------------------
// State.

TEST(OptimizerStateTest, BufferNamesFollowTheConfig) {
  using Names = std::vector<std::string>;
  OptimizerConfig c = Config(OptimizerKind::kSgd, 0.01);
  EXPECT_EQ(StateBufferNames(c), Names{});
  c.momentum = 0.9;
  EXPECT_EQ(StateBufferNames(c), Names{"momentum_buffer"});
  c.kind = OptimizerKind::kAdam;
  EXPECT_EQ(StateBufferNames(c), (Names{"exp_avg", "exp_avg_sq"}));
  c.kind = OptimizerKind::kAdamW;
  EXPECT_EQ(StateBufferNames(c), (Names{"exp_avg", "exp_avg_sq"}));
  c.kind = OptimizerKind::kRmsprop;
  c.momentum = 0;
  EXPECT_EQ(StateBufferNames(c), Names{"square_avg"});
  c.centered = true;
  EXPECT_EQ(StateBufferNames(c), (Names{"square_avg", "grad_avg"}));
  c.momentum = 0.5;
  EXPECT_EQ(StateBufferNames(c),
            (Names{"square_avg", "grad_avg", "momentum_buffer"}));
  c.centered = false;
  EXPECT_EQ(StateBufferNames(c), (Names{"square_avg", "momentum_buffer"}));
  c.kind = OptimizerKind::kAdadelta;
  EXPECT_EQ(StateBufferNames(c), (Names{"square_avg", "acc_delta"}));
  c.kind = OptimizerKind::kAdagrad;
  EXPECT_EQ(StateBufferNames(c), Names{"sum"});
}

TEST(OptimizerStateTest, KindNames) {
  EXPECT_EQ(OptimizerKindName(OptimizerKind::kSgd), "sgd");
  EXPECT_EQ(OptimizerKindName(OptimizerKind::kAdam), "adam");
  EXPECT_EQ(OptimizerKindName(OptimizerKind::kAdamW), "adamw");
  EXPECT_EQ(OptimizerKindName(OptimizerKind::kRmsprop), "rmsprop");
  EXPECT_EQ(OptimizerKindName(OptimizerKind::kAdadelta), "adadelta");
  EXPECT_EQ(OptimizerKindName(OptimizerKind::kAdagrad), "adagrad");
}

TEST(OptimizerStateTest, FreshStateIsZeroedOrInitialAccumulator) {
  OptimizerSpec spec = Spec("adagrad");
  spec.set_initial_accumulator_value(0.25);
  std::unique_ptr<Optimizer> optimizer = MustCreate(spec, kSmallSizes, 1);
  ASSERT_NE(optimizer, nullptr);
  const OptimizerState state = optimizer->SaveState().value();
  EXPECT_EQ(state.steps, 0);
  ASSERT_EQ(state.buffers.size(), 1u);
  ASSERT_EQ(state.buffers[0].size(), kSmallSizes.size());
  for (size_t k = 0; k < kSmallSizes.size(); ++k) {
    EXPECT_EQ(state.buffers[0][k], std::vector<float>(kSmallSizes[k], 0.25f));
  }
  std::unique_ptr<Optimizer> sgd = MustCreate(Spec("sgd"), kSmallSizes, 1);
  ASSERT_NE(sgd, nullptr);
  EXPECT_TRUE(sgd->SaveState()->buffers.empty());
}

TEST(OptimizerStateTest, RestoreRejectsMismatchedStateAndKeepsItsOwn) {
  std::unique_ptr<Optimizer> optimizer =
      MustCreate(Spec("adam"), kSmallSizes, 1);
  ASSERT_NE(optimizer, nullptr);
  std::vector<std::vector<float>> params(kSmallSizes.size());
  std::vector<std::vector<float>> grads(kSmallSizes.size());
  for (size_t k = 0; k < kSmallSizes.size(); ++k) {
    params[k].assign(kSmallSizes[k], 1.0f);
    grads[k].assign(kSmallSizes[k], 0.5f);
  }
  StepOnce(*optimizer, params, grads);
  const OptimizerState good = optimizer->SaveState().value();

  std::vector<std::pair<std::string, OptimizerState>> bad;
  {
    OptimizerState s = good;
    s.buffers.pop_back();
    bad.emplace_back("one buffer too few", s);
  }
  {
    OptimizerState s = good;
    s.buffers.push_back(s.buffers[0]);
    bad.emplace_back("one buffer too many", s);
  }
  {
    OptimizerState s = good;
    s.buffers[1].pop_back();
    bad.emplace_back("one tensor too few", s);
  }
  {
    OptimizerState s = good;
    s.buffers[0][2].push_back(0.0f);
    bad.emplace_back("tensor too long", s);
  }
  {
    OptimizerState s = good;
    s.buffers[1][3].push_back(0.0f);  // tensor 3 is empty
    bad.emplace_back("empty tensor not empty", s);
  }
  {
    OptimizerState s = good;
    s.steps = -1;
    bad.emplace_back("negative steps", s);
  }
  { bad.emplace_back("empty state", OptimizerState{}); }
  for (const auto& [label, state] : bad) {
    const absl::Status status = optimizer->RestoreState(state);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << label << ": " << status;
  }
  const OptimizerState after = optimizer->SaveState().value();
  EXPECT_EQ(after.steps, 1);
  ASSERT_EQ(after.buffers.size(), good.buffers.size());
  for (size_t b = 0; b < good.buffers.size(); ++b) {
    EXPECT_TRUE(BitwiseEqual(after.buffers[b], good.buffers[b]));
  }
  EXPECT_TRUE(optimizer->RestoreState(good).ok());
}

// ---------------------------------------------------------------------------
// Engine options.

TEST(OptimizerEngineTest, DeviceNamesAreCheckedAndResolved) {
  EngineOptions engine;
  engine.device = "cuda";  // must be resolved to cuda:N first
  EXPECT_EQ(CreateOptimizer(Spec("adam"), kSmallSizes, engine).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveOptimizerDevice("cpu").value(), "cpu");
  EXPECT_EQ(ResolveOptimizerDevice("gpu").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveOptimizerDevice("cuda:x").status().code(),
            absl::StatusCode::kInvalidArgument);
  if (CudaEngine::DeviceCount() == 0) {
    // No GPU: auto falls back to the CPU; asking for a GPU is an error that
    // says what to do, and so is building an optimizer on one.
    EXPECT_EQ(ResolveOptimizerDevice("auto").value(), "cpu");
    absl::StatusOr<std::string> cuda = ResolveOptimizerDevice("cuda");
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(cuda.status().message().find("--device=auto"), std::string::npos);
    engine.device = "cuda:0";
    EXPECT_FALSE(CreateOptimizer(Spec("adam"), kSmallSizes, engine).ok());
  } else {
    EXPECT_EQ(ResolveOptimizerDevice("auto").value(), "cuda:0");
    EXPECT_EQ(ResolveOptimizerDevice("cuda").value(), "cuda:0");
  }
}

TEST(OptimizerEngineTest, RejectsThreadCountOutOfRange) {
  for (const int threads : {0, -1, 100000}) {
    EngineOptions engine;
    engine.threads = threads;
    EXPECT_EQ(
        CreateOptimizer(Spec("adam"), kSmallSizes, engine).status().code(),
        absl::StatusCode::kInvalidArgument)
        << threads;
  }
}

TEST(OptimizerEngineTest, ConfigIsValidatedLikeASpec) {
  OptimizerConfig config;
  config.beta1 = 1.0;
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      CreateOptimizer(config, kSmallSizes);
  EXPECT_EQ(optimizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(optimizer.status().message().find("optimizer.beta1"),
            std::string::npos);
  config.beta1 = 0.5;
  EXPECT_TRUE(CreateOptimizer(config, kSmallSizes).ok());
}

// Thread slices cut the concatenated elements at multiples of 16 within a
// tensor; with many threads and many small tensors, boundaries fall at tensor
// starts, inside tensors shorter than 16 and next to each other. Whatever the
// split, every element must be updated exactly once.
TEST(OptimizerEngineTest, AnySplitUpdatesEveryElementOnce) {
  const std::vector<std::vector<size_t>> layouts = {
      {65536 + 3, 1, 17},
      {65536, 0, 16, 15, 5, 100, 31, 2000, 16, 3072, 0},
      std::vector<size_t>(4000, 17),
  };
  OptimizerSpec spec = Spec("sgd");
  spec.set_momentum(0.9);
  for (const std::vector<size_t>& sizes : layouts) {
    std::vector<std::vector<float>> expected;
    for (const int threads : {1, 2, 3, 7, 64, 256}) {
      std::unique_ptr<Optimizer> optimizer = MustCreate(spec, sizes, threads);
      ASSERT_NE(optimizer, nullptr);
      std::mt19937 rng(3);
      std::vector<std::vector<float>> params =
          ToFloat(RandomTensors(rng, sizes, 0.1, false));
      for (int step = 0; step < 3; ++step) {
        StepOnce(*optimizer, params,
                 ToFloat(RandomTensors(rng, sizes, 1.0, false)));
      }
      if (threads == 1) {
        expected = params;
      } else {
        EXPECT_TRUE(BitwiseEqual(params, expected))
            << threads << " threads, " << sizes.size() << " tensors";
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Validation.

struct RejectCase {
  std::string label;
  OptimizerSpec spec;
  std::string field;  // must appear in the message
};

std::vector<RejectCase> RejectCases() {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<RejectCase> cases;
  auto add = [&cases](std::string label, OptimizerSpec spec,
                      std::string field) {
    cases.push_back({std::move(label), std::move(spec), std::move(field)});
  };
  add("unknown name", Spec("lamb"), "optimizer.name");
  add("wrong case", Spec("Adam"), "optimizer.name");
  add("trailing space", Spec("sgd "), "optimizer.name");
  for (const char* optimizer_name :
       {"sgd", "adam", "adamw", "rmsprop", "adadelta", "adagrad"}) {
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
  for (const char* optimizer_name :
       {"adam", "adamw", "rmsprop", "adadelta", "adagrad"}) {
    const std::string name = optimizer_name;
    for (double eps : {0.0, -1e-8, inf, nan}) {
      OptimizerSpec spec = Spec(name);
      spec.set_epsilon(eps);
      add(name + " epsilon " + std::to_string(eps), spec, "optimizer.epsilon");
    }
  }
  for (const double value : {-0.1, 1.0, 1.5, nan, inf}) {
    const std::string v = std::to_string(value);
    for (const char* name : {"adam", "adamw"}) {
      OptimizerSpec spec1 = Spec(name);
      spec1.set_beta1(value);
      add(absl::StrCat(name, " beta1 ", v), spec1, "optimizer.beta1");
      OptimizerSpec spec2 = Spec(name);
      spec2.set_beta2(value);
      add(absl::StrCat(name, " beta2 ", v), spec2, "optimizer.beta2");
    }
    for (const char* name : {"sgd", "rmsprop"}) {
      OptimizerSpec spec = Spec(name);
      spec.set_momentum(value);
      add(absl::StrCat(name, " momentum ", v), spec, "optimizer.momentum");
    }
    OptimizerSpec alpha = Spec("rmsprop");
    alpha.set_alpha(value);
    add("alpha " + v, alpha, "optimizer.alpha");
    OptimizerSpec rho = Spec("adadelta");
    rho.set_rho(value);
    add("rho " + v, rho, "optimizer.rho");
  }
  for (const double value : {-1e-3, inf, nan}) {
    const std::string v = std::to_string(value);
    OptimizerSpec lr_decay = Spec("adagrad");
    lr_decay.set_lr_decay(value);
    add("lr_decay " + v, lr_decay, "optimizer.lr_decay");
    OptimizerSpec initial = Spec("adagrad");
    initial.set_initial_accumulator_value(value);
    add("initial_accumulator_value " + v, initial,
        "optimizer.initial_accumulator_value");
  }
  OptimizerSpec nesterov = Spec("sgd");
  nesterov.set_nesterov(true);
  add("nesterov without momentum", nesterov, "optimizer.nesterov");
  return cases;
}

TEST(OptimizerValidationTest, RejectsInvalidSpecs) {
  for (const RejectCase& c : RejectCases()) {
    absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
        CreateOptimizer(c.spec, kSmallSizes);
    ASSERT_FALSE(optimizer.ok()) << c.label;
    EXPECT_EQ(optimizer.status().code(), absl::StatusCode::kInvalidArgument)
        << c.label;
    EXPECT_NE(optimizer.status().message().find(c.field), std::string::npos)
        << c.label << ": " << optimizer.status();
  }
}

TEST(OptimizerValidationTest, MessagesStateRangeAndValue) {
  OptimizerSpec spec = Spec("adam");
  spec.set_beta1(1.5);
  EXPECT_EQ(ResolveOptimizerConfig(spec).status().message(),
            "optimizer.beta1 must be in [0, 1), got 1.5");
  OptimizerSpec rmsprop = Spec("rmsprop");
  rmsprop.set_alpha(2);
  EXPECT_EQ(ResolveOptimizerConfig(rmsprop).status().message(),
            "optimizer.alpha must be in [0, 1), got 2");
  OptimizerSpec adagrad = Spec("adagrad");
  adagrad.set_lr_decay(-1);
  EXPECT_EQ(ResolveOptimizerConfig(adagrad).status().message(),
            "optimizer.lr_decay must be a finite number >= 0, got -1");
  EXPECT_EQ(ResolveOptimizerConfig(Spec("x")).status().message(),
            "optimizer.name: unknown optimizer 'x'; available: 'sgd', 'adam', "
            "'adamw', 'rmsprop', 'adadelta', 'adagrad'");
}

TEST(OptimizerValidationTest, EmptyNameIsAdam) {
  absl::StatusOr<OptimizerConfig> config = ResolveOptimizerConfig(Spec(""));
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectConfigEq(*config, Config(OptimizerKind::kAdam, 1e-3), "empty name");
}

TEST(OptimizerValidationTest, IgnoresFieldsTheOptimizerDoesNotUse) {
  OptimizerSpec sgd = Spec("sgd");
  sgd.set_beta1(7.0);
  sgd.set_alpha(-1);
  sgd.set_epsilon(0);
  absl::StatusOr<OptimizerConfig> config = ResolveOptimizerConfig(sgd);
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectConfigEq(*config, Config(OptimizerKind::kSgd, 0.01), "sgd");
  OptimizerSpec adam = Spec("adam");
  adam.set_momentum(-1.0);
  adam.set_nesterov(true);
  adam.set_centered(true);
  adam.set_rho(3);
  adam.set_lr_decay(-1);
  config = ResolveOptimizerConfig(adam);
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectConfigEq(*config, Config(OptimizerKind::kAdam, 1e-3), "adam");
  // Momentum given to adam must not give it a momentum buffer.
  EXPECT_EQ(StateBufferNames(*config).size(), 2u);
}

TEST(OptimizerValidationTest, AcceptsBoundaryValues) {
  OptimizerSpec adam = Spec("adam");
  adam.set_beta1(0.0);
  adam.set_beta2(0.0);
  adam.set_weight_decay(0.0);
  EXPECT_TRUE(CreateOptimizer(adam, kSmallSizes).ok());
  OptimizerSpec sgd = Spec("sgd");
  sgd.set_momentum(0.0);
  EXPECT_TRUE(CreateOptimizer(sgd, {}).ok());
  OptimizerSpec rmsprop = Spec("rmsprop");
  rmsprop.set_alpha(0.0);
  EXPECT_TRUE(CreateOptimizer(rmsprop, kSmallSizes).ok());
  OptimizerSpec adadelta = Spec("adadelta");
  adadelta.set_rho(0.0);
  EXPECT_TRUE(CreateOptimizer(adadelta, kSmallSizes).ok());
  OptimizerSpec adagrad = Spec("adagrad");
  adagrad.set_lr_decay(0.0);
  adagrad.set_initial_accumulator_value(0.0);
  EXPECT_TRUE(CreateOptimizer(adagrad, kSmallSizes).ok());
}

// common/spec/job_spec.cc normalizes a submitted spec with its own copy of the
// defaults and ranges; the master then resolves the normalized spec. Both
// must accept and reject the same specs, with the same messages, and
// normalizing must not change what a spec resolves to.
TEST(OptimizerValidationTest, AgreesWithJobSpecNormalization) {
  std::vector<OptimizerSpec> specs;
  for (const Case& c : Cases()) specs.push_back(c.spec);
  for (const RejectCase& c : RejectCases()) specs.push_back(c.spec);
  specs.push_back(Spec(""));
  for (const OptimizerSpec& spec : specs) {
    const std::string what = spec.ShortDebugString();
    v1::JobSpec job;
    job.mutable_data()->set_train_images("a");
    job.mutable_data()->set_train_labels("b");
    *job.mutable_optimizer() = spec;
    const absl::Status normalized = NormalizeJobSpec(&job);
    const absl::StatusOr<OptimizerConfig> resolved =
        ResolveOptimizerConfig(spec);
    ASSERT_EQ(normalized.ok(), resolved.ok())
        << what << ": " << normalized << " vs " << resolved.status();
    if (!normalized.ok()) {
      EXPECT_EQ(normalized.message(), resolved.status().message()) << what;
      continue;
    }
    const absl::StatusOr<OptimizerConfig> again =
        ResolveOptimizerConfig(job.optimizer());
    ASSERT_TRUE(again.ok()) << what << ": " << again.status();
    ExpectConfigEq(*again, *resolved, what);
    // Every default the optimizer uses is written into the stored spec.
    const OptimizerSpec& stored = job.optimizer();
    EXPECT_EQ(stored.name(), OptimizerKindName(resolved->kind)) << what;
    EXPECT_EQ(stored.learning_rate(), resolved->learning_rate) << what;
    EXPECT_EQ(stored.weight_decay(), resolved->weight_decay) << what;
    switch (resolved->kind) {
      case OptimizerKind::kSgd:
        EXPECT_TRUE(stored.has_momentum() && stored.has_nesterov()) << what;
        break;
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW:
        EXPECT_TRUE(stored.has_beta1() && stored.has_beta2() &&
                    stored.has_epsilon())
            << what;
        break;
      case OptimizerKind::kRmsprop:
        EXPECT_TRUE(stored.has_alpha() && stored.has_epsilon() &&
                    stored.has_momentum() && stored.has_centered())
            << what;
        break;
      case OptimizerKind::kAdadelta:
        EXPECT_TRUE(stored.has_rho() && stored.has_epsilon()) << what;
        break;
      case OptimizerKind::kAdagrad:
        EXPECT_TRUE(stored.has_lr_decay() &&
                    stored.has_initial_accumulator_value() &&
                    stored.has_epsilon())
            << what;
        break;
    }
  }
}

// Guarded updates: LastStepFinite reports what the step wrote (checked
// against a scan of the parameters and every state buffer), and whenever
// PrepareStep vouches for a step, the step is finite; UndoStep puts back
// the state of a step it did not vouch for. Magnitudes
// sweep from normal training to the edge of fp32; a normal step must be
// vouched for (else every update would pay for the undoable path).
TEST(OptimizerGuardTest, CertainStepsStayFiniteAndTrackingIsExact) {
  std::vector<v1::OptimizerSpec> specs;
  const auto add = [&](const std::string& name, auto&& set) {
    v1::OptimizerSpec spec;
    spec.set_name(name);
    set(spec);
    specs.push_back(spec);
  };
  add("sgd", [](v1::OptimizerSpec&) {});
  add("sgd", [](v1::OptimizerSpec& s) {
    s.set_momentum(0.9);
    s.set_nesterov(true);
    s.set_weight_decay(0.1);
  });
  add("adam", [](v1::OptimizerSpec& s) { s.set_weight_decay(0.01); });
  add("adamw", [](v1::OptimizerSpec&) {});
  add("rmsprop", [](v1::OptimizerSpec& s) { s.set_momentum(0.5); });
  add("rmsprop", [](v1::OptimizerSpec& s) { s.set_centered(true); });
  add("adadelta", [](v1::OptimizerSpec&) {});
  add("adagrad", [](v1::OptimizerSpec& s) { s.set_lr_decay(0.1); });
  const std::vector<size_t> sizes = {67, 5};
  const auto finite_everywhere = [&](const Optimizer& optimizer,
                                     const std::vector<std::vector<float>>& p) {
    for (const auto& t : p) {
      for (float v : t) {
        if (!std::isfinite(v)) return false;
      }
    }
    const OptimizerState state = optimizer.SaveState().value();
    for (const auto& buffer : state.buffers) {
      for (const auto& t : buffer) {
        for (float v : t) {
          if (!std::isfinite(v)) return false;
        }
      }
    }
    return true;
  };
  int vouched = 0;
  for (const v1::OptimizerSpec& spec : specs) {
    for (const double param_scale : {1.0, 1e10, 1e30, 1e37}) {
      for (const double grad_scale : {1e-3, 1.0, 1e15, 1e20, 1e30, 3e38}) {
        SCOPED_TRACE(absl::StrCat(spec.ShortDebugString(), " params ",
                                  param_scale, " grads ", grad_scale));
        auto optimizer = CreateOptimizer(spec, sizes).value();
        // Nothing known yet: the first step is tracked.
        EXPECT_FALSE(optimizer->PrepareStep(1.0));
        std::mt19937 rng(7);
        std::uniform_real_distribution<double> unit(-1.0, 1.0);
        std::vector<std::vector<float>> params, small, grads;
        for (size_t size : sizes) {
          params.emplace_back(size);
          small.emplace_back(size);
          grads.emplace_back(size);
          for (size_t i = 0; i < size; ++i) {
            params.back()[i] = static_cast<float>(param_scale * unit(rng));
            small.back()[i] = static_cast<float>(unit(rng));
            grads.back()[i] = static_cast<float>(grad_scale * unit(rng));
          }
        }
        std::vector<absl::Span<float>> p(params.begin(), params.end());
        std::vector<absl::Span<const float>> g1(small.begin(), small.end());
        std::vector<absl::Span<const float>> g2(grads.begin(), grads.end());
        ASSERT_TRUE(optimizer->Step(p, g1).ok());
        EXPECT_EQ(optimizer->LastStepFinite(p),
                  finite_everywhere(*optimizer, params));
        if (!optimizer->LastStepFinite(p)) continue;
        double max_grad = 0.0;
        for (const auto& t : grads) {
          for (float v : t) max_grad = std::max(max_grad, std::fabs(double{v}));
        }
        const OptimizerState before = optimizer->SaveState().value();
        const bool certain = optimizer->PrepareStep(max_grad);
        ASSERT_TRUE(optimizer->Step(p, g2).ok());
        const bool finite = finite_everywhere(*optimizer, params);
        EXPECT_EQ(optimizer->LastStepFinite(p), finite);
        if (certain) {
          EXPECT_TRUE(finite);
          ++vouched;
        } else if (!finite) {
          // An uncertain step is undoable: UndoStep puts the state back.
          ASSERT_TRUE(optimizer->UndoStep().ok());
          const OptimizerState undone = optimizer->SaveState().value();
          EXPECT_EQ(undone.steps, before.steps);
          EXPECT_EQ(undone.buffers.size(), before.buffers.size());
          for (size_t b = 0; b < before.buffers.size(); ++b) {
            for (size_t t = 0; t < before.buffers[b].size(); ++t) {
              EXPECT_EQ(std::memcmp(undone.buffers[b][t].data(),
                                    before.buffers[b][t].data(),
                                    before.buffers[b][t].size() * sizeof(float)),
                        0);
            }
          }
        }
        if (param_scale == 1.0 && grad_scale <= 1.0 && !spec.centered()) {
          EXPECT_TRUE(certain) << "a normal step must take the fast path";
        }
      }
    }
  }
  EXPECT_GT(vouched, 0);
}

}  // namespace
}  // namespace mpilearn::server
