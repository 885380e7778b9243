// OpenNumpyFile: NumPy .npy files and .npz archives (data_file.h).
//
// A .npy file (npy_header.h) is read by range (pread). A .npz file is a ZIP
// archive of .npy members: STORED members (numpy.savez) are read by range
// like .npy files; DEFLATED members (numpy.savez_compressed) cannot be, so
// such a member is inflated into memory once, on its first read, and served
// from there (at most kMaxInflatedBytes).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/data/data_file.h"
#include "worker/data/npy_header.h"

namespace mpilearn::worker {
namespace {

// Elements are handed to FeaturesFromRaw in native byte order, and only
// little-endian arrays are accepted.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the NumPy reader assumes a little-endian host");

// A DEFLATED .npz member is inflated whole into memory; larger ones must be
// saved uncompressed (numpy.savez), which is read by range.
constexpr int64_t kMaxInflatedBytes = int64_t{2} << 30;
// A ZIP central directory larger than this is not a .npz numpy wrote.
constexpr int64_t kMaxCentralDirectoryBytes = int64_t{64} << 20;
constexpr int64_t kInflateChunkBytes = int64_t{1} << 20;

// A file read by range. It remembers its size at open, so a read notices a
// file that changed under the job. Used by one thread at a time.
class RangeFile {
 public:
  static absl::StatusOr<std::shared_ptr<RangeFile>> Open(
      const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      if (error == ENOENT) {
        return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
      }
      return absl::ErrnoToStatus(error,
                                 absl::StrCat("cannot open '", path, "'"));
    }
    auto file = std::shared_ptr<RangeFile>(new RangeFile(path, fd));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat("cannot stat '", path, "'"));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' is not a regular file"));
    }
    file->size_ = st.st_size;
    return file;
  }

  RangeFile(const RangeFile&) = delete;
  RangeFile& operator=(const RangeFile&) = delete;
  ~RangeFile() { close(fd_); }

  const std::string& path() const { return path_; }
  // The size at open.
  int64_t size() const { return size_; }

  // Reads exactly `n` bytes at `offset` into `dst`. DataLoss when the file's
  // size is no longer the size at open, or the read fails or comes up short.
  absl::Status ReadAt(int64_t offset, int64_t n, void* dst) const {
    struct stat st;
    if (fstat(fd_, &st) != 0) {
      return absl::DataLossError(
          absl::StrCat("cannot stat '", path_, "': ", std::strerror(errno)));
    }
    if (st.st_size != size_) {
      return absl::DataLossError(absl::StrCat(
          "'", path_, "' changed while the job ran: it held ", size_,
          " bytes when opened and holds ", st.st_size, " now"));
    }
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got = pread(fd_, out, static_cast<size_t>(n), offset);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        return absl::DataLossError(absl::StrCat("reading '", path_,
                                                "' at byte ", offset, ": ",
                                                std::strerror(errno)));
      }
      if (got == 0) {
        return absl::DataLossError(absl::StrCat(
            "'", path_, "' is truncated: it ends before byte ", offset + n));
      }
      out += got;
      offset += got;
      n -= got;
    }
    return absl::OkStatus();
  }

 private:
  RangeFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  const std::string path_;
  const int fd_;
  int64_t size_ = 0;
};

// .npy bytes stored as they are at `start` in `file`.
class StoredBytes final : public NpyBytes {
 public:
  StoredBytes(std::shared_ptr<RangeFile> file, int64_t start, int64_t size)
      : file_(std::move(file)), start_(start), size_(size) {}
  int64_t size() const override { return size_; }
  absl::Status ReadAt(int64_t offset, int64_t n, void* dst) override {
    return file_->ReadAt(start_ + offset, n, dst);
  }

 private:
  const std::shared_ptr<RangeFile> file_;
  const int64_t start_;
  const int64_t size_;
};

struct InflateStreamEnder {
  void operator()(z_stream* stream) const { inflateEnd(stream); }
};

