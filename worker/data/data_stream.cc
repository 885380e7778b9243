// ScanDataFiles, FileReader and UnitPrefetcher (data_stream.h).
//
// The splits follow LoadDatasets (dataset.cc) row for row: train_limit keeps
// the first rows of the training list, the hold-out takes HeldOutRows's
// block of those (the last validation_count, or a cross-validation fold),
// test_limit the first test rows; the row shapes and the label kind are
// those the DataFile conversions give. (Only the training rows' order can
// differ: a fold strictly inside one file moves that file's rows after it
// to the end, FileList in data_stream.h says why.) What the
// in-memory path checks on the whole data (finite values, class indices in
// range) is checked here on every range read, and the class indices also
// once up front, by a scan of the labels alone, for the class count.
//
// About 700 lines, in one file because the scan, the reader and the
// prefetcher share the split rules and the row checks above them.
#include "worker/data/data_stream.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/file_list.h"
#include "common/status_macros.h"
#include "worker/data/dataset.h"

namespace mpilearn::worker {
namespace {

using ::mpilearn::v1::DataSpec;

// Rows of class indices scanned at a time.
constexpr int64_t kScanRows = int64_t{1} << 20;

// `status` with "data.<field>: " before its message.
absl::Status InField(absl::string_view field, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("data.", field, ": ", status.message()));
}

// What the checks between files compare, from one file's metadata.
struct FileInfo {
  std::string path;
  int64_t rows = 0;
  // One row's shape as read (after the conversions of data_file.h).
  std::vector<int64_t> feature_sizes;
  std::vector<int64_t> label_sizes;  // {} for class indices, {K} for rows
  ElementType feature_type = ElementType::kFloat32;
  ElementType label_type = ElementType::kInt64;
  std::vector<int64_t> stored_label_shape;
  // A file of several datasets: how they are packed.
  std::optional<PackedLayout> packed;
};

bool IsClassIndices(const FileInfo& info) { return info.label_sizes.empty(); }

// "class indices (int64 [N])" or "float rows of width 3 (float32 [N, 3])".
std::string LabelKind(const FileInfo& info) {
  std::vector<std::string> stored = {"N"};
  for (const int64_t d : info.stored_label_shape) {
    stored.push_back(absl::StrCat(d));
  }
  return absl::StrCat(
      IsClassIndices(info)
          ? std::string("class indices")
          : absl::StrCat("float rows of width ", info.label_sizes[0]),
      " (", ElementTypeName(info.label_type), " [", absl::StrJoin(stored, ", "),
      "])");
}

// Opens `path` for its metadata; an empty read gives the row shapes.
absl::StatusOr<FileInfo> Inspect(absl::string_view field,
                                 const std::string& path,
                                 const DataFileNames& names) {
  absl::StatusOr<std::unique_ptr<DataFile>> file = OpenDataFile(path, names);
  if (!file.ok()) return InField(field, file.status());
  absl::StatusOr<DataRows> empty = (*file)->Read(0, 0);
  if (!empty.ok()) return InField(field, empty.status());
  FileInfo info;
  info.path = path;
  info.rows = (*file)->rows();
  info.feature_sizes = empty->features.sizes().slice(1).vec();
  info.label_sizes = empty->labels.sizes().slice(1).vec();
  info.feature_type = (*file)->feature_type();
  info.label_type = (*file)->label_type();
  info.stored_label_shape = (*file)->label_shape();
  if ((*file)->packed() != nullptr) info.packed = *(*file)->packed();
  return info;
}

// For files of several datasets: CheckAgrees dataset by dataset.
absl::Status CheckPartsAgree(absl::string_view field, const FileInfo& info,
                             const FileInfo& reference, absl::string_view ref) {
  const auto compare = [&](const char* role, const std::vector<PackedLayout::Part>& parts,
                           const std::vector<PackedLayout::Part>& reference_parts) {
    for (size_t i = 0; i < parts.size(); ++i) {
      const PackedLayout::Part& part = parts[i];
      const PackedLayout::Part& want = reference_parts[i];
      const bool scaled = part.type == ElementType::kUint8;
      const bool classes = part.shape.empty() && std::string(role) == "labels";
      if (part.shape != want.shape || scaled != (want.type == ElementType::kUint8) ||
          (classes && IsIntegerElementType(part.type) != IsIntegerElementType(want.type))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.", field, ": the ", role, " dataset '", part.name, "' of '", info.path,
            "' holds rows of shape ", ShapeText(part.shape), " (", ElementTypeName(part.type),
            ") but in ", ref, " ", ShapeText(want.shape), " (", ElementTypeName(want.type),
            "); every file must hold each dataset alike (unsigned bytes are scaled by 1/255, "
            "other types are not)"));
      }
    }
    return absl::OkStatus();
  };
  MPILEARN_RETURN_IF_ERROR(compare("features", info.packed->features, reference.packed->features));
  return compare("labels", info.packed->labels, reference.packed->labels);
}

