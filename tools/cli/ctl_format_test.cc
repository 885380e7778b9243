// The exact text mpilearnctl prints for hand-built statuses: the expected
// strings below are written out column by column, so a change in alignment,
// a section or a number's format shows up as a diff.
#include "tools/cli/ctl_format.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TextTableTest, ColumnsAlignWithTwoBlanksAndNoTrailingBlanks) {
  TextTable table({"A", "LONGER", "C"});
  table.AddRow({"xxxx", "y", ""});  // empty last cell: no padding left
  table.AddRow({"z"});              // shorter than the header
  EXPECT_EQ(table.Format("  "),
            "  A     LONGER  C\n"
            "  xxxx  y\n"
            "  z\n");
  EXPECT_EQ(TextTable({"ONLY"}).Format(), "ONLY\n");
}

TEST(StateNameTest, DropsThePrefix) {
  EXPECT_EQ(StateName(v1::JOB_STATE_RUNNING), "RUNNING");
  EXPECT_EQ(StateName(v1::JOB_STATE_COMPLETED), "COMPLETED");
}

TEST(FormatJobListTest, OneRowPerJob) {
  std::vector<v1::JobStatus> jobs(2);
  jobs[0].set_job_id("job-000001");
  jobs[0].set_state(v1::JOB_STATE_RUNNING);
  jobs[0].mutable_spec()->set_name("fm");
  jobs[0].mutable_spec()->mutable_model()->set_name("mlp");
  jobs[0].mutable_spec()->set_algorithm("downpour");
  jobs[0].mutable_spec()->set_epochs(10);
  jobs[0].set_epochs_done(3);
  jobs[0].set_updates_applied(120);
  jobs[1].set_job_id("job-000002");
  jobs[1].set_state(v1::JOB_STATE_COMPLETED);
  jobs[1].mutable_spec()->mutable_model()->set_name("cnn");
  jobs[1].mutable_spec()->set_algorithm("easgd");
  jobs[1].mutable_spec()->set_epochs(2);
  jobs[1].set_epochs_done(2);
  jobs[1].set_updates_applied(7);
  jobs[1].set_test_accuracy(0.87654);
  jobs[1].mutable_spec()->set_owner("alice");
  EXPECT_EQ(
      FormatJobList(jobs),
      "JOB         STATE      OWNER  NAME  MODEL  ALGORITHM  EPOCHS  UPDATES  TEST_ACC\n"
      "job-000001  RUNNING    -      fm    mlp    downpour   3/10    120      -\n"
      "job-000002  COMPLETED  alice  -     cnn    easgd      2/2     7        0.8765\n");
  EXPECT_EQ(FormatJobList({}),
            "JOB  STATE  OWNER  NAME  MODEL  ALGORITHM  EPOCHS  UPDATES  TEST_ACC\n");
}

v1::JobStatus QueuedJob(const std::string& id, int position,
                        const std::string& owner) {
  v1::JobStatus job;
  job.set_job_id(id);
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_queue_position(position);
  job.mutable_spec()->set_owner(owner);
  return job;
}

TEST(QueuedInOrderTest, QueuedJobsByPositionUnknownPositionsLast) {
  std::vector<v1::JobStatus> jobs = {
      QueuedJob("job-000001", 3, "alice"), QueuedJob("job-000002", 0, "bob"),
      QueuedJob("job-000003", 1, "carol"), QueuedJob("job-000004", 0, "dan"),
      QueuedJob("job-000005", 2, "erin")};
  jobs.push_back(QueuedJob("job-000006", 0, "frank"));
  jobs.back().set_state(v1::JOB_STATE_RUNNING);  // not queued: left out
  std::vector<std::string> ids;
  for (const v1::JobStatus& job : QueuedInOrder(jobs)) {
    ids.push_back(job.job_id());
  }
  EXPECT_THAT(ids, ::testing::ElementsAre("job-000003", "job-000005",
                                          "job-000001", "job-000002",
                                          "job-000004"));
  EXPECT_TRUE(QueuedInOrder({}).empty());
}

TEST(FormatQueueTest, PositionOwnerPriorityStudyName) {
  std::vector<v1::JobStatus> queued = {QueuedJob("job-000004", 1, "alice"),
                                       QueuedJob("job-000002", 2, ""),
                                       QueuedJob("job-000007", 0, "bob")};
  queued[0].mutable_spec()->set_priority(10);
  queued[0].mutable_spec()->set_name("urgent");
  queued[1].mutable_spec()->set_priority(-5);
  queued[2].mutable_spec()->set_study("s-3");
  queued[2].mutable_spec()->set_name("trial-0");
  EXPECT_EQ(FormatQueue(queued),
            "POS  JOB         OWNER  PRIORITY  STUDY  NAME\n"
            "1    job-000004  alice  10        -      urgent\n"
            "2    job-000002  -      -5        -      -\n"
            "-    job-000007  bob    0         s-3    trial-0\n");
}