// .npy bytes DEFLATED (raw deflate, ZIP method 8) at `start` in `file`.
// Header reads within the first kPrefixBytes inflate only that prefix, so a
// file opened for its shapes alone never holds a whole member; the first
// data read inflates the whole member, checks its CRC-32 and keeps it in
// memory.
class DeflatedBytes final : public NpyBytes {
 public:
  static constexpr int64_t kPrefixBytes = int64_t{64} << 10;

  DeflatedBytes(std::shared_ptr<RangeFile> file, std::string what,
                int64_t start, int64_t compressed_size, int64_t size,
                uint32_t crc)
      : file_(std::move(file)),
        what_(std::move(what)),
        start_(start),
        compressed_size_(compressed_size),
        size_(size),
        crc_(crc) {}

  int64_t size() const override { return size_; }

  absl::Status ReadAt(int64_t offset, int64_t n, void* dst) override {
    if (!complete_) MPILEARN_RETURN_IF_ERROR(Inflate(size_));
    std::memcpy(dst, inflated_.data() + offset, static_cast<size_t>(n));
    return absl::OkStatus();
  }

  absl::Status ReadHeaderAt(int64_t offset, int64_t n, void* dst) override {
    if (offset + n > static_cast<int64_t>(inflated_.size())) {
      MPILEARN_RETURN_IF_ERROR(Inflate(
          offset + n <= kPrefixBytes ? std::min(size_, kPrefixBytes) : size_));
    }
    std::memcpy(dst, inflated_.data() + offset, static_cast<size_t>(n));
    return absl::OkStatus();
  }

  void HeaderDone() override {
    if (!complete_) std::vector<char>().swap(inflated_);
  }

 private:
  // Inflates the first `want` bytes of the member into inflated_ (all of it,
  // CRC checked, when want == size_).
  absl::Status Inflate(int64_t want) {
    z_stream stream{};
    if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) {
      return absl::ResourceExhaustedError("zlib: inflateInit2 failed");
    }
    std::unique_ptr<z_stream, InflateStreamEnder> ender(&stream);
    std::vector<char> out(static_cast<size_t>(want));
    std::vector<char> in(static_cast<size_t>(
        std::min(kInflateChunkBytes, std::max<int64_t>(compressed_size_, 1))));
    int64_t consumed = 0;
    stream.next_out = reinterpret_cast<Bytef*>(out.data());
    stream.avail_out = static_cast<uInt>(want);
    while (static_cast<int64_t>(stream.total_out) < want) {
      if (stream.avail_in == 0) {
        if (consumed == compressed_size_) break;
        const int64_t chunk =
            std::min<int64_t>(in.size(), compressed_size_ - consumed);
        MPILEARN_RETURN_IF_ERROR(
            file_->ReadAt(start_ + consumed, chunk, in.data()));
        consumed += chunk;
        stream.next_in = reinterpret_cast<Bytef*>(in.data());
        stream.avail_in = static_cast<uInt>(chunk);
      }
      const int rc = inflate(&stream, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) break;
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return absl::DataLossError(absl::StrCat(
            what_, " is corrupt: inflate failed (",
            stream.msg != nullptr ? stream.msg : "zlib error", ")"));
      }
    }
    if (static_cast<int64_t>(stream.total_out) < want) {
      return absl::DataLossError(
          absl::StrCat(what_, " is corrupt: it inflates to ", stream.total_out,
                       " bytes, but the archive says ", size_));
    }
    if (want == size_) {
      const uint32_t crc = static_cast<uint32_t>(
          crc32_z(crc32_z(0L, Z_NULL, 0),
                  reinterpret_cast<const Bytef*>(out.data()), out.size()));
      if (crc != crc_) {
        return absl::DataLossError(
            absl::StrCat(what_, " is corrupt: its CRC-32 does not match"));
      }
      complete_ = true;
    }
    inflated_ = std::move(out);
    return absl::OkStatus();
  }

  const std::shared_ptr<RangeFile> file_;
  const std::string what_;  // for messages: "'a.npz' member 'b.npy'"
  const int64_t start_;
  const int64_t compressed_size_;
  const int64_t size_;
  const uint32_t crc_;
  // The first inflated_.size() bytes of the member; all of them once
  // complete_.
  std::vector<char> inflated_;
  bool complete_ = false;
};

