// Fuzz target: every call of the Master protocol through the master's core
// API (server/core/master_core.h), which the gRPC service adapts one to one.
// An input is a script run against a fresh MasterCore (state directory in a
// fresh temporary directory): a sequence of calls, each one opcode byte, a
// 2-byte little-endian length and that many bytes of the call's request
// message (protobuf). InitWeights and PushGradient take the header from the
// bytes and fill the tensors the header announces from a pattern picked by
// one more byte (zeros, ones, huge, tiny, NaN, Inf, alternating signs), so
// scripts reach the update rules with hostile values too. Properties:
//   - no script crashes the core, leaks, or trips a sanitizer;
//   - the core keeps serving: after the script, a fresh job submits,
//     registers, installs weights and takes a finite push;
//   - a job's weights stay finite whatever was pushed (guarded weights).
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "common/tensor_codec.h"
#include "proto/mpilearn.pb.h"
#include "server/core/master_core.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

namespace v1 = mpilearn::v1;
using mpilearn::server::MasterCore;
using mpilearn::server::PendingTensors;

// Every call's caller: the core runs without tokens here, as on loopback.
const mpilearn::server::Caller kCaller;

enum Op : uint8_t {
  kSubmit, kRegister, kInitWeights, kPush, kPull, kNextUnit, kReportEpoch,
  kHeartbeat, kLeave, kReportValidation, kStatus, kList, kSubscribe, kStop,
  kReportSlice, kOpCount
};

float Pattern(uint8_t kind, size_t i) {
  switch (kind % 8) {
    case 0: return 0.0f;
    case 1: return 1.0f;
    case 2: return 3e38f;
    case 3: return 1e-42f;  // subnormal
    case 4: return std::numeric_limits<float>::quiet_NaN();
    case 5: return std::numeric_limits<float>::infinity();
    case 6: return (i % 2 == 0) ? 1e30f : -1e30f;
    default: return 0.01f * static_cast<float>(i % 7) - 0.03f;
  }
}

// Fills and commits a pending call's tensors; false if it was refused.
template <typename Commit>
bool FillAndCommit(absl::StatusOr<PendingTensors> pending,
                   const v1::TensorSetHeader& header, uint8_t pattern,
                   Commit commit) {
  if (!pending.ok()) return false;
  absl::StatusOr<std::vector<int64_t>> counts =
      mpilearn::TensorSetAssembler::ElementCounts(header);
  if (!counts.ok()) return false;
  std::vector<std::vector<float>> values;
  for (int64_t n : *counts) {
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = Pattern(pattern, i);
    values.push_back(std::move(v));
  }
  std::vector<absl::Span<const float>> spans(values.begin(), values.end());
  if (!pending->CopyFrom(spans).ok()) return false;
  return commit(*std::move(pending));
}

std::string FreshStateDir() {
  const char* shm = "/dev/shm";
  std::string pattern = std::filesystem::is_directory(shm)
                            ? std::string(shm) + "/mpilearn-fuzz-XXXXXX"
                            : std::filesystem::temp_directory_path().string() +
                                  "/mpilearn-fuzz-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) std::abort();
  return pattern;
}

v1::SubmitJobRequest GoodSubmit() {
  v1::SubmitJobRequest request;
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_name("fuzz");
  spec->mutable_model()->set_name("mlp");
  spec->mutable_data()->set_train_images("/d/t.gz");
  spec->mutable_data()->set_train_labels("/d/l.gz");
  spec->set_epochs(1);
  return request;
}

// With FUZZ_VERBOSE set, prints each refused call (to check what seeds
// reach).
template <typename T>
void Note(const char* call, const T& result) {
  if (std::getenv("FUZZ_VERBOSE") == nullptr) return;
  if constexpr (std::is_same_v<T, absl::Status>) {
    std::fprintf(stderr, "%s: %s\n", call, result.ToString().c_str());
  } else {
    std::fprintf(stderr, "%s: %s\n", call, result.status().ToString().c_str());
  }
}

bool AllFinite(const mpilearn::server::WeightsSnapshot& weights) {
  for (const std::vector<float>& tensor : weights.values) {
    for (float x : tensor) {
      if (!std::isfinite(x)) return false;
    }
  }
  return true;
}

