// DataQueue (data_queue.h). Over ~500 lines because every figure that comes
// from outside (a request's counts and file list, a checkpoint's queue) is
// checked here, next to the state it must fit, with a message a user can act
// on.
#include "server/core/data_queue.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/error_reason.h"
#include "common/status_macros.h"

namespace mpilearn::server {
namespace {

double ToUnixSecondsDouble(absl::Time time) {
  return absl::ToDoubleSeconds(time - absl::UnixEpoch());
}

absl::Time FromUnixSecondsDouble(double seconds) {
  return absl::UnixEpoch() + absl::Seconds(seconds);
}

int64_t UnitsPerEpoch(int64_t samples, int64_t unit_size) {
  return samples / unit_size + (samples % unit_size != 0 ? 1 : 0);
}

// data.max_unit_failures as the proto defines it: 3 when unset; a spec that
// was not normalized cannot make it < 1.
int32_t MaxUnitFailures(const v1::DataSpec& data) {
  if (!data.has_max_unit_failures()) return 3;
  return std::max(1, data.max_unit_failures());
}

}  // namespace

DataQueue::DataQueue(std::string job_id, const JobConfig& config)
    : job_id_(std::move(job_id)),
      epochs_(config.spec().epochs()),
      unit_size_(config.spec().data_unit_size()),
      seed_(config.spec().seed()),
      skip_bad_values_(config.skips_bad_values()),
      max_unit_failures_(MaxUnitFailures(config.spec().data())) {}

absl::Status DataQueue::Check(const v1::NextDataUnitRequest& request,
                              int64_t held_unit) const {
  const std::string& group_id = request.group_id();
  if (epochs_ < 1 || unit_size_ < 1) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "job ", job_id_, " has epochs ", epochs_, " and data_unit_size ",
            unit_size_, "; its spec was not normalized (NormalizeJobSpec)")),
        v1::ERROR_REASON_JOB_STATE);
  }
  const int64_t asked = request.train_samples();
  if (asked < 0 || (asked == 0 && train_samples_ == 0)) {
    return InvalidRequestError(absl::StrCat(
        "train_samples must be > 0 (the training samples group ", group_id,
        " sees after train_limit and the validation hold-out), got ", asked));
  }
  if (train_samples_ != 0 && asked != 0 && asked != train_samples_) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "group ", group_id, " sees ", asked, " samples but job ", job_id_,
            " has ", train_samples_,
            "; do all groups read the same data files with the same "
            "train_limit?")),
        v1::ERROR_REASON_JOB_STATE);
  }
  const int64_t samples = train_samples_ != 0 ? train_samples_ : asked;
  MPILEARN_RETURN_IF_ERROR(CheckFileRows(request, samples));
  const int64_t per_epoch =
      request.file_rows().empty()
          ? UnitsPerEpoch(samples, unit_size_)
          : FileUnits::CountUnits(request.file_rows(), unit_size_);
  if (!request.file_rows().empty() &&
      per_epoch > FileUnits::kMaxUnitsPerEpoch) {
    return InvalidRequestError(absl::StrCat(
        "the ", request.file_rows_size(), " files of group ", group_id,
        " make ", per_epoch, " data units of ", unit_size_,
        " rows per epoch, more than ", FileUnits::kMaxUnitsPerEpoch,
        "; raise data_unit_size"));
  }
  if (per_epoch > std::numeric_limits<int64_t>::max() / epochs_) {
    return InvalidRequestError(absl::StrCat(
        "train_samples ", samples, " in units of ", unit_size_, " over ",
        epochs_, " epochs makes too many data units; raise data_unit_size"));
  }
  bool listed_held = false;
  for (const v1::CompletedUnit& done : request.completed()) {
    if (held_unit == kNoUnit || done.unit_id() != held_unit || listed_held) {
      return InvalidRequestError(absl::StrCat(
          "group ", group_id, " lists unit ", done.unit_id(),
          " as completed but ",
          held_unit == kNoUnit
              ? std::string("holds no unit")
              : absl::StrCat("holds unit ", held_unit,
                             listed_held ? ", already listed" : "")));
    }
    listed_held = true;
    // A held unit was handed out, so train_samples_ is fixed.
    const v1::DataUnit unit = Unit(done.unit_id());
    const uint64_t unit_samples = static_cast<uint64_t>(unit.end() - unit.begin());
    // Compared without adding, which could overflow.
    if (done.skipped() > unit_samples ||
        done.samples() != unit_samples - done.skipped()) {
      return InvalidRequestError(absl::StrCat(
          "unit ", done.unit_id(), " covers ", unit_samples,
          " samples but group ", group_id, " reports ", done.samples(),
          " trained and ", done.skipped(),
          " skipped; the two must add up to the unit's size"));
    }
    if (done.skipped() != 0 && !skip_bad_values_) {
      return InvalidRequestError(absl::StrCat(
          "group ", group_id, " skipped ", done.skipped(), " rows of unit ",
          done.unit_id(), " but job ", job_id_,
          " does not skip bad values (data.bad_values is not 'skip')"));
    }
  }
  if (held_unit != kNoUnit && !listed_held) {
    return InvalidRequestError(absl::StrCat("group ", group_id,
                                            " still holds unit ", held_unit,
                                            "; list it in completed"));
  }
  return absl::OkStatus();
}

