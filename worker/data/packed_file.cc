// A data file of several features or labels datasets (DataFileNames with
// lists): each dataset read through a plain file of its format, the rows
// packed as PackedLayout (data_file.h) says.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/data_file.h"

namespace mpilearn::worker {
namespace {

int64_t Columns(const std::vector<int64_t>& row_shape) {
  int64_t columns = 1;
  for (const int64_t d : row_shape) columns *= d;
  return columns;
}

class PackedFile final : public DataFile {
 public:
  // parts[k] reads features dataset min(k, F - 1) and labels dataset
  // min(k, L - 1).
  PackedFile(std::string path, std::vector<std::unique_ptr<DataFile>> parts,
             PackedLayout layout)
      : parts_(std::move(parts)), layout_(std::move(layout)) {
    path_ = std::move(path);
    rows_ = parts_[0]->rows();
    const DataFile& first = *parts_[0];
    if (layout_.features.size() > 1) {
      int64_t columns = 0;
      for (const PackedLayout::Part& part : layout_.features) columns += part.columns;
      feature_shape_ = {columns};
      feature_type_ = ElementType::kFloat32;
    } else {
      feature_shape_ = first.feature_shape();
      feature_type_ = first.feature_type();
    }
    if (layout_.labels.size() > 1) {
      int64_t columns = 0;
      for (const PackedLayout::Part& part : layout_.labels) columns += part.columns;
      label_shape_ = {columns};
      label_type_ = ElementType::kFloat32;
    } else {
      label_shape_ = first.label_shape();
      label_type_ = first.label_type();
    }
  }

  const PackedLayout* packed() const override { return &layout_; }

  absl::StatusOr<torch::Tensor> ReadFeatures(int64_t begin, int64_t end) override {
    MPILEARN_RETURN_IF_ERROR(CheckRange(begin, end));
    if (layout_.features.size() == 1) return parts_[0]->ReadFeatures(begin, end);
    return Pack(layout_.features, feature_shape_[0], begin, end,
                [](DataFile& part, int64_t b, int64_t e) { return part.ReadFeatures(b, e); });
  }

  absl::StatusOr<torch::Tensor> ReadLabels(int64_t begin, int64_t end) override {
    MPILEARN_RETURN_IF_ERROR(CheckRange(begin, end));
    if (layout_.labels.size() == 1) return parts_[0]->ReadLabels(begin, end);
    return Pack(layout_.labels, label_shape_[0], begin, end,
                [](DataFile& part, int64_t b, int64_t e) { return part.ReadLabels(b, e); });
  }

 private:
  // Rows [begin, end) of each of `parts` (part i read from parts_[i] by
  // `read`) side by side in one float32 [n, width]; class indices [n]
  // become one column of floats.
  template <typename Read>
  absl::StatusOr<torch::Tensor> Pack(const std::vector<PackedLayout::Part>& parts, int64_t width,
                                     int64_t begin, int64_t end, Read read) {
    const int64_t n = end - begin;
    torch::Tensor packed = NewHostTensor({n, width}, torch::kFloat32);
    int64_t at = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      MPILEARN_ASSIGN_OR_RETURN(torch::Tensor part, read(*parts_[i], begin, end));
      packed.narrow(1, at, parts[i].columns).copy_(part.reshape({n, parts[i].columns}));
      at += parts[i].columns;
    }
    return packed;
  }

  std::vector<std::unique_ptr<DataFile>> parts_;
  PackedLayout layout_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DataFile>> OpenPackedFile(const std::string& path,
                                                         const DataFileNames& names) {
  const std::vector<std::string> features =
      names.all_features.empty() ? std::vector<std::string>{names.features} : names.all_features;
  const std::vector<std::string> labels =
      names.all_labels.empty() ? std::vector<std::string>{names.labels} : names.all_labels;
  const size_t count = std::max(features.size(), labels.size());
  std::vector<std::unique_ptr<DataFile>> parts;
  PackedLayout layout;
  for (size_t k = 0; k < count; ++k) {
    DataFileNames pair;
    pair.features = features[std::min(k, features.size() - 1)];
    pair.labels = labels[std::min(k, labels.size() - 1)];
    MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<DataFile> part, OpenDataFile(path, pair));
    if (!parts.empty() && part->rows() != parts[0]->rows()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "': dataset '", k < features.size() ? pair.features : pair.labels,
          "' holds ", part->rows(), " rows but '", features[0], "' holds ", parts[0]->rows(),
          "; every features and labels dataset must hold one row per sample"));
    }
    // An empty read gives each dataset's row shape as read.
    if (k < features.size()) {
      MPILEARN_ASSIGN_OR_RETURN(torch::Tensor rows, part->ReadFeatures(0, 0));
      std::vector<int64_t> shape = rows.sizes().slice(1).vec();
      layout.features.push_back({pair.features, shape, part->feature_type(), Columns(shape)});
    }
    if (k < labels.size()) {
      MPILEARN_ASSIGN_OR_RETURN(torch::Tensor rows, part->ReadLabels(0, 0));
      std::vector<int64_t> shape = rows.sizes().slice(1).vec();
      layout.labels.push_back({pair.labels, shape, part->label_type(), Columns(shape)});
    }
    parts.push_back(std::move(part));
  }
  return std::unique_ptr<DataFile>(
      std::make_unique<PackedFile>(path, std::move(parts), std::move(layout)));
}

}  // namespace mpilearn::worker
