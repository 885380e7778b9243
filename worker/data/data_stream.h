// Streamed file-list data (HDF5, NumPy): what a rank knows of a job's files
// from their metadata alone, and the readers that fetch only the rows it
// trains or evaluates, so a rank's memory is bounded by a few data units
// and never by the data set.
//
//   MPILEARN_ASSIGN_OR_RETURN(FileSplits files, ScanDataFiles(spec.data()));
//   files.train.rows;   // training rows of each file, for NextDataUnit
//   UnitPrefetcher prefetch(files.train, files.names);
//   prefetch.Prefetch({unit.file(), begin, end});   // read in the background
//   MPILEARN_ASSIGN_OR_RETURN(DataRows rows,
//                             prefetch.Take({unit.file(), begin, end}));
//
//   FileReader validation(files.validation, files.names);
//   MPILEARN_ASSIGN_OR_RETURN(DataRows batch, validation.ReadRange(0, 1000));
//
// A split is a list of files, each used from a first row for a number of
// rows: train_limit cuts the training list, and without validation files a
// block of the (limited) training list is the validation split
// (HeldOutRows in dataset.h: the last validation_count rows, or a
// cross-validation fold), so a file can be split between the two.
//
// Thread safety: FileSplits is immutable after ScanDataFiles. A FileReader
// belongs to one thread at a time. UnitPrefetcher's methods are called from
// one thread (the rank's training thread); its reads run on its own thread.
#ifndef MPILEARN_WORKER_DATA_DATA_STREAM_H_
#define MPILEARN_WORKER_DATA_DATA_STREAM_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/mpilearn.pb.h"
#include "worker/data/data_file.h"
#include "worker/data/dataset.h"

namespace mpilearn::worker {

// The files of one split and the rows of each it uses.
struct FileList {
  // The spec field the list came from ("train_files"), for messages.
  std::string field;
  std::vector<std::string> paths;
  // first[i], rows[i]: file i's rows [first[i], first[i] + rows[i]) belong
  // to this split (rows[i] may be 0: a training file past train_limit, or
  // one wholly held out, keeps its place in the list with no rows).
  //
  // Entries 0..P-1 are the spec's P files in order (the master addresses
  // data units by file index, and every rank builds the same list). The
  // training list may hold one entry more, at the end: when a
  // cross-validation fold lies strictly inside one file, that file's rows
  // after the fold (the same path, its own first and rows). So the same
  // path can appear twice, and the training rows in list order are the
  // spec's in order except for that last part.
  std::vector<int64_t> first;
  std::vector<int64_t> rows;

  int64_t total_rows() const;
  bool empty() const { return total_rows() == 0; }
};

// What ScanDataFiles learns from every file's metadata.
struct FileSplits {
  FileList train;
  FileList validation;  // validation_files, or the held-out training rows
  FileList test;        // empty without test_files
  DataFileNames names;
  // One row's feature shape (the model's input shape), shared by all files:
  // the packed [F] with several inputs.
  std::vector<int64_t> input_shape;
  // Several inputs or labels datasets (DatasetSplits::heads).
  DataHeads heads;
  // As DatasetSplits (dataset.h): the output width, and whether labels are
  // float rows rather than class indices.
  int64_t num_classes = 0;
  bool float_labels = false;
};

// Opens every file of `spec`'s lists for its metadata (no features are
// read) and checks that the files agree: the same feature row shape (as
// read), features all unsigned bytes (scaled by 1/255) or none, the same
// kind of labels (class indices, or float rows of one width). For class-index
// labels the labels alone are read, in bounded chunks, for the class count and
// to check every index is in [0, kMaxClasses). Every file of a list is opened,
// also those past a limit. Requires spec.train_files. Errors name the spec
// field and the file (and dataset, row): NotFound for a missing file,
// InvalidArgument for files that disagree, an empty list, a hold-out that
// leaves no training rows, a bad label; DataLoss for a failed read.
absl::StatusOr<FileSplits> ScanDataFiles(const v1::DataSpec& spec);

// Reads rows of one split's files, keeping a few of them open.
class FileReader {
 public:
  // With `skip_bad_rows` (data.bad_values "skip"), rows whose features or
  // float labels hold a NaN or infinity are left out of what ReadFileRows
  // returns and counted in DataRows::skipped instead of failing the read.
  FileReader(FileList list, DataFileNames names, bool skip_bad_rows = false);

