#include "common/checkpoint_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace mpilearn {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

uint32_t Crc32(const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), n);
    data += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

absl::StatusOr<std::string> EncodeCheckpoint(
    const v1::JobCheckpointFile& checkpoint) {
  const size_t size = checkpoint.ByteSizeLong();
  if (size > static_cast<size_t>(INT32_MAX)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoint of ", size, " bytes is over protobuf's 2 GiB limit"));
  }
  std::string bytes(size + kCheckpointTrailerBytes, '\0');
  if (!checkpoint.SerializeToArray(bytes.data(), static_cast<int>(size))) {
    return absl::InternalError("cannot serialize the checkpoint");
  }
  const uint32_t crc = Crc32(bytes.data(), size);
  for (int i = 0; i < 4; ++i) {
    bytes[size + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  }
  std::memcpy(bytes.data() + size + 4, kCheckpointMagic.data(), 4);
  return bytes;
}

absl::StatusOr<v1::JobCheckpointFile> DecodeCheckpoint(const std::string& bytes,
                                                       const std::string& what) {
  if (bytes.size() < kCheckpointTrailerBytes ||
      std::memcmp(bytes.data() + bytes.size() - 4, kCheckpointMagic.data(),
                  4) != 0) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", what, "' is truncated or not a checkpoint (",
        bytes.size(), " bytes, no MLCK trailer)"));
  }
  const size_t size = bytes.size() - kCheckpointTrailerBytes;
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[size + i]))
              << (8 * i);
  }
  const uint32_t computed = Crc32(bytes.data(), size);
  if (stored != computed) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint '%s' is damaged: CRC-32 %08x, trailer says %08x", what,
        computed, stored));
  }
  v1::JobCheckpointFile checkpoint;
  if (size > static_cast<size_t>(INT32_MAX) ||
      !checkpoint.ParseFromArray(bytes.data(), static_cast<int>(size))) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", what, "' does not parse as a JobCheckpointFile"));
  }
  return checkpoint;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  const std::streamoff size = in.tellg();
  std::string contents(size > 0 ? static_cast<size_t>(size) : 0, '\0');
  in.seekg(0);
  if (size < 0 || !in.read(contents.data(), size)) {
    return ErrnoError("cannot read", path);
  }
  return contents;
}

absl::StatusOr<v1::JobCheckpointFile> ReadCheckpointFile(
    const std::string& path) {
  MPILEARN_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  return DecodeCheckpoint(bytes, path);
}

absl::StatusOr<v1::JobCheckpointFile> ReadWeightsOrCheckpointFile(const std::string& path,
                                                                  uint64_t max_bytes) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (error) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "': ", error.message()));
  }
  if (size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "'", path, "' is ", size, " bytes, over the ", max_bytes, " this reads"));
  }
  MPILEARN_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  if (absl::EndsWith(bytes, kCheckpointMagic)) return DecodeCheckpoint(bytes, path);
  v1::JobCheckpointFile weights_only;
  if (!weights_only.mutable_weights()->ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' is neither a serialized mpilearn.v1.TensorSet (a job's weights.pb) "
        "nor a checkpoint (corrupt or another format)"));
  }
  return weights_only;
}

absl::Status FsyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open directory", dir);
  if (::fsync(fd) != 0) {
    absl::Status status = ErrnoError("cannot flush directory", dir);
    ::close(fd);
    return status;
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents) {
  // Unique per process and call: two threads may write the same file.
  static std::atomic<uint64_t> sequence{0};
  const std::string tmp = absl::StrCat(path, kAtomicWriteTempInfix, getpid(),
                                       ".", sequence.fetch_add(1));
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp);
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n =
        ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status status = ErrnoError("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return status;
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    absl::Status status = ErrnoError("cannot flush", tmp);
    ::unlink(tmp.c_str());
    return status;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status status = ErrnoError("cannot rename into", path);
    ::unlink(tmp.c_str());
    return status;
  }
  // The rename is an entry in the directory: until the directory itself is
  // flushed, a power loss may bring back the old entry (or none, for a new
  // file) although the file's bytes were on disk.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  return FsyncDirectory(dir);
}

}  // namespace mpilearn
