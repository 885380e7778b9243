// End to end with the users' own data files, streamed: Fashion-MNIST
// converted to HDF5 in the test (tools/data/convert_data) trains on 2 ranks to
// the accuracy it reaches from IDX; the units of a multi-file epoch are
// trained exactly once across two groups (every rank's rows, from the
// groups' traces); a data set much larger than a rank's memory budget trains
// with each rank's peak RSS bounded; bad files end their job FAILED with a
// message naming the file while the master serves on.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/client/master_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kFashion[] = "/usr/share/datasets/fashion-mnist/";

int RunCommand(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class DataFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) {
      GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
    }
    dir_ = NewTempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto master = MasterProcess::Start(dir_);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = *std::move(master);
    auto client = MasterClient::Connect(master_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // Converts an IDX pair to HDF5 with tools/data/convert_data.
  void Convert(const std::string& features, const std::string& labels,
               const std::string& out, const std::string& flags) {
    ASSERT_EQ(RunCommand(absl::StrCat(Runfile("tools/data/convert_data"), " --features ",
                               features, " --labels ", labels, " --out ", out,
                               " ", flags, " >>", dir_, "/convert.log 2>&1")),
              0)
        << ReadFileOrDie(dir_ + "/convert.log");
  }

  // Writes an HDF5 file of `rows` float32 rows of `width` Gaussian features
  // (seeded) and class labels 0-3 from the signs of the first two features,
  // with Debian's python3-h5py; the rows in `nan_rows` get a NaN feature.
  // `labels` (Python, of x) replaces the class labels, e.g. with float
  // regression targets.
  void WriteHdf5(const std::string& path, int64_t rows, int64_t width, int seed,
                 const std::vector<int64_t>& nan_rows = {},
                 const std::string& labels =
                     "(x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0)") {
    const std::string script = absl::StrCat(
        "import h5py, numpy as np\n"
        "rng = np.random.default_rng(", seed, ")\n"
        "x = rng.standard_normal((", rows, ", ", width, "), dtype=np.float32)\n"
        "y = ", labels, "\n"
        "x[[", absl::StrJoin(nan_rows, ", "), "], -1] = np.nan\n"
        "with h5py.File('", path, "', 'w') as f:\n"
        "    f['features'] = x\n"
        "    f['labels'] = y\n");
    WriteFileOrDie(dir_ + "/write.py", script);
    ASSERT_EQ(RunCommand(absl::StrCat("/usr/bin/python3 ", dir_, "/write.py >>",
                                      dir_, "/write.log 2>&1")),
              0)
        << ReadFileOrDie(dir_ + "/write.log");
  }

  // part0.h5, part1.h5 and part2.h5 of 3000, 1000 and 4100 rows of 16
  // features; their paths.
  std::vector<std::string> WriteParts() {
    const std::vector<int64_t> file_rows = {3000, 1000, 4100};
    std::vector<std::string> paths;
    for (size_t i = 0; i < file_rows.size(); ++i) {
      paths.push_back(absl::StrCat(dir_, "/part", i, ".h5"));
      WriteHdf5(paths.back(), file_rows[i], 16, static_cast<int>(i) + 1);
    }
    return paths;
  }

  // A job on the files at `paths` (MLP, downpour, 1 thread per rank).
  static v1::JobSpec FilesSpec(const std::vector<std::string>& paths,
                               int64_t validation_count, int epochs) {
    v1::JobSpec spec;
    spec.set_name("streamed");
    for (const std::string& path : paths) spec.mutable_data()->add_train_files(path);
    spec.mutable_data()->set_validation_count(validation_count);
    spec.mutable_model()->set_name("mlp");
    spec.mutable_model()->add_hidden(32);
    spec.set_algorithm("downpour");
    spec.set_epochs(epochs);
    spec.set_batch_size(50);
    spec.set_data_unit_size(500);
    return spec;
  }

  // Runs `spec` on `ranks` workers to the end (RunJobToEnd).
  JobRun Train(const v1::JobSpec& spec, int ranks) {
    absl::StatusOr<JobRun> run =
        RunJobToEnd(*client_, master_->address(), spec, ranks, dir_);
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? *std::move(run) : JobRun();
  }

  std::string dir_;
  std::unique_ptr<MasterProcess> master_;
  std::unique_ptr<MasterClient> client_;
};