  const FileList& list() const { return list_; }

  // Rows [begin, end) of file `file`'s part of the split (row 0 is the
  // file's row first[file]). InvalidArgument for a range outside it, or
  // rows holding a NaN or infinity (features, float labels) or a class
  // index outside [0, kMaxClasses); DataLoss for a file that now holds
  // fewer rows than the split uses, or a failed read. Errors name the
  // field, the file and the rows (the first bad row, counted from the
  // file's start).
  absl::StatusOr<DataRows> ReadFileRows(int file, int64_t begin, int64_t end);

  // Rows [begin, end) of the split as one sequence (file after file), which
  // may cross files. An empty range gives 0 rows of the split's row shapes
  // (undefined tensors for a list of no files).
  absl::StatusOr<DataRows> ReadRange(int64_t begin, int64_t end);

 private:
  // File `file`, opened if it is not open (closing the least recently used
  // one when kMaxOpen are).
  absl::StatusOr<DataFile*> Open(int file);

  static constexpr int kMaxOpen = 4;
  FileList list_;
  DataFileNames names_;
  const bool skip_bad_rows_;
  // Open files, most recently used first: (file index, file).
  std::deque<std::pair<int, std::unique_ptr<DataFile>>> open_;
};

// Rows of one file, as a data unit's share: file index and row range in
// FileReader::ReadFileRows's terms.
struct RowRange {
  int file = 0;
  int64_t begin = 0;
  int64_t end = 0;
  // Non-zero: UnitPrefetcher shuffles the rows it read (on its thread) by
  // a permutation drawn from this seed.
  uint64_t shuffle_seed = 0;

  bool operator==(const RowRange& other) const {
    return file == other.file && begin == other.begin && end == other.end &&
           shuffle_seed == other.shuffle_seed;
  }
};

// Reads a rank's shares of units ahead on a background thread, in the
// order they were asked for, holding at most kMaxPending read or being
// read (so at most that many shares in memory besides the one the caller
// trains).
class UnitPrefetcher {
 public:
  static constexpr int kMaxPending = 2;

  // `skip_bad_rows` as FileReader's.
  UnitPrefetcher(FileList train, DataFileNames names,
                 bool skip_bad_rows = false);
  // Stops the thread after the read in progress.
  ~UnitPrefetcher();

  UnitPrefetcher(const UnitPrefetcher&) = delete;
  UnitPrefetcher& operator=(const UnitPrefetcher&) = delete;

  // Starts reading `range` in the background, unless it is already pending.
  // When kMaxPending reads are pending, the oldest is dropped.
  void Prefetch(const RowRange& range);

  // The rows of `range`: waits for its read and drops every read pending
  // before it. A range that was not prefetched is read next, ahead of the
  // pending ones, which stay pending. The read's error, if it failed (that
  // range's only: later reads go on).
  absl::StatusOr<DataRows> Take(const RowRange& range);

 private:
  // One read asked for. Fields other than `range` are guarded by mu_.
  struct Pending {
    RowRange range;
    bool started = false;  // the thread has taken it
    bool done = false;     // `rows` holds the result
    absl::StatusOr<DataRows> rows;
  };
  // The thread's loop: reads the oldest pending range not started, until
  // stop_.
  void Loop();
  // Reorders rows->features and labels by a permutation drawn from `seed`.
  static void ShuffleRows(uint64_t seed, DataRows* rows);
  // Whether the thread has something to do (a read to start, or stop).
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  FileReader reader_;  // used only on the thread
  absl::Mutex mu_;
  // Reads asked for and not yet taken, oldest first (a dropped read that
  // is in progress is finished by the thread and then discarded).
  std::deque<std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started last, after the members it uses
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_DATA_DATA_STREAM_H_
