#include "tools/soak/soak_group.h"

#include <chrono>
#include <functional>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/client/channel_args.h"
#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace mpilearn {
namespace soak {
namespace {

constexpr int kInputs = 64;              // an 8x8 image, flattened
constexpr int kOutputs = 10;             // classes
constexpr double kHeartbeatSeconds = 5;  // declared lost after 15 s silent
// Never opened: the master hands out units by sample counts alone.
constexpr char kTrainImages[] = "/nonexistent/soak/train-images-idx3-ubyte.gz";
constexpr char kTrainLabels[] = "/nonexistent/soak/train-labels-idx1-ubyte.gz";

}  // namespace

bool IsStale(const absl::Status& status) {
  return status.code() == absl::StatusCode::kAborted &&
         ReasonOf(status) == v1::ERROR_REASON_STALE_UPDATE;
}
bool IsJobEnded(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         ReasonOf(status) == v1::ERROR_REASON_JOB_ENDED;
}
bool IsJobUnknown(const absl::Status& status) {
  return status.code() == absl::StatusCode::kNotFound &&
         ReasonOf(status) == v1::ERROR_REASON_JOB_UNKNOWN;
}

absl::StatusOr<std::unique_ptr<MasterClient>> ConnectOwnChannel(
    const std::string& address, const ClientSecurity& security,
    absl::Duration rpc_timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  SetBulkTransferArgs(&args);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                            CreateMasterChannel(address, security, args));
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::seconds(10))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach mpilearn-master at ", address, " within 10 s"));
  }
  MasterClient::Options client_options;
  client_options.rpc_timeout = rpc_timeout;
  client_options.security = security;
  return MasterClient::ForChannel(std::move(channel), address, client_options);
}

Layout MlpLayout(int hidden) {
  return {{"fc1.weight", "fc1.bias", "out.weight", "out.bias"},
          {{hidden, kInputs}, {hidden}, {kOutputs, hidden}, {kOutputs}}};
}

v1::JobSpec JobSpecFor(const std::string& name, const std::string& algorithm,
                       int hidden, int epochs, int64_t unit_samples) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_name("mlp");
  spec.mutable_model()->add_hidden(hidden);
  spec.mutable_data()->set_train_images(kTrainImages);
  spec.mutable_data()->set_train_labels(kTrainLabels);
  spec.set_algorithm(algorithm);
  spec.set_epochs(epochs);
  // Two pushes per unit, as a worker with this batch size would make.
  spec.set_batch_size(static_cast<int32_t>(unit_samples / kPushesPerUnit));
  spec.set_data_unit_size(unit_samples);
  if (algorithm == "downpour") spec.set_max_staleness(1);
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_learning_rate(1e-3);
  return spec;
}

SimGroup::SimGroup(std::unique_ptr<MasterClient> client, RpcStats& stats,
                   const Layout& layout, uint32_t seed)
    : client_(std::move(client)), stats_(stats), layout_(layout) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (const auto& shape : layout_.shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> update(static_cast<size_t>(n));
    for (float& x : update) x = normal(random);
    update_.push_back(std::move(update));
    weights_.emplace_back(static_cast<size_t>(n));
  }
  for (auto& w : weights_) weight_spans_.push_back(absl::MakeSpan(w));
  for (auto& u : update_) update_spans_.push_back(absl::MakeConstSpan(u));
}

absl::StatusOr<v1::RegisterGroupResponse> SimGroup::Register(
    const std::string& job_id) {
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  request.set_host("soak");
  request.set_heartbeat_seconds(kHeartbeatSeconds);
  auto registered = client_->RegisterGroup(request);
  stats_.Record(Rpc::kRegisterGroup, StatusOf(registered));
  if (!registered.ok()) return registered.status();
  job_id_ = registered->job_id();
  group_id_ = registered->group_id();
  version_ = 0;
  applied_ = 0;
  header_ = v1::PushGradientRequest::Header();
  header_.set_job_id(job_id_);
  header_.set_group_id(group_id_);
  header_.set_rank(0);
  header_.set_samples(static_cast<uint64_t>(registered->spec().batch_size()));
  header_.set_kind(UpdateKindOf(AlgorithmOf(registered->spec())));
  *header_.mutable_gradient() =
      MakeFloat32Header(0, layout_.names, layout_.shapes);
  return registered;
}

absl::Status SimGroup::Init() {
  std::mt19937 random(static_cast<uint32_t>(std::hash<std::string>()(job_id_)));
  std::uniform_real_distribution<float> uniform(-0.1f, 0.1f);
  for (auto& w : weights_) {
    for (float& x : w) x = uniform(random);
  }
  std::vector<absl::Span<const float>> values(weights_.begin(), weights_.end());
  auto accepted = client_->InitWeights(
      job_id_, group_id_, MakeFloat32Header(0, layout_.names, layout_.shapes),
      values);
  stats_.Record(Rpc::kInitWeights, StatusOf(accepted));
  if (!accepted.ok()) return accepted.status();
  if (!*accepted) {
    stats_.CheckFailed(absl::StrCat("job ", job_id_,
                                    ": InitWeights from its first group "
                                    "was not accepted"));
  }
  return absl::OkStatus();
}

