// Test fakes of the study table's tests: the master's jobs as a map the
// test moves along (FakeJobs), a small study over Fashion-MNIST-like IDX
// paths (BaseStudy), and a fixture making tables over the fake jobs
// without their refresh thread (the test calls Refresh).
#ifndef MPILEARN_SERVER_OPT_STUDY_TEST_FAKES_H_
#define MPILEARN_SERVER_OPT_STUDY_TEST_FAKES_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "gtest/gtest.h"
#include "server/opt/study_table.h"
#include "server/opt/trial_scheduler.h"

namespace mpilearn::opt {

// Jobs as the registry would hold them; the test moves them along.
class FakeJobs : public TrialJobs {
 public:
  absl::StatusOr<std::string> Submit(const v1::JobSpec& spec) override {
    if (!submit_error.ok()) return submit_error;
    v1::JobSpec normalized = spec;
    absl::Status valid = NormalizeJobSpec(&normalized);
    if (!valid.ok()) return valid;
    const std::string id = absl::StrCat("job-", ++last_);
    v1::JobStatus& job = jobs[id];
    job.set_job_id(id);
    *job.mutable_spec() = normalized;
    job.set_state(v1::JOB_STATE_QUEUED);
    order.push_back(id);
    return id;
  }
  absl::StatusOr<v1::JobStatus> Status(const std::string& job_id) override {
    auto it = jobs.find(job_id);
    if (it == jobs.end()) return absl::NotFoundError("unknown job");
    return it->second;
  }
  absl::Status Stop(const std::string& job_id,
                    const std::string& reason) override {
    auto it = jobs.find(job_id);
    if (it == jobs.end()) return absl::NotFoundError("unknown job");
    v1::JobStatus& job = it->second;
    if (job.state() == v1::JOB_STATE_COMPLETED ||
        job.state() == v1::JOB_STATE_FAILED) {
      return absl::FailedPreconditionError("ended");
    }
    job.set_state(v1::JOB_STATE_COMPLETED);
    job.set_stop_reason(reason);
    stopped[job_id] = reason;
    return absl::OkStatus();
  }
  std::optional<std::string> FindByName(const std::string& name) override {
    for (const std::string& id : order) {
      if (jobs[id].spec().name() == name) return id;
    }
    return std::nullopt;
  }

  // The test's moves: a group takes the job, an epoch's validation, the end.
  void Validate(const std::string& id, int epoch, double accuracy) {
    v1::JobStatus& job = jobs.at(id);
    job.set_state(v1::JOB_STATE_RUNNING);
    job.set_epochs_done(epoch);
    v1::ValidationRecord* record = job.add_validations();
    record->set_epoch(epoch);
    record->set_val_accuracy(accuracy);
    record->set_val_loss(1 - accuracy);
    (*record->mutable_metrics())["val_accuracy"] = accuracy;
    (*record->mutable_metrics())["val_loss"] = 1 - accuracy;
  }
  void Complete(const std::string& id) {
    jobs.at(id).set_state(v1::JOB_STATE_COMPLETED);
  }
  void Fail(const std::string& id, const std::string& message) {
    jobs.at(id).set_state(v1::JOB_STATE_FAILED);
    jobs.at(id).set_message(message);
  }

  std::map<std::string, v1::JobStatus> jobs;
  std::vector<std::string> order;
  std::map<std::string, std::string> stopped;
  absl::Status submit_error = absl::OkStatus();

 private:
  int last_ = 0;
};

inline v1::StudySpec BaseStudy() {
  v1::StudySpec spec;
  spec.set_name("test");
  v1::JobSpec& base = *spec.mutable_base();
  base.mutable_data()->set_train_images("train-images.gz");
  base.mutable_data()->set_train_labels("train-labels.gz");
  base.set_epochs(4);
  v1::ParameterSpec* lr = spec.add_parameters();
  lr->set_path("optimizer.learning_rate");
  lr->mutable_real()->set_low(1e-4);
  lr->mutable_real()->set_high(1e-1);
  lr->mutable_real()->set_log(true);
  v1::ParameterSpec* batch = spec.add_parameters();
  batch->set_path("batch_size");
  batch->mutable_int_()->set_low(16);
  batch->mutable_int_()->set_high(128);
  batch->mutable_int_()->set_step(16);
  spec.set_sampler("random");
  spec.set_trials(4);
  spec.set_parallelism(2);
  return spec;
}

class StudyTableFixture : public ::testing::Test {
 protected:
  std::unique_ptr<StudyTable> NewTable(const std::string& state_dir = "") {
    StudyTable::Options options;
    options.state_dir = state_dir;
    options.run_thread = false;
    auto table = StudyTable::Create(options, jobs_);
    EXPECT_TRUE(table.ok()) << table.status();
    return std::move(table).value();
  }
  v1::StudyStatus Get(StudyTable& table, const std::string& id) {
    return table.GetStudy(id).value();
  }

  FakeJobs jobs_;
};

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_STUDY_TEST_FAKES_H_
