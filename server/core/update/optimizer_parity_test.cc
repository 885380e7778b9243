// CUDA vs CPU: the same optimizer steps give the same parameters and state
// on both devices. Runs where a GPU is present; skips with the reason
// elsewhere (CI has no GPU).
#include <random>

#include "gtest/gtest.h"
#include "server/core/update/benchmark_tensors.h"
#include "server/core/update/cuda/cuda_engine.h"
#include "server/core/update/optimizer.h"

namespace mpilearn::server {
namespace {

v1::OptimizerSpec SpecFor(const std::string& name) {
  v1::OptimizerSpec spec;
  spec.set_name(name);
  spec.set_weight_decay(0.01);
  if (name == "sgd" || name == "rmsprop") spec.set_momentum(0.9);
  if (name == "rmsprop") spec.set_centered(true);
  return spec;
}

class ParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ParityTest, CudaMatchesCpu) {
  if (CudaEngine::DeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device on this machine ("
                 << (CudaEngine::BuiltWithCuda() ? "CUDA build"
                                                 : "build without CUDA")
                 << "); CUDA vs CPU parity runs on a GPU machine";
  }
  const std::vector<size_t> sizes = {1, 7, 1000, 4099, 0, 65536 + 3};
  const v1::OptimizerSpec spec = SpecFor(GetParam());
  EngineOptions cpu_engine;
  EngineOptions cuda_engine;
  cuda_engine.device = "cuda:0";
  auto cpu = CreateOptimizer(spec, sizes, cpu_engine);
  auto gpu = CreateOptimizer(spec, sizes, cuda_engine);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto p_cpu = RandomTensors(sizes, 1, 0.1f);
  auto p_gpu = p_cpu;
  for (uint32_t step = 0; step < 6; ++step) {
    const auto grads = RandomTensors(sizes, 100 + step, 0.1f);
    std::vector<absl::Span<const float>> g(grads.begin(), grads.end());
    std::vector<absl::Span<float>> a(p_cpu.begin(), p_cpu.end());
    std::vector<absl::Span<float>> b(p_gpu.begin(), p_gpu.end());
    ASSERT_TRUE((*cpu)->Step(a, g).ok());
    ASSERT_TRUE((*gpu)->Step(b, g).ok());
  }
  for (size_t t = 0; t < sizes.size(); ++t) {
    for (size_t i = 0; i < sizes[t]; ++i) {
      ASSERT_NEAR(p_cpu[t][i], p_gpu[t][i], 1e-6 + 1e-5 * std::abs(p_cpu[t][i]))
          << "tensor " << t << " element " << i;
    }
  }
  auto s_cpu = (*cpu)->SaveState();
  auto s_gpu = (*gpu)->SaveState();
  ASSERT_TRUE(s_cpu.ok() && s_gpu.ok());
  EXPECT_EQ(s_cpu->steps, s_gpu->steps);
  ASSERT_EQ(s_cpu->buffers.size(), s_gpu->buffers.size());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ParityTest,
                         ::testing::Values("sgd", "adam", "adamw", "rmsprop",
                                           "adadelta", "adagrad"));

}  // namespace
}  // namespace mpilearn::server
