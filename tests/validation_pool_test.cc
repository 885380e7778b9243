// End to end: a training group publishes snapshots (every 20 updates and at
// each epoch end) and two validation pools, `mpirun -np 2` and `-np 1`,
// validate them against the real master.
//
// What it proves: the pools' records reach the job's status; the two-rank
// pool, which splits the validation set and reduces the sums over MPI,
// reports the same val_loss and val_accuracy (to 1e-5) as the one-process
// pool on the same weight versions, so the split and the reduction lose and
// double-count nothing; every pool validates the job's final weights (the
// last epoch's snapshot is delivered even though the job ends right after
// it), and its numbers for them match a reference computed here in double
// precision from the master's final weights.
#include <signal.h>

#include <cmath>
#include <map>
#include <string>

#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/client/master_client.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"
#include "worker/data/dataset.h"
#include "worker/model/model.h"

namespace mpilearn::testing {
namespace {

constexpr int64_t kTrainLimit = 6000;  // 4,000 train + 2,000 validation
constexpr int64_t kValidation = 2000;
constexpr int kEpochs = 2;
constexpr double kTolerance = 1e-5;

std::map<uint64_t, v1::ValidationRecord> RecordsFrom(const v1::JobStatus& status,
                                                     const std::string& source) {
  std::map<uint64_t, v1::ValidationRecord> records;
  for (const v1::ValidationRecord& record : status.validations()) {
    if (record.source() == source) records[record.version()] = record;
  }
  return records;
}

struct Reference {
  uint64_t version = 0;
  double loss = 0, accuracy = 0;
};

// The job's current weights on the master, evaluated on the whole
// validation set in double precision (log-softmax and gather, not the
// workers' float cross_entropy).
absl::StatusOr<Reference> ReferenceValidation(MasterClient& client,
                                              const std::string& job_id,
                                              const v1::JobSpec& spec) {
  absl::StatusOr<worker::DatasetSplits> splits = worker::LoadDatasets(spec.data());
  if (!splits.ok()) return splits.status();
  const worker::Dataset& validation = splits->validation;
  absl::StatusOr<worker::Model> model =
      worker::Model::Build(spec.model(), splits->input_shape, splits->num_classes);
  if (!model.ok()) return model.status();
  std::vector<absl::Span<float>> views;
  for (const torch::Tensor& p : model->state()) {
    views.emplace_back(p.data_ptr<float>(), p.numel());
  }
  Reference reference;
  absl::StatusOr<uint64_t> version = client.PullWeights(job_id, "", views);
  if (!version.ok()) return version.status();
  reference.version = *version;
  torch::NoGradGuard no_grad;
  model->module().to(torch::kDouble);
  model->SetTraining(false);
  const torch::Tensor logits = model->Forward(validation.features.to(torch::kDouble));
  const torch::Tensor y = validation.labels;
  reference.loss = -torch::log_softmax(logits, 1)
                        .gather(1, y.unsqueeze(1))
                        .mean()
                        .item<double>();
  reference.accuracy = logits.argmax(1).eq(y).to(torch::kDouble).mean().item<double>();
  return reference;
}

TEST(ValidationPoolTest, PoolsValidateSnapshotsAndAgreeWithOneProcess) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const std::string dir = NewTempDir("validation_pool");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect((*master)->address());
  ASSERT_TRUE(client.ok()) << client.status();

  v1::JobSpec spec = FashionMnistSubset("sync", kTrainLimit, kEpochs);
  spec.mutable_snapshots()->set_every_updates(20);
  spec.set_inband_validation(false);
  auto job_id = (*client)->SubmitJob(spec);
  ASSERT_TRUE(job_id.ok()) << job_id.status();

  // Both pools subscribe before training starts, so both see every
  // snapshot; each leaves 15 s after the last one.
  auto start_pool = [&](int ranks, const std::string& label) {
    return StartWorkers(ranks, (*master)->address(),
                        {"--role=validate", "--jobs=" + *job_id,
                         "--pool_label=" + label, "--exit_when_idle_s=15",
                         "--threads=1"},
                        dir + "/pool_" + label + ".log");
  };
  // One mpirun at a time: Open MPI's session directory setup races when
  // two start at once.
  auto two = start_pool(2, "two");
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(WaitForLog(**two, "waiting for snapshots", absl::Seconds(120)))
      << (*two)->Log();
  auto one = start_pool(1, "one");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(WaitForLog(**one, "waiting for snapshots", absl::Seconds(120)))
      << (*one)->Log();

