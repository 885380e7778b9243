// The studies' files: each study as <state_dir>/studies/<id>/study.pb (a
// v1::StudyFile), written atomically whenever the study table says it
// changed, and read back when the master starts.
//
//   StudyStore store(state_dir);              // "" keeps nothing on disk
//   MPILEARN_ASSIGN_OR_RETURN(auto loaded, store.Load());
//   MPILEARN_RETURN_IF_ERROR(store.Write(status));
//
// Load creates the studies folder (UNAVAILABLE when it cannot), removes the
// temporary files of writes a crash interrupted, and returns every study
// whose file reads and names its own folder, in the order of their numbers;
// a file that does not read is logged and skipped, yet its number still
// counts, so a new study never reuses it. Write failures are returned, for
// the caller to log and retry.
//
// Threading: holds no state beyond the folder's name; calls may run on any
// thread, but writes of one study must not overlap (the study table makes
// them under its lock).
#ifndef MPILEARN_SERVER_OPT_STUDY_STORE_H_
#define MPILEARN_SERVER_OPT_STUDY_STORE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/study.pb.h"

namespace mpilearn::opt {

class StudyStore {
 public:
  // What Load found.
  struct Loaded {
    // Studies that read, by number ("s-1", "s-2", ...).
    std::vector<v1::StudyStatus> studies;
    // The highest study number found, read or not; 0 when none.
    int last_number = 0;
  };

  // Studies go under `state_dir`/studies; an empty `state_dir` keeps them
  // in memory only (Load finds none, Write does nothing).
  explicit StudyStore(std::string state_dir)
      : state_dir_(std::move(state_dir)) {}

  bool on_disk() const { return !state_dir_.empty(); }

  absl::StatusOr<Loaded> Load() const;
  // Replaces the study's file (status.study_id() names its folder).
  absl::Status Write(const v1::StudyStatus& status) const;

 private:
  const std::string state_dir_;
};

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_STUDY_STORE_H_