absl::Status DataQueue::CheckFileRows(const v1::NextDataUnitRequest& request,
                                      int64_t samples) const {
  const std::string& group_id = request.group_id();
  const auto& rows = request.file_rows();
  if (rows.size() > FileUnits::kMaxFiles) {
    return InvalidRequestError(absl::StrCat(
        "group ", group_id, " lists ", rows.size(),
        " training files in file_rows; at most ", FileUnits::kMaxFiles,
        " are allowed"));
  }
  int64_t sum = 0;
  for (int i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0) {
      return InvalidRequestError(absl::StrCat(
          "group ", group_id, " gives ", rows[i], " rows for file ", i,
          "; file_rows must be >= 0"));
    }
    // sum <= samples throughout, so the sum never overflows.
    if (rows[i] > samples - sum) {
      return InvalidRequestError(absl::StrCat(
          "group ", group_id, "'s file_rows sum to more than train_samples ",
          samples));
    }
    sum += rows[i];
  }
  if (!rows.empty() && sum != samples) {
    return InvalidRequestError(absl::StrCat("group ", group_id,
                                            "'s file_rows sum to ", sum,
                                            " but train_samples is ", samples));
  }
  if (train_samples_ == 0) return absl::OkStatus();  // the first request
  const size_t fixed_files =
      files_.has_value() ? files_->file_rows().size() : 0;
  std::string mismatch;
  if (static_cast<size_t>(rows.size()) != fixed_files) {
    mismatch = absl::StrCat(
        "has ", rows.size(), " files but job ", job_id_, " has ",
        fixed_files == 0 ? std::string("none") : absl::StrCat(fixed_files));
  } else {
    for (int i = 0; i < rows.size(); ++i) {
      const int64_t fixed = files_->file_rows()[static_cast<size_t>(i)];
      if (rows[i] != fixed) {
        mismatch = absl::StrCat("gives ", rows[i], " rows for file ", i,
                                " (of ", rows.size(), ") but job ", job_id_,
                                " has ", fixed);
        break;
      }
    }
  }
  if (mismatch.empty()) return absl::OkStatus();
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat(
          "group ", group_id, "'s file list ", mismatch,
          "; do all groups read the same files with the same train_limit?")),
      v1::ERROR_REASON_JOB_STATE);
}

