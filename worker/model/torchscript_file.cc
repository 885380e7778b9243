#include "worker/model/torchscript_file.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mpilearn::worker {

absl::StatusOr<torch::jit::Module> LoadTorchScriptFile(const std::string& path,
                                                       absl::string_view field,
                                                       absl::string_view how_to) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::NotFoundError(
        absl::StrCat(field, ": '", path, "' does not exist or is not a file"));
  }
  if (!std::ifstream(path).good()) {
    return absl::PermissionDeniedError(absl::StrCat(field, ": cannot read '", path, "'"));
  }
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is not a TorchScript file LibTorch 1.13 can load (",
                     ShortExceptionMessage(e), "); ", how_to));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' could not be loaded (",
                                                   e.what(), "); ", how_to));
  }
  if (module.find_method("forward") == c10::nullopt) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' has no forward method; ", how_to));
  }
  return module;
}

std::string ShortExceptionMessage(const std::exception& e) {
  // LibTorch's own errors carry a C++ backtrace after the message.
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  std::string message =
      torch_error != nullptr ? torch_error->what_without_backtrace() : e.what();
  const size_t start = message.find_first_not_of("\n ");
  if (start != std::string::npos) message.erase(0, start);
  const size_t newline = message.find('\n');
  if (newline != std::string::npos) message.resize(newline);
  if (message.size() > 300) message = message.substr(0, 300) + "...";
  return message;
}

}  // namespace mpilearn::worker
