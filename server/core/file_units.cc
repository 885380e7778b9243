#include "server/core/file_units.h"

#include <algorithm>
#include <random>
#include <utility>

namespace mpilearn::server {
namespace {

// SplitMix64's finalizer: spreads nearby inputs (seed 1 and 2, epoch 0 and
// 1) over the whole 64-bit range before they seed the generator.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, bound), bound >= 1: rejects the draws below 2^64 mod bound
// so every remainder is equally likely.
uint64_t Below(std::mt19937_64& generator, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t draw = generator();
    if (draw >= threshold) return draw % bound;
  }
}

}  // namespace

std::vector<uint32_t> FileUnits::EpochOrder(uint64_t seed, int32_t epoch,
                                            int64_t units) {
  std::vector<uint32_t> order(static_cast<size_t>(units));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  // std::mt19937_64's output for a given seed is fixed by the standard.
  std::mt19937_64 generator(
      Mix(seed ^ Mix(static_cast<uint64_t>(static_cast<uint32_t>(epoch)))));
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(Below(generator, i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

FileUnits::FileUnits(std::vector<int64_t> file_rows, int64_t unit_size,
                     uint64_t seed)
    : file_rows_(std::move(file_rows)), unit_size_(unit_size), seed_(seed) {
  first_unit_.reserve(file_rows_.size());
  for (int64_t rows : file_rows_) {
    first_unit_.push_back(units_per_epoch_);
    units_per_epoch_ += rows / unit_size_ + (rows % unit_size_ != 0 ? 1 : 0);
  }
}

void FileUnits::Locate(int32_t epoch, int64_t slot, v1::DataUnit* unit) {
  auto it = orders_.find(epoch);
  if (it == orders_.end()) {
    while (orders_.size() >= kMaxCachedEpochs) orders_.erase(orders_.begin());
    it = orders_.emplace(epoch, EpochOrder(seed_, epoch, units_per_epoch_))
             .first;
  }
  const int64_t index = it->second[static_cast<size_t>(slot)];
  // The last file whose first unit is at or before `index`: it has units
  // (files with none share their first unit with a later file), and
  // `index` is one of them.
  const size_t file = static_cast<size_t>(
      std::upper_bound(first_unit_.begin(), first_unit_.end(), index) -
      first_unit_.begin() - 1);
  unit->set_file(static_cast<int32_t>(file));
  unit->set_begin((index - first_unit_[file]) * unit_size_);
  unit->set_end(std::min(file_rows_[file], unit->begin() + unit_size_));
}

void FileUnits::Forget(int32_t epoch) {
  orders_.erase(orders_.begin(), orders_.lower_bound(epoch));
}

}  // namespace mpilearn::server