DataQueue::Completed DataQueue::Accept(
    const v1::NextDataUnitRequest& request, absl::Time now,
    uint64_t updates_applied,
    google::protobuf::RepeatedField<int32_t>* finished) {
  if (train_samples_ == 0) {
    train_samples_ = request.train_samples();
    if (request.file_rows().empty()) {
      units_per_epoch_ = UnitsPerEpoch(train_samples_, unit_size_);
    } else {
      files_.emplace(std::vector<int64_t>(request.file_rows().begin(),
                                          request.file_rows().end()),
                     unit_size_, seed_);
      units_per_epoch_ = files_->units_per_epoch();
    }
  }
  Completed completed;
  double loss_sum = 0.0;
  for (const v1::CompletedUnit& done : request.completed()) {
    const int32_t epoch = static_cast<int32_t>(done.unit_id() / units_per_epoch_);
    EpochProgress& progress = open_epochs_[epoch];
    if (progress.completed.empty()) {
      progress.completed.assign(static_cast<size_t>(units_per_epoch_), false);
    }
    progress.completed[static_cast<size_t>(done.unit_id() % units_per_epoch_)] =
        true;
    ++progress.units_completed;
    failures_by_unit_.erase(done.unit_id());
    progress.samples += done.samples();
    progress.loss_sum += done.loss_sum();
    if (progress.units_completed == units_per_epoch_) {
      progress.completed_at = now;
      progress.updates_at_completion = updates_applied;
    }
    ++completed.units;
    completed.samples += done.samples();
    completed.skipped += done.skipped();
    loss_sum += done.loss_sum();
  }
  samples_trained_ += completed.samples;
  samples_skipped_ += completed.skipped;
  if (completed.samples > 0) {
    train_loss_ = loss_sum / static_cast<double>(completed.samples);
  }
  RecordCompletedEpochs(finished);
  return completed;
}

int64_t DataQueue::HandOut(absl::Time now) {
  if (!requeued_units_.empty()) {
    const int64_t unit = requeued_units_.front();
    requeued_units_.pop_front();
    return unit;
  }
  // next_epoch_ is at most one past the oldest unfinished epoch.
  if (next_epoch_ >= epochs_ || next_epoch_ > epochs_done() + 1) return kNoUnit;
  const int64_t unit = next_epoch_ * units_per_epoch_ + next_unit_;
  if (next_unit_ == 0) open_epochs_[next_epoch_].first_handout = now;
  if (++next_unit_ == units_per_epoch_) {
    ++next_epoch_;
    next_unit_ = 0;
  }
  return unit;
}

v1::DataUnit DataQueue::Unit(int64_t unit_id) const {
  const int64_t index = unit_id % units_per_epoch_;
  v1::DataUnit unit;
  unit.set_epoch(static_cast<int32_t>(unit_id / units_per_epoch_));
  unit.set_unit_id(unit_id);
  if (files_.has_value()) {
    files_->Locate(unit.epoch(), index, &unit);
    return unit;
  }
  unit.set_begin(index * unit_size_);
  unit.set_end(std::min(train_samples_, unit.begin() + unit_size_));
  return unit;
}

void DataQueue::GiveBack(int64_t unit_id) {
  requeued_units_.push_back(unit_id);
  ++units_requeued_;
}

DataQueue::Failure DataQueue::UnitFailed(int64_t unit_id,
                                         const std::string& error) {
  ++unit_failures_;
  last_data_error_ = BoundDataError(error);
  Failure failure;
  failure.unit_failures = ++failures_by_unit_[unit_id];
  failure.exhausted = failure.unit_failures >= max_unit_failures_;
  return failure;
}

std::string DataQueue::Describe(int64_t unit_id) const {
  if (!files_.has_value()) return absl::StrCat("unit ", unit_id);
  const v1::DataUnit unit = Unit(unit_id);
  return absl::StrCat("unit ", unit_id, " (file ", unit.file(), " rows [",
                      unit.begin(), ", ", unit.end(), "))");
}

