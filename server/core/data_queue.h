// A job's data queue: which unit of which epoch each group trains next, and
// the record of every finished epoch.
//
// Each epoch's training order is cut into units of data_unit_size samples
// (the last one shorter); unit i of 0-based epoch e has id
// e * units_per_epoch + i. train_samples is fixed by the first request
// (NextDataUnitRequest.train_samples) and every later one must agree. Groups
// ask for one unit at a time and report it done with their next request.
// Epoch e + 1 is handed out once every unit of epoch e has been, but never
// while epoch e - 1 is unfinished: at most one epoch runs ahead of the
// oldest unfinished one. A unit given back (its group left or was lost) is
// handed out again before any fresh one. An epoch's record (train loss,
// samples, wall time, updates applied when it completed) is written when
// its last unit completes, in epoch order; groups merge their validation
// into it later (MergeEpochReport).
//
// Bad data: with the spec's data.bad_values "skip" a completed unit may
// report rows left out (CompletedUnit.skipped; samples + skipped is the
// unit's size), counted in JobStatus.samples_skipped; an epoch's record
// counts the samples trained, and the epoch completes when its units do.
// A unit whose read failed in a group (UnitFailed) is given back like any
// other and counted: per unit (the job gives up on a unit that failed
// data.max_unit_failures times) and in JobStatus.unit_failures, with the
// latest error (bounded to kMaxDataErrorBytes) in last_data_error. The
// per-unit counts are saved in CheckpointQueue.unit_failures; the job-wide
// count and error come back with the status.
//
// File-list data: when the first request also carries file_rows (the
// training rows of each file, summing to train_samples), every later one
// must carry the same list, and units are row ranges inside one file
// (DataUnit.file, begin, end) whose order within each epoch is shuffled
// from the spec's seed and the epoch (file_units.h). Ids, hand-out order,
// epochs and records work as above; only what a slot covers differs.
//
//   DataQueue queue(job_id, spec);
//   MPILEARN_RETURN_IF_ERROR(queue.Check(request, held_unit));
//   queue.Accept(request, now, updates_applied, &finished_epochs);
//   if (!queue.done()) held_unit = queue.HandOut(now);  // or kNoUnit: wait
//
// Errors carry a v1::ErrorReason (common/error_reason.h).
//
// Threading: not thread-safe; a Job calls it under its own mutex.
#ifndef MPILEARN_SERVER_CORE_DATA_QUEUE_H_
#define MPILEARN_SERVER_CORE_DATA_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/spec/job_config.h"
#include "proto/mpilearn.pb.h"
#include "server/core/file_units.h"

namespace mpilearn::server {

class DataQueue {
 public:
  // No unit (held, or to hand out).
  static constexpr int64_t kNoUnit = -1;

  // last_data_error keeps at most this many bytes of an error.
  static constexpr size_t kMaxDataErrorBytes = 1024;

  // The queue of job `job_id` (named in messages), with the spec's epochs,
  // data_unit_size and seed (the order of file units), and its data's
  // bad_values (BadValues::kSkip allows CompletedUnit.skipped) and
  // max_unit_failures (3 when unset).
  DataQueue(std::string job_id, const JobConfig& config);

  // Checks a NextDataUnit request from a group that holds `held_unit` (or
  // kNoUnit), changing nothing. FAILED_PRECONDITION (ERROR_REASON_JOB_STATE)
  // for a spec that was not normalized, train_samples other than the
  // queue's, or a file list (file_rows) other than the queue's, including
  // one given where the queue has none or missing where it has one;
  // INVALID_ARGUMENT (ERROR_REASON_INVALID_REQUEST) for train_samples <= 0
  // before the queue's is fixed, more than FileUnits::kMaxFiles files, a
  // negative file_rows entry, file_rows not summing to train_samples, too
  // many units, a completed unit the group does not hold (or whose samples
  // + skipped is not its size, or with skipped rows when the spec's
  // bad_values is not "skip"), or holding a unit without listing it.
  absl::Status Check(const v1::NextDataUnitRequest& request,
                     int64_t held_unit) const;

  // What Accept recorded.
  struct Completed {
    uint64_t units = 0;
    uint64_t samples = 0;  // trained
    uint64_t skipped = 0;  // left out for bad values
  };

  // Records a request that passed Check: fixes train_samples (and
  // file_rows) on the first,
  // marks the listed units completed (`updates_applied` is the job's count,
  // kept for an epoch completed now) and writes the records of the oldest
  // epochs while they are complete, appending their 0-based numbers to
  // `finished`.
  Completed Accept(const v1::NextDataUnitRequest& request, absl::Time now,
                   uint64_t updates_applied,
                   google::protobuf::RepeatedField<int32_t>* finished);

  // Every epoch has its record: the data is done.
  bool done() const { return epochs_done() >= epochs_; }

  // The next unit to train (given-back units first), or kNoUnit when every
  // unit that may be handed out now is held (the group waits).
  // Precondition: train_samples is fixed and !done().
  int64_t HandOut(absl::Time now);

  // Unit `unit_id`'s range within its epoch (file-list data: its file and
  // rows in it); unit_id < epochs * units_per_epoch. Const for its callers:
  // it may draw and cache an epoch's order of file units.
  v1::DataUnit Unit(int64_t unit_id) const;

  // Gives back a unit handed out and not completed; it is handed out again
  // before any fresh unit.
  void GiveBack(int64_t unit_id);

  // What UnitFailed counted.
  struct Failure {
    // Failures of this unit so far, this one included.
    int32_t unit_failures = 0;
    // unit_failures reached max_unit_failures: the job is to give up.
    bool exhausted = false;
  };

