#include "glog/logging.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/fuzz_target.h"

namespace mpilearn::fuzz {

void QuietProtobufLogs() {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    // The master's own INFO and WARNING lines (a job per input).
    FLAGS_minloglevel = google::GLOG_ERROR;
    return true;
  }();
  (void)quiet;
}

}  // namespace mpilearn::fuzz