  // A slightly slowed group (5 ms per batch: 20 updates take >= 100 ms) so
  // the pools, which validate 2,000 samples in tens of ms, keep up and
  // mostly validate the same versions.
  auto group = StartWorkers(1, (*master)->address(),
                            {"--job_id=" + *job_id, "--threads=1",
                             "--slowdown_ms_per_batch=5"},
                            dir + "/group.log");
  ASSERT_TRUE(group.ok()) << group.status();
  const std::optional<int> group_exit = (*group)->Wait(absl::Seconds(300));
  ASSERT_TRUE(group_exit.has_value()) << "group did not finish:\n" << (*group)->Log();
  ASSERT_EQ(*group_exit, 0) << (*group)->Log();

  for (auto* pool : {&*two, &*one}) {
    const std::optional<int> exit_code = (*pool)->Wait(absl::Seconds(120));
    ASSERT_TRUE(exit_code.has_value()) << "pool did not exit when idle:\n"
                                       << (*pool)->Log();
    EXPECT_EQ(*exit_code, 0) << (*pool)->Log();
    EXPECT_TRUE(absl::StrContains((*pool)->Log(), "validated " + *job_id + " v"))
        << (*pool)->Log();
  }

  auto status = (*client)->GetJobStatus(*job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_COMPLETED) << status->message();
  // 125 updates per epoch: 6 every-20 snapshots and one epoch end each.
  EXPECT_GE(status->snapshots_published(), 2u * kEpochs);

  const auto by_two = RecordsFrom(*status, "pool two");
  const auto by_one = RecordsFrom(*status, "pool one");
  ASSERT_FALSE(by_two.empty()) << (*two)->Log();
  ASSERT_FALSE(by_one.empty()) << (*one)->Log();
  for (const auto* records : {&by_two, &by_one}) {
    for (const auto& [version, record] : *records) {
      EXPECT_EQ(record.samples(), kValidation) << "v" << version;
      EXPECT_TRUE(std::isfinite(record.val_loss())) << "v" << version;
      EXPECT_GE(record.val_accuracy(), 0.0);
      EXPECT_LE(record.val_accuracy(), 1.0);
      EXPECT_LE(record.epoch(), kEpochs);
    }
  }

  // Same weights, same numbers, whether split over 2 ranks or not.
  int compared = 0;
  for (const auto& [version, mine] : by_two) {
    auto theirs = by_one.find(version);
    if (theirs == by_one.end()) continue;
    ++compared;
    EXPECT_NEAR(mine.val_loss(), theirs->second.val_loss(), kTolerance)
        << "v" << version;
    EXPECT_NEAR(mine.val_accuracy(), theirs->second.val_accuracy(), kTolerance)
        << "v" << version;
    EXPECT_EQ(mine.epoch(), theirs->second.epoch()) << "v" << version;
  }
  EXPECT_GE(compared, 1);
  RecordProperty("versions_compared", compared);
  RecordProperty("versions_by_two", static_cast<int>(by_two.size()));
  RecordProperty("versions_by_one", static_cast<int>(by_one.size()));