// The features and labels of one .npy pair or .npz archive.
class NumpyFile final : public DataFile {
 public:
  NumpyFile(std::string path, NpyArray features, NpyArray labels)
      : features_(std::move(features)), labels_(std::move(labels)) {
    path_ = std::move(path);
    rows_ = features_.shape[0];
    feature_shape_.assign(features_.shape.begin() + 1, features_.shape.end());
    label_shape_.assign(labels_.shape.begin() + 1, labels_.shape.end());
    feature_type_ = features_.type;
    label_type_ = labels_.type;
  }

  absl::StatusOr<torch::Tensor> ReadFeatures(int64_t begin,
                                             int64_t end) override {
    MPILEARN_RETURN_IF_ERROR(CheckRange(begin, end));
    MPILEARN_ASSIGN_OR_RETURN(torch::Tensor raw,
                              ReadRows(features_, begin, end));
    return FeaturesFromRaw(raw.data_ptr(), features_.type,
                           ShapeOf(features_, end - begin));
  }

  absl::StatusOr<torch::Tensor> ReadLabels(int64_t begin,
                                           int64_t end) override {
    MPILEARN_RETURN_IF_ERROR(CheckRange(begin, end));
    MPILEARN_ASSIGN_OR_RETURN(torch::Tensor raw, ReadRows(labels_, begin, end));
    return LabelsFromRaw(raw.data_ptr(), labels_.type,
                         ShapeOf(labels_, end - begin));
  }

 private:
  static std::vector<int64_t> ShapeOf(const NpyArray& array, int64_t rows) {
    std::vector<int64_t> shape = array.shape;
    shape[0] = rows;
    return shape;
  }

  // Rows [begin, end) of `array`'s raw bytes, in a uint8 tensor (aligned
  // for every element type).
  static absl::StatusOr<torch::Tensor> ReadRows(NpyArray& array, int64_t begin,
                                                int64_t end) {
    const int64_t n = (end - begin) * array.row_bytes;
    torch::Tensor raw = NewHostTensor({n}, torch::kUInt8);
    if (n == 0) return raw;
    const absl::Status read = array.bytes->ReadAt(
        array.data_offset + begin * array.row_bytes, n, raw.data_ptr());
    if (!read.ok()) {
      return absl::DataLossError(absl::StrCat("reading rows [", begin, ", ",
                                              end, ") of ", array.what, ": ",
                                              read.message()));
    }
    return raw;
  }

  NpyArray features_;
  NpyArray labels_;
};

absl::Status CheckRows(const NpyArray& features, const NpyArray& labels) {
  if (features.shape[0] == labels.shape[0]) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      features.what, " holds ", features.shape[0], " rows of features but ",
      labels.what, " holds ", labels.shape[0],
      " rows of labels; both must have the same first dimension"));
}

// One entry of a ZIP central directory.
struct ZipMember {
  std::string name;
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  int64_t compressed_size = 0;
  int64_t size = 0;
  int64_t local_header_offset = 0;
};