std::string DataQueue::BoundDataError(const std::string& error) {
  if (error.size() <= kMaxDataErrorBytes) return error;
  constexpr absl::string_view kEllipsis = "...";
  size_t cut = kMaxDataErrorBytes - kEllipsis.size();
  // Back up over UTF-8 continuation bytes (10xxxxxx) so no character is
  // split; at most 3 of them follow a character's first byte (the request
  // was proto3 text, so valid UTF-8; the bound keeps odd input cheap).
  for (int i = 0;
       i < 3 && (static_cast<unsigned char>(error[cut]) & 0xC0) == 0x80; ++i) {
    --cut;
  }
  return absl::StrCat(absl::string_view(error).substr(0, cut), kEllipsis);
}

absl::Status DataQueue::MergeEpochReport(const v1::EpochRecord& record) {
  if (record.epoch() < 1) {
    return InvalidRequestError(absl::StrCat(
        "epoch must be >= 1 (epochs are numbered from 1), got ",
        record.epoch()));
  }
  if (record.epoch() > epochs_done()) {
    return WithReason(
        absl::NotFoundError(absl::StrCat(
            "epoch ", record.epoch(), " of job ", job_id_,
            " is not finished (", history_.size(),
            " are); report an epoch once NextDataUnit lists it in "
            "finished_epochs")),
        v1::ERROR_REASON_JOB_STATE);
  }
  v1::EpochRecord& stored = history_[static_cast<size_t>(record.epoch() - 1)];
  stored.set_val_loss(record.val_loss());
  stored.set_val_accuracy(record.val_accuracy());
  *stored.mutable_metrics() = record.metrics();
  stored.set_group_id(record.group_id());
  return absl::OkStatus();
}

void DataQueue::SetEpochLearningRate(int32_t epoch, double rate) {
  if (epoch < 1 || epoch > epochs_done()) return;
  history_[static_cast<size_t>(epoch - 1)].set_learning_rate(rate);
}

v1::JobProgress DataQueue::Progress() const {
  v1::JobProgress progress;
  progress.set_epochs_done(epochs_done());
  progress.set_epochs(static_cast<int32_t>(epochs_));
  progress.set_samples_trained(samples_trained_);
  progress.set_samples_per_epoch(static_cast<uint64_t>(train_samples_));
  if (train_loss_.has_value()) progress.set_train_loss(*train_loss_);
  return progress;
}

void DataQueue::FillStatus(bool with_history, v1::JobStatus* status) const {
  status->set_samples_trained(samples_trained_);
  status->set_samples_skipped(samples_skipped_);
  status->set_unit_failures(unit_failures_);
  status->set_last_data_error(last_data_error_);
  status->set_epochs_done(epochs_done());
  status->set_units_requeued(units_requeued_);
  if (train_loss_.has_value()) status->set_train_loss(*train_loss_);
  status->set_samples_per_epoch(static_cast<uint64_t>(train_samples_));
  if (with_history) {
    for (const auto& record : history_) *status->add_history() = record;
  }
}

void DataQueue::RecordCompletedEpochs(
    google::protobuf::RepeatedField<int32_t>* finished) {
  for (;;) {
    const int32_t epoch = epochs_done();
    auto it = open_epochs_.find(epoch);
    if (it == open_epochs_.end() ||
        it->second.units_completed < units_per_epoch_) {
      return;
    }
    const EpochProgress& progress = it->second;
    v1::EpochRecord record;
    record.set_epoch(epoch + 1);
    record.set_samples(progress.samples);
    record.set_train_loss(progress.samples > 0
                              ? progress.loss_sum /
                                    static_cast<double>(progress.samples)
                              : 0.0);
    const double seconds =
        absl::ToDoubleSeconds(progress.completed_at - progress.first_handout);
    record.set_wall_seconds(seconds);
    record.set_samples_per_second(
        seconds > 0.0 ? static_cast<double>(progress.samples) / seconds : 0.0);
    record.set_updates_applied(progress.updates_at_completion);
    history_.push_back(std::move(record));
    open_epochs_.erase(it);
    finished->Add(epoch);
    if (files_.has_value()) files_->Forget(epochs_done());
  }
}

