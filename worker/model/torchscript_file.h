// Reading a TorchScript file a job names (model.torchscript,
// loss_options.torchscript), with errors that name the spec field, the
// file and what to do; and the short form of a LibTorch error that every
// such message passes on.
#ifndef MPILEARN_WORKER_MODEL_TORCHSCRIPT_FILE_H_
#define MPILEARN_WORKER_MODEL_TORCHSCRIPT_FILE_H_

#include <torch/script.h>

#include <exception>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mpilearn::worker {

// The module in `path`, loaded on the CPU, with a forward method.
// NOT_FOUND (no such file), PERMISSION_DENIED (unreadable) or
// INVALID_ARGUMENT (LibTorch cannot load it, or it has no forward), each
// message starting "FIELD: 'PATH'" and, for the invalid ones, ending with
// `how_to`.
absl::StatusOr<torch::jit::Module> LoadTorchScriptFile(const std::string& path,
                                                       absl::string_view field,
                                                       absl::string_view how_to);

// The first line of a LibTorch (or other) exception's message, without
// LibTorch's backtrace, at most 300 characters: what error messages pass on.
std::string ShortExceptionMessage(const std::exception& e);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_MODEL_TORCHSCRIPT_FILE_H_