TEST(FormatQueueTest, NoteColumnOnlyWhenAJobHasOne) {
  std::vector<v1::JobStatus> queued = {QueuedJob("job-000001", 1, "alice"),
                                       QueuedJob("job-000002", 2, "bob")};
  queued[1].set_queue_note("owner bob holds 2 groups, its limit");
  EXPECT_EQ(FormatQueue(queued),
            "POS  JOB         OWNER  PRIORITY  STUDY  NAME  NOTE\n"
            "1    job-000001  alice  0         -      -\n"
            "2    job-000002  bob    0         -      -     owner bob holds 2 "
            "groups, its limit\n");
  EXPECT_EQ(FormatQueue({}), "POS  JOB  OWNER  PRIORITY  STUDY  NAME\n");
}

TEST(SameMajorMinorTest, OnlyMajorAndMinorCount) {
  struct Case {
    const char* master;
    bool same;  // with a client of 0.10.0
  };
  for (const Case& c : std::vector<Case>{
           {"0.10.0", true},
           {"0.10.7", true},
           {"0.10", true},
           {"0.10.0-rc1", true},
           {"0.010.2", true},  // numbers, not text
           {"0.9.1", false},
           {"0.1.0", false},  // not a prefix match
           {"1.10.0", false},
           {"", false},
           {"0", false},
           {"dev", false},
           {"0.x.1", false},
           {"-0.10.0", false},
           {"0.10rc1", false},
       }) {
    EXPECT_EQ(SameMajorMinor("0.10.0", c.master), c.same) << c.master;
  }
  EXPECT_FALSE(SameMajorMinor("", ""));  // nothing to go by
}

TEST(FormatVersionsTest, ClientMasterAndCaller) {
  v1::ServerInfo info;
  info.set_version("0.10.2");
  info.set_caller("alice");
  info.set_role("owner");
  EXPECT_EQ(FormatVersions("0.10.0", info, "10.0.0.5:7070"),
            "client  0.10.0 (mpilearnctl)\n"
            "master  0.10.2 at 10.0.0.5:7070\n"
            "caller  alice (role owner)\n");
  // A master without tokens: no name, every caller an admin.
  info.clear_caller();
  info.set_role("admin");
  EXPECT_THAT(FormatVersions("0.10.0", info, "h:1"),
              HasSubstr("caller  - (role admin)\n"));
}

TEST(VersionMismatchMessageTest, NamesBothVersionsAndWhatToDo) {
  const std::string message =
      VersionMismatchMessage("0.10.0", "0.9.1", "10.0.0.5:7070");
  EXPECT_THAT(message, HasSubstr("this mpilearnctl is 0.10.0 and the master "
                                 "at 10.0.0.5:7070 runs 0.9.1"));
  EXPECT_THAT(message,
              HasSubstr("use the mpilearnctl built with the master"));
  EXPECT_THAT(VersionMismatchMessage("0.10.0", "", "h:1"),
              HasSubstr("the master at h:1 predates 0.10"));
}

