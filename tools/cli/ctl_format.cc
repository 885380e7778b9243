#include "tools/cli/ctl_format.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/spec/job_spec.h"
#include "common/spec/spec_kinds.h"

namespace mpilearn::ctl {
namespace {

constexpr char kNone[] = "-";

std::string OrNone(const std::string& text) {
  return text.empty() ? kNone : text;
}

// "0.10.0" -> {0, 10}; nullopt unless it starts with two numbers.
std::optional<std::pair<int, int>> MajorMinor(absl::string_view version) {
  const std::vector<absl::string_view> parts =
      absl::StrSplit(version, absl::MaxSplits('.', 2));
  if (parts.size() < 2) return std::nullopt;
  std::pair<int, int> numbers;
  for (auto [part, number] : {std::pair{parts[0], &numbers.first},
                              std::pair{parts[1], &numbers.second}}) {
    if (part.empty() || !absl::c_all_of(part, absl::ascii_isdigit) ||
        !absl::SimpleAtoi(part, number)) {
      return std::nullopt;
    }
  }
  return numbers;
}

std::string Fixed(double value, int digits) {
  return absl::StrFormat("%.*f", digits, value);
}

// "40.0%" of all the job's epochs, or "-" while the master does not know the
// samples per epoch yet (no group has asked for data).
std::string ProgressPercent(const v1::JobStatus& job) {
  const double total = static_cast<double>(job.samples_per_epoch()) *
                       static_cast<double>(job.spec().epochs());
  if (!(total > 0)) return kNone;
  const double percent =
      std::clamp(100.0 * static_cast<double>(job.samples_trained()) / total,
                 0.0, 100.0);
  return absl::StrFormat("%.1f%%", percent);
}

// Whether a history record carries a validation (groups report one per
// epoch unless the job validates in a pool only).
bool HasValidation(const v1::EpochRecord& epoch) {
  return epoch.val_loss() != 0 || epoch.val_accuracy() != 0 ||
         !epoch.metrics().empty();
}

// A job trained with a regression loss reports val_mae and val_mse instead
// of val_accuracy (JobSpec.loss); the tables then show val_mae where they
// show val_accuracy for classification. A job of several outputs shows its
// first output's accuracy or MAE.
bool IsRegression(const v1::JobSpec& spec) {
  const std::optional<LossKind> loss = LossKindFromName(
      spec.outputs_size() > 0 ? spec.outputs(0).loss() : spec.loss());
  return loss && !InfoOf(*loss).classification;
}

// The metric shown beside val_loss: val_accuracy, val_mae, or the first
// output's (val_<name>_accuracy, val_<name>_mae).
std::string ShownMetricName(const v1::JobSpec& spec) {
  const std::string prefix =
      spec.outputs_size() > 0 ? absl::StrCat("val_", spec.outputs(0).name(), "_") : "val_";
  return absl::StrCat(prefix, IsRegression(spec) ? "mae" : "accuracy");
}

// Its column header: VAL_ACC, VAL_MAE, VAL_<NAME>_ACC, VAL_<NAME>_MAE.
std::string ShownMetricHeader(const v1::JobSpec& spec) {
  std::string name = absl::AsciiStrToUpper(ShownMetricName(spec));
  if (absl::EndsWith(name, "_ACCURACY")) name.resize(name.size() - 5);  // "_ACC"
  return name;
}

// The record's shown metric ("-" when the record lacks it). `Record` is an
// EpochRecord or a ValidationRecord.
template <typename Record>
std::string ShownMetric(const v1::JobSpec& spec, const Record& record) {
  const std::string name = ShownMetricName(spec);
  if (name == "val_accuracy") return Fixed(record.val_accuracy(), 4);
  auto it = record.metrics().find(name);
  return it == record.metrics().end() ? kNone : Fixed(it->second, 4);
}

// The live training loss, else the last epoch's mean.
std::string LatestTrainLoss(const v1::JobStatus& job) {
  if (job.has_train_loss()) return Fixed(job.train_loss(), 4);
  if (!job.history().empty()) {
    return Fixed(job.history(job.history_size() - 1).train_loss(), 4);
  }
  return kNone;
}

// The shown metric (ShownMetric) of the latest validation (group or pool),
// else the last epoch's.
std::string LatestValMetric(const v1::JobStatus& job) {
  if (!job.validations().empty()) {
    return ShownMetric(job.spec(),
                       job.validations(job.validations_size() - 1));
  }
  if (!job.history().empty()) {
    const v1::EpochRecord& last = job.history(job.history_size() - 1);
    if (HasValidation(last)) return ShownMetric(job.spec(), last);
  }
  return kNone;
}

std::string LatestSamplesPerSecond(const v1::JobStatus& job) {
  if (job.history().empty()) return kNone;
  return Fixed(job.history(job.history_size() - 1).samples_per_second(), 0);
}

// "2 (4 ranks)": the alive groups serving the job and their ranks.
std::string AliveGroups(const v1::JobStatus& job) {
  int groups = 0;
  int64_t ranks = 0;
  for (const v1::GroupInfo& group : job.groups()) {
    if (!group.alive()) continue;
    ++groups;
    ranks += group.ranks();
  }
  if (groups == 0) return "0";
  return absl::StrFormat("%d (%d rank%s)", groups, ranks,
                         ranks == 1 ? "" : "s");
}

std::string TestAccuracy(const v1::JobStatus& job) {
  return job.has_test_accuracy() ? Fixed(job.test_accuracy(), 4) : kNone;
}

// A rank's own optimizer (easgd's, gem's): "sgd (lr 0.05, momentum 0.9)",
// "adam (lr 0.001)".
std::string LocalOptimizerText(const v1::OptimizerSpec& local) {
  if (local.name() == "adam") return absl::StrFormat("adam (lr %g)", local.learning_rate());
  return absl::StrFormat("%s (lr %g, momentum %g)", local.name(), local.learning_rate(),
                         local.momentum());
}

// The master's optimizer, or the rule easgd and gem apply instead.
std::string OptimizerText(const v1::JobSpec& spec) {
  const v1::Algorithm algorithm = AlgorithmOf(spec);
  if (algorithm == v1::ALGORITHM_EASGD) {
    return absl::StrFormat("elastic averaging (alpha %g); ranks step with %s",
                           spec.easgd().alpha(), LocalOptimizerText(spec.easgd().worker_optimizer()));
  }
  if (algorithm == v1::ALGORITHM_GEM) {
    const v1::GemSpec& gem = spec.gem();
    if (gem.has_worker_optimizer()) {
      return absl::StrFormat(
          "gradient energy matching (momentum %g, kappa %g); ranks step with %s",
          gem.momentum(), gem.kappa(), LocalOptimizerText(gem.worker_optimizer()));
    }
    return absl::StrFormat(
        "gradient energy matching (lr %g, momentum %g, kappa %g)",
        gem.learning_rate(), gem.momentum(), gem.kappa());
  }
  return absl::StrFormat("%s (lr %g)", spec.optimizer().name(),
                         spec.optimizer().learning_rate());
}

std::string ModelText(const v1::ModelSpec& model) {
  const std::optional<ModelKind> kind = BuiltInModelFromName(model.name());
  const ModelKindInfo* info = kind ? &InfoOf(*kind) : nullptr;
  if (kind == ModelKind::kMlp && !model.hidden().empty()) {
    return absl::StrCat(model.name(), " (hidden ",
                        absl::StrJoin(model.hidden(), ","), ")");
  }
  if (info != nullptr && info->conv_dims > 0 && !model.channels().empty()) {
    return absl::StrCat(model.name(), " (channels ",
                        absl::StrJoin(model.channels(), ","), ", dense ",
                        model.dense(), ")");
  }
  if (info != nullptr && info->recurrent_gates > 0 &&
      !model.recurrent().empty()) {
    return absl::StrCat(model.name(), " (recurrent ",
                        absl::StrJoin(model.recurrent(), ","), ", dense ",
                        model.dense(), ")");
  }
  if (!model.torchscript().empty()) {
    return absl::StrCat("torchscript (", model.torchscript(), ")");
  }
  return model.name();
}

// The step-time shares of a group's telemetry, in the order DATA% COMPUTE%
// MASTER% MPI%; "-" for each when the group reported none.
std::vector<std::string> StepShares(const v1::GroupInfo& group) {
  const v1::GroupTelemetry& t = group.telemetry();
  const double parts[] = {t.data_seconds(), t.compute_seconds(),
                          t.master_seconds(), t.mpi_seconds()};
  double sum = 0;
  for (double part : parts) sum += std::max(part, 0.0);
  std::vector<std::string> shares;
  for (double part : parts) {
    shares.push_back(group.has_telemetry() && sum > 0
                         ? absl::StrFormat("%.1f", 100.0 *
                                                       std::max(part, 0.0) /
                                                       sum)
                         : kNone);
  }
  return shares;
}

// The key/value block that opens FormatJobStatus.
std::string SummaryBlock(const v1::JobStatus& job) {
  const v1::JobSpec& spec = job.spec();
  TextTable summary({"job", job.job_id()});
  if (!spec.name().empty()) summary.AddRow({"name", spec.name()});
  summary.AddRow({"state", StateName(job.state())});
  if (!job.stop_reason().empty()) {
    summary.AddRow({"stop_reason", job.stop_reason()});
  }
  if (!job.message().empty()) summary.AddRow({"message", job.message()});
  if (!job.storage_error().empty()) {
    // Right under the state: what a restart of the master would lose.
    summary.AddRow({"storage_error", job.storage_error()});
  }
  summary.AddRow({"algorithm", spec.algorithm()});
  summary.AddRow({"model", ModelText(spec.model())});
  summary.AddRow({"optimizer", OptimizerText(spec)});
  summary.AddRow(
      {"batch", absl::StrFormat("%d per rank, sync every %d batch%s",
                                spec.batch_size(), spec.sync_every(),
                                spec.sync_every() == 1 ? "" : "es")});
  summary.AddRow(
      {"epochs", absl::StrCat(job.epochs_done(), "/", spec.epochs())});
  if (job.samples_per_epoch() > 0) {
    summary.AddRow(
        {"progress",
         absl::StrFormat("%s (%d of %d samples)", ProgressPercent(job),
                         job.samples_trained(),
                         job.samples_per_epoch() *
                             static_cast<uint64_t>(spec.epochs()))});
  } else {
    summary.AddRow({"progress",
                    absl::StrFormat("%d samples trained (samples per epoch "
                                    "not known until a group asks for data)",
                                    job.samples_trained())});
  }
  summary.AddRow({"train_loss", LatestTrainLoss(job)});
  summary.AddRow({"version", absl::StrCat(job.version())});
  if (job.learning_rate() > 0) {
    const v1::LrScheduleSpec& schedule = spec.optimizer().schedule();
    summary.AddRow({"learning_rate",
                    absl::StrFormat("%.6g%s", job.learning_rate(),
                                    schedule.name().empty() || schedule.name() == "constant"
                                        ? ""
                                        : absl::StrCat(" (", schedule.name(), " schedule)"))});
  }
  summary.AddRow(
      {"updates", absl::StrFormat("%d applied, %d units requeued",
                                  job.updates_applied(),
                                  job.units_requeued())});
  if (job.samples_skipped() > 0 || job.unit_failures() > 0) {
    // Streamed data: rows left out for bad values, and units whose read
    // failed in a group and went to another.
    summary.AddRow(
        {"data", absl::StrFormat("%d rows skipped (NaN or infinite), %d unit "
                                 "reads failed",
                                 job.samples_skipped(), job.unit_failures())});
  }
  if (!job.last_data_error().empty()) {
    summary.AddRow({"last_data_error", job.last_data_error()});
  }
  summary.AddRow({"parameters", absl::StrCat(job.parameters())});
  std::string staleness = absl::StrFormat(
      "mean %.2f, max %d, rejected %d", job.mean_staleness(),
      job.max_staleness_seen(), job.stale_rejected());
  if (spec.max_staleness() > 0) {
    absl::StrAppend(&staleness, " (max_staleness ", spec.max_staleness(), ")");
  }
  summary.AddRow({"staleness", staleness});
  summary.AddRow({"snapshots",
                  absl::StrFormat("%d published, %d skipped",
                                  job.snapshots_published(),
                                  job.snapshots_skipped())});
  summary.AddRow({"checkpoint", job.checkpoint_version() > 0
                                    ? absl::StrCat("version ",
                                                   job.checkpoint_version())
                                    : "none yet"});
  if (job.has_best_metric_value()) {
    summary.AddRow({"best", absl::StrCat(spec.checkpoint().best_metric(), " ",
                                         Fixed(job.best_metric_value(), 4))});
  }
  if (job.has_test_loss()) {
    summary.AddRow({"test_loss", Fixed(job.test_loss(), 4)});
  }
  if (job.has_test_accuracy()) {
    summary.AddRow({"test_accuracy", Fixed(job.test_accuracy(), 4)});
  }
  for (const char* name : {"test_mae", "test_mse"}) {
    auto it = job.test_metrics().find(name);
    if (it != job.test_metrics().end()) {
      summary.AddRow({name, Fixed(it->second, 4)});
    }
  }
  return summary.Format();
}

// GROUPS: one row per group the job has seen, with its step-time shares.
std::string GroupsSection(const v1::JobStatus& job) {
  std::string text = "GROUPS\n";
  if (job.groups().empty()) return text + "  none\n";
  TextTable groups({"GROUP", "RANKS", "HOST", "ALIVE", "SEEN", "UNITS",
                    "SAMPLES", "UPDATES", "DATA%", "COMPUTE%", "MASTER%",
                    "MPI%"});
  for (const v1::GroupInfo& group : job.groups()) {
    std::vector<std::string> row = {
        group.group_id(),
        absl::StrCat(group.ranks()),
        group.host().empty() ? kNone : group.host(),
        group.alive() ? "yes" : "no",
        absl::StrFormat("%.1fs", group.seconds_since_seen()),
        absl::StrCat(group.units_completed()),
        absl::StrCat(group.samples_trained()),
        absl::StrCat(group.updates_applied()),
    };
    for (std::string& share : StepShares(group)) {
      row.push_back(std::move(share));
    }
    groups.AddRow(std::move(row));
  }
  return text + groups.Format("  ");
}

// SHARDS: where a sharded job's weights live, each slice as its shard last
// reported it; nothing for a job on the master alone.
std::string ShardsSection(const v1::JobStatus& job) {
  if (job.shards().empty()) return "";
  TextTable shards({"SHARD", "ADDRESS", "STATE", "PARAMETERS", "VERSION", "UPDATES", "STALE",
                    "SEEN"});
  for (const v1::ShardSliceStatus& slice : job.shards()) {
    shards.AddRow({absl::StrCat(slice.shard(), "/", slice.shards()), slice.address(),
                   StateName(slice.state()), absl::StrCat(slice.parameters()),
                   absl::StrCat(slice.version()), absl::StrCat(slice.updates_applied()),
                   absl::StrCat(slice.updates_stale()),
                   absl::StrFormat("%.1fs", slice.seconds_since_seen())});
  }
  std::string text = "SHARDS\n" + shards.Format("  ");
  // The newest version with a checkpoint on every shard (shard_manifest.json).
  if (job.shard_set_version() > 0) {
    absl::StrAppend(&text, "  restore set: the shards' checkpoints of version ",
                    job.shard_set_version(), "\n");
  }
  return text;
}

// EPOCHS: the per-epoch history.
std::string EpochsSection(const v1::JobStatus& job) {
  std::string text = "EPOCHS\n";
  if (job.history().empty()) return text + "  none completed yet\n";
  TextTable history({"EPOCH", "TRAIN_LOSS", "VAL_LOSS",
                     ShownMetricHeader(job.spec()), "SAMPLES/S", "SECONDS"});
  for (const v1::EpochRecord& epoch : job.history()) {
    const bool validated = HasValidation(epoch);
    history.AddRow({absl::StrCat(epoch.epoch()),
                    Fixed(epoch.train_loss(), 4),
                    validated ? Fixed(epoch.val_loss(), 4) : kNone,
                    validated ? ShownMetric(job.spec(), epoch) : kNone,
                    Fixed(epoch.samples_per_second(), 0),
                    Fixed(epoch.wall_seconds(), 1)});
  }
  return text + history.Format("  ");
}

// VALIDATIONS: the newest kValidationsShown, oldest first.
std::string ValidationsSection(const v1::JobStatus& job) {
  const int shown = std::min(job.validations_size(), kValidationsShown);
  std::string text =
      shown < job.validations_size()
          ? absl::StrFormat("VALIDATIONS (last %d of %d)\n", shown,
                            job.validations_size())
          : std::string("VALIDATIONS\n");
  if (shown == 0) return text + "  none yet\n";
  TextTable validations({"VERSION", "EPOCH", "VAL_LOSS",
                         ShownMetricHeader(job.spec()), "SOURCE"});
  for (int i = job.validations_size() - shown; i < job.validations_size();
       ++i) {
    const v1::ValidationRecord& record = job.validations(i);
    validations.AddRow(
        {absl::StrCat(record.version()), absl::StrCat(record.epoch()),
         Fixed(record.val_loss(), 4), ShownMetric(job.spec(), record),
         record.source().empty() ? kNone : record.source()});
  }
  return text + validations.Format("  ");
}

}  // namespace

TextTable::TextTable(std::vector<std::string> header) {
  rows_.push_back(std::move(header));
}

void TextTable::AddRow(std::vector<std::string> row) {
  rows_.push_back(std::move(row));
}

std::string TextTable::Format(absl::string_view indent) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  std::string text;
  for (const auto& row : rows_) {
    std::string line(indent);
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) {
        line.append(widths[i] - row[i].size() + 2, ' ');
      }
    }
    // An empty last cell would leave the padding of the one before it.
    line.erase(line.find_last_not_of(' ') + 1);
    absl::StrAppend(&text, line, "\n");
  }
  return text;
}

