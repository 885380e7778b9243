// The checkpoint file format, shared by the master (which writes and reloads
// checkpoints, server/core/store/job_store.h) and the tools that read them
// (mpilearn-export).
//
// A checkpoint file is a serialized v1::JobCheckpointFile followed by an
// 8-byte trailer: the CRC-32 (zlib's crc32) of the serialized bytes as a
// little-endian uint32, then the 4 bytes "MLCK". A reader refuses a file
// whose trailer is missing or whose checksum differs (DATA_LOSS), so a
// truncated or damaged file is never mistaken for a checkpoint. To look at
// one by hand (strip the trailer, then decode):
//   head -c -8 FILE | protoc --proto_path=proto
//       --decode=mpilearn.v1.JobCheckpointFile mpilearn.proto
//
//   MPILEARN_ASSIGN_OR_RETURN(std::string bytes, EncodeCheckpoint(file));
//   MPILEARN_RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
//   ...
//   MPILEARN_ASSIGN_OR_RETURN(v1::JobCheckpointFile file,
//                             ReadCheckpointFile(path));
//
// Where the files live under a master's --state_dir is JobStore's business
// (server/core/store/job_store.h). All functions are thread-safe (no shared
// mutable state).
#ifndef MPILEARN_COMMON_CHECKPOINT_FILE_H_
#define MPILEARN_COMMON_CHECKPOINT_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// The last 4 bytes of every checkpoint file.
inline constexpr absl::string_view kCheckpointMagic = "MLCK";
// CRC-32 (4 bytes, little-endian) and kCheckpointMagic.
inline constexpr size_t kCheckpointTrailerBytes = 8;

// A checkpoint file's bytes: payload and trailer. RESOURCE_EXHAUSTED when
// the message is over protobuf's 2 GiB limit.
absl::StatusOr<std::string> EncodeCheckpoint(
    const v1::JobCheckpointFile& checkpoint);

// Checks and parses a checkpoint file's bytes. Every error is DATA_LOSS and
// names `what` (the path): missing trailer (truncated or not a checkpoint),
// checksum mismatch (damaged), or a payload that does not parse.
absl::StatusOr<v1::JobCheckpointFile> DecodeCheckpoint(const std::string& bytes,
                                                       const std::string& what);

// Reads and checks one checkpoint file: NOT_FOUND if it cannot be read,
// otherwise DecodeCheckpoint's result.
absl::StatusOr<v1::JobCheckpointFile> ReadCheckpointFile(
    const std::string& path);

// A checkpoint file (as ReadCheckpointFile), or a bare serialized TensorSet
// (a job's final weights.pb) as a JobCheckpointFile holding only those
// weights. NOT_FOUND if it cannot be read; RESOURCE_EXHAUSTED, unread, when
// it is over `max_bytes`; DATA_LOSS naming the file when it is neither.
absl::StatusOr<v1::JobCheckpointFile> ReadWeightsOrCheckpointFile(const std::string& path,
                                                                  uint64_t max_bytes);

// The whole file at `path`; NOT_FOUND if it cannot be opened, INTERNAL if a
// read fails.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Writes `contents` to `path` atomically and durably: a temporary file in
// the same directory (its name holds ".tmp."), fsync, rename, fsync of the
// directory. A reader sees the old or the new file, never half of one; once
// it returns OK the new file survives a power loss; a crash may leave the
// temporary file.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents);

// Flushes directory `dir` itself, so that its entries (a rename into it, a
// new file) survive a power loss as the files' bytes do.
absl::Status FsyncDirectory(const std::string& dir);

// The infix of WriteFileAtomically's temporary file names, so that a cleanup
// can find the ones a crash left.
inline constexpr absl::string_view kAtomicWriteTempInfix = ".tmp.";

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_CHECKPOINT_FILE_H_