// The same samples from HDF5 (chunked and gzip'd for training, contiguous
// for the test set, the training file named through a list file) train the
// same model to the same accuracy as from IDX: sync is deterministic given
// the data, so the two runs agree closely.
TEST_F(DataFilesTest, FashionMnistFromHdf5TrainsAsFromIdx) {
  Convert(absl::StrCat(kFashion, "train-images-idx3-ubyte.gz"),
          absl::StrCat(kFashion, "train-labels-idx1-ubyte.gz"),
          dir_ + "/train.h5", "--limit 12000 --chunk_rows 1024 --gzip 4");
  Convert(absl::StrCat(kFashion, "t10k-images-idx3-ubyte.gz"),
          absl::StrCat(kFashion, "t10k-labels-idx1-ubyte.gz"),
          dir_ + "/test.h5", "--limit 2000 --chunk_rows 0");
  WriteFileOrDie(dir_ + "/train.txt", "# the training files\ntrain.h5\n");

  const v1::JobSpec idx = FashionMnistSubset("sync", 12000, 2);
  v1::JobSpec hdf5 = idx;
  v1::DataSpec* data = hdf5.mutable_data();
  data->clear_train_images();
  data->clear_train_labels();
  data->clear_test_images();
  data->clear_test_labels();
  data->set_train_limit(0);
  data->set_test_limit(0);
  data->add_train_files(dir_ + "/train.txt");
  data->add_test_files(dir_ + "/test.h5");
  double accuracy[2];
  int i = 0;
  for (const v1::JobSpec& spec : {idx, hdf5}) {
    const JobRun run = Train(spec, 2);
    ASSERT_EQ(run.status.state(), v1::JOB_STATE_COMPLETED)
        << run.status.message() << run.log;
    ASSERT_TRUE(run.status.has_test_accuracy()) << run.log;
    accuracy[i++] = run.status.test_accuracy();
  }
  // Streamed, the batches differ (units are row ranges of the file, their
  // order and the rows within each shuffled): the same accuracy, not the
  // same weights.
  EXPECT_GE(accuracy[0], 0.75);
  EXPECT_NEAR(accuracy[1], accuracy[0], 0.02)
      << "IDX " << accuracy[0] << ", HDF5 " << accuracy[1];
}

// Bad files end the job FAILED, naming the file and what is wrong.
TEST_F(DataFilesTest, BadFilesFailTheirJobWithTheCause) {
  Convert(absl::StrCat(kFashion, "t10k-images-idx3-ubyte.gz"),
          absl::StrCat(kFashion, "t10k-labels-idx1-ubyte.gz"),
          dir_ + "/good.h5", "--limit 3000");
  WriteFileOrDie(dir_ + "/not.h5", "not an HDF5 file");
  WriteFileOrDie(dir_ + "/empty.txt", "# nothing\n");
  struct Case {
    std::vector<std::string> files;
    std::string features_dataset;
    std::string cause;
  };
  const std::vector<Case> cases = {
      {{dir_ + "/missing.h5"}, "", "missing.h5"},
      {{dir_ + "/not.h5"}, "", "not an HDF5 file"},
      {{dir_ + "/good.h5"}, "images", "images"},
      {{dir_ + "/empty.txt"}, "", "names no files"},
      {{dir_ + "/data.csv"}, "", "data.csv"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.cause);
    v1::JobSpec spec = FashionMnistSubset("downpour", 0, 1);
    v1::DataSpec* data = spec.mutable_data();
    data->Clear();
    for (const std::string& f : c.files) data->add_train_files(f);
    data->set_validation_count(500);
    if (!c.features_dataset.empty()) data->set_features_dataset(c.features_dataset);
    const JobRun run = Train(spec, 1);
    EXPECT_EQ(run.status.state(), v1::JOB_STATE_FAILED) << run.log;
    EXPECT_THAT(run.status.message(), HasSubstr(c.cause)) << run.log;
    EXPECT_THAT(run.status.message(), HasSubstr("data.train_files")) << run.log;
  }
  EXPECT_TRUE(client_->ListJobs().ok());
}

// The rows each rank read, from a group's Chrome trace: the data_load
// events of streamed units carry epoch, file and rows.
struct TracedRows {
  int epoch;
  int file;
  int64_t begin;
  int64_t end;
};

std::vector<TracedRows> ReadTracedRows(const std::string& path) {
  absl::StatusOr<google::protobuf::Value> json = ParseJson(ReadFileOrDie(path));
  EXPECT_TRUE(json.ok()) << json.status();
  std::vector<TracedRows> rows;
  if (!json.ok()) return rows;
  for (const google::protobuf::Value& event : json->list_value().values()) {
    if (Field(event, "name").string_value() != "data_load") continue;
    const google::protobuf::Value& args = Field(event, "args");
    if (Field(args, "file").kind_case() == google::protobuf::Value::KIND_NOT_SET) {
      continue;  // a batch's load, not a unit's
    }
    rows.push_back({static_cast<int>(Field(args, "epoch").number_value()),
                    static_cast<int>(Field(args, "file").number_value()),
                    static_cast<int64_t>(Field(args, "begin").number_value()),
                    static_cast<int64_t>(Field(args, "end").number_value())});
  }
  return rows;
}