std::string StateName(v1::JobState state) {
  return std::string(
      absl::StripPrefix(v1::JobState_Name(state), "JOB_STATE_"));
}

std::string FormatJobList(absl::Span<const v1::JobStatus> jobs) {
  TextTable table({"JOB", "STATE", "OWNER", "NAME", "MODEL", "ALGORITHM",
                   "EPOCHS", "UPDATES", "TEST_ACC"});
  for (const v1::JobStatus& job : jobs) {
    table.AddRow({
        job.job_id(),
        StateName(job.state()),
        OrNone(job.spec().owner()),
        OrNone(job.spec().name()),
        job.spec().model().name(),
        job.spec().algorithm(),
        absl::StrCat(job.epochs_done(), "/", job.spec().epochs()),
        absl::StrCat(job.updates_applied()),
        job.has_test_accuracy() ? absl::StrFormat("%.4f", job.test_accuracy())
                                : "-",
    });
  }
  return table.Format();
}

std::vector<v1::JobStatus> QueuedInOrder(
    absl::Span<const v1::JobStatus> jobs) {
  std::vector<v1::JobStatus> queued;
  for (const v1::JobStatus& job : jobs) {
    if (job.state() == v1::JOB_STATE_QUEUED) queued.push_back(job);
  }
  // Position 0 (not known) after every known one; list order otherwise.
  std::stable_sort(queued.begin(), queued.end(),
                   [](const v1::JobStatus& a, const v1::JobStatus& b) {
                     const auto key = [](const v1::JobStatus& job) {
                       return job.queue_position() > 0
                                  ? job.queue_position()
                                  : std::numeric_limits<int32_t>::max();
                     };
                     return key(a) < key(b);
                   });
  return queued;
}

