#include "worker/data/idx_writer.h"

#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "worker/data/idx_reader.h"

namespace mpilearn::worker {

absl::Status IdxGzWriter::Open(const std::string& path, IdxType type,
                               const std::vector<int64_t>& dims) {
  path_ = path;
  type_ = type;
  dims_ = dims;
  expected_ = 1;
  for (const int64_t d : dims) expected_ *= d;
  written_ = 0;
  errno = 0;
  // Level 1, the fastest: the noisy payloads barely compress at any level.
  file_.reset(gzopen(path.c_str(), "wb1"));
  if (file_ == nullptr) {
    return absl::ErrnoToStatus(errno == 0 ? ENOMEM : errno,
                               absl::StrCat("cannot create '", path, "'"));
  }
  std::vector<uint8_t> header = {0, 0, static_cast<uint8_t>(type),
                                 static_cast<uint8_t>(dims.size())};
  for (const int64_t d : dims) {
    const uint32_t u = static_cast<uint32_t>(d);
    header.insert(header.end(),
                  {static_cast<uint8_t>(u >> 24), static_cast<uint8_t>(u >> 16),
                   static_cast<uint8_t>(u >> 8), static_cast<uint8_t>(u)});
  }
  return Write(header);
}

absl::Status IdxGzWriter::Append(absl::Span<const float> values) {
  buffer_.clear();
  for (const float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    buffer_.insert(buffer_.end(), {static_cast<uint8_t>(bits >> 24),
                                   static_cast<uint8_t>(bits >> 16),
                                   static_cast<uint8_t>(bits >> 8),
                                   static_cast<uint8_t>(bits)});
  }
  written_ += values.size();
  return Write(buffer_);
}

absl::Status IdxGzWriter::Append(absl::Span<const uint8_t> values) {
  written_ += values.size();
  return Write(values);
}

absl::Status IdxGzWriter::Close() {
  if (written_ != expected_) {
    return absl::InternalError(absl::StrCat("'", path_, "': wrote ", written_,
                                            " elements but declared ",
                                            expected_));
  }
  const int result = gzclose(file_.release());
  if (result != Z_OK) {
    return absl::DataLossError(absl::StrCat(
        "cannot finish '", path_, "': gzclose returned ", result));
  }
  return absl::OkStatus();
}

absl::Status IdxGzWriter::Write(absl::Span<const uint8_t> bytes) {
  if (bytes.empty()) return absl::OkStatus();
  if (gzwrite(file_.get(), bytes.data(), bytes.size()) !=
      static_cast<int>(bytes.size())) {
    int zerr = Z_OK;
    const char* msg = gzerror(file_.get(), &zerr);
    if (zerr == Z_ERRNO) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat("cannot write '", path_, "'"));
    }
    return absl::DataLossError(absl::StrCat(
        "cannot write '", path_, "': gzip: ", msg == nullptr ? "?" : msg));
  }
  return absl::OkStatus();
}

}  // namespace mpilearn::worker
