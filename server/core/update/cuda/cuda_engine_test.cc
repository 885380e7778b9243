#include "server/core/update/cuda/cuda_engine.h"
#include "server/core/update/optimizer_reference.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "server/core/update/optimizer_config.h"

namespace mpilearn::server {
namespace {

// Empty tensors, scalar-only tensors, and tails of every length mod 4.
const std::vector<size_t> kSizes = {1, 7, 1000, 4099, 0};
constexpr int kSteps = 6;
constexpr double kTolerance = 1e-5;

// Skips the calling test where no GPU is found (CI, the build machines).
#define SKIP_WITHOUT_GPU()                                                \
  do {                                                                    \
    if (CudaEngine::DeviceCount() == 0) {                                 \
      GTEST_SKIP() << "no CUDA device: this test needs a GPU (the build " \
                      "has no GPU or no driver, or was built without "    \
                      "CUDA)";                                            \
    }                                                                     \
  } while (false)

using Tensors = std::vector<std::vector<float>>;
using DoubleTensors = std::vector<std::vector<double>>;

Tensors RandomTensors(const std::vector<size_t>& sizes, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensors tensors;
  for (size_t size : sizes) {
    tensors.emplace_back(size);
    for (float& x : tensors.back()) x = normal(rng);
  }
  return tensors;
}

std::vector<absl::Span<float>> Spans(Tensors& tensors) {
  return {tensors.begin(), tensors.end()};
}

std::vector<absl::Span<const float>> ConstSpans(const Tensors& tensors) {
  return {tensors.begin(), tensors.end()};
}

DoubleTensors ToDouble(const Tensors& tensors) {
  DoubleTensors out;
  for (const auto& t : tensors) out.emplace_back(t.begin(), t.end());
  return out;
}


// Expects every element within kTolerance relative to the larger of its own
// magnitude and the RMS of all of `want`, so that elements that a sum of
// signed terms brought near zero are held to the accuracy of the terms, not
// of their rounding residue.
void ExpectClose(const Tensors& got, const DoubleTensors& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double sum_sq = 0;
  size_t count = 0;
  for (const auto& tensor : want) {
    for (double x : tensor) sum_sq += x * x;
    count += tensor.size();
  }
  const double rms = count == 0 ? 0 : std::sqrt(sum_sq / count);
  int failures = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size()) << what << " tensor " << k;
    for (size_t i = 0; i < want[k].size() && failures < 5; ++i) {
      const double scale = std::max({std::abs(want[k][i]), rms, 1e-30});
      if (!(std::abs(got[k][i] - want[k][i]) <= kTolerance * scale)) {
        ADD_FAILURE() << what << " tensor " << k << " element " << i << ": got "
                      << got[k][i] << ", want " << want[k][i];
        ++failures;
      }
    }
  }
}

struct Case {
  std::string name;
  OptimizerConfig config;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const auto add = [&](const std::string& name, OptimizerKind kind,
                       double learning_rate, auto customise) {
    OptimizerConfig config;
    config.kind = kind;
    config.learning_rate = learning_rate;
    customise(config);
    cases.push_back({name, config});
  };
  const auto none = [](OptimizerConfig&) {};
  add("sgd", OptimizerKind::kSgd, 0.05, none);
  add("sgd_momentum_decay", OptimizerKind::kSgd, 0.05, [](OptimizerConfig& c) {
    c.momentum = 0.9;
    c.weight_decay = 0.01;
  });
  add("sgd_nesterov", OptimizerKind::kSgd, 0.05, [](OptimizerConfig& c) {
    c.momentum = 0.8;
    c.nesterov = true;
  });
  add("adam", OptimizerKind::kAdam, 0.01,
      [](OptimizerConfig& c) { c.weight_decay = 0.01; });
  add("adamw", OptimizerKind::kAdamW, 0.01, [](OptimizerConfig& c) {
    c.weight_decay = 0.1;
    c.beta1 = 0.8;
    c.beta2 = 0.99;
  });
  add("rmsprop", OptimizerKind::kRmsprop, 0.01, none);
  add("rmsprop_centered_momentum", OptimizerKind::kRmsprop, 0.01,
      [](OptimizerConfig& c) {
        c.centered = true;
        c.momentum = 0.9;
        c.weight_decay = 0.01;
      });
  add("adadelta", OptimizerKind::kAdadelta, 1.0, [](OptimizerConfig& c) {
    c.epsilon = 1e-6;
    c.weight_decay = 0.01;
  });
  add("adagrad", OptimizerKind::kAdagrad, 0.01, [](OptimizerConfig& c) {
    c.epsilon = 1e-10;
    c.lr_decay = 0.01;
    c.initial_accumulator_value = 0.1;
    c.weight_decay = 0.01;
  });
  return cases;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CudaEngineRuleTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaEngineRuleTest, MatchesDoublePrecisionReference) {
  SKIP_WITHOUT_GPU();
  const OptimizerConfig& config = GetParam().config;
  auto engine = CudaEngine::Create(config, kSizes, 0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mt19937 rng(1234);
  Tensors params = RandomTensors(kSizes, rng);
  DoubleTensors want = ToDouble(params);
  ReferenceOptimizer reference(config, kSizes);
  for (int step = 1; step <= kSteps; ++step) {
    const Tensors grads = RandomTensors(kSizes, rng);
    ASSERT_TRUE((*engine)->Step(Spans(params), ConstSpans(grads)).ok());
    reference.Step(want, ToDouble(grads));
    ExpectClose(params, want, "step " + std::to_string(step) + " params");
  }
  EXPECT_EQ((*engine)->steps(), kSteps);

  auto saved = (*engine)->SaveState();
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->steps, kSteps);
  const std::vector<std::string> names = StateBufferNames(config);
  ASSERT_EQ(saved->buffers.size(), names.size());
  for (size_t b = 0; b < names.size(); ++b) {
    ExpectClose(saved->buffers[b], reference.buffer(names[b]), names[b]);
  }
}