// Checks that `info` (from spec field `field`) agrees with `reference`, the
// first training file: the same row shape, features scaled or not alike,
// the same kind of labels.
absl::Status CheckAgrees(absl::string_view field, const FileInfo& info,
                         const FileInfo& reference) {
  const std::string ref =
      absl::StrCat(field == "train_files" ? "" : "the training file ", "'",
                   reference.path, "'");
  if (info.packed.has_value() && reference.packed.has_value()) {
    MPILEARN_RETURN_IF_ERROR(CheckPartsAgree(field, info, reference, ref));
  }
  if (info.feature_sizes != reference.feature_sizes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", field, ": '", info.path,
                     "' holds samples of shape ", ShapeText(info.feature_sizes),
                     " but ", ref, " holds ", ShapeText(reference.feature_sizes)));
  }
  const bool scaled = info.feature_type == ElementType::kUint8;
  if (scaled != (reference.feature_type == ElementType::kUint8)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": '", info.path, "' holds features of type ",
        ElementTypeName(info.feature_type), " but ", ref, " holds ",
        ElementTypeName(reference.feature_type),
        "; unsigned bytes are scaled by 1/255 and other types are not, so "
        "give every file the same element type"));
  }
  if (info.label_sizes != reference.label_sizes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": '", info.path, "' holds labels that are ",
        LabelKind(info), " but ", ref, " holds ", LabelKind(reference)));
  }
  return absl::OkStatus();
}

// InvalidArgument naming the first of `labels` (class indices of rows
// `first_row`... of `path`'s labels dataset `dataset`; int64, or a packed
// float column) outside [0, kMaxClasses), if any.
absl::Status CheckClassIndices(absl::string_view field, const std::string& path,
                               const std::string& dataset, const torch::Tensor& labels,
                               int64_t first_row) {
  if (labels.numel() == 0) return absl::OkStatus();
  const torch::Tensor bad = (labels < 0).logical_or(labels >= kMaxClasses);
  if (!bad.any().item<bool>()) return absl::OkStatus();
  const int64_t i = bad.nonzero()[0][0].item<int64_t>();
  // A packed column holds integers from an integer dataset, as floats.
  const int64_t value = labels.is_floating_point()
                            ? static_cast<int64_t>(labels[i].item<double>())
                            : labels[i].item<int64_t>();
  return absl::InvalidArgumentError(absl::StrCat(
      "data.", field, ": the labels ('", dataset, "') of '", path,
      "' hold class index ", value, " at row ", first_row + i,
      "; class indices must be in [0, ", kMaxClasses, ")",
      value < 0 ? " (regression targets belong in a float file)" : ""));
}

// Each class-index column of packed labels `labels` (`layout`), checked
// as CheckClassIndices does.
absl::Status CheckPackedClassIndices(absl::string_view field, const std::string& path,
                                     const PackedLayout& layout, const torch::Tensor& labels,
                                     int64_t first_row) {
  int64_t column = 0;
  for (const PackedLayout::Part& part : layout.labels) {
    if (part.shape.empty()) {
      MPILEARN_RETURN_IF_ERROR(
          CheckClassIndices(field, path, part.name, labels.select(1, column), first_row));
    }
    column += part.columns;
  }
  return absl::OkStatus();
}

