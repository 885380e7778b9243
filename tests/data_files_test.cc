// End to end with the users' own data files: Fashion-MNIST converted to
// HDF5 in the test (tools/convert_data) trains on 2 ranks exactly as from
// IDX, a NumPy regression set trains to a stated error, and bad files end
// their job FAILED with a message naming the file while the master serves
// on.
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/master_client.h"
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

  // Converts an IDX pair to HDF5 with tools/convert_data.
  void Convert(const std::string& features, const std::string& labels,
               const std::string& out, const std::string& flags) {
    ASSERT_EQ(RunCommand(absl::StrCat(Runfile("tools/convert_data"), " --features ",
                               features, " --labels ", labels, " --out ", out,
                               " ", flags, " >>", dir_, "/convert.log 2>&1")),
              0)
        << ReadFileOrDie(dir_ + "/convert.log");
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
  EXPECT_GE(accuracy[0], 0.75);
  EXPECT_NEAR(accuracy[1], accuracy[0], 0.005)
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

}  // namespace
}  // namespace mpilearn::testing