TEST_P(CudaEngineRuleTest, RestoredStateGivesTheSameNextStep) {
  SKIP_WITHOUT_GPU();
  const OptimizerConfig& config = GetParam().config;
  auto original = CudaEngine::Create(config, kSizes, 0);
  ASSERT_TRUE(original.ok()) << original.status();
  std::mt19937 rng(99);
  Tensors params = RandomTensors(kSizes, rng);
  for (int step = 0; step < 3; ++step) {
    const Tensors grads = RandomTensors(kSizes, rng);
    ASSERT_TRUE((*original)->Step(Spans(params), ConstSpans(grads)).ok());
  }
  auto saved = (*original)->SaveState();
  ASSERT_TRUE(saved.ok()) << saved.status();

  auto restored = CudaEngine::Create(config, kSizes, 0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE((*restored)->RestoreState(*saved).ok());
  EXPECT_EQ((*restored)->steps(), 3);

  // Same kernel, same inputs, same device: identical to the bit.
  Tensors restored_params = params;
  for (int step = 0; step < 2; ++step) {
    const Tensors grads = RandomTensors(kSizes, rng);
    ASSERT_TRUE((*original)->Step(Spans(params), ConstSpans(grads)).ok());
    ASSERT_TRUE(
        (*restored)->Step(Spans(restored_params), ConstSpans(grads)).ok());
    EXPECT_EQ(restored_params, params) << "step " << step;
  }
  auto original_state = (*original)->SaveState();
  auto restored_state = (*restored)->SaveState();
  ASSERT_TRUE(original_state.ok() && restored_state.ok());
  EXPECT_EQ(restored_state->steps, 5);
  EXPECT_EQ(restored_state->buffers, original_state->buffers);
}

INSTANTIATE_TEST_SUITE_P(AllRules, CudaEngineRuleTest,
                         ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

OptimizerConfig Sgd(double learning_rate) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  config.learning_rate = learning_rate;
  return config;
}

TEST(CudaEngineTest, DeviceCountNeverFails) {
  EXPECT_GE(CudaEngine::DeviceCount(), 0);
}

TEST(CudaEngineTest, CreateOnAMissingDeviceFails) {
  const int count = CudaEngine::DeviceCount();
  for (int device : {count, -1}) {
    auto engine = CudaEngine::Create(Sgd(0.1), kSizes, device);
    ASSERT_FALSE(engine.ok());
#ifdef MPILEARN_WITH_CUDA
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(engine.status().message(),
              "no CUDA device " + std::to_string(device) + " (found " +
                  std::to_string(count) + ")");
#else
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnimplemented);
#endif
  }
  EXPECT_FALSE(CudaEngine::MeasureCopyBandwidthGBps(1 << 20, count).ok());
}