// Three files of different sizes, the hold-out cutting the last one, two
// groups (2 ranks and 1 slower rank) on one job: in every epoch the rows the
// ranks of both groups read tile each file's training rows exactly, with
// no row read twice and none left out.
// Trains `spec` (on the files of `file_rows` rows) with two groups, one of
// them slowed, and checks from the ranks' traces that every epoch read each
// entry of the training list exactly once: `train_rows[i]` rows of entry i.
void ExpectEveryRowOnce(MasterClient& client, const std::string& master,
                        const std::string& dir, const v1::JobSpec& spec,
                        const std::vector<int64_t>& train_rows) {
  absl::StatusOr<std::string> job_id = client.SubmitJob(spec);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  const std::string traces[2] = {dir + "/g1.trace.json", dir + "/g2.trace.json"};
  auto first = StartWorkers(2, master,
                            {"--job_id=" + *job_id, "--threads=1",
                             "--trace=" + traces[0]},
                            dir + "/g1.log");
  auto second = StartWorkers(1, master,
                             {"--job_id=" + *job_id, "--threads=1",
                              "--slowdown_ms_per_batch=5", "--trace=" + traces[1]},
                             dir + "/g2.log");
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ((*first)->Wait(absl::Seconds(240)).value_or(-1), 0) << (*first)->Log();
  ASSERT_EQ((*second)->Wait(absl::Seconds(240)).value_or(-1), 0) << (*second)->Log();
  const v1::JobStatus status = client.GetJobStatus(*job_id).value();
  ASSERT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();

  // (epoch, file) -> the row ranges read.
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> read;
  int groups_that_trained = 0;
  for (const std::string& trace : traces) {
    const std::vector<TracedRows> rows = ReadTracedRows(trace);
    if (!rows.empty()) ++groups_that_trained;
    for (const TracedRows& r : rows) {
      if (r.end > r.begin) read[{r.epoch, r.file}].push_back({r.begin, r.end});
    }
  }
  ::testing::Test::RecordProperty("groups_that_trained", groups_that_trained);
  int64_t per_epoch = 0;
  for (int64_t rows : train_rows) per_epoch += rows;
  for (int epoch = 0; epoch < spec.epochs(); ++epoch) {
    for (size_t file = 0; file < train_rows.size(); ++file) {
      SCOPED_TRACE(absl::StrCat("epoch ", epoch, ", file ", file));
      std::vector<std::pair<int64_t, int64_t>> ranges =
          read[{epoch, static_cast<int>(file)}];
      std::sort(ranges.begin(), ranges.end());
      int64_t next = 0;  // every row before it was read exactly once
      for (const auto& [begin, end] : ranges) {
        ASSERT_EQ(begin, next) << (begin < next ? "rows read twice" : "rows left out");
        next = end;
      }
      EXPECT_EQ(next, train_rows[file]);
    }
    // Nothing read from an entry the list does not have.
    EXPECT_EQ(read.count({epoch, static_cast<int>(train_rows.size())}), 0u);
  }
  ASSERT_EQ(status.history_size(), spec.epochs());
  for (const v1::EpochRecord& epoch : status.history()) {
    EXPECT_EQ(epoch.samples(), static_cast<uint64_t>(per_epoch));
  }
  // The labels follow the first two features' signs: learnable.
  EXPECT_GT(status.history(spec.epochs() - 1).val_accuracy(), 0.8);
}

TEST_F(DataFilesTest, StreamedUnitsCoverEveryRowOnceAcrossTwoGroups) {
  const std::vector<std::string> paths = WriteParts();
  constexpr int64_t kHoldOut = 600;  // from the end of part2.h5
  ExpectEveryRowOnce(*client_, master_->address(), dir_, FilesSpec(paths, kHoldOut, 2),
                     {3000, 1000, 4100 - kHoldOut});
}

// A cross-validation fold strictly inside the first file: the training list
// gets that file's rows after the fold as a fourth entry, which the master
// hands out as units like any file's (docs/protocol.md, "Cross-validation").
TEST_F(DataFilesTest, AFoldInsideAFileTrainsTheRestOnce) {
  const std::vector<std::string> paths = WriteParts();
  v1::JobSpec spec = FilesSpec(paths, 0, 2);
  spec.mutable_data()->clear_validation_count();
  spec.mutable_data()->set_folds(9);  // blocks of 900 rows of the 8100
  spec.mutable_data()->set_fold(1);   // rows [900, 1800) of part0.h5
  ExpectEveryRowOnce(*client_, master_->address(), dir_, spec, {900, 1000, 4100, 1200});
}