TEST(FormatJobsTableTest, LatestValuesProgressAndAliveGroups) {
  std::vector<v1::JobStatus> jobs(3);
  // Running: live train loss, latest validation, two alive groups of two
  // ranks and a dead one that does not count.
  v1::JobStatus& running = jobs[0];
  running.set_job_id("job-000001");
  running.set_state(v1::JOB_STATE_RUNNING);
  running.mutable_spec()->set_name("fm");
  running.mutable_spec()->set_epochs(10);
  running.set_epochs_done(4);
  running.set_samples_per_epoch(1000);
  running.set_samples_trained(4000);
  running.add_history()->set_samples_per_second(999);
  running.add_history()->set_samples_per_second(1234.6);
  running.set_train_loss(0.51234);
  running.add_validations()->set_val_accuracy(0.8);
  running.add_validations()->set_val_accuracy(0.9);
  for (const auto& [ranks, alive] :
       std::vector<std::pair<int, bool>>{{2, true}, {2, true}, {3, false}}) {
    v1::GroupInfo* group = running.add_groups();
    group->set_ranks(ranks);
    group->set_alive(alive);
  }
  // Queued: nothing known yet.
  jobs[1].set_job_id("job-000002");
  jobs[1].set_state(v1::JOB_STATE_QUEUED);
  jobs[1].mutable_spec()->set_epochs(5);
  // Completed: trained past its nominal samples (progress stops at 100%),
  // loss from the last epoch, which carries no validation.
  v1::JobStatus& completed = jobs[2];
  completed.set_job_id("job-000003");
  completed.set_state(v1::JOB_STATE_COMPLETED);
  completed.mutable_spec()->set_epochs(1);
  completed.set_epochs_done(1);
  completed.set_samples_per_epoch(100);
  completed.set_samples_trained(150);
  v1::EpochRecord* epoch = completed.add_history();
  epoch->set_train_loss(0.7);
  epoch->set_samples_per_second(80.4);
  completed.set_test_accuracy(0.6);
  v1::GroupInfo* group = completed.add_groups();
  group->set_ranks(1);
  group->set_alive(true);

  EXPECT_EQ(FormatJobsTable(jobs),
            "JOB         NAME  STATE      EPOCH  PROGRESS  SAMPLES/S  LOSS    "
            "VAL_ACC  TEST_ACC  GROUPS\n"
            "job-000001  fm    RUNNING    4/10   40.0%     1235       0.5123  "
            "0.9000   -         2 (4 ranks)\n"
            "job-000002  -     QUEUED     0/5    -         -          -       "
            "-        -         0\n"
            "job-000003  -     COMPLETED  1/1    100.0%    80         0.7000  "
            "-        0.6000    1 (1 rank)\n");
}

// A job with every optional field set, more validations than are shown, a
// group with telemetry and one without, and an epoch without validation.
v1::JobStatus FullStatus() {
  v1::JobStatus job;
  job.set_job_id("job-000042");
  v1::JobSpec& spec = *job.mutable_spec();
  spec.set_name("fashion");
  spec.set_algorithm("easgd");
  spec.mutable_model()->set_name("cnn");
  spec.mutable_model()->add_channels(16);
  spec.mutable_model()->add_channels(32);
  spec.mutable_model()->set_dense(128);
  spec.mutable_easgd()->set_alpha(0.5);
  spec.mutable_easgd()->mutable_worker_optimizer()->set_name("sgd");
  spec.mutable_easgd()->mutable_worker_optimizer()->set_learning_rate(0.05);
  spec.mutable_easgd()->mutable_worker_optimizer()->set_momentum(0.9);
  spec.set_batch_size(64);
  spec.set_sync_every(2);
  spec.set_epochs(3);
  spec.set_max_staleness(4);
  spec.mutable_checkpoint()->set_best_metric("val_accuracy");
  job.set_state(v1::JOB_STATE_COMPLETED);
  job.set_stop_reason("target reached");
  job.set_epochs_done(2);
  job.set_samples_per_epoch(60000);
  job.set_samples_trained(120000);
  job.set_version(812);
  job.set_updates_applied(800);
  job.set_units_requeued(3);
  job.set_parameters(101770);
  job.set_mean_staleness(1.234);
  job.set_max_staleness_seen(5);
  job.set_stale_rejected(2);
  job.set_snapshots_published(9);
  job.set_snapshots_skipped(1);
  job.set_checkpoint_version(800);
  job.set_best_metric_value(0.88126);
  job.set_test_loss(0.35);
  job.set_test_accuracy(0.875);

  v1::GroupInfo* g1 = job.add_groups();
  g1->set_group_id("g-1");
  g1->set_ranks(2);
  g1->set_host("node-a");
  g1->set_alive(true);
  g1->set_seconds_since_seen(0.3);
  g1->set_units_completed(12);
  g1->set_samples_trained(24000);
  g1->set_updates_applied(400);
  g1->mutable_telemetry()->set_data_seconds(1);
  g1->mutable_telemetry()->set_compute_seconds(6);
  g1->mutable_telemetry()->set_master_seconds(2);
  g1->mutable_telemetry()->set_mpi_seconds(1);
  v1::GroupInfo* g2 = job.add_groups();
  g2->set_group_id("g-2");
  g2->set_ranks(1);
  g2->set_seconds_since_seen(42.04);

  v1::EpochRecord* e1 = job.add_history();
  e1->set_epoch(1);
  e1->set_train_loss(0.52);
  e1->set_val_loss(0.41);
  e1->set_val_accuracy(0.85);
  e1->set_samples_per_second(2345.4);
  e1->set_wall_seconds(25.56);
  v1::EpochRecord* e2 = job.add_history();
  e2->set_epoch(2);
  e2->set_train_loss(0.31);
  e2->set_samples_per_second(2400.6);
  e2->set_wall_seconds(25);

  struct Validation {
    int epoch;
    double loss, accuracy;
    const char* source;
  };
  const Validation validations[] = {
      {0, 0.49, 0.81, "group g-1"}, {0, 0.48, 0.82, "group g-1"},
      {0, 0.47, 0.83, "group g-1"}, {1, 0.46, 0.84, ""},
      {1, 0.45, 0.85, "pool v-1"},  {1, 0.44, 0.86, ""},
      {2, 0.43, 0.87, "group g-1"},
  };
  int version = 100;
  for (const Validation& v : validations) {
    v1::ValidationRecord* record = job.add_validations();
    record->set_version(version);
    record->set_epoch(v.epoch);
    record->set_val_loss(v.loss);
    record->set_val_accuracy(v.accuracy);
    record->set_source(v.source);
    version += 100;
  }
  return job;
}

