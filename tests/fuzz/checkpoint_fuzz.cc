// Fuzz target: a job's checkpoint file as a restarting master reads it
// (common/checkpoint_file DecodeCheckpoint, then Job::Resume, as LoadJobs
// in server/core/store/job_loader.h does). The first input byte picks the
// mode: odd bytes are a whole file (trailer and CRC-32 included); even bytes
// are a payload to which the correct trailer is appended, so mutations reach
// the protobuf and the job's own checks instead of stopping at the CRC.
// Properties:
//   - no file crashes the master's loader;
//   - a file that resumes a job can be saved again (SaveCheckpoint), and
//     that file resumes a fresh job at the same version.
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint_file.h"
#include "common/tensor_codec.h"
#include "common/spec/job_config.h"
#include "server/core/job.h"
#include "tests/fuzz/fuzz_target.h"
#include "zlib.h"

namespace {

namespace v1 = mpilearn::v1;
using mpilearn::JobConfig;
using mpilearn::server::Job;

// The spec the checkpoints belong to (the master reads it from spec.json,
// not from the checkpoint).
v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.mutable_optimizer()->set_name("adam");
  spec.set_epochs(2);
  spec.set_data_unit_size(10);
  return spec;
}

std::string WithTrailer(std::string payload) {
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(payload.data()),
            static_cast<uInt>(payload.size())));
  for (int i = 0; i < 4; ++i) payload.push_back(static_cast<char>(crc >> (8 * i)));
  payload.append(mpilearn::kCheckpointMagic.data(), mpilearn::kCheckpointMagic.size());
  return payload;
}

absl::Time Now() { return absl::FromUnixSeconds(1000); }

}  // namespace

namespace mpilearn::fuzz {

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  Job job("job-1", JobConfig::FromNormalized(Spec()));
  if (!job.AddGroup("g-1", 1, "host", Now()).ok()) return seeds;
  std::vector<std::vector<float>> values = {
      {0.5f, -1.0f, 2.0f, 0.25f, 1.0f, -3.0f}, {0.1f, 0.2f}};
  if (!job.InitWeights(MakeFloat32Header(0, {"w", "b"}, {{2, 3}, {2}}), values)
           .ok()) {
    return seeds;
  }
  v1::NextDataUnitRequest ask;
  ask.set_job_id("job-1");
  ask.set_group_id("g-1");
  ask.set_train_samples(40);
  for (int step = 0; step < 3; ++step) {
    (void)job.NextDataUnit(ask, Now());
    server::GradientUpdate update;
    update.group_id = "g-1";
    update.values = {{0.1f, -0.2f, 0.3f, 0.0f, 1.0f, 2.0f}, {-0.5f, 0.5f}};
    (void)job.ApplyGradient(update, Now());
    absl::StatusOr<v1::JobCheckpointFile> file = job.SaveCheckpoint(Now());
    if (!file.ok()) continue;
    absl::StatusOr<std::string> bytes = EncodeCheckpoint(*file);
    if (!bytes.ok()) continue;
    seeds.push_back(std::string(1, '\1') + *bytes);  // a whole file
    seeds.push_back(std::string(1, '\0') +         // a payload
                    bytes->substr(0, bytes->size() - kCheckpointTrailerBytes));
  }
  // A lead's checkpoint of weights on shards (no optimizer state).
  auto gathered = std::make_shared<server::WeightsSnapshot>();
  gathered->header = MakeFloat32Header(3, {"w[0:6]"}, {{6}});
  gathered->values = values;
  gathered->values.pop_back();
  Job lead("job-1", JobConfig::FromNormalized(Spec()));
  absl::StatusOr<v1::JobCheckpointFile> file = lead.SaveCheckpoint(Now(), gathered);
  absl::StatusOr<std::string> bytes =
      file.ok() ? EncodeCheckpoint(*file) : absl::StatusOr<std::string>(file.status());
  if (bytes.ok()) seeds.push_back(std::string(1, '\1') + *bytes);
  return seeds;
}

}  // namespace mpilearn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mpilearn::fuzz::QuietProtobufLogs();
  if (size < 1) return 0;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) bytes = WithTrailer(std::move(bytes));
  absl::StatusOr<v1::JobCheckpointFile> file =
      mpilearn::DecodeCheckpoint(bytes, "fuzz");
  if (!file.ok()) {
    if (std::getenv("FUZZ_VERBOSE") != nullptr) {
      std::fprintf(stderr, "refused: %s\n", file.status().ToString().c_str());
    }
    return 0;
  }
  // A lead's checkpoint of weights on shards resumes without weights; it
  // is saved again with weights as gathered from shards (none here).
  std::shared_ptr<mpilearn::server::WeightsSnapshot> gathered;
  if (file->weights_on_shards()) {
    gathered = std::make_shared<mpilearn::server::WeightsSnapshot>();
    gathered->header = mpilearn::MakeFloat32Header(0, {}, {});
  }
  Job job("job-1", JobConfig::FromNormalized(Spec()));
  const absl::Status resumed = job.Resume(*std::move(file));
  if (!resumed.ok()) {
    if (std::getenv("FUZZ_VERBOSE") != nullptr) {
      std::fprintf(stderr, "refused: %s\n", resumed.ToString().c_str());
    }
    return 0;
  }
  const v1::JobStatus status = job.Status(/*with_history=*/true, Now());

  absl::StatusOr<v1::JobCheckpointFile> saved = job.SaveCheckpoint(Now(), gathered);
  FUZZ_CHECK(saved.ok(), "a resumed job checkpoints");
  absl::StatusOr<std::string> again = mpilearn::EncodeCheckpoint(*saved);
  FUZZ_CHECK(again.ok(), "its checkpoint encodes");
  absl::StatusOr<v1::JobCheckpointFile> reread =
      mpilearn::DecodeCheckpoint(*again, "again");
  FUZZ_CHECK(reread.ok(), "its checkpoint decodes");
  Job fresh("job-1", JobConfig::FromNormalized(Spec()));
  FUZZ_CHECK(fresh.Resume(*std::move(reread)).ok(), "its checkpoint resumes");
  FUZZ_CHECK(fresh.Status(true, Now()).version() == status.version(),
             "at the same version");
  mpilearn::fuzz::Accepted();
  return 0;
}