// The flat index of the first NaN or infinite value of `values` (float32),
// -1 when there is none. A plain scan: no temporary tensors of the unit's
// size (see NewHostTensor in data_file.h for why allocations matter here),
// one pass that stops at the first bad value.
int64_t FirstNonFinite(const torch::Tensor& values) {
  const torch::Tensor flat = values.to(torch::kFloat32).contiguous();
  const float* data = flat.data_ptr<float>();
  const int64_t count = flat.numel();
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(data[i])) return i;
  }
  return -1;
}

// InvalidArgument naming the first row of `values` (rows `first_row`... of
// `path`'s `role` `dataset`) that holds a NaN or infinity, if any.
absl::Status CheckFinite(absl::string_view field, const std::string& path,
                         const char* role, const std::string& dataset,
                         const torch::Tensor& values, int64_t first_row) {
  const int64_t bad = FirstNonFinite(values);
  if (bad < 0) return absl::OkStatus();
  const int64_t per_row = values.numel() / values.size(0);
  return absl::InvalidArgumentError(absl::StrCat(
      "data.", field, ": the ", role, " ('", dataset, "') of '", path,
      "' hold ", values.reshape({-1})[bad].item<float>(), " at row ",
      first_row + bad / per_row,
      "; every value must be finite (or set data.bad_values to \"skip\" to "
      "leave such training rows out)"));
}

// Leaves out the rows of `rows` whose features or float labels hold a NaN
// or infinity, counting them in rows->skipped.
void DropNonFiniteRows(DataRows* rows) {
  const int64_t n = rows->features.size(0);
  if (n == 0) return;
  torch::Tensor keep = torch::isfinite(rows->features.reshape({n, -1})).all(1);
  if (rows->labels.dim() == 2) {
    keep.logical_and_(torch::isfinite(rows->labels).all(1));
  }
  const torch::Tensor index = keep.nonzero().squeeze(1);
  rows->skipped += n - index.size(0);
  rows->features = rows->features.index_select(0, index);
  rows->labels = rows->labels.index_select(0, index);
}

// One list's files, inspected, and each one's rows in the split (the
// first `limit` rows of the list; 0: all).
struct ScannedList {
  FileList list;
  std::vector<FileInfo> files;
};

absl::StatusOr<ScannedList> ScanList(
    absl::string_view field,
    const google::protobuf::RepeatedPtrField<std::string>& entries,
    const DataFileNames& names, int64_t limit) {
  ScannedList scanned;
  scanned.list.field = std::string(field);
  MPILEARN_ASSIGN_OR_RETURN(
      scanned.list.paths,
      ExpandFileList(field, {entries.begin(), entries.end()}));
  int64_t total = 0;
  for (const std::string& path : scanned.list.paths) {
    MPILEARN_ASSIGN_OR_RETURN(FileInfo info, Inspect(field, path, names));
    const int64_t take =
        limit > 0 ? std::min(info.rows, std::max<int64_t>(limit - total, 0))
                  : info.rows;
    total += take;
    scanned.list.first.push_back(0);
    scanned.list.rows.push_back(take);
    scanned.files.push_back(std::move(info));
  }
  if (total == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field,
        scanned.list.paths.empty() ? ": the list names no files"
                                   : ": the files hold no samples"));
  }
  return scanned;
}

