// Files of several features and labels datasets (data.features_datasets,
// labels_datasets): what ScanDataFiles learns of them (each input's shape,
// each labels set's columns and classes), the packed rows FileReader gives
// against the datasets read one by one, and each refusal naming the dataset.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "worker/data/data_file.h"
#include "worker/data/data_stream.h"
#include "worker/data/dataset.h"
#include "worker/data/hdf5_writer.h"

namespace mpilearn::worker {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

// `rows` rows: a float32 [n, 2], b uint8 [n, 3, 2], c int64 class indices
// [n] (row i: (i + shift) % classes), d float32 [n, 2].
struct Arrays {
  torch::Tensor a, b, c, d;
};

Arrays MakeArrays(int64_t rows, int64_t shift, int64_t classes) {
  Arrays x;
  x.a = torch::arange(rows * 2, torch::kFloat32).reshape({rows, 2}).div(4);
  x.b = torch::arange(rows * 6, torch::kInt64).remainder(256).reshape({rows, 3, 2});
  x.c = torch::arange(rows, torch::kInt64).add(shift).remainder(classes);
  x.d = torch::arange(rows * 2, torch::kFloat32).reshape({rows, 2}).neg();
  return x;
}

std::string Write(const std::string& name, const Arrays& x) {
  const std::string path = TempPath(name);
  const absl::Status status = WriteHdf5Arrays(path, {{"a", ElementType::kFloat32, x.a},
                                                     {"b", ElementType::kUint8, x.b},
                                                     {"c", ElementType::kInt64, x.c},
                                                     {"d", ElementType::kFloat32, x.d}});
  EXPECT_TRUE(status.ok()) << status;
  return path;
}

v1::DataSpec SpecOf(const std::vector<std::string>& train) {
  v1::DataSpec spec;
  for (const std::string& path : train) spec.add_train_files(path);
  spec.add_features_datasets("a");
  spec.add_features_datasets("b");
  spec.add_labels_datasets("c");
  spec.add_labels_datasets("d");
  spec.set_validation_count(3);
  return spec;
}

TEST(PackedFileTest, ScanKnowsEachInputAndLabelsSet) {
  const Arrays first = MakeArrays(10, 0, 4);
  const Arrays second = MakeArrays(7, 2, 5);  // classes up to 4, held out last
  absl::StatusOr<FileSplits> files =
      ScanDataFiles(SpecOf({Write("scan0.h5", first), Write("scan1.h5", second)}));
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(files->input_shape, ElementsAre(2 + 6));
  ASSERT_EQ(files->heads.inputs.size(), 2u);
  EXPECT_THAT(files->heads.inputs[0], ElementsAre(2));
  // Unsigned bytes [N, H, W] read as one channel, as images are.
  EXPECT_THAT(files->heads.inputs[1], ElementsAre(1, 3, 2));
  ASSERT_EQ(files->heads.labels.size(), 2u);
  const DataHeads::Labels& c = files->heads.labels[0];
  const DataHeads::Labels& d = files->heads.labels[1];
  EXPECT_TRUE(c.class_indices);
  EXPECT_EQ(c.column, 0);
  EXPECT_EQ(c.columns, 1);
  EXPECT_EQ(c.num_classes, 5);  // the validation rows' 4 counts too
  EXPECT_FALSE(d.class_indices);
  EXPECT_EQ(d.column, 1);
  EXPECT_EQ(d.columns, 2);
  EXPECT_TRUE(files->float_labels);
  EXPECT_EQ(files->num_classes, 3);  // the packed width

  // Packed rows against the datasets, across the two files.
  FileReader reader(files->train, files->names);
  absl::StatusOr<DataRows> rows = reader.ReadRange(0, 14);
  ASSERT_TRUE(rows.ok()) << rows.status();
  const auto packed_features = [](const Arrays& x, int64_t n) {
    return torch::cat({x.a.narrow(0, 0, n),
                       x.b.narrow(0, 0, n).to(torch::kFloat32).div(255).reshape({n, 6})},
                      1);
  };
  const auto packed_labels = [](const Arrays& x, int64_t n) {
    return torch::cat({x.c.narrow(0, 0, n).to(torch::kFloat32).unsqueeze(1), x.d.narrow(0, 0, n)},
                      1);
  };
  EXPECT_TRUE(torch::equal(rows->features,
                           torch::cat({packed_features(first, 10), packed_features(second, 4)})));
  EXPECT_TRUE(torch::equal(rows->labels,
                           torch::cat({packed_labels(first, 10), packed_labels(second, 4)})));

  // Two float labels sets (no class indices to count) and one input: the
  // features stay as the file gives them.
  v1::DataSpec floats = SpecOf({TempPath("scan0.h5")});
  floats.clear_features_datasets();
  floats.add_features_datasets("b");
  floats.clear_labels_datasets();
  floats.add_labels_datasets("d");
  floats.add_labels_datasets("a");
  files = ScanDataFiles(floats);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_TRUE(files->heads.inputs.empty());
  EXPECT_THAT(files->input_shape, ElementsAre(1, 3, 2));
  ASSERT_EQ(files->heads.labels.size(), 2u);
  EXPECT_FALSE(files->heads.labels[0].class_indices || files->heads.labels[1].class_indices);
  EXPECT_EQ(files->heads.labels[1].column, 2);
  EXPECT_EQ(files->num_classes, 4);

  // In-memory loading is for one dataset each.
  EXPECT_THAT(std::string(LoadDatasets(SpecOf({TempPath("scan0.h5")})).status().message()),
              HasSubstr("several datasets are read by streaming only"));
}

TEST(PackedFileTest, RefusalsNameTheDataset) {
  const std::string good = Write("good.h5", MakeArrays(6, 0, 3));
  // A file whose b rows have another shape.
  Arrays wide = MakeArrays(6, 0, 3);
  wide.b = torch::zeros({6, 3, 3}, torch::kInt64);
  absl::StatusOr<FileSplits> files = ScanDataFiles(SpecOf({good, Write("wide.h5", wide)}));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(files.status().message()),
              AllOf(HasSubstr("the features dataset 'b'"), HasSubstr("wide.h5"),
                    HasSubstr("[1, 3, 3]"), HasSubstr("[1, 3, 2]")));
  // A dataset of fewer rows than the others in the file.
  Arrays short_d = MakeArrays(6, 0, 3);
  short_d.d = torch::zeros({5, 2});
  files = ScanDataFiles(SpecOf({Write("short.h5", short_d)}));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(files.status().message()), AllOf(HasSubstr("short.h5"), HasSubstr("'d'")));
  // A negative class index in a labels set: named with its row.
  Arrays negative = MakeArrays(6, 0, 3);
  negative.c[4] = -2;
  files = ScanDataFiles(SpecOf({good, Write("negative.h5", negative)}));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(files.status().message()),
              AllOf(HasSubstr("the labels ('c')"), HasSubstr("negative.h5"),
                    HasSubstr("class index -2 at row 4")));
  // A missing dataset: the format's own message.
  v1::DataSpec spec = SpecOf({good});
  spec.set_labels_datasets(1, "energy");
  files = ScanDataFiles(spec);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(files.status().message()), HasSubstr("'energy'"));
}

}  // namespace
}  // namespace mpilearn::worker