// Reads the central directory of the ZIP archive `file` (ZIP64 included).
absl::StatusOr<std::vector<ZipMember>> ReadZipDirectory(const RangeFile& file) {
  const std::string not_zip = absl::StrCat(
      "'", file.path(),
      "' is not a NumPy .npz archive (a ZIP file, as numpy.savez writes): ");
  constexpr int64_t kEndRecordBytes = 22;
  if (file.size() < kEndRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat(not_zip, "too short"));
  }
  // The end record is the last 22 bytes plus a comment of up to 65535.
  const int64_t tail_bytes =
      std::min<int64_t>(file.size(), kEndRecordBytes + 65535);
  const int64_t tail_start = file.size() - tail_bytes;
  std::vector<unsigned char> tail(static_cast<size_t>(tail_bytes));
  MPILEARN_RETURN_IF_ERROR(file.ReadAt(tail_start, tail_bytes, tail.data()));
  int64_t end = -1;
  for (int64_t i = tail_bytes - kEndRecordBytes; i >= 0; --i) {
    if (Le32(&tail[i]) == 0x06054b50 &&
        i + kEndRecordBytes + Le16(&tail[i + 20]) <= tail_bytes) {
      end = i;
      break;
    }
  }
  if (end < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(not_zip, "it has no end-of-central-directory record"));
  }
  const unsigned char* record = &tail[end];
  if (Le16(record + 4) != 0 || Le16(record + 6) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(not_zip, "it spans several disks"));
  }
  int64_t entries = Le16(record + 10);
  int64_t directory_bytes = Le32(record + 12);
  int64_t directory_offset = Le32(record + 16);
  if (entries == 0xFFFF || directory_bytes == 0xFFFFFFFF ||
      directory_offset == 0xFFFFFFFF) {
    // ZIP64: the locator (20 bytes) right before the end record points to
    // the ZIP64 end record (56 bytes) with the 64-bit values.
    const int64_t locator = tail_start + end - 20;
    unsigned char buffer[56];
    if (locator < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(not_zip, "its ZIP64 locator is missing"));
    }
    MPILEARN_RETURN_IF_ERROR(file.ReadAt(locator, 20, buffer));
    const int64_t end64 = static_cast<int64_t>(std::min<uint64_t>(
        Le64(buffer + 8), std::numeric_limits<int64_t>::max()));
    if (Le32(buffer) != 0x07064b50 || end64 > locator - 56) {
      return absl::InvalidArgumentError(
          absl::StrCat(not_zip, "its ZIP64 locator is missing or corrupt"));
    }
    MPILEARN_RETURN_IF_ERROR(file.ReadAt(end64, 56, buffer));
    if (Le32(buffer) != 0x06064b50) {
      return absl::InvalidArgumentError(
          absl::StrCat(not_zip, "its ZIP64 end record is missing"));
    }
    entries =
        static_cast<int64_t>(std::min<uint64_t>(Le64(buffer + 32), 1u << 30));
    directory_bytes = static_cast<int64_t>(
        std::min<uint64_t>(Le64(buffer + 40), uint64_t{1} << 62));
    directory_offset = static_cast<int64_t>(
        std::min<uint64_t>(Le64(buffer + 48), uint64_t{1} << 62));
  }
  if (directory_bytes > kMaxCentralDirectoryBytes ||
      directory_offset + directory_bytes > file.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(not_zip, "its central directory lies outside the file"));
  }
  std::vector<unsigned char> directory(static_cast<size_t>(directory_bytes));
  MPILEARN_RETURN_IF_ERROR(
      file.ReadAt(directory_offset, directory_bytes, directory.data()));
  std::vector<ZipMember> members;
  int64_t pos = 0;
  constexpr int64_t kEntryBytes = 46;
  for (int64_t i = 0; i < entries; ++i) {
    if (pos + kEntryBytes > directory_bytes ||
        Le32(&directory[pos]) != 0x02014b50) {
      return absl::InvalidArgumentError(
          absl::StrCat(not_zip, "its central directory is corrupt"));
    }
    const unsigned char* entry = &directory[pos];
    const int64_t name_bytes = Le16(entry + 28);
    const int64_t extra_bytes = Le16(entry + 30);
    const int64_t comment_bytes = Le16(entry + 32);
    if (pos + kEntryBytes + name_bytes + extra_bytes + comment_bytes >
        directory_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(not_zip, "its central directory is corrupt"));
    }
    ZipMember member;
    member.flags = Le16(entry + 8);
    member.method = Le16(entry + 10);
    member.crc = Le32(entry + 16);
    member.compressed_size = Le32(entry + 20);
    member.size = Le32(entry + 24);
    member.local_header_offset = Le32(entry + 42);
    member.name.assign(reinterpret_cast<const char*>(entry + kEntryBytes),
                       static_cast<size_t>(name_bytes));
    // ZIP64 extra field (id 1): the 64-bit values of the fields that hold
    // 0xFFFFFFFF, in this order.
    const unsigned char* extra = entry + kEntryBytes + name_bytes;
    for (int64_t e = 0; e + 4 <= extra_bytes;) {
      const int64_t id = Le16(extra + e);
      const int64_t length = Le16(extra + e + 2);
      if (e + 4 + length > extra_bytes) break;
      if (id == 1) {
        const unsigned char* value = extra + e + 4;
        const unsigned char* value_end = value + length;
        for (int64_t* field : {&member.size, &member.compressed_size,
                               &member.local_header_offset}) {
          if (*field != 0xFFFFFFFF) continue;
          if (value + 8 > value_end) break;
          *field = static_cast<int64_t>(
              std::min<uint64_t>(Le64(value), uint64_t{1} << 62));
          value += 8;
        }
      }
      e += 4 + length;
    }
    members.push_back(std::move(member));
    pos += kEntryBytes + name_bytes + extra_bytes + comment_bytes;
  }
  return members;
}