// Streamed data's counters appear only when there is something to say.
TEST(FormatJobStatusTest, DataProblemsWhenThereAreAny) {
  v1::JobStatus job = FullStatus();
  EXPECT_EQ(FormatJobStatus(job).find("rows skipped"), std::string::npos);
  job.set_samples_skipped(6);
  job.set_unit_failures(1);
  job.set_last_data_error("data.train_files: 'a.h5' is gone");
  const std::string text = FormatJobStatus(job);
  EXPECT_NE(text.find(" 6 rows skipped (NaN or infinite), 1 unit reads failed\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nlast_data_error  data.train_files: 'a.h5' is gone\n"),
            std::string::npos)
      << text;
}

// Unwritten records are shown only while there are any.
TEST(FormatJobStatusTest, StorageErrorWhenThereIsOne) {
  v1::JobStatus job = FullStatus();
  EXPECT_EQ(FormatJobStatus(job).find("storage_error"), std::string::npos);
  job.set_storage_error("history.json not written since 01:02:03 UTC: disk full; retrying");
  const std::string text = FormatJobStatus(job);
  EXPECT_NE(text.find("\nstorage_error  history.json not written since 01:02:03 "
                      "UTC: disk full; retrying\n"),
            std::string::npos)
      << text;
}

// A sharded job lists its shards between the groups and the epochs.
TEST(FormatJobStatusTest, ShardsOfAShardedJob) {
  v1::JobStatus job = FullStatus();
  EXPECT_EQ(FormatJobStatus(job).find("SHARDS"), std::string::npos);
  for (int s = 0; s < 2; ++s) {
    v1::ShardSliceStatus* slice = job.add_shards();
    slice->set_shard(s);
    slice->set_shards(2);
    slice->set_address(absl::StrCat("10.0.0.", s + 2, ":7070"));
    slice->set_state(v1::JOB_STATE_RUNNING);
    slice->set_parameters(117573);
    slice->set_version(40 + s);
    slice->set_updates_applied(40 + s);
    slice->set_seconds_since_seen(0.5);
  }
  const std::string text = FormatJobStatus(job);
  EXPECT_NE(text.find("SHARDS\n"
                      "  SHARD  ADDRESS        STATE    PARAMETERS  VERSION  UPDATES  STALE  SEEN\n"
                      "  0/2    10.0.0.2:7070  RUNNING  117573      40       40       0      0.5s\n"
                      "  1/2    10.0.0.3:7070  RUNNING  117573      41       41       0      0.5s\n"
                      "\nEPOCHS"),
            std::string::npos)
      << text;
  job.set_shard_set_version(40);
  EXPECT_NE(FormatJobStatus(job).find("  1/2    10.0.0.3:7070  RUNNING  117573      41       41"
                                      "       0      0.5s\n"
                                      "  restore set: the shards' checkpoints of version 40\n"
                                      "\nEPOCHS"),
            std::string::npos);
}