// One call; `body` is the request's bytes, `extra` one more byte.
void Call(MasterCore& core, uint8_t op, const std::string& body, uint8_t extra) {
  switch (static_cast<Op>(op % kOpCount)) {
    case kSubmit: {
      v1::SubmitJobRequest request;
      if (request.ParseFromString(body)) Note("SubmitJob", core.SubmitJob(request));
      break;
    }
    case kRegister: {
      v1::RegisterGroupRequest request;
      if (request.ParseFromString(body)) Note("RegisterGroup", core.RegisterGroup(kCaller, request));
      break;
    }
    case kInitWeights: {
      v1::InitWeightsRequest::Header header;
      if (!header.ParseFromString(body)) break;
      FillAndCommit(core.BeginInitWeights(kCaller, header), header.weights(), extra,
                    [&core](PendingTensors p) {
                      auto committed = core.CommitInitWeights(std::move(p));
                      Note("InitWeights", committed);
                      return committed.ok();
                    });
      break;
    }
    case kPush: {
      v1::PushGradientRequest::Header header;
      if (!header.ParseFromString(body)) break;
      FillAndCommit(core.BeginPush(kCaller, header), header.gradient(), extra,
                    [&core](PendingTensors p) {
                      absl::StatusOr<std::shared_ptr<
                          const mpilearn::server::WeightsSnapshot>>
                          weights = core.CommitPush(std::move(p));
                      Note("Push", weights);
                      if (weights.ok()) {
                        FUZZ_CHECK(AllFinite(**weights),
                                   "a push never makes the weights non-finite");
                      }
                      return weights.ok();
                    });
      break;
    }
    case kPull: {
      v1::PullWeightsRequest request;
      if (!request.ParseFromString(body)) break;
      auto weights = core.PullWeights(kCaller, request);
      Note("PullWeights", weights);
      if (weights.ok()) {
        FUZZ_CHECK(AllFinite(**weights), "pulled weights are finite");
      }
      break;
    }
    case kNextUnit: {
      v1::NextDataUnitRequest request;
      if (request.ParseFromString(body)) Note("NextDataUnit", core.NextDataUnit(kCaller, request));
      break;
    }
    case kReportEpoch: {
      v1::ReportEpochRequest request;
      if (request.ParseFromString(body)) Note("ReportEpoch", core.ReportEpoch(kCaller, request));
      break;
    }
    case kHeartbeat: {
      v1::HeartbeatRequest request;
      if (request.ParseFromString(body)) Note("Heartbeat", core.Heartbeat(kCaller, request));
      break;
    }
    case kLeave: {
      v1::LeaveRequest request;
      if (request.ParseFromString(body)) Note("Leave", core.Leave(kCaller, request));
      break;
    }
    case kReportValidation: {
      v1::ReportValidationRequest request;
      if (request.ParseFromString(body)) Note("ReportValidation", core.ReportValidation(kCaller, request));
      break;
    }
    case kStatus: {
      v1::GetJobStatusRequest request;
      if (request.ParseFromString(body)) Note("GetJobStatus", core.GetJobStatus(request));
      break;
    }
    case kList: {
      v1::ListJobsRequest request;
      if (request.ParseFromString(body)) (void)core.ListJobs(request);
      break;
    }
    case kSubscribe: {
      v1::SubscribeSnapshotsRequest request;
      if (request.ParseFromString(body)) {
        (void)core.SubscribeSnapshots(kCaller, request, "fuzz");
      }
      break;
    }
    case kStop:
      Note("StopJob", core.StopJob(body, "fuzz"));
      break;
    case kReportSlice: {
      // A shard's slice (no gather waits for it here: its header's bounds
      // and the refusal are what is reached).
      v1::ReportSliceRequest::Header header;
      if (!header.ParseFromString(body)) break;
      FillAndCommit(core.BeginSliceReport(header), header.weights(), extra,
                    [&](PendingTensors pending) {
                      const absl::Status done = core.CommitSliceReport(std::move(pending));
                      Note("ReportSlice", done);
                      return done.ok();
                    });
      break;
    }
    default:
      break;
  }
}

std::string Frame(Op op, const std::string& body, uint8_t extra = 7) {
  std::string framed;
  framed.push_back(static_cast<char>(op));
  framed.push_back(static_cast<char>(extra));
  return framed + mpilearn::fuzz::LengthPrefixed(body);
}

}  // namespace