// A rank's peak resident memory (VmHWM) from /proc, 0 when it cannot be
// read (the process ended).
int64_t PeakRssBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, "VmHWM:")) continue;
    int64_t kib = 0;
    std::string value = line.substr(6);
    value.erase(value.find("kB"));
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &kib)) return kib * 1024;
  }
  return 0;
}

// Runs `spec` on 2 ranks to the end, sampling every rank's peak RSS while
// it runs; returns the largest.
int64_t LargestRankPeakRss(MasterClient& client, const std::string& master,
                           const v1::JobSpec& spec, const std::string& dir) {
  absl::StatusOr<std::string> job_id = client.SubmitJob(spec);
  EXPECT_TRUE(job_id.ok()) << job_id.status();
  auto workers = StartWorkers(2, master, {"--job_id=" + job_id.value_or(""), "--threads=1"},
                              absl::StrCat(dir, "/", job_id.value_or("x"), ".log"));
  EXPECT_TRUE(workers.ok()) << workers.status();
  if (!workers.ok()) return 0;
  int64_t peak = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(240);
  std::optional<int> exit_code;
  while (!(exit_code = (*workers)->Wait(absl::Milliseconds(100))) &&
         absl::Now() < deadline) {
    for (pid_t pid : (*workers)->Descendants()) {
      if (absl::StrContains(CommandLine(pid), "mpilearn-worker")) {
        peak = std::max(peak, PeakRssBytes(pid));
      }
    }
  }
  EXPECT_EQ(exit_code.value_or(-1), 0) << (*workers)->Log();
  const v1::JobStatus status = client.GetJobStatus(job_id.value_or("")).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
  return peak;
}

// Memory bound: 512 MiB of training data (4 files) trains on 2 ranks with
// each rank's peak RSS within 64 MiB of what the same job takes on a 32 MiB
// data set, where loading the data whole would take 512 MiB per rank. A
// rank holds the unit it trains, the next ones read ahead and one
// evaluation batch (units of 2048 rows: 8 MiB per rank's share); measured
// here: 25 MiB more.
TEST_F(DataFilesTest, RankMemoryStaysBoundedWhenTheDataIsLarger) {
  constexpr int64_t kWidth = 2048;  // 8 KiB per row
  std::vector<std::string> large;
  for (int i = 0; i < 4; ++i) {
    large.push_back(absl::StrCat(dir_, "/large", i, ".h5"));
    WriteHdf5(large.back(), 16384, kWidth, 10 + i);
  }
  const std::string small = dir_ + "/small.h5";
  WriteHdf5(small, 4096, kWidth, 20);
  v1::JobSpec small_spec = FilesSpec({small}, 1000, 1);
  small_spec.set_data_unit_size(2048);
  small_spec.set_batch_size(128);
  v1::JobSpec large_spec = small_spec;
  large_spec.mutable_data()->clear_train_files();
  for (const std::string& path : large) large_spec.mutable_data()->add_train_files(path);

  const int64_t small_peak =
      LargestRankPeakRss(*client_, master_->address(), small_spec, dir_);
  const int64_t large_peak =
      LargestRankPeakRss(*client_, master_->address(), large_spec, dir_);
  ::testing::Test::RecordProperty("small_peak_mib", static_cast<int>(small_peak >> 20));
  ::testing::Test::RecordProperty("large_peak_mib", static_cast<int>(large_peak >> 20));
  ASSERT_GT(small_peak, 0);
  EXPECT_LT(large_peak, small_peak + (int64_t{64} << 20))
      << "peak RSS per rank: " << (small_peak >> 20) << " MiB on 32 MiB of data, "
      << (large_peak >> 20) << " MiB on 512 MiB";
}