// Reads the labels alone of the rows `list` uses, kScanRows at a time, and
// hands each chunk to `each` with its file and first row; stops at the
// first error (read errors name the field).
absl::Status ScanLabels(
    const FileList& list, const DataFileNames& names,
    const std::function<absl::Status(const std::string& path, const torch::Tensor& labels,
                                     int64_t first_row)>& each) {
  for (size_t i = 0; i < list.paths.size(); ++i) {
    if (list.rows[i] == 0) continue;
    absl::StatusOr<std::unique_ptr<DataFile>> file = OpenDataFile(list.paths[i], names);
    if (!file.ok()) return InField(list.field, file.status());
    const int64_t end = list.first[i] + list.rows[i];
    for (int64_t begin = list.first[i]; begin < end; begin += kScanRows) {
      const int64_t stop = std::min(end, begin + kScanRows);
      absl::StatusOr<torch::Tensor> labels = (*file)->ReadLabels(begin, stop);
      if (!labels.ok()) return InField(list.field, labels.status());
      MPILEARN_RETURN_IF_ERROR(each(list.paths[i], *labels, begin));
    }
  }
  return absl::OkStatus();
}

// The largest class index in the rows `list` uses (ScanLabels);
// InvalidArgument for one outside [0, kMaxClasses). -1 for no rows.
absl::StatusOr<int64_t> MaxClassIndex(const FileList& list,
                                      const DataFileNames& names) {
  int64_t max_label = -1;
  MPILEARN_RETURN_IF_ERROR(ScanLabels(
      list, names,
      [&](const std::string& path, const torch::Tensor& labels, int64_t first_row) {
        MPILEARN_RETURN_IF_ERROR(
            CheckClassIndices(list.field, path, names.labels, labels, first_row));
        max_label = std::max(max_label, labels.max().item<int64_t>());
        return absl::OkStatus();
      }));
  return max_label;
}

// The heads of several labels datasets (`layout.labels`), each class-index
// one's classes counted over the rows of `lists` (ScanLabels, checked).
absl::StatusOr<std::vector<DataHeads::Labels>> PackedLabelHeads(
    const PackedLayout& layout, const std::vector<const FileList*>& lists,
    const DataFileNames& names) {
  std::vector<DataHeads::Labels> heads;
  int64_t column = 0;
  bool any_classes = false;
  for (const PackedLayout::Part& part : layout.labels) {
    DataHeads::Labels head;
    head.column = column;
    head.columns = part.columns;
    head.class_indices = part.shape.empty();
    head.num_classes = head.class_indices ? 0 : part.columns;
    any_classes = any_classes || head.class_indices;
    heads.push_back(head);
    column += part.columns;
  }
  // Float targets are checked as they are read; only class indices need a
  // pass over the labels (for the class counts), as for one labels dataset.
  if (!any_classes) return heads;
  for (const FileList* list : lists) {
    MPILEARN_RETURN_IF_ERROR(ScanLabels(
        *list, names,
        [&](const std::string& path, const torch::Tensor& labels, int64_t first_row) {
          MPILEARN_RETURN_IF_ERROR(
              CheckPackedClassIndices(list->field, path, layout, labels, first_row));
          for (DataHeads::Labels& head : heads) {
            if (!head.class_indices || labels.size(0) == 0) continue;
            const int64_t largest =
                static_cast<int64_t>(labels.select(1, head.column).max().item<double>());
            head.num_classes = std::max(head.num_classes, largest + 1);
          }
          return absl::OkStatus();
        }));
  }
  return heads;
}

// Moves rows [held.begin, held.end) of `train`, counted over the list in
// order, to the list it returns: the same paths, each file's overlap with
// the block in its place (rows 0 for the others). Each file keeps its rows
// before the block in its place; rows after it stay there too, unless the
// block lies strictly inside the file: then they become an extra entry at
// the end of `train`, so that entries 0..P-1 stay the spec's P files in
// order (the master addresses data units by file index).
FileList HoldOut(const RowBlock& held, FileList* train) {
  FileList out;
  out.field = train->field;
  out.paths = train->paths;
  out.first.assign(out.paths.size(), 0);
  out.rows.assign(out.paths.size(), 0);
  int64_t start = 0;  // the list's row at file i's first row
  for (size_t i = 0; i < out.paths.size(); ++i) {
    const int64_t file_rows = train->rows[i];
    const int64_t from = std::max(held.begin, start) - start;  // in the file
    const int64_t to = std::min(held.end, start + file_rows) - start;
    start += file_rows;
    if (from >= to) continue;
    const int64_t first = train->first[i];
    out.first[i] = first + from;
    out.rows[i] = to - from;
    if (to == file_rows) {  // the block reaches the file's end
      train->rows[i] = from;
    } else if (from == 0) {  // the block ends inside the file
      train->first[i] = first + to;
      train->rows[i] = file_rows - to;
    } else {  // strictly inside
      const std::string path = train->paths[i];
      train->paths.push_back(path);
      train->first.push_back(first + to);
      train->rows.push_back(file_rows - to);
      train->rows[i] = from;
    }
  }
  return out;
}

}  // namespace