  // The final weights (the last epoch's snapshot) reached both pools, and
  // their numbers match the reference. Accuracy may differ by one sample
  // whose two best logits tie within float rounding.
  absl::StatusOr<Reference> reference =
      ReferenceValidation(**client, *job_id, status->spec());
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_EQ(reference->version, status->version());
  for (const auto* records : {&by_two, &by_one}) {
    auto last = records->find(reference->version);
    ASSERT_NE(last, records->end()) << "final version v" << reference->version;
    EXPECT_EQ(last->second.epoch(), kEpochs);
    EXPECT_NEAR(last->second.val_loss(), reference->loss, kTolerance);
    EXPECT_NEAR(last->second.val_accuracy(), reference->accuracy,
                1.0 / kValidation + 1e-9);
    // A trained model, well above chance (0.1) on held-out data.
    EXPECT_GT(last->second.val_accuracy(), 0.6);
  }
}

// A pool leaves cleanly on SIGTERM; a master shutting down ends an open
// snapshot stream itself with UNAVAILABLE "the master is shutting down" (it
// does not leave the stream to be cancelled at the end of its 5 s grace
// period), and the pool then exits with that reason. How long the shutdown
// takes depends on the machine, so no duration is asserted.
TEST(ValidationPoolTest, SigtermStopsAPoolAndAPoolGivesUpOnAGoneMaster) {
  const std::string dir = NewTempDir("validation_pool_stop");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  // The orphan tries to subscribe again for 3 s after the master is gone.
  auto start_pool = [&](int ranks, const std::string& label) {
    return StartWorkers(ranks, (*master)->address(),
                        {"--role=validate", "--pool_label=" + label, "--threads=1",
                         "--reconnect_timeout_s=3"},
                        dir + "/pool_" + label + ".log");
  };
  // One mpirun at a time (see above).
  auto stopped = start_pool(2, "sigterm");
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  ASSERT_TRUE(WaitForLog(**stopped, "waiting for snapshots", absl::Seconds(120)))
      << (*stopped)->Log();
  auto orphan = start_pool(1, "orphan");
  ASSERT_TRUE(orphan.ok()) << orphan.status();
  ASSERT_TRUE(WaitForLog(**orphan, "waiting for snapshots", absl::Seconds(120)))
      << (*orphan)->Log();

  // SIGTERM to every rank, as a batch system stopping the job would send.
  int ranks_signalled = 0;
  for (pid_t pid : (*stopped)->Descendants()) {
    if (absl::StrContains(CommandLine(pid), "mpilearn-worker")) {
      kill(pid, SIGTERM);
      ++ranks_signalled;
    }
  }
  EXPECT_EQ(ranks_signalled, 2);
  const std::optional<int> stopped_exit = (*stopped)->Wait(absl::Seconds(60));
  ASSERT_TRUE(stopped_exit.has_value()) << (*stopped)->Log();
  EXPECT_EQ(*stopped_exit, 0) << (*stopped)->Log();
  EXPECT_TRUE(absl::StrContains((*stopped)->Log(), "pool sigterm: validated 0"))
      << (*stopped)->Log();

  kill((*master)->process().pid(), SIGTERM);
  const std::optional<int> master_exit =
      (*master)->process().Wait(absl::Seconds(30));
  ASSERT_TRUE(master_exit.has_value()) << (*master)->process().Log();
  EXPECT_EQ(*master_exit, 0) << (*master)->process().Log();
  const std::optional<int> orphan_exit = (*orphan)->Wait(absl::Seconds(60));
  ASSERT_TRUE(orphan_exit.has_value()) << (*orphan)->Log();
  EXPECT_EQ(*orphan_exit, 1) << (*orphan)->Log();
  EXPECT_TRUE(absl::StrContains((*orphan)->Log(), "shutting down"))
      << (*orphan)->Log();
  EXPECT_TRUE(absl::StrContains((*orphan)->Log(), "could not subscribe again"))
      << (*orphan)->Log();
}

// A pool outlives a master restart: it subscribes again to the new master
// (same address and state directory) and validates the snapshots of a job
// trained after the restart.
TEST(ValidationPoolTest, PoolRidesOutAMasterRestart) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const std::string dir = NewTempDir("validation_pool_restart");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string address = (*master)->address();
  const std::string port = address.substr(address.rfind(':') + 1);
  auto pool = StartWorkers(1, address,
                           {"--role=validate", "--pool_label=survivor",
                            "--threads=1", "--reconnect_timeout_s=120"},
                           dir + "/pool.log");
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_TRUE(WaitForLog(**pool, "waiting for snapshots", absl::Seconds(120)))
      << (*pool)->Log();

  kill((*master)->process().pid(), SIGTERM);
  const std::optional<int> master_exit = (*master)->process().Wait(absl::Seconds(30));
  ASSERT_TRUE(master_exit.has_value()) << (*master)->process().Log();
  ASSERT_TRUE(WaitForLog(**pool, "subscribing again", absl::Seconds(30)))
      << (*pool)->Log();
  auto restarted = MasterProcess::Start(dir, {"--listen=127.0.0.1:" + port});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(WaitForLog(**pool, "subscribed again", absl::Seconds(60)))
      << (*pool)->Log();

  auto client = MasterClient::Connect((*restarted)->address());
  ASSERT_TRUE(client.ok()) << client.status();
  v1::JobSpec spec = FashionMnistSubset("sync", 3000, 1);
  spec.mutable_snapshots()->set_every_updates(10);
  spec.mutable_snapshots()->set_at_epoch_end(true);
  spec.set_inband_validation(false);
  auto job_id = (*client)->SubmitJob(spec);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto group = StartWorkers(1, (*restarted)->address(),
                            {"--job_id=" + *job_id, "--threads=1"},
                            dir + "/group.log");
  ASSERT_TRUE(group.ok()) << group.status();
  const std::optional<int> group_exit = (*group)->Wait(absl::Seconds(300));
  ASSERT_TRUE(group_exit.has_value()) << (*group)->Log();
  ASSERT_EQ(*group_exit, 0) << (*group)->Log();

  // The final snapshot's record arrives shortly after the group leaves.
  size_t records = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && records == 0) {
    auto status = (*client)->GetJobStatus(*job_id);
    ASSERT_TRUE(status.ok()) << status.status();
    records = RecordsFrom(*status, "pool survivor").size();
    if (records == 0) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_GT(records, 0u) << (*pool)->Log();

  for (pid_t pid : (*pool)->Descendants()) {
    if (absl::StrContains(CommandLine(pid), "mpilearn-worker")) kill(pid, SIGTERM);
  }
  const std::optional<int> pool_exit = (*pool)->Wait(absl::Seconds(60));
  ASSERT_TRUE(pool_exit.has_value()) << (*pool)->Log();
  EXPECT_EQ(*pool_exit, 0) << (*pool)->Log();
}

}  // namespace
}  // namespace mpilearn::testing
