// JobStore's history files: history.json without the lists plus the
// append-only records.jsonl, read back merged; cut and damaged lines, the
// format written before records.jsonl existed, and the size bounds.
#include "server/core/store/job_store.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
}

v1::EpochRecord Epoch(int epoch, double train_loss) {
  v1::EpochRecord record;
  record.set_epoch(epoch);
  record.set_train_loss(train_loss);
  record.set_samples(1000);
  record.set_updates_applied(7 * epoch);
  return record;
}

v1::ValidationRecord Validation(uint64_t version, double val_loss) {
  v1::ValidationRecord record;
  record.set_version(version);
  record.set_epoch(1);
  record.set_val_loss(val_loss);
  record.set_val_accuracy(1.0 / 3.0);  // not exact in decimal: round trip
  record.set_source("pool v-1");
  record.set_unix_seconds(1700000000.123456);
  (*record.mutable_metrics())["val_mae"] = 0.1;
  return record;
}

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(
        ::testing::TempDir(), "/",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    store_ = JobStore::Open(dir_).value();
    status_.set_job_id(kJob);
    status_.set_state(v1::JOB_STATE_RUNNING);
    status_.set_version(42);
    status_.set_epochs_done(1);
    status_.set_test_loss(0.25);
    ASSERT_TRUE(store_->WriteHistory(kJob, status_).ok());
  }

  // Appends the records that make status_'s lists, as the registry does
  // while a job trains: the master's epoch record, validations, then the
  // epoch record merged with the group's validation.
  void AppendTraining() {
    JobStore::Records first;
    first.epochs.push_back(Epoch(1, 0.9));
    ASSERT_TRUE(store_->AppendRecords(kJob, first).ok());
    for (int i = 0; i < 3; ++i) {
      JobStore::Records one;
      one.validations.push_back(Validation(10 + i, 0.5 - 0.1 * i));
      ASSERT_TRUE(store_->AppendRecords(kJob, one).ok());
    }
    JobStore::Records merged;
    v1::EpochRecord epoch = Epoch(1, 0.9);
    epoch.set_val_loss(0.45);
    epoch.set_group_id("g-1");
    merged.epochs.push_back(epoch);
    merged.validations.push_back(Validation(13, 0.45));
    ASSERT_TRUE(store_->AppendRecords(kJob, merged).ok());
    JobStore::Records second;
    second.epochs.push_back(Epoch(2, 0.7));
    ASSERT_TRUE(store_->AppendRecords(kJob, second).ok());

    *status_.add_history() = epoch;
    *status_.add_history() = Epoch(2, 0.7);
    for (int i = 0; i < 3; ++i) {
      *status_.add_validations() = Validation(10 + i, 0.5 - 0.1 * i);
    }
    *status_.add_validations() = Validation(13, 0.45);
  }

  void ExpectReadsAsStatus() {
    JobStore::HistoryFormat format;
    auto read = store_->ReadHistory(kJob, &format);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(
        google::protobuf::util::MessageDifferencer::Equals(*read, status_))
        << "read:\n"
        << read->DebugString() << "\nwanted:\n"
        << status_.DebugString();
    EXPECT_FALSE(format.torn_tail);
  }

  static constexpr char kJob[] = "job-000001";
  std::string dir_;
  std::unique_ptr<JobStore> store_;
  v1::JobStatus status_;
};

TEST_F(JobStoreTest, AppendedRecordsReadBackAsTheFullStatus) {
  AppendTraining();
  ExpectReadsAsStatus();
  // history.json holds neither list; records.jsonl one line per append.
  const std::string history = ReadFile(store_->HistoryPath(kJob));
  EXPECT_NE(history.find("\"history\": []"), std::string::npos) << history;
  EXPECT_NE(history.find("\"validations\": []"), std::string::npos) << history;
  const std::string records = ReadFile(store_->RecordsPath(kJob));
  EXPECT_EQ(std::count(records.begin(), records.end(), '\n'), 7) << records;
  EXPECT_EQ(records.substr(0, 10), "{\"epoch\":{") << records;

  // A rewrite (reset line plus every record) reads back the same, and so
  // does a history.json rewritten with the full status (lists dropped).
  ASSERT_TRUE(store_->WriteRecords(kJob, status_).ok());
  ASSERT_TRUE(store_->WriteHistory(kJob, status_).ok());
  ExpectReadsAsStatus();
  EXPECT_EQ(ReadFile(store_->RecordsPath(kJob)).substr(0, 15),
            "{\"reset\":true}\n");
  // Appends go on after a rewrite.
  JobStore::Records more;
  more.validations.push_back(Validation(20, 0.3));
  ASSERT_TRUE(store_->AppendRecords(kJob, more).ok());
  *status_.add_validations() = Validation(20, 0.3);
  ExpectReadsAsStatus();
}