int64_t FileList::total_rows() const {
  int64_t total = 0;
  for (const int64_t n : rows) total += n;
  return total;
}

absl::StatusOr<FileSplits> ScanDataFiles(const DataSpec& spec) {
  if (spec.train_files().empty()) {
    return absl::InvalidArgumentError(
        "data.train_files is required: HDF5 (.h5, .hdf5) or NumPy (.npz, "
        ".npy) files, or one text file listing them");
  }
  MPILEARN_RETURN_IF_ERROR(CheckDataCounts(spec));
  FileSplits splits;
  splits.names = DataFileNames::FromSpec(spec);

  MPILEARN_ASSIGN_OR_RETURN(ScannedList train,
                            ScanList("train_files", spec.train_files(),
                                     splits.names, spec.train_limit()));
  const FileInfo& reference = train.files[0];
  for (const FileInfo& info : train.files) {
    MPILEARN_RETURN_IF_ERROR(CheckAgrees("train_files", info, reference));
  }

  if (!spec.validation_files().empty()) {
    MPILEARN_ASSIGN_OR_RETURN(
        ScannedList validation,
        ScanList("validation_files", spec.validation_files(), splits.names,
                 /*limit=*/0));
    for (const FileInfo& info : validation.files) {
      MPILEARN_RETURN_IF_ERROR(
          CheckAgrees("validation_files", info, reference));
    }
    splits.validation = std::move(validation.list);
  } else {
    MPILEARN_ASSIGN_OR_RETURN(
        const RowBlock held,
        HeldOutRows(spec, train.list.total_rows(), "the training files hold",
                    "data.validation_files"));
    splits.validation = HoldOut(held, &train.list);
  }

  if (!spec.test_files().empty()) {
    MPILEARN_ASSIGN_OR_RETURN(ScannedList test,
                              ScanList("test_files", spec.test_files(),
                                       splits.names, spec.test_limit()));
    for (const FileInfo& info : test.files) {
      MPILEARN_RETURN_IF_ERROR(CheckAgrees("test_files", info, reference));
    }
    splits.test = std::move(test.list);
  } else {
    splits.test.field = "test_files";
  }
  splits.train = std::move(train.list);

  splits.input_shape = reference.feature_sizes;
  splits.float_labels = !IsClassIndices(reference);
  if (reference.packed.has_value() && reference.packed->features.size() > 1) {
    for (const PackedLayout::Part& part : reference.packed->features) {
      splits.heads.inputs.push_back(part.shape);
    }
  }
  if (reference.packed.has_value() && reference.packed->labels.size() > 1) {
    MPILEARN_ASSIGN_OR_RETURN(
        splits.heads.labels,
        PackedLabelHeads(*reference.packed, {&splits.train, &splits.validation, &splits.test},
                         splits.names));
    splits.num_classes = reference.label_sizes[0];
  } else if (splits.float_labels) {
    splits.num_classes = reference.label_sizes[0];
  } else {
    int64_t max_label = 0;
    for (const FileList* list :
         {&splits.train, &splits.validation, &splits.test}) {
      MPILEARN_ASSIGN_OR_RETURN(const int64_t list_max,
                                MaxClassIndex(*list, splits.names));
      max_label = std::max(max_label, list_max);
    }
    splits.num_classes = max_label + 1;
  }
  return splits;
}