TEST(FormatJobStatusTest, SummaryAndEverySection) {
  EXPECT_EQ(
      FormatJobStatus(FullStatus()),
      "job            job-000042\n"
      "name           fashion\n"
      "state          COMPLETED\n"
      "stop_reason    target reached\n"
      "algorithm      easgd\n"
      "model          cnn (channels 16,32, dense 128)\n"
      "optimizer      elastic averaging (alpha 0.5); ranks step with sgd (lr "
      "0.05, momentum 0.9)\n"
      "batch          64 per rank, sync every 2 batches\n"
      "epochs         2/3\n"
      "progress       66.7% (120000 of 180000 samples)\n"
      "train_loss     0.3100\n"
      "version        812\n"
      "updates        800 applied, 3 units requeued\n"
      "parameters     101770\n"
      "staleness      mean 1.23, max 5, rejected 2 (max_staleness 4)\n"
      "snapshots      9 published, 1 skipped\n"
      "checkpoint     version 800\n"
      "best           val_accuracy 0.8813\n"
      "test_loss      0.3500\n"
      "test_accuracy  0.8750\n"
      "\n"
      "GROUPS\n"
      "  GROUP  RANKS  HOST    ALIVE  SEEN   UNITS  SAMPLES  UPDATES  DATA%  "
      "COMPUTE%  MASTER%  MPI%\n"
      "  g-1    2      node-a  yes    0.3s   12     24000    400      10.0   "
      "60.0      20.0     10.0\n"
      "  g-2    1      -       no     42.0s  0      0        0        -      "
      "-         -        -\n"
      "\n"
      "EPOCHS\n"
      "  EPOCH  TRAIN_LOSS  VAL_LOSS  VAL_ACC  SAMPLES/S  SECONDS\n"
      "  1      0.5200      0.4100    0.8500   2345       25.6\n"
      "  2      0.3100      -         -        2401       25.0\n"
      "\n"
      "VALIDATIONS (last 5 of 7)\n"
      "  VERSION  EPOCH  VAL_LOSS  VAL_ACC  SOURCE\n"
      "  300      0      0.4700    0.8300   group g-1\n"
      "  400      1      0.4600    0.8400   -\n"
      "  500      1      0.4500    0.8500   pool v-1\n"
      "  600      1      0.4400    0.8600   -\n"
      "  700      2      0.4300    0.8700   group g-1\n");
}

TEST(FormatJobStatusTest, NewJobShowsEmptySections) {
  v1::JobStatus job;
  job.set_job_id("job-000007");
  job.set_state(v1::JOB_STATE_QUEUED);
  v1::JobSpec& spec = *job.mutable_spec();
  spec.set_algorithm("downpour");
  spec.mutable_model()->set_name("mlp");
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_learning_rate(0.001);
  spec.set_batch_size(32);
  spec.set_sync_every(1);
  spec.set_epochs(5);
  EXPECT_EQ(FormatJobStatus(job),
            "job         job-000007\n"
            "state       QUEUED\n"
            "algorithm   downpour\n"
            "model       mlp\n"
            "optimizer   adam (lr 0.001)\n"
            "batch       32 per rank, sync every 1 batch\n"
            "epochs      0/5\n"
            "progress    0 samples trained (samples per epoch not known until "
            "a group asks for data)\n"
            "train_loss  -\n"
            "version     0\n"
            "updates     0 applied, 0 units requeued\n"
            "parameters  0\n"
            "staleness   mean 0.00, max 0, rejected 0\n"
            "snapshots   0 published, 0 skipped\n"
            "checkpoint  none yet\n"
            "\n"
            "GROUPS\n"
            "  none\n"
            "\n"
            "EPOCHS\n"
            "  none completed yet\n"
            "\n"
            "VALIDATIONS\n"
            "  none yet\n");
}

TEST(FormatJobStatusTest, OptimizerAndModelTextPerAlgorithm) {
  v1::JobStatus job;
  v1::JobSpec& spec = *job.mutable_spec();
  spec.set_algorithm("gem");
  spec.mutable_gem()->set_learning_rate(0.01);
  spec.mutable_gem()->set_momentum(0.9);
  spec.mutable_gem()->set_kappa(2);
  spec.mutable_model()->set_name("mlp");
  spec.mutable_model()->add_hidden(256);
  spec.mutable_model()->add_hidden(128);
  const std::string text = FormatJobStatus(job);
  EXPECT_THAT(text, HasSubstr("\noptimizer   gradient energy matching (lr "
                              "0.01, momentum 0.9, kappa 2)\n"));
  EXPECT_THAT(text, HasSubstr("\nmodel       mlp (hidden 256,128)\n"));
  // Exactly as many validations as shown: no "(last N of M)".
  for (int i = 0; i < kValidationsShown; ++i) job.add_validations();
  EXPECT_THAT(FormatJobStatus(job), HasSubstr("\nVALIDATIONS\n  VERSION"));
  EXPECT_THAT(FormatJobStatus(job), Not(HasSubstr("last")));
}

