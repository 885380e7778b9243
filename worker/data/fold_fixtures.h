// The reference of the cross-validation tests (dataset_test for the
// in-memory loader, data_stream_test for the streamed file lists): which
// of n training rows a fold holds out, decided row by row, independently of
// HeldOutRows's block arithmetic.
#ifndef MPILEARN_WORKER_DATA_FOLD_FIXTURES_H_
#define MPILEARN_WORKER_DATA_FOLD_FIXTURES_H_

#include <cstdint>
#include <vector>

namespace mpilearn::worker {

// Rows 0..n-1 split by fold `fold` of `folds`: held out, and trained on.
struct FoldRows {
  std::vector<int64_t> held;
  std::vector<int64_t> rest;
};

// Row r lies in block f when floor(f n / k) <= r < floor((f + 1) n / k),
// which for integers is f = ceil((r + 1) k / n) - 1 = floor(((r + 1) k - 1) / n).
inline FoldRows ExpectedFoldRows(int64_t n, int64_t folds, int64_t fold) {
  FoldRows rows;
  for (int64_t r = 0; r < n; ++r) {
    const bool held = ((r + 1) * folds - 1) / n == fold;
    (held ? rows.held : rows.rest).push_back(r);
  }
  return rows;
}

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_DATA_FOLD_FIXTURES_H_