// Locates the .npy bytes of archive member `name` of `file`.
absl::StatusOr<NpyArray> OpenZipMember(std::shared_ptr<RangeFile> file,
                                       const std::vector<ZipMember>& members,
                                       const std::string& name) {
  const auto it =
      std::find_if(members.begin(), members.end(),
                   [&name](const ZipMember& m) { return m.name == name; });
  if (it == members.end()) {
    constexpr size_t kMaxListed = 20;
    std::vector<std::string> names;
    for (const ZipMember& m : members) {
      if (names.size() == kMaxListed) break;
      names.push_back(m.name);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "'", file->path(), "' has no member '", name, "'; its members: ",
        names.empty() ? "(none)" : absl::StrJoin(names, ", "),
        members.size() > kMaxListed
            ? absl::StrCat(" and ", members.size() - kMaxListed, " more")
            : ""));
  }
  const ZipMember& member = *it;
  NpyArray array;
  array.what = absl::StrCat("'", file->path(), "' member '", name, "'");
  if (member.flags & 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(array.what, " is encrypted"));
  }
  unsigned char local[30];
  if (member.local_header_offset + 30 > file->size()) {
    return absl::DataLossError(
        absl::StrCat(array.what, " lies outside the file (truncated)"));
  }
  MPILEARN_RETURN_IF_ERROR(file->ReadAt(member.local_header_offset, 30, local));
  if (Le32(local) != 0x04034b50) {
    return absl::InvalidArgumentError(
        absl::StrCat(array.what, " has no local file header"));
  }
  const int64_t start =
      member.local_header_offset + 30 + Le16(local + 26) + Le16(local + 28);
  if (start + member.compressed_size > file->size()) {
    return absl::DataLossError(absl::StrCat(
        array.what, " is truncated: its data ends past the end of the file"));
  }
  if (member.method == 0) {
    if (member.compressed_size != member.size) {
      return absl::InvalidArgumentError(
          absl::StrCat(array.what, " is corrupt: stored sizes disagree"));
    }
    array.bytes =
        std::make_unique<StoredBytes>(std::move(file), start, member.size);
  } else if (member.method == 8) {
    if (member.size > kMaxInflatedBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          array.what, " is compressed and holds ", member.size,
          " bytes; compressed members are inflated into memory, up to ",
          kMaxInflatedBytes >> 30,
          " GiB: save with numpy.savez (uncompressed), which is read by "
          "range, or use HDF5"));
    }
    // Deflate expands at most 1032:1, so a larger claim is corruption, caught
    // before memory is taken for it.
    if (member.size > member.compressed_size * 1032 + 1024) {
      return absl::DataLossError(
          absl::StrCat(array.what, " is corrupt: ", member.compressed_size,
                       " compressed bytes cannot inflate to the ", member.size,
                       " the archive claims"));
    }
    array.bytes = std::make_unique<DeflatedBytes>(std::move(file), array.what,
                                                  start, member.compressed_size,
                                                  member.size, member.crc);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        array.what, " uses ZIP compression method ", member.method,
        "; only stored (numpy.savez) and deflated (numpy.savez_compressed) "
        "members are supported"));
  }
  return array;
}

