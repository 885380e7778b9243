#include "server/opt/study_store.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint_file.h"
#include "glog/logging.h"

namespace mpilearn::opt {

absl::StatusOr<StudyStore::Loaded> StudyStore::Load() const {
  Loaded loaded;
  if (!on_disk()) return loaded;
  const std::string root = absl::StrCat(state_dir_, "/studies");
  std::error_code error;
  std::filesystem::create_directories(root, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", root, ": ", error.message(),
                     "; give --state_dir a directory the master can write"));
  }
  std::vector<std::pair<int, std::string>> found;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string id = entry.path().filename().string();
    int number = 0;
    if (!absl::StartsWith(id, "s-") ||
        !absl::SimpleAtoi(id.substr(2), &number)) {
      continue;
    }
    found.emplace_back(number, id);
  }
  std::sort(found.begin(), found.end());
  for (const auto& [number, id] : found) {
    loaded.last_number = std::max(loaded.last_number, number);
    // Temporary files of writes a crash interrupted (WriteFileAtomically).
    for (const auto& file : std::filesystem::directory_iterator(
             absl::StrCat(root, "/", id), error)) {
      if (absl::StrContains(file.path().filename().string(),
                            kAtomicWriteTempInfix)) {
        std::filesystem::remove(file.path(), error);
      }
    }
    const std::string path = absl::StrCat(root, "/", id, "/study.pb");
    absl::StatusOr<std::string> bytes = ReadWholeFile(path);
    v1::StudyFile file;
    if (!bytes.ok() || !file.ParseFromString(*bytes) ||
        file.status().study_id() != id) {
      LOG(WARNING) << "study " << id << ": cannot read " << path
                   << (bytes.ok()
                           ? ""
                           : absl::StrCat(": ", bytes.status().ToString()))
                   << "; skipped";
      continue;
    }
    loaded.studies.push_back(std::move(*file.mutable_status()));
  }
  return loaded;
}

absl::Status StudyStore::Write(const v1::StudyStatus& status) const {
  if (!on_disk()) return absl::OkStatus();
  const std::string dir =
      absl::StrCat(state_dir_, "/studies/", status.study_id());
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot write ", dir, "/study.pb: ", error.message()));
  }
  v1::StudyFile file;
  *file.mutable_status() = status;
  const absl::Status written = WriteFileAtomically(
      absl::StrCat(dir, "/study.pb"), file.SerializeAsString());
  if (!written.ok()) {
    return absl::Status(
        written.code(),
        absl::StrCat("cannot write ", dir, "/study.pb: ", written.message()));
  }
  return absl::OkStatus();
}

}  // namespace mpilearn::opt