absl::Status SimGroup::Pull() {
  auto version = client_->PullWeights(job_id_, group_id_, weight_spans_);
  stats_.Record(Rpc::kPullWeights, StatusOf(version));
  if (!version.ok()) return version.status();
  version_ = *version;
  return absl::OkStatus();
}

absl::Status SimGroup::Push(bool after_cancel) {
  header_.mutable_gradient()->set_version(version_);
  header_.clear_sequence();  // the client numbers it
  auto version = client_->PushGradient(header_, update_spans_, weight_spans_);
  const absl::Status status = StatusOf(version);
  const bool expected = !after_cancel && IsStale(status);
  stats_.Record(Rpc::kPushGradient, status, expected);
  if (version.ok()) {
    // After CancelJob a push is dropped: the reply is the last weights, at
    // the version the group already had.
    if (after_cancel && *version != version_) {
      stats_.CheckFailed(absl::StrCat("job ", job_id_,
                                      ": a push after CancelJob was applied"));
    }
    if (!after_cancel) ++applied_;
    version_ = *version;
    return absl::OkStatus();
  }
  if (after_cancel && expected) return absl::OkStatus();
  if (expected) return Pull();
  return status;
}

absl::Status SimGroup::Heartbeat() {
  auto state = client_->Heartbeat(job_id_, group_id_);
  stats_.Record(Rpc::kHeartbeat, StatusOf(state));
  return state.status();
}

absl::Status SimGroup::ReportEpoch(int epoch) {
  v1::ReportEpochRequest request;
  request.set_job_id(job_id_);
  request.mutable_record()->set_epoch(epoch);
  request.mutable_record()->set_val_loss(1.0);
  request.mutable_record()->set_val_accuracy(0.5);
  request.mutable_record()->set_group_id(group_id_);
  auto state = client_->ReportEpoch(request);
  stats_.Record(Rpc::kReportEpoch, StatusOf(state));
  return state.status();
}

absl::StatusOr<v1::JobState> SimGroup::Leave(bool completed) {
  v1::LeaveRequest request;
  request.set_job_id(job_id_);
  request.set_group_id(group_id_);
  request.set_completed(completed);
  auto state = client_->Leave(request);
  stats_.Record(Rpc::kLeave, StatusOf(state));
  return state;
}

absl::StatusOr<SimGroup::Outcome> SimGroup::Train(const std::atomic<bool>& stop,
                                                  int64_t train_samples,
                                                  int max_units) {
  Outcome outcome;
  std::optional<v1::CompletedUnit> completed;
  while (!stop.load()) {
    v1::NextDataUnitRequest request;
    request.set_job_id(job_id_);
    request.set_group_id(group_id_);
    request.set_train_samples(train_samples);
    if (completed.has_value()) *request.add_completed() = *completed;
    auto next = client_->NextDataUnit(request);
    stats_.Record(Rpc::kNextDataUnit, StatusOf(next));
    if (!next.ok()) return next.status();
    completed.reset();
    for (int epoch : next->finished_epochs()) {
      MPILEARN_RETURN_IF_ERROR(Pull());
      MPILEARN_RETURN_IF_ERROR(ReportEpoch(epoch + 1));
    }
    switch (next->action()) {
      case v1::NextDataUnitResponse::TRAIN: {
        if (outcome.units >= max_units) {
          outcome.holding = true;
          return outcome;
        }
        for (int i = 0; i < kPushesPerUnit; ++i)
          MPILEARN_RETURN_IF_ERROR(Push());
        MPILEARN_RETURN_IF_ERROR(Pull());
        MPILEARN_RETURN_IF_ERROR(Heartbeat());
        const v1::DataUnit& unit = next->unit();
        v1::CompletedUnit done;
        done.set_unit_id(unit.unit_id());
        done.set_samples(static_cast<uint64_t>(unit.end() - unit.begin()));
        done.set_loss_sum(0.5 * static_cast<double>(done.samples()));
        completed = done;
        ++outcome.units;
        break;
      }
      case v1::NextDataUnitResponse::WAIT:
        absl::SleepFor(absl::Milliseconds(20));  // as the worker waits
        break;
      case v1::NextDataUnitResponse::DONE:
        outcome.done = true;
        outcome.finish = next->finish();
        return outcome;
      default:
        stats_.CheckFailed(absl::StrCat("job ", job_id_,
                                        ": NextDataUnit answered action ",
                                        next->action()));
        return absl::InternalError("unknown NextDataUnit action");
    }
  }
  return outcome;
}

void CancelAndDelete(MasterClient& client, RpcStats& stats,
                     const std::string& job_id) {
  auto cancelled = client.CancelJob(job_id, "soak cleanup");
  stats.Record(Rpc::kCancelJob, StatusOf(cancelled),
               IsJobEnded(StatusOf(cancelled)));
  const absl::Status deleted = client.DeleteJob(job_id);
  stats.Record(Rpc::kDeleteJob, deleted);
}

}  // namespace soak
}  // namespace mpilearn