  // Counts a failed read of unit `unit_id` (handed out, not completed) in a
  // group: its own count, unit_failures and last_data_error (`error`, cut
  // to kMaxDataErrorBytes by BoundDataError). Does not give the unit back
  // (GiveBack does, as for any unit its group lets go).
  Failure UnitFailed(int64_t unit_id, const std::string& error);
  int32_t max_unit_failures() const { return max_unit_failures_; }

  // "unit U (file F rows [B, E))" for file-list data, else "unit U"; for
  // messages. Precondition as Unit().
  std::string Describe(int64_t unit_id) const;

  // `error` if it has at most kMaxDataErrorBytes bytes, else its first
  // kMaxDataErrorBytes - 3 bytes, cut back to a UTF-8 character boundary,
  // and "..." (at most kMaxDataErrorBytes bytes in all).
  static std::string BoundDataError(const std::string& error);

  // Merges a group's validation (val_loss, val_accuracy, group_id) into the
  // record of epoch record.epoch() (1-based), keeping the queue's own
  // fields. INVALID_ARGUMENT (ERROR_REASON_INVALID_REQUEST) for an epoch
  // < 1, NOT_FOUND (ERROR_REASON_JOB_STATE) for one not finished yet.
  absl::Status MergeEpochReport(const v1::EpochRecord& record);

  // Records `rate` as the learning rate of finished epoch `epoch`
  // (1-based); no-op for an epoch not finished.
  void SetEpochLearningRate(int32_t epoch, double rate);

  int32_t epochs_done() const { return static_cast<int32_t>(history_.size()); }
  // One record per finished epoch, in order: history()[e] is epoch e + 1.
  const std::vector<v1::EpochRecord>& history() const { return history_; }

  // The queue's part of JobProgress / JobStatus: epochs, samples trained,
  // samples per epoch, train loss (and units requeued, the history).
  v1::JobProgress Progress() const;
  void FillStatus(bool with_history, v1::JobStatus* status) const;

  // Where the queue stands, for a checkpoint (per-unit failure counts
  // included).
  v1::CheckpointQueue Save() const;

  // Makes a fresh queue the one `queue` was saved of, with the history and
  // counters of `status` (the checkpoint's: samples trained and skipped,
  // units requeued, unit failures, last data error). Units handed out but
  // not completed count as given back. DATA_LOSS (ERROR_REASON_INTERNAL) when
  // the two do not fit together or the spec (file_rows that do not sum to
  // train_samples included); the queue is then unusable.
  absl::Status Resume(const v1::CheckpointQueue& queue,
                      const v1::JobStatus& status);

  // History and counters of an ended job known from its status alone (no
  // checkpoint); nothing is handed out any more.
  void ResumeEnded(const v1::JobStatus& status);

 private:
  // An epoch some of whose units were handed out and whose record is not
  // written yet.
  struct EpochProgress {
    int64_t units_completed = 0;
    // completed[i]: unit i of the epoch is done (units_per_epoch_ entries
    // once a unit completed; for checkpoints).
    std::vector<bool> completed;
    // Trained (skipped rows are not counted).
    uint64_t samples = 0;
    double loss_sum = 0.0;
    absl::Time first_handout;
    // Set when units_completed reaches units_per_epoch_ (an epoch can
    // complete before the one before it, whose record comes first).
    absl::Time completed_at;
    uint64_t updates_at_completion = 0;
  };

  // Writes the records of the oldest epochs while they are complete.
  void RecordCompletedEpochs(google::protobuf::RepeatedField<int32_t>* finished);
  // Units of 0-based `epoch` handed out so far.
  int64_t HandedOut(int64_t epoch) const;
  absl::Status BadQueueError(const std::string& what) const;
  // Check's part for file_rows, given the train_samples in force.
  absl::Status CheckFileRows(const v1::NextDataUnitRequest& request,
                             int64_t samples) const;

  const std::string job_id_;
  const int64_t epochs_;
  const int64_t unit_size_;
  const uint64_t seed_;
  // data.bad_values is "skip": completed units may report skipped rows.
  const bool skip_bad_values_;
  // data.max_unit_failures (>= 1).
  const int32_t max_unit_failures_;

  // 0 until the first request fixes it; then units_per_epoch_ =
  // ceil(train_samples_ / unit_size_).
  int64_t train_samples_ = 0;
  int64_t units_per_epoch_ = 0;
  // Set with train_samples_ when the first request carried file_rows; then
  // units_per_epoch_ = files_->units_per_epoch(). Mutable: Unit() caches
  // epoch orders in it.
  mutable std::optional<FileUnits> files_;
  // Units given back, handed out first.
  std::deque<int64_t> requeued_units_;
  uint64_t units_requeued_ = 0;
  // The next fresh unit: unit next_unit_ of epoch next_epoch_. Every unit
  // before it has been handed out at least once.
  int32_t next_epoch_ = 0;
  int64_t next_unit_ = 0;
  // Keyed by 0-based epoch; holds epochs history_.size() and on.
  std::map<int32_t, EpochProgress> open_epochs_;
  std::vector<v1::EpochRecord> history_;
  // Samples of completed units: trained, and left out for bad values.
  uint64_t samples_trained_ = 0;
  uint64_t samples_skipped_ = 0;
  // Failed reads (UnitFailed): in all, the latest error (bounded), and per
  // unit not completed since (an entry is dropped when its unit completes).
  uint64_t unit_failures_ = 0;
  std::string last_data_error_;
  std::map<int64_t, int32_t> failures_by_unit_;
  // Mean loss of the units the latest request that completed any
  // completed; unset before the first.
  std::optional<double> train_loss_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_DATA_QUEUE_H_