FileReader::FileReader(FileList list, DataFileNames names, bool skip_bad_rows)
    : list_(std::move(list)),
      names_(std::move(names)),
      skip_bad_rows_(skip_bad_rows) {}

absl::StatusOr<DataFile*> FileReader::Open(int file) {
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->first != file) continue;
    if (it != open_.begin()) {
      auto entry = std::move(*it);
      open_.erase(it);
      open_.push_front(std::move(entry));
    }
    return open_.front().second.get();
  }
  const std::string& path = list_.paths[file];
  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenDataFile(path, names_);
  if (!opened.ok()) return InField(list_.field, opened.status());
  const int64_t need = list_.first[file] + list_.rows[file];
  if ((*opened)->rows() < need) {
    return absl::DataLossError(absl::StrCat(
        "data.", list_.field, ": '", path, "' holds ", (*opened)->rows(),
        " rows now but ", need,
        " when the job started (did it change while the job ran?)"));
  }
  if (static_cast<int>(open_.size()) >= kMaxOpen) open_.pop_back();
  open_.emplace_front(file, std::move(*opened));
  return open_.front().second.get();
}

absl::StatusOr<DataRows> FileReader::ReadFileRows(int file, int64_t begin,
                                                  int64_t end) {
  if (file < 0 || file >= static_cast<int>(list_.paths.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", list_.field, ": no file ", file,
                     " (the list has ", list_.paths.size(), ")"));
  }
  const std::string& path = list_.paths[file];
  if (begin < 0 || end < begin || end > list_.rows[file]) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", list_.field, ": rows [", begin, ", ", end,
                     ") are outside the ", list_.rows[file], " rows of '", path,
                     "' (file ", file, ") in this split"));
  }
  MPILEARN_ASSIGN_OR_RETURN(DataFile * data, Open(file));
  const int64_t first = list_.first[file] + begin;
  absl::StatusOr<DataRows> rows = data->Read(first, list_.first[file] + end);
  if (!rows.ok()) return InField(list_.field, rows.status());
  if (skip_bad_rows_ &&
      ((!IsIntegerElementType(data->feature_type()) &&
        FirstNonFinite(rows->features) >= 0) ||
       (rows->labels.dim() == 2 && !IsIntegerElementType(data->label_type()) &&
        FirstNonFinite(rows->labels) >= 0))) {
    DropNonFiniteRows(&*rows);
  }
  if (!IsIntegerElementType(data->feature_type())) {
    MPILEARN_RETURN_IF_ERROR(CheckFinite(
        list_.field, path, "features", names_.features, rows->features, first));
  }
  if (rows->labels.dim() == 1) {
    MPILEARN_RETURN_IF_ERROR(
        CheckClassIndices(list_.field, path, names_.labels, rows->labels, first));
  } else if (data->packed() != nullptr && data->packed()->labels.size() > 1) {
    MPILEARN_RETURN_IF_ERROR(CheckFinite(list_.field, path, "labels", names_.labels,
                                         rows->labels, first));
    MPILEARN_RETURN_IF_ERROR(
        CheckPackedClassIndices(list_.field, path, *data->packed(), rows->labels, first));
  } else if (!IsIntegerElementType(data->label_type())) {
    MPILEARN_RETURN_IF_ERROR(CheckFinite(list_.field, path, "labels",
                                         names_.labels, rows->labels, first));
  }
  return rows;
}

absl::StatusOr<DataRows> FileReader::ReadRange(int64_t begin, int64_t end) {
  const int64_t total = list_.total_rows();
  if (begin < 0 || end < begin || end > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", list_.field, ": rows [", begin, ", ", end,
                     ") are outside the split's ", total, " rows"));
  }
  if (list_.paths.empty()) return DataRows{};
  // An empty range reads no rows of the first file, for the row shapes.
  if (begin == end) return ReadFileRows(0, 0, 0);
  std::vector<torch::Tensor> features, labels;
  int64_t start = 0;  // the split's row at file i's first row
  for (int i = 0; i < static_cast<int>(list_.paths.size()) && start < end;
       ++i) {
    const int64_t stop = start + list_.rows[i];
    // File i's part of [begin, end).
    const int64_t from = std::max(begin, start);
    const int64_t to = std::min(end, stop);
    if (from < to) {
      MPILEARN_ASSIGN_OR_RETURN(DataRows rows,
                                ReadFileRows(i, from - start, to - start));
      features.push_back(std::move(rows.features));
      labels.push_back(std::move(rows.labels));
    }
    start = stop;
  }
  if (features.size() == 1) {
    return DataRows{std::move(features[0]), std::move(labels[0])};
  }
  return DataRows{torch::cat(features), torch::cat(labels)};
}