std::string FormatQueue(absl::Span<const v1::JobStatus> queued) {
  const bool notes = absl::c_any_of(queued, [](const v1::JobStatus& job) {
    return !job.queue_note().empty();
  });
  std::vector<std::string> header = {"POS",      "JOB",   "OWNER",
                                     "PRIORITY", "STUDY", "NAME"};
  if (notes) header.push_back("NOTE");
  TextTable table(std::move(header));
  for (const v1::JobStatus& job : queued) {
    std::vector<std::string> row = {
        job.queue_position() > 0 ? absl::StrCat(job.queue_position()) : kNone,
        job.job_id(),
        OrNone(job.spec().owner()),
        absl::StrCat(job.spec().priority()),
        OrNone(job.spec().study()),
        OrNone(job.spec().name()),
    };
    if (notes) row.push_back(job.queue_note());
    table.AddRow(std::move(row));
  }
  return table.Format();
}

bool SameMajorMinor(absl::string_view client, absl::string_view master) {
  const auto ours = MajorMinor(client);
  return ours.has_value() && ours == MajorMinor(master);
}

std::string FormatVersions(absl::string_view client_version,
                           const v1::ServerInfo& info,
                           absl::string_view address) {
  TextTable lines({"client", absl::StrCat(client_version, " (mpilearnctl)")});
  lines.AddRow({"master", absl::StrCat(OrNone(info.version()), " at ", address)});
  lines.AddRow({"caller", absl::StrCat(OrNone(info.caller()), " (role ",
                                       OrNone(info.role()), ")")});
  return lines.Format();
}