// NaN in the training files: with data.bad_values "fail" (the default) the
// job fails naming the file, dataset and row; with "skip" the rows are
// left out, counted once per epoch, and the job completes.
TEST_F(DataFilesTest, NonFiniteTrainingRowsFailOrAreSkipped) {
  const std::string path = dir_ + "/nan.h5";
  WriteHdf5(path, 3000, 8, 7, /*nan_rows=*/{17, 1234, 2001});
  v1::JobSpec spec = FilesSpec({path}, 500, 2);  // rows 2500.. held out

  JobRun run = Train(spec, 2);
  EXPECT_EQ(run.status.state(), v1::JOB_STATE_FAILED) << run.log;
  EXPECT_THAT(run.status.message(), HasSubstr(path));
  EXPECT_THAT(run.status.message(), HasSubstr("'features'"));
  EXPECT_THAT(run.status.message(), HasSubstr("bad_values"));
  EXPECT_TRUE(absl::StrContains(run.status.message(), "at row 17;") ||
              absl::StrContains(run.status.message(), "at row 1234;") ||
              absl::StrContains(run.status.message(), "at row 2001;"))
      << run.status.message();

  spec.mutable_data()->set_bad_values("skip");
  run = Train(spec, 2);
  ASSERT_EQ(run.status.state(), v1::JOB_STATE_COMPLETED)
      << run.status.message() << run.log;
  EXPECT_EQ(run.status.samples_skipped(), 2u * 3u);  // 3 rows, 2 epochs
  for (const v1::EpochRecord& epoch : run.status.history()) {
    EXPECT_EQ(epoch.samples(), 2500u - 3u);
  }
}

// A group whose reads fail (fault injection: --fail_unit_reads) leaves with
// the data error while another group trains the job: the job goes on, the
// failed unit is trained by the other group, and the failure is on record.
TEST_F(DataFilesTest, AUnitThatFailsInOneGroupIsRetriedByAnother) {
  const std::string path = dir_ + "/retry.h5";
  WriteHdf5(path, 6000, 8, 9);
  const v1::JobSpec spec = FilesSpec({path}, 500, 2);
  absl::StatusOr<std::string> job_id = client_->SubmitJob(spec);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto healthy = StartWorkers(1, master_->address(),
                              {"--job_id=" + *job_id, "--threads=1",
                               "--slowdown_ms_per_batch=50"},
                              dir_ + "/healthy.log");
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  // The healthy group is training before the failing one starts.
  ASSERT_TRUE(WaitForStatus(*client_, *job_id, absl::Seconds(120),
                            [](const v1::JobStatus& s) {
                              return s.samples_trained() > 0;
                            })
                  .ok());
  auto failing = StartWorkers(1, master_->address(),
                              {"--job_id=" + *job_id, "--threads=1",
                               "--fail_unit_reads=1"},
                              dir_ + "/failing.log");
  ASSERT_TRUE(failing.ok()) << failing.status();
  EXPECT_EQ((*failing)->Wait(absl::Seconds(120)).value_or(-1), 1) << (*failing)->Log();
  EXPECT_THAT((*failing)->Log(), HasSubstr("injected failure"));
  ASSERT_EQ((*healthy)->Wait(absl::Seconds(240)).value_or(-1), 0) << (*healthy)->Log();

  const v1::JobStatus status = client_->GetJobStatus(*job_id).value();
  ASSERT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
  EXPECT_EQ(status.unit_failures(), 1u);
  EXPECT_THAT(status.last_data_error(), HasSubstr("injected failure"));
  for (const v1::EpochRecord& epoch : status.history()) {
    EXPECT_EQ(epoch.samples(), 5500u);  // every unit trained, the failed one too
  }
}

// Regression from streamed files: float targets y = x0 - x1 / 2 + x2 / 4
// (variance 1.31, no noise) in two training files and a test file; the
// MLP with mse reaches a test MSE below 0.05 (predicting the mean would
// give 1.31).
TEST_F(DataFilesTest, StreamedRegressionReachesAStatedError) {
  const std::string targets =
      "(x[:, 0] - 0.5 * x[:, 1] + 0.25 * x[:, 2]).astype(np.float32)";
  WriteHdf5(dir_ + "/reg0.h5", 3000, 8, 21, {}, targets);
  WriteHdf5(dir_ + "/reg1.h5", 3000, 8, 22, {}, targets);
  WriteHdf5(dir_ + "/reg_test.h5", 1000, 8, 23, {}, targets);
  v1::JobSpec spec = FilesSpec({dir_ + "/reg0.h5", dir_ + "/reg1.h5"}, 500, 6);
  spec.mutable_data()->add_test_files(dir_ + "/reg_test.h5");
  spec.set_loss("mse");
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_learning_rate(0.003);
  const JobRun run = Train(spec, 2);
  ASSERT_EQ(run.status.state(), v1::JOB_STATE_COMPLETED)
      << run.status.message() << run.log;
  ASSERT_TRUE(run.status.test_metrics().contains("test_mse")) << run.log;
  EXPECT_LT(run.status.test_metrics().at("test_mse"), 0.05) << run.log;
  EXPECT_THAT(run.log, HasSubstr("test_mse="));
}

}  // namespace
}  // namespace mpilearn::testing