UnitPrefetcher::UnitPrefetcher(FileList train, DataFileNames names,
                               bool skip_bad_rows)
    : reader_(std::move(train), std::move(names), skip_bad_rows),
      thread_([this] { Loop(); }) {}

UnitPrefetcher::~UnitPrefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    pending_.clear();
  }
  thread_.join();
}

bool UnitPrefetcher::HasWork() const {
  if (stop_) return true;
  for (const auto& pending : pending_) {
    if (!pending->started) return true;
  }
  return false;
}

void UnitPrefetcher::ShuffleRows(uint64_t seed, DataRows* rows) {
  const int64_t n = rows->features.size(0);
  const torch::Tensor order =
      torch::randperm(n, torch::make_generator<at::CPUGeneratorImpl>(seed));
  // Into malloc'd tensors, as the reads (NewHostTensor explains why).
  for (torch::Tensor* t : {&rows->features, &rows->labels}) {
    torch::Tensor shuffled = NewHostTensor(t->sizes().vec(), t->scalar_type());
    torch::index_select_out(shuffled, *t, 0, order);
    *t = std::move(shuffled);
  }
}

void UnitPrefetcher::Loop() {
  while (true) {
    std::shared_ptr<Pending> next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &UnitPrefetcher::HasWork));
      if (stop_) return;
      for (const auto& pending : pending_) {
        if (!pending->started) {
          next = pending;
          break;
        }
      }
      next->started = true;
    }
    absl::StatusOr<DataRows> rows;
    try {
      rows = reader_.ReadFileRows(next->range.file, next->range.begin,
                                  next->range.end);
      if (rows.ok() && next->range.shuffle_seed != 0) {
        ShuffleRows(next->range.shuffle_seed, &*rows);
      }
    } catch (const std::exception& e) {
      // LibTorch throws (e.g. out of memory); the thread must go on.
      rows = absl::InternalError(absl::StrCat(
          "reading rows [", next->range.begin, ", ", next->range.end,
          ") of training file ", next->range.file, ": ", e.what()));
    }
    absl::MutexLock lock(&mu_);
    next->rows = std::move(rows);
    next->done = true;
  }
}

void UnitPrefetcher::Prefetch(const RowRange& range) {
  absl::MutexLock lock(&mu_);
  for (const auto& pending : pending_) {
    if (pending->range == range) return;
  }
  if (static_cast<int>(pending_.size()) >= kMaxPending) pending_.pop_front();
  auto pending = std::make_shared<Pending>();
  pending->range = range;
  pending_.push_back(std::move(pending));
}

absl::StatusOr<DataRows> UnitPrefetcher::Take(const RowRange& range) {
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(
      pending_.begin(), pending_.end(),
      [&](const std::shared_ptr<Pending>& p) { return p->range == range; });
  std::shared_ptr<Pending> mine;
  if (it == pending_.end()) {
    mine = std::make_shared<Pending>();
    mine->range = range;
    pending_.push_front(mine);
    it = pending_.begin();
  } else {
    mine = *it;
  }
  pending_.erase(pending_.begin(), it);  // the reads asked for before it
  mu_.Await(absl::Condition(&mine->done));
  const auto done = std::find(pending_.begin(), pending_.end(), mine);
  if (done != pending_.end()) pending_.erase(done);
  return std::move(mine->rows);
}

}  // namespace mpilearn::worker