TEST(CudaEngineTest, RejectsMismatchedShapesWithoutChangingState) {
  SKIP_WITHOUT_GPU();
  auto engine = CudaEngine::Create(Sgd(0.1), kSizes, 0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mt19937 rng(5);
  Tensors params = RandomTensors(kSizes, rng);
  Tensors grads = RandomTensors(kSizes, rng);
  Tensors short_grads = grads;
  short_grads[2].pop_back();
  Tensors too_few = grads;
  too_few.pop_back();
  EXPECT_EQ((*engine)->Step(Spans(params), ConstSpans(short_grads)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->Step(Spans(params), ConstSpans(too_few)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->steps(), 0);

  OptimizerState bad;
  bad.buffers.resize(1);  // plain sgd keeps none
  EXPECT_EQ((*engine)->RestoreState(bad).code(),
            absl::StatusCode::kInvalidArgument);
  // Still usable.
  EXPECT_TRUE((*engine)->Step(Spans(params), ConstSpans(grads)).ok());
  EXPECT_EQ((*engine)->steps(), 1);
}

TEST(CudaEngineTest, DeviceParametersAreAuthoritativeBetweenSteps) {
  SKIP_WITHOUT_GPU();
  const std::vector<size_t> sizes = {5};
  auto engine = CudaEngine::Create(Sgd(1.0), sizes, 0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Tensors params = {{1, 2, 3, 4, 5}};
  const Tensors zero = {{0, 0, 0, 0, 0}};
  const Tensors one = {{1, 1, 1, 1, 1}};
  ASSERT_TRUE((*engine)->Step(Spans(params), ConstSpans(one)).ok());
  EXPECT_EQ(params, (Tensors{{0, 1, 2, 3, 4}}));

  // A host-side change is ignored until the engine is told about it.
  params = {{10, 10, 10, 10, 10}};
  ASSERT_TRUE((*engine)->Step(Spans(params), ConstSpans(zero)).ok());
  EXPECT_EQ(params, (Tensors{{0, 1, 2, 3, 4}}));

  params = {{10, 10, 10, 10, 10}};
  (*engine)->MarkHostParamsChanged();
  ASSERT_TRUE((*engine)->Step(Spans(params), ConstSpans(one)).ok());
  EXPECT_EQ(params, (Tensors{{9, 9, 9, 9, 9}}));

  const Tensors uploaded = {{7, 7, 7, 7, 7}};
  ASSERT_TRUE((*engine)->UploadParams(ConstSpans(uploaded)).ok());
  ASSERT_TRUE((*engine)->Step(Spans(params), ConstSpans(one)).ok());
  EXPECT_EQ(params, (Tensors{{6, 6, 6, 6, 6}}));
}

// Tensors longer than one host<->device copy chunk and than one pass of the
// grid, with a misaligned tensor boundary in the middle.
TEST(CudaEngineTest, LargeTensorsSpanSeveralCopyChunks) {
  SKIP_WITHOUT_GPU();
  const std::vector<size_t> sizes = {(size_t{9} << 20) + 3, 5,
                                     (size_t{3} << 20) + 1};
  const OptimizerConfig config = Sgd(0.5);
  auto engine = CudaEngine::Create(config, sizes, 0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Tensors params, grads;
  for (size_t k = 0; k < sizes.size(); ++k) {
    params.emplace_back(sizes[k]);
    grads.emplace_back(sizes[k]);
    for (size_t i = 0; i < sizes[k]; ++i) {
      params[k][i] = static_cast<float>((i * 7 + k) % 1000);
      grads[k][i] = static_cast<float>((i + 3 * k) % 16);  // exact * 0.5
    }
  }
  Tensors want = params;
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE((*engine)->Step(Spans(params), ConstSpans(grads)).ok());
    for (size_t k = 0; k < sizes.size(); ++k) {
      for (size_t i = 0; i < sizes[k]; ++i) want[k][i] -= 0.5f * grads[k][i];
    }
    ASSERT_EQ(params, want) << "step " << step;
  }
}

TEST(CudaEngineTest, MeasuresCopyBandwidth) {
  SKIP_WITHOUT_GPU();
  auto bandwidth = CudaEngine::MeasureCopyBandwidthGBps(size_t{64} << 20, 0);
  ASSERT_TRUE(bandwidth.ok()) << bandwidth.status();
  EXPECT_GT(*bandwidth, 1.0);
  std::cout << "device-to-device copy: " << *bandwidth << " GB/s\n";
}

}  // namespace
}  // namespace mpilearn::server
