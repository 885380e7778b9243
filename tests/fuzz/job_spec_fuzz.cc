// Fuzz target: the job spec JSON parser (common/spec/job_spec), which every spec
// a user submits goes through. Properties, for any input that parses:
//   - the normalized spec normalizes to itself (defaults are idempotent);
//   - its JSON (JobSpecToJson) parses back to the same spec.
#include <string>
#include <vector>

#include "common/spec/job_spec.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/fuzz/fuzz_target.h"

namespace mpilearn::fuzz {

std::vector<std::string> Seeds() {
  return {
      R"({"name": "quick", "model": {"name": "mlp"}, "epochs": 1,
          "data": {"train_images": "/d/t.gz", "train_labels": "/d/l.gz"}})",
      R"({"name": "cnn", "model": {"name": "cnn"}, "algorithm": "sync",
          "batch_size": 32, "sync_every": 2,
          "optimizer": {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9,
                        "nesterov": true, "clip_grad_norm": 5.0},
          "data": {"train_images": "/x/train.gz", "train_labels": "/x/l.gz",
                   "train_limit": 1000, "validation_count": 100},
          "early_stopping": {"metric": "val_loss", "patience": 2},
          "checkpoint": {"every_updates": 100},
          "exchange": {"update_dtype": "DTYPE_BFLOAT16"}})",
      R"({"model": {"name": "mlp", "hidden": [128, 64]}, "algorithm": "easgd",
          "data": {"train_files": ["/d/a.h5"], "features_dataset": "x", "labels_dataset": "y"},
          "easgd": {"alpha": 0.5}, "max_staleness": 4,
          "staleness_scaling": "inverse", "loss": "huber", "huber_delta": 2})",
      R"({"model": {"name": "mlp"}, "algorithm": "gem",
          "data": {"train_images": "/d/t.gz", "train_labels": "/d/l.gz"},
          "optimizer": {"name": "adamw", "weight_decay": 0.1},
          "target": {"metric": "val_accuracy", "value": 0.9},
          "snapshots": {"every_updates": 50, "at_epoch_end": true},
          "inband_validation": false, "seed": 7, "data_unit_size": 512})",
  };
}

}  // namespace mpilearn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mpilearn::fuzz::QuietProtobufLogs();
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<mpilearn::v1::JobSpec> spec = mpilearn::ParseJobSpecJson(json);
  if (!spec.ok()) {
    if (std::getenv("FUZZ_VERBOSE") != nullptr) {
      std::fprintf(stderr, "refused: %s\n", std::string(spec.status().message()).c_str());
    }
    FUZZ_CHECK(!spec.status().message().empty(), "a refusal says why");
    return 0;
  }
  using google::protobuf::util::MessageDifferencer;
  mpilearn::v1::JobSpec again = *spec;
  FUZZ_CHECK(mpilearn::NormalizeJobSpec(&again).ok(),
             "a normalized spec normalizes again");
  FUZZ_CHECK(MessageDifferencer::Equals(again, *spec),
             "normalizing is idempotent");
  absl::StatusOr<mpilearn::v1::JobSpec> reparsed =
      mpilearn::ParseJobSpecJson(mpilearn::JobSpecToJson(*spec));
  FUZZ_CHECK(reparsed.ok(), "the spec's own JSON parses");
  FUZZ_CHECK(MessageDifferencer::Equals(*reparsed, *spec),
             "JSON round trip keeps the spec");
  mpilearn::fuzz::Accepted();
  return 0;
}