std::string VersionMismatchMessage(absl::string_view client_version,
                                   absl::string_view master_version,
                                   absl::string_view address) {
  const std::string master =
      master_version.empty()
          ? absl::StrCat("the master at ", address,
                         " predates 0.10 (it does not answer GetServerInfo)")
          : absl::StrCat("the master at ", address, " runs ", master_version);
  return absl::StrCat(
      "this mpilearnctl is ", client_version, " and ", master,
      ": use the mpilearnctl built with the master (the same major.minor: "
      "bazel build //tools:mpilearnctl in the master's checkout), or run a "
      "master of this release");
}

std::string FormatJobsTable(absl::Span<const v1::JobStatus> jobs) {
  // VAL_ACC, VAL_MAE when every job is a regression job, VAL_ACC/MAE when
  // the jobs are mixed (each row shows its own job's metric).
  int regression = 0;
  for (const v1::JobStatus& job : jobs) regression += IsRegression(job.spec());
  const std::string metric_header =
      regression == 0 ? "VAL_ACC"
      : regression == static_cast<int>(jobs.size()) ? "VAL_MAE"
                                                     : "VAL_ACC/MAE";
  TextTable table({"JOB", "NAME", "STATE", "EPOCH", "PROGRESS", "SAMPLES/S",
                   "LOSS", metric_header, "TEST_ACC", "GROUPS"});
  for (const v1::JobStatus& job : jobs) {
    table.AddRow({
        job.job_id(),
        OrNone(job.spec().name()),
        StateName(job.state()),
        absl::StrCat(job.epochs_done(), "/", job.spec().epochs()),
        ProgressPercent(job),
        LatestSamplesPerSecond(job),
        LatestTrainLoss(job),
        LatestValMetric(job),
        TestAccuracy(job),
        AliveGroups(job),
    });
  }
  return table.Format();
}

std::string FormatJobStatus(const v1::JobStatus& job) {
  const std::string shards = ShardsSection(job);
  return absl::StrCat(SummaryBlock(job), "\n", GroupsSection(job), "\n", shards,
                      shards.empty() ? "" : "\n", EpochsSection(job), "\n",
                      ValidationsSection(job));
}

}  // namespace mpilearn::ctl
