#include "common/file_list.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace mpilearn {

bool IsDataFile(const std::string& path) {
  const std::string lower = absl::AsciiStrToLower(path);
  for (const char* ext : {".h5", ".hdf5", ".npz", ".npy"}) {
    if (absl::EndsWith(lower, ext)) return true;
  }
  return false;
}

absl::StatusOr<std::vector<std::string>> ExpandFileList(
    absl::string_view field, const std::vector<std::string>& entries) {
  std::vector<std::string> paths = entries;
  if (paths.size() != 1 || IsDataFile(paths[0])) return paths;
  const std::string list = paths[0];
  constexpr std::uintmax_t kMaxListBytes = 64 << 20;
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(list, error);
  if (error) {
    return absl::NotFoundError(absl::StrCat(
        "data.", field, ": cannot read the file list '", list, "': ",
        error.message(),
        " (entries must be .h5, .hdf5, .npz or .npy files, or one text file "
        "listing them)"));
  }
  if (size > kMaxListBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": the file list '", list, "' is ", size,
        " bytes; at most ", kMaxListBytes));
  }
  std::ifstream in(list);
  const std::filesystem::path dir = std::filesystem::path(list).parent_path();
  paths.clear();
  std::string line;
  while (std::getline(in, line)) {
    const absl::string_view entry = absl::StripAsciiWhitespace(line);
    if (entry.empty() || entry[0] == '#') continue;
    std::filesystem::path path{std::string(entry)};
    if (path.is_relative()) path = dir / path;
    paths.push_back(path.string());
  }
  if (paths.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": the file list '", list, "' names no files"));
  }
  return paths;
}

}  // namespace mpilearn