namespace mpilearn::fuzz {

std::vector<std::string> Seeds() {
  // A group's life on job "job-000001" (the first id of a fresh master), then
  // variants: hostile pushes, a second group, validation and stop.
  const std::string job = "job-000001";
  std::string life = Frame(kSubmit, GoodSubmit().SerializeAsString());
  v1::RegisterGroupRequest reg;
  reg.set_job_id(job);
  reg.set_ranks(2);
  reg.set_host("node-1");
  life += Frame(kRegister, reg.SerializeAsString());
  const std::string group = "g-1";
  v1::InitWeightsRequest::Header init;
  init.set_job_id(job);
  init.set_group_id(group);
  *init.mutable_weights() = MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}});
  life += Frame(kInitWeights, init.SerializeAsString(), 7);
  v1::PushGradientRequest::Header push;
  push.set_job_id(job);
  push.set_group_id(group);
  push.set_sequence(1);
  *push.mutable_gradient() = MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}});
  life += Frame(kPush, push.SerializeAsString(), 7);
  v1::NextDataUnitRequest unit;
  unit.set_job_id(job);
  unit.set_group_id(group);
  unit.set_train_samples(100);
  life += Frame(kNextUnit, unit.SerializeAsString());
  v1::HeartbeatRequest beat;
  beat.set_job_id(job);
  beat.set_group_id(group);
  life += Frame(kHeartbeat, beat.SerializeAsString());
  v1::PullWeightsRequest pull;
  pull.set_job_id(job);
  pull.set_group_id(group);
  life += Frame(kPull, pull.SerializeAsString());
  v1::GetJobStatusRequest status;
  status.set_job_id(job);
  life += Frame(kStatus, status.SerializeAsString());

  std::vector<std::string> seeds = {life};
  std::string hostile = life;
  for (uint8_t pattern : {2, 4, 5, 6}) {
    push.set_sequence(push.sequence() + 1);
    hostile += Frame(kPush, push.SerializeAsString(), pattern);
  }
  seeds.push_back(hostile);
  std::string ended = life;
  v1::ReportValidationRequest validation;
  validation.set_job_id(job);
  validation.mutable_record()->set_version(1);
  validation.mutable_record()->set_val_loss(0.5);
  ended += Frame(kReportValidation, validation.SerializeAsString());
  v1::ReportEpochRequest epoch;
  epoch.set_job_id(job);
  epoch.mutable_record()->set_epoch(1);
  epoch.mutable_record()->set_val_loss(0.5);
  ended += Frame(kReportEpoch, epoch.SerializeAsString());
  v1::LeaveRequest leave;
  leave.set_job_id(job);
  leave.set_group_id(group);
  leave.set_error("rank 1 died");
  ended += Frame(kLeave, leave.SerializeAsString());
  ended += Frame(kStop, job);
  v1::ListJobsRequest list;
  ended += Frame(kList, list.SerializeAsString());
  v1::SubscribeSnapshotsRequest subscribe;
  subscribe.add_job_ids(job);
  ended += Frame(kSubscribe, subscribe.SerializeAsString());
  // A slice nobody asked for, with a tensor cut from a whole one.
  v1::ReportSliceRequest::Header slice;
  slice.set_job_id(job);
  slice.set_request(1);
  slice.set_address("shard:1");
  v1::TensorInfo* piece = slice.mutable_weights()->add_tensors();
  piece->set_name("w[0:4]");
  piece->set_dtype(v1::DTYPE_FLOAT32);
  piece->add_shape(4);
  piece->mutable_slice_of()->add_shape(2);
  piece->mutable_slice_of()->add_shape(4);
  ended += Frame(kReportSlice, slice.SerializeAsString());
  seeds.push_back(ended);
  return seeds;
}

}  // namespace mpilearn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mpilearn::fuzz::QuietProtobufLogs();
  const std::string dir = FreshStateDir();
  {
    MasterCore::Options options;
    options.registry.state_dir = dir;
    options.registry.resume_jobs = false;
    // Small bounds, so a header may announce "too much" cheaply.
    options.limits.max_model_bytes = uint64_t{16} << 20;
    options.limits.max_queued_jobs = 16;
    absl::StatusOr<std::unique_ptr<MasterCore>> core = MasterCore::Create(options);
    FUZZ_CHECK(core.ok(), "a core starts on an empty state directory");
    for (size_t at = 0; at + 4 <= size;) {
      const uint8_t op = data[at];
      const uint8_t extra = data[at + 1];
      const size_t n = data[at + 2] | (size_t{data[at + 3]} << 8);
      at += 4;
      const size_t take = std::min(n, size - at);
      Call(**core, op, std::string(reinterpret_cast<const char*>(data + at), take),
           extra);
      at += take;
    }

    // Still serving: a fresh job goes through a whole exchange.
    absl::StatusOr<v1::SubmitJobResponse> submitted =
        (*core)->SubmitJob(GoodSubmit());
    if (submitted.ok()) {  // a full queue refuses it, rightly
      v1::RegisterGroupRequest reg;
      reg.set_job_id(submitted->job_id());
      reg.set_ranks(1);
      reg.set_host("after");
      absl::StatusOr<v1::RegisterGroupResponse> group = (*core)->RegisterGroup(kCaller, reg);
      FUZZ_CHECK(group.ok(), "a fresh job takes a group");
      v1::InitWeightsRequest::Header init;
      init.set_job_id(submitted->job_id());
      init.set_group_id(group->group_id());
      *init.mutable_weights() = mpilearn::MakeFloat32Header(0, {"w"}, {{8}});
      FUZZ_CHECK(FillAndCommit((*core)->BeginInitWeights(kCaller, init), init.weights(), 7,
                               [&core](PendingTensors p) {
                                 return (*core)->CommitInitWeights(std::move(p)).ok();
                               }),
                 "a fresh job takes weights");
      v1::PushGradientRequest::Header push;
      push.set_job_id(submitted->job_id());
      push.set_group_id(group->group_id());
      push.set_sequence(1);
      *push.mutable_gradient() = mpilearn::MakeFloat32Header(0, {"w"}, {{8}});
      FUZZ_CHECK(FillAndCommit((*core)->BeginPush(kCaller, push), push.gradient(), 1,
                               [&core](PendingTensors p) {
                                 return (*core)->CommitPush(std::move(p)).ok();
                               }),
                 "a fresh job takes a finite push");
      mpilearn::fuzz::Accepted();
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return 0;
}