absl::StatusOr<std::unique_ptr<DataFile>> OpenNpz(const std::string& path,
                                                  const DataFileNames& names) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<RangeFile> file,
                            RangeFile::Open(path));
  MPILEARN_ASSIGN_OR_RETURN(std::vector<ZipMember> members,
                            ReadZipDirectory(*file));
  MPILEARN_ASSIGN_OR_RETURN(
      NpyArray features,
      OpenZipMember(file, members, absl::StrCat(names.features, ".npy")));
  MPILEARN_ASSIGN_OR_RETURN(
      NpyArray labels,
      OpenZipMember(file, members, absl::StrCat(names.labels, ".npy")));
  MPILEARN_RETURN_IF_ERROR(ReadNpyHeader(&features));
  MPILEARN_RETURN_IF_ERROR(ReadNpyHeader(&labels));
  MPILEARN_RETURN_IF_ERROR(CheckRows(features, labels));
  return std::make_unique<NumpyFile>(path, std::move(features),
                                     std::move(labels));
}

// The labels file of the .npy features file `path` (see data_file.h).
absl::StatusOr<std::string> LabelsPathOf(const std::string& path,
                                         const DataFileNames& names) {
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t at =
      names.features.empty() ? std::string::npos : path.rfind(names.features);
  if (at == std::string::npos || at < base || names.features == names.labels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path,
        "': the labels of a .npy features file are read from the "
        ".npy file whose name has the last '",
        names.features, "' replaced by '", names.labels, "' (x_",
        names.features, ".npy -> x_", names.labels,
        ".npy), but this file name does not contain '", names.features,
        "'; rename it, or use a .npz archive or an HDF5 file"));
  }
  std::string labels = path;
  labels.replace(at, names.features.size(), names.labels);
  return labels;
}

absl::StatusOr<NpyArray> OpenNpy(const std::string& path) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<RangeFile> file,
                            RangeFile::Open(path));
  NpyArray array;
  array.what = absl::StrCat("'", path, "'");
  const int64_t size = file->size();
  array.bytes = std::make_unique<StoredBytes>(std::move(file), 0, size);
  MPILEARN_RETURN_IF_ERROR(ReadNpyHeader(&array));
  return array;
}

absl::StatusOr<std::unique_ptr<DataFile>> OpenNpyPair(
    const std::string& path, const DataFileNames& names) {
  MPILEARN_ASSIGN_OR_RETURN(NpyArray features, OpenNpy(path));
  MPILEARN_ASSIGN_OR_RETURN(const std::string labels_path,
                            LabelsPathOf(path, names));
  absl::StatusOr<NpyArray> labels = OpenNpy(labels_path);
  if (absl::IsNotFound(labels.status())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' needs its labels in '", labels_path,
        "' (the name with the last '", names.features, "' replaced by '",
        names.labels, "'), which does not exist"));
  }
  MPILEARN_RETURN_IF_ERROR(labels.status());
  MPILEARN_RETURN_IF_ERROR(CheckRows(features, *labels));
  return std::make_unique<NumpyFile>(path, std::move(features),
                                     std::move(*labels));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataFile>> OpenNumpyFile(
    const std::string& path, const DataFileNames& names) {
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".npz")) return OpenNpz(path, names);
  if (absl::EndsWith(lower, ".npy")) return OpenNpyPair(path, names);
  return absl::InvalidArgumentError(absl::StrCat(
      "'", path, "' is not a NumPy file: the name must end in .npy or .npz"));
}

}  // namespace mpilearn::worker
