// The data units of file-list data (NextDataUnitRequest.file_rows): each
// training file with r rows is cut into ceil(r / unit_size) units of
// unit_size rows (the last one shorter; a file with 0 rows has none), so a
// unit never spans two files. The epoch's canonical list is file order, then
// row order; slot i of epoch e (unit id e * units_per_epoch + i) is unit
// order_e[i] of that list, where order_e is a permutation drawn from the
// job's seed and e alone (EpochOrder): a master that resumes from a
// checkpoint maps every unit id to the same rows.
//
//   FileUnits units({100, 0, 30}, /*unit_size=*/64, /*seed=*/1);
//   units.units_per_epoch();          // 2 + 0 + 1 = 3
//   v1::DataUnit unit;
//   units.Locate(/*epoch=*/0, /*slot=*/2, &unit);  // file, begin, end
//
// Threading: not thread-safe, not even Locate (it fills a cache); a
// DataQueue calls it under its Job's mutex.
#ifndef MPILEARN_SERVER_CORE_FILE_UNITS_H_
#define MPILEARN_SERVER_CORE_FILE_UNITS_H_

#include <cstdint>
#include <map>
#include <vector>

#include "proto/mpilearn.pb.h"

namespace mpilearn::server {

class FileUnits {
 public:
  // Bounds on what a request may ask for, checked before anything is built.
  static constexpr int64_t kMaxFiles = 1000000;
  // One epoch's order takes 4 bytes a unit (64 MiB at the bound).
  static constexpr int64_t kMaxUnitsPerEpoch = int64_t{1} << 24;

  // Units per epoch of files with `file_rows` rows (each >= 0) in units of
  // `unit_size` (>= 1). Never overflows: at most the rows' sum.
  template <typename Rows>
  static int64_t CountUnits(const Rows& file_rows, int64_t unit_size) {
    int64_t units = 0;
    for (int64_t rows : file_rows) {
      units += rows / unit_size + (rows % unit_size != 0 ? 1 : 0);
    }
    return units;
  }

  // The order of the `units` slots of 0-based `epoch`: a permutation of
  // 0..units-1 drawn by Fisher-Yates over std::mt19937_64 (seeded from
  // `seed` and `epoch`) with rejection sampling written here, so it is the
  // same with every standard library. Precondition: units <=
  // kMaxUnitsPerEpoch.
  static std::vector<uint32_t> EpochOrder(uint64_t seed, int32_t epoch,
                                          int64_t units);

  // Preconditions: file_rows.size() <= kMaxFiles, each entry >= 0,
  // unit_size >= 1, CountUnits(file_rows, unit_size) in [1,
  // kMaxUnitsPerEpoch].
  FileUnits(std::vector<int64_t> file_rows, int64_t unit_size, uint64_t seed);

  const std::vector<int64_t>& file_rows() const { return file_rows_; }
  int64_t units_per_epoch() const { return units_per_epoch_; }

  // Sets unit's file, begin and end to those of slot `slot` (in [0,
  // units_per_epoch)) of 0-based `epoch`. Draws and caches the epoch's
  // order on first use; a few epochs stay cached (see Forget).
  void Locate(int32_t epoch, int64_t slot, v1::DataUnit* unit);

  // Drops the cached orders of epochs before `epoch` (their records are
  // written: nothing of them is handed out or completed any more).
  void Forget(int32_t epoch);

 private:
  // At most this many orders cached; the oldest goes first.
  static constexpr size_t kMaxCachedEpochs = 3;

  const std::vector<int64_t> file_rows_;
  const int64_t unit_size_;
  const uint64_t seed_;
  // first_unit_[f]: the canonical index of file f's first unit
  // (nondecreasing; equal for a file with no rows and the next one).
  std::vector<int64_t> first_unit_;
  int64_t units_per_epoch_ = 0;
  // EpochOrder of each epoch in use, by epoch.
  std::map<int32_t, std::vector<uint32_t>> orders_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_FILE_UNITS_H_