// A regression job's tables show val_mae (from the records' metrics) where a
// classification job's show val_accuracy.
TEST(FormatJobStatusTest, RegressionJobShowsValMae) {
  v1::JobStatus job;
  job.set_job_id("job-000009");
  job.set_state(v1::JOB_STATE_RUNNING);
  v1::JobSpec& spec = *job.mutable_spec();
  spec.set_loss("huber");
  spec.mutable_model()->set_name("lstm");
  spec.mutable_model()->add_recurrent(32);
  spec.mutable_model()->add_recurrent(16);
  spec.mutable_model()->set_dense(8);
  spec.set_epochs(4);
  v1::EpochRecord* e1 = job.add_history();
  e1->set_epoch(1);
  e1->set_train_loss(0.9);
  e1->set_val_loss(0.75);
  (*e1->mutable_metrics())["val_loss"] = 0.75;
  (*e1->mutable_metrics())["val_mae"] = 0.625;
  (*e1->mutable_metrics())["val_mse"] = 1.5;
  e1->set_samples_per_second(100);
  e1->set_wall_seconds(3);
  v1::ValidationRecord* first = job.add_validations();
  first->set_version(10);
  first->set_epoch(1);
  first->set_val_loss(0.75);
  (*first->mutable_metrics())["val_mae"] = 0.625;
  v1::ValidationRecord* second = job.add_validations();  // no val_mae
  second->set_version(20);
  second->set_epoch(1);
  second->set_val_loss(0.5);
  second->set_source("pool v-1");
  const std::string text = FormatJobStatus(job);
  EXPECT_THAT(text,
              HasSubstr("\nmodel       lstm (recurrent 32,16, dense 8)\n"));
  EXPECT_THAT(text, HasSubstr("EPOCHS\n"
                              "  EPOCH  TRAIN_LOSS  VAL_LOSS  VAL_MAE  "
                              "SAMPLES/S  SECONDS\n"
                              "  1      0.9000      0.7500    0.6250   100"
                              "        3.0\n"));
  EXPECT_THAT(text, HasSubstr("VALIDATIONS\n"
                              "  VERSION  EPOCH  VAL_LOSS  VAL_MAE  SOURCE\n"
                              "  10       1      0.7500    0.6250   -\n"
                              "  20       1      0.5000    -        "
                              "pool v-1\n"));
  EXPECT_THAT(text, Not(HasSubstr("VAL_ACC")));

  // `status`: VAL_MAE when every job is a regression job, VAL_ACC/MAE with
  // each row's own metric when they are mixed.
  job.mutable_validations()->RemoveLast();
  v1::JobStatus classification;
  classification.set_job_id("job-000010");
  classification.set_state(v1::JOB_STATE_RUNNING);
  classification.mutable_spec()->set_epochs(1);
  classification.add_validations()->set_val_accuracy(0.5);
  std::vector<v1::JobStatus> jobs = {job};
  EXPECT_THAT(FormatJobsTable(jobs), HasSubstr("  LOSS    VAL_MAE  TEST_ACC"));
  EXPECT_THAT(FormatJobsTable(jobs), HasSubstr("  0.9000  0.6250   -"));
  jobs.push_back(classification);
  EXPECT_EQ(FormatJobsTable(jobs),
            "JOB         NAME  STATE    EPOCH  PROGRESS  SAMPLES/S  LOSS    "
            "VAL_ACC/MAE  TEST_ACC  GROUPS\n"
            "job-000009  -     RUNNING  0/4    -         100        0.9000  "
            "0.6250       -         0\n"
            "job-000010  -     RUNNING  0/1    -         -          -       "
            "0.5000       -         0\n");
}

TEST(FormatJobStatusTest, ModelTextForEveryModel) {
  v1::JobStatus job;
  v1::ModelSpec& model = *job.mutable_spec()->mutable_model();
  model.set_name("cnn1d");
  model.add_channels(8);
  model.set_dense(0);
  EXPECT_THAT(FormatJobStatus(job),
              HasSubstr("\nmodel       cnn1d (channels 8, dense 0)\n"));
  model.Clear();
  model.set_name("torchscript");
  model.set_torchscript("/models/net.pt");
  EXPECT_THAT(FormatJobStatus(job),
              HasSubstr("\nmodel       torchscript (/models/net.pt)\n"));
}

}  // namespace
}  // namespace mpilearn::ctl