int64_t DataQueue::HandedOut(int64_t epoch) const {
  return epoch < next_epoch_ ? units_per_epoch_
                             : epoch == next_epoch_ ? next_unit_ : 0;
}

absl::Status DataQueue::BadQueueError(const std::string& what) const {
  return WithReason(
      absl::DataLossError(absl::StrCat("checkpoint of job ", job_id_,
                                       " has an inconsistent data queue: ",
                                       what)),
      v1::ERROR_REASON_INTERNAL);
}

v1::CheckpointQueue DataQueue::Save() const {
  v1::CheckpointQueue queue;
  queue.set_train_samples(train_samples_);
  queue.set_next_epoch(next_epoch_);
  queue.set_next_unit(next_unit_);
  if (files_.has_value()) {
    queue.mutable_file_rows()->Add(files_->file_rows().begin(),
                                   files_->file_rows().end());
  }
  for (const auto& [unit_id, failures] : failures_by_unit_) {
    (*queue.mutable_unit_failures())[unit_id] = failures;
  }
  for (const auto& [epoch, progress] : open_epochs_) {
    v1::CheckpointEpochProgress* out = queue.add_open_epochs();
    out->set_epoch(epoch);
    for (size_t i = 0; i < progress.completed.size(); ++i) {
      if (progress.completed[i]) {
        out->add_completed_units(epoch * units_per_epoch_ +
                                 static_cast<int64_t>(i));
      }
    }
    out->set_samples(progress.samples);
    out->set_loss_sum(progress.loss_sum);
    out->set_first_handout_unix_seconds(
        ToUnixSecondsDouble(progress.first_handout));
    if (progress.units_completed == units_per_epoch_) {
      out->set_completed_unix_seconds(ToUnixSecondsDouble(progress.completed_at));
      out->set_updates_at_completion(progress.updates_at_completion);
    }
  }
  return queue;
}

