// history_benchmark: the latency of JobRegistry::ReportValidation as a job's
// validations accumulate, against the write it replaced.
//
//   bazel build -c opt //server/core:history_benchmark
//   bazel-out/k8-opt/bin/server/core/history_benchmark --calls=2000
//   (--dir=DIR to measure another file system than /tmp's)
//
// Two ways of keeping one more validation, each run --rounds times,
// alternating, on the same file system (--dir):
//   rewrite  what ReportValidation did before records.jsonl: add the record
//            to the job, then write the job's whole JobStatus (every epoch
//            record and validation) as history.json (JSON, temporary file,
//            fsync, rename, directory fsync). Reproduced here with the
//            same calls the old JobRegistry::PersistHistory and
//            JobStore::WriteHistory made.
//   append   JobRegistry::ReportValidation now: add the record and append
//            one line to records.jsonl (write, fdatasync).
// Printed per round: the latency of call 1 and of call --calls, and the
// medians of the first and the last 20 calls (single calls are noisy).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/checkpoint_file.h"
#include "common/tensor_codec.h"
#include "google/protobuf/util/json_util.h"
#include "server/core/job.h"
#include "server/core/job_registry.h"

ABSL_FLAG(int, calls, 2000, "Validations reported per round.");
ABSL_FLAG(int, rounds, 3, "Rounds of each way, alternating.");
ABSL_FLAG(std::string, dir, "",
          "Scratch directory (default: a new one under /tmp); it is "
          "emptied first.");

namespace mpilearn::server {
namespace {

// The spec normalized, as MasterCore::SubmitJob hands it to the registry.
JobConfig Normalized(const v1::JobSpec& spec) {
  return JobConfig::Create(spec).value();
}

v1::JobSpec BenchSpec() {
  v1::JobSpec spec;
  spec.mutable_data()->set_train_images("images.gz");
  spec.mutable_data()->set_train_labels("labels.gz");
  spec.mutable_optimizer()->set_name("sgd");
  spec.set_epochs(10);
  return spec;
}

// A pool's validation: none improves after the first, so no checkpoint.
v1::ValidationRecord Record(int i) {
  v1::ValidationRecord record;
  record.set_version(static_cast<uint64_t>(i + 1));
  record.set_epoch(0);
  record.set_val_loss(i == 0 ? 0.5 : 0.9);
  record.set_val_accuracy(0.83);
  record.set_samples(10000);
  record.set_source("pool v-1");
  (*record.mutable_metrics())["val_loss"] = record.val_loss();
  (*record.mutable_metrics())["val_accuracy"] = 0.83;
  return record;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Round {
  std::vector<double> ms;  // per call
};

// The old path: the record added to a job, then history.json rewritten
// whole, as the previous JobRegistry::PersistHistory ->
// JobStore::WriteHistory did it.
Round Rewrite(const std::string& dir, int calls) {
  std::filesystem::create_directories(dir);
  Job job("job-000001", JobConfig::FromNormalized(BenchSpec()));
  Round round;
  for (int i = 0; i < calls; ++i) {
    const absl::Time start = absl::Now();
    (void)job.RecordValidation(Record(i), absl::Now());
    const v1::JobStatus status = job.Status(/*with_history=*/true, absl::Now());
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(status, &json, options);
    const absl::Status written =
        WriteFileAtomically(dir + "/history.json", json);
    round.ms.push_back(Ms(absl::Now() - start));
    if (!written.ok()) {
      std::fprintf(stderr, "%s\n", written.ToString().c_str());
      std::exit(1);
    }
  }
  return round;
}

// The new path, through the registry.
Round Append(const std::string& dir, int calls) {
  JobRegistry::Options options;
  options.state_dir = dir;
  options.resume_jobs = false;
  auto registry = JobRegistry::Create(options);
  if (!registry.ok()) {
    std::fprintf(stderr, "%s\n", registry.status().ToString().c_str());
    std::exit(1);
  }
  const std::string job_id = (*registry)->Submit(Normalized(BenchSpec())).value();
  Round round;
  for (int i = 0; i < calls; ++i) {
    const absl::Time start = absl::Now();
    const auto state = (*registry)->ReportValidation(job_id, Record(i));
    round.ms.push_back(Ms(absl::Now() - start));
    if (!state.ok()) {
      std::fprintf(stderr, "%s\n", state.status().ToString().c_str());
      std::exit(1);
    }
  }
  const v1::JobStatus status = (*registry)->Status(job_id).value();
  if (status.validations_size() != calls || !status.storage_error().empty()) {
    std::fprintf(stderr, "append: %d validations, storage_error '%s'\n",
                 status.validations_size(), status.storage_error().c_str());
    std::exit(1);
  }
  return round;
}

void Print(const char* way, int round_number, const Round& round) {
  const size_t n = round.ms.size();
  const size_t window = std::min<size_t>(20, n);
  const std::vector<double> first(round.ms.begin(), round.ms.begin() + window);
  const std::vector<double> last(round.ms.end() - window, round.ms.end());
  std::printf(
      "%-8s round %d: call 1 %.3f ms, call %zu %.3f ms; median of calls "
      "1-%zu %.3f ms, of calls %zu-%zu %.3f ms\n",
      way, round_number, round.ms.front(), n, round.ms.back(), window,
      Median(first), n - window + 1, n, Median(last));
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) dir = absl::StrCat("/tmp/history-benchmark-", getpid());
  const int calls = std::max(1, absl::GetFlag(FLAGS_calls));
  std::printf("history_benchmark: %d validations per round in %s\n", calls,
              dir.c_str());
  for (int r = 1; r <= absl::GetFlag(FLAGS_rounds); ++r) {
    std::filesystem::remove_all(dir);
    Print("rewrite", r, Rewrite(dir + "/rewrite", calls));
    std::filesystem::remove_all(dir);
    Print("append", r, Append(dir + "/append", calls));
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace mpilearn::server

int main(int argc, char** argv) { return mpilearn::server::Main(argc, argv); }
