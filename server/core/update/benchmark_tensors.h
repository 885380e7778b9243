// Tensor sets for the optimizer benchmarks and tests: sizes split like a
// model's parameters (a few large tensors, some bias-sized ones) and seeded
// normal values, so per-tensor overheads count as they do in real jobs.
// Header-only; used by //server/core/update:optimizer_benchmark,
// //server/core/update/cuda:cuda_engine_benchmark and the parity test.
#ifndef MPILEARN_SERVER_CORE_UPDATE_BENCHMARK_TENSORS_H_
#define MPILEARN_SERVER_CORE_UPDATE_BENCHMARK_TENSORS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace mpilearn::server {

// Splits `params` into nine tensors: four large (45, 30, 15 and 8 % of
// them), each followed by a bias of at most 512, and the rest.
inline std::vector<size_t> ModelLikeSizes(size_t params) {
  std::vector<size_t> sizes;
  const double shares[] = {0.45, 0.30, 0.15, 0.08};
  size_t used = 0;
  for (double s : shares) {
    sizes.push_back(static_cast<size_t>(params * s));
    used += sizes.back();
    sizes.push_back(std::min<size_t>(512, params / 1000 + 1));  // a bias
    used += sizes.back();
  }
  sizes.push_back(params > used ? params - used : 1);
  return sizes;
}

// Tensors of `sizes` with N(0, stddev^2) values from a generator seeded
// with `seed`.
inline std::vector<std::vector<float>> RandomTensors(
    const std::vector<size_t>& sizes, uint32_t seed, float stddev = 0.01f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<std::vector<float>> out;
  for (size_t n : sizes) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_UPDATE_BENCHMARK_TENSORS_H_