absl::Status DataQueue::Resume(const v1::CheckpointQueue& queue,
                               const v1::JobStatus& status) {
  if (status.history_size() > epochs_) {
    return BadQueueError(
        absl::StrCat(status.history_size(), " epochs recorded of ", epochs_));
  }
  history_.assign(status.history().begin(), status.history().end());
  samples_trained_ = status.samples_trained();
  samples_skipped_ = status.samples_skipped();
  unit_failures_ = status.unit_failures();
  last_data_error_ = BoundDataError(status.last_data_error());
  if (status.has_train_loss()) train_loss_ = status.train_loss();
  if (queue.train_samples() == 0) {
    if (queue.next_epoch() != 0 || queue.next_unit() != 0 ||
        queue.open_epochs_size() != 0 || queue.file_rows_size() != 0 ||
        !history_.empty()) {
      return BadQueueError("progress without train_samples");
    }
    units_requeued_ += status.units_requeued();
    return absl::OkStatus();
  }
  if (queue.train_samples() < 0 || epochs_ < 1 || unit_size_ < 1) {
    return BadQueueError(absl::StrCat("train_samples ", queue.train_samples(),
                                      ", epochs ", epochs_,
                                      ", data_unit_size ", unit_size_));
  }
  const int64_t samples = queue.train_samples();
  int64_t per_epoch = UnitsPerEpoch(samples, unit_size_);
  if (queue.file_rows_size() != 0) {
    if (queue.file_rows_size() > FileUnits::kMaxFiles) {
      return BadQueueError(
          absl::StrCat(queue.file_rows_size(), " training files"));
    }
    int64_t sum = 0;
    for (int64_t rows : queue.file_rows()) {
      if (rows < 0 || rows > samples - sum) {
        return BadQueueError(absl::StrCat(
            "file_rows do not sum to train_samples ", samples));
      }
      sum += rows;
    }
    if (sum != samples) {
      return BadQueueError(absl::StrCat("file_rows sum to ", sum,
                                        " but train_samples is ", samples));
    }
    per_epoch = FileUnits::CountUnits(queue.file_rows(), unit_size_);
    if (per_epoch > FileUnits::kMaxUnitsPerEpoch) {
      return BadQueueError(absl::StrCat(per_epoch, " file units per epoch"));
    }
  }
  const int64_t recorded = epochs_done();
  if (queue.next_epoch() < recorded || queue.next_epoch() > epochs_ ||
      queue.next_unit() < 0 || queue.next_unit() >= per_epoch ||
      (queue.next_epoch() == epochs_ && queue.next_unit() != 0)) {
    return BadQueueError(absl::StrCat("next unit ", queue.next_unit(),
                                      " of epoch ", queue.next_epoch()));
  }
  train_samples_ = samples;
  units_per_epoch_ = per_epoch;
  if (queue.file_rows_size() != 0) {
    files_.emplace(std::vector<int64_t>(queue.file_rows().begin(),
                                        queue.file_rows().end()),
                   unit_size_, seed_);
  }
  next_epoch_ = queue.next_epoch();
  next_unit_ = queue.next_unit();
  for (const v1::CheckpointEpochProgress& in : queue.open_epochs()) {
    const int32_t epoch = in.epoch();
    if (epoch < recorded || epoch >= epochs_ || HandedOut(epoch) == 0 ||
        open_epochs_.count(epoch) != 0) {
      return BadQueueError(absl::StrCat("open epoch ", epoch));
    }
    EpochProgress& progress = open_epochs_[epoch];
    progress.completed.assign(static_cast<size_t>(units_per_epoch_), false);
    for (int64_t unit_id : in.completed_units()) {
      const int64_t index = unit_id - epoch * units_per_epoch_;
      if (index < 0 || index >= HandedOut(epoch) ||
          progress.completed[static_cast<size_t>(index)]) {
        return BadQueueError(
            absl::StrCat("unit ", unit_id, " completed in epoch ", epoch));
      }
      progress.completed[static_cast<size_t>(index)] = true;
      ++progress.units_completed;
    }
    progress.samples = in.samples();
    progress.loss_sum = in.loss_sum();
    progress.first_handout = FromUnixSecondsDouble(in.first_handout_unix_seconds());
    if (progress.units_completed == units_per_epoch_) {
      progress.completed_at = FromUnixSecondsDouble(in.completed_unix_seconds());
      progress.updates_at_completion = in.updates_at_completion();
    }
  }
  for (const auto& [unit_id, failures] : queue.unit_failures()) {
    if (unit_id < 0 || unit_id / units_per_epoch_ >= epochs_ || failures < 1) {
      return BadQueueError(
          absl::StrCat(failures, " failures of unit ", unit_id));
    }
    failures_by_unit_[unit_id] = failures;
  }
  // What was handed out and not completed was in flight: hand it out again,
  // oldest first.
  for (int64_t epoch = recorded; epoch < epochs_; ++epoch) {
    const int64_t count = HandedOut(epoch);
    if (count == 0) break;
    auto progress = open_epochs_.find(static_cast<int32_t>(epoch));
    if (progress == open_epochs_.end()) {
      return BadQueueError(absl::StrCat(
          "epoch ", epoch, " has units handed out but no progress"));
    }
    for (int64_t i = 0; i < count; ++i) {
      if (progress->second.completed[static_cast<size_t>(i)]) continue;
      GiveBack(epoch * units_per_epoch_ + i);
    }
  }
  units_requeued_ += status.units_requeued();
  return absl::OkStatus();
}

void DataQueue::ResumeEnded(const v1::JobStatus& status) {
  history_.assign(status.history().begin(), status.history().end());
  samples_trained_ = status.samples_trained();
  samples_skipped_ = status.samples_skipped();
  unit_failures_ = status.unit_failures();
  last_data_error_ = BoundDataError(status.last_data_error());
  if (status.has_train_loss()) train_loss_ = status.train_loss();
  units_requeued_ = status.units_requeued();
}

}  // namespace mpilearn::server