TEST_F(JobStoreTest, CutLastLineIsSkipped) {
  AppendTraining();
  const std::string path = store_->RecordsPath(kJob);
  const std::string whole = ReadFile(path);
  const std::string line =
      "{\"validation\":{\"version\":\"99\",\"val_loss\":1}}\n";
  // Cut anywhere inside the line being appended: the rest reads.
  for (size_t cut : {size_t{1}, size_t{20}, line.size() - 1}) {
    WriteFile(path, whole + line.substr(0, cut));
    JobStore::HistoryFormat format;
    auto read = store_->ReadHistory(kJob, &format);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(format.torn_tail);
    EXPECT_TRUE(
        google::protobuf::util::MessageDifferencer::Equals(*read, status_));
    // An append refuses to go on after the cut line (DATA_LOSS), leaving
    // the file as it is; the registry rewrites it instead.
    JobStore::Records more;
    more.validations.push_back(Validation(20, 0.3));
    EXPECT_EQ(store_->AppendRecords(kJob, more).code(),
              absl::StatusCode::kDataLoss);
    EXPECT_EQ(ReadFile(path), whole + line.substr(0, cut));
  }
  // Zeros after a crash (size grown, data not written): also skipped.
  WriteFile(path, whole + std::string(64, '\0') + "\n");
  JobStore::HistoryFormat format;
  ASSERT_TRUE(store_->ReadHistory(kJob, &format).ok());
  EXPECT_TRUE(format.torn_tail);
}

TEST_F(JobStoreTest, DamagedLineInTheMiddleIsDataLoss) {
  AppendTraining();
  const std::string path = store_->RecordsPath(kJob);
  const std::string whole = ReadFile(path);
  const size_t second = whole.find('\n') + 1;
  for (const std::string& bad :
       {std::string("garbage\n"),
        std::string("{\"epoch\":{\"epoch\":\"x\"}}\n"),
        std::string("{\"epoch\":{},\"validation\":{}}\n")}) {
    WriteFile(path, whole.substr(0, second) + bad + whole.substr(second));
    auto read = store_->ReadHistory(kJob);
    ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_NE(read.status().message().find(path + "' line 2"),
              std::string::npos)
        << read.status();
    // history.json alone still reads (the job's state survives).
    auto alone = store_->ReadHistoryStatus(kJob);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(alone->state(), v1::JOB_STATE_RUNNING);
  }
  ASSERT_TRUE(store_->QuarantineRecords(kJob).ok());
  EXPECT_TRUE(std::filesystem::exists(path + ".corrupt"));
  EXPECT_EQ(store_->ReadHistory(kJob)->validations_size(), 0);
}

// A state directory of a master before records.jsonl: history.json holds
// the whole JobStatus, lists included.
TEST_F(JobStoreTest, LegacyHistoryWithListsLoads) {
  AppendTraining();
  const v1::JobStatus full = status_;
  std::filesystem::remove(store_->RecordsPath(kJob));
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  ASSERT_TRUE(
      google::protobuf::util::MessageToJsonString(full, &json, options).ok());
  WriteFile(store_->HistoryPath(kJob), json);
  JobStore::HistoryFormat format;
  auto read = store_->ReadHistory(kJob, &format);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(format.lists_in_history);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*read, full));

  // Records appended to such a directory replay on top of its lists; a
  // rewrite's reset line replaces them (no record counted twice).
  JobStore::Records more;
  more.validations.push_back(Validation(20, 0.3));
  ASSERT_TRUE(store_->AppendRecords(kJob, more).ok());
  EXPECT_EQ(store_->ReadHistory(kJob)->validations_size(), 5);
  ASSERT_TRUE(store_->WriteRecords(kJob, *store_->ReadHistory(kJob)).ok());
  EXPECT_EQ(store_->ReadHistory(kJob)->validations_size(), 5);
  EXPECT_EQ(store_->ReadHistory(kJob)->history_size(), 2);
}

TEST_F(JobStoreTest, OversizedRecordsAreRefusedUnread) {
  AppendTraining();
  const std::string path = store_->RecordsPath(kJob);
  // A line over the bound, complete or cut.
  const std::string whole = ReadFile(path);
  const std::string long_line =
      "{\"validation\":{\"source\":\"" +
      std::string(JobStore::kMaxRecordLineBytes, 'x') + "\"}}";
  for (const std::string& tail : {long_line + "\n", long_line}) {
    WriteFile(path, whole + tail);
    auto read = store_->ReadHistory(kJob);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(read.status().message().find("line 8"), std::string::npos)
        << read.status();
  }
  // A file over the bound is refused by its size (sparse: no disk used).
  WriteFile(path, whole);
  std::filesystem::resize_file(path, JobStore::kMaxRecordsBytes + 1);
  auto read = store_->ReadHistory(kJob);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(read.status().message().find("bytes, over the"), std::string::npos)
      << read.status();
}

TEST_F(JobStoreTest, AppendNeedsTheJobDirectory) {
  // A deleted job's directory is not brought back by a late append.
  JobStore::Records one;
  one.validations.push_back(Validation(1, 0.5));
  EXPECT_FALSE(store_->AppendRecords("job-000009", one).ok());
  EXPECT_FALSE(std::filesystem::exists(store_->JobDir("job-000009")));
  // No history.json: NOT_FOUND, whatever records there are.
  EXPECT_EQ(store_->ReadHistory("job-000009").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mpilearn::server
