// MasterMetrics over a real JobRegistry (in process, no network): the text
// a scrape returns is parsed by a small exposition-format parser written
// here (independent of prometheus-cpp) and checked for form (names, TYPE
// lines, counters' _total, cumulative histogram buckets), for values (the
// registry's own figures, the telemetry groups sent) and for bounded
// cardinality (groups coming and going, jobs ending). When /usr/bin/promtool
// is installed, `promtool check metrics` must accept the text too.
//
// Over ~500 lines because the exposition-format parser the checks need is
// written here, independent of the code under test.
#include "server/master_metrics.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/core/job_registry.h"

namespace mpilearn::server {
namespace {

// The spec normalized, as MasterCore::SubmitJob hands it to the registry.
JobConfig Normalized(const v1::JobSpec& spec) {
  return JobConfig::Create(spec).value();
}

constexpr char kPromtool[] = "/usr/bin/promtool";

// ---------------------------------------------------------------------------
// A small parser for the Prometheus text exposition format (version 0.0.4).

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};

struct Exposition {
  std::map<std::string, std::string> types;  // family name -> type
  std::map<std::string, std::string> helps;
  std::vector<Sample> samples;  // in order
};

bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         c == ':';
}
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// Reads a metric or label name at `pos`.
absl::StatusOr<std::string> ReadName(absl::string_view line, size_t& pos) {
  const size_t start = pos;
  if (pos >= line.size() || !IsNameStart(line[pos])) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a name at column ", pos, " of: ", line));
  }
  while (pos < line.size() && IsNameChar(line[pos])) ++pos;
  return std::string(line.substr(start, pos - start));
}

// Reads a quoted label value at `pos` (escapes \\, \" and \n).
absl::StatusOr<std::string> ReadLabelValue(absl::string_view line, size_t& pos) {
  if (pos >= line.size() || line[pos] != '"') {
    return absl::InvalidArgumentError(absl::StrCat("expected '\"' in: ", line));
  }
  ++pos;
  std::string value;
  while (pos < line.size() && line[pos] != '"') {
    char c = line[pos++];
    if (c == '\\') {
      if (pos >= line.size()) break;
      const char escaped = line[pos++];
      switch (escaped) {
        case '\\': c = '\\'; break;
        case '"': c = '"'; break;
        case 'n': c = '\n'; break;
        default:
          return absl::InvalidArgumentError(
              absl::StrCat("bad escape \\", std::string(1, escaped), " in: ", line));
      }
    }
    value += c;
  }
  if (pos >= line.size()) {
    return absl::InvalidArgumentError(absl::StrCat("unterminated value in: ", line));
  }
  ++pos;  // the closing quote
  return value;
}

absl::StatusOr<double> ParseValue(const std::string& text) {
  if (text == "+Inf" || text == "Inf") return HUGE_VAL;
  if (text == "-Inf") return -HUGE_VAL;
  if (text == "NaN" || text == "Nan" || text == "nan") return std::nan("");
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    return absl::InvalidArgumentError(absl::StrCat("bad value '", text, "'"));
  }
  return value;
}

absl::StatusOr<Sample> ParseSample(absl::string_view line) {
  Sample sample;
  size_t pos = 0;
  absl::StatusOr<std::string> name = ReadName(line, pos);
  if (!name.ok()) return name.status();
  sample.name = *name;
  if (pos < line.size() && line[pos] == '{') {
    ++pos;
    while (pos < line.size() && line[pos] != '}') {
      absl::StatusOr<std::string> label = ReadName(line, pos);
      if (!label.ok()) return label.status();
      if (pos >= line.size() || line[pos] != '=') {
        return absl::InvalidArgumentError(absl::StrCat("expected '=' in: ", line));
      }
      ++pos;
      absl::StatusOr<std::string> value = ReadLabelValue(line, pos);
      if (!value.ok()) return value.status();
      if (!sample.labels.emplace(*label, *value).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("label ", *label, " twice in: ", line));
      }
      if (pos < line.size() && line[pos] == ',') ++pos;
    }
    if (pos >= line.size()) {
      return absl::InvalidArgumentError(absl::StrCat("expected '}' in: ", line));
    }
    ++pos;
  }
  if (pos >= line.size() || line[pos] != ' ') {
    return absl::InvalidArgumentError(absl::StrCat("expected ' ' in: ", line));
  }
  // The value, then an optional timestamp.
  const std::vector<std::string> rest =
      absl::StrSplit(line.substr(pos + 1), ' ', absl::SkipEmpty());
  if (rest.empty() || rest.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("bad sample: ", line));
  }
  absl::StatusOr<double> value = ParseValue(rest[0]);
  if (!value.ok()) return value.status();
  sample.value = *value;
  return sample;
}

absl::StatusOr<Exposition> Parse(const std::string& text) {
  Exposition out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      const std::vector<std::string> words =
          absl::StrSplit(line, absl::MaxSplits(' ', 3));
      if (words.size() >= 3 && (words[1] == "HELP" || words[1] == "TYPE")) {
        auto& map = words[1] == "HELP" ? out.helps : out.types;
        if (!map.emplace(words[2], words.size() > 3 ? words[3] : "").second) {
          return absl::InvalidArgumentError(
              absl::StrCat(words[1], " for ", words[2], " twice"));
        }
      }
      continue;  // other comments
    }
    absl::StatusOr<Sample> sample = ParseSample(line);
    if (!sample.ok()) return sample.status();
    out.samples.push_back(std::move(sample).value());
  }
  return out;
}

// The family a sample belongs to: its own name, or for a histogram's or
// summary's _bucket, _sum and _count series the name without the suffix.
std::string FamilyOf(const Exposition& e, const std::string& name) {
  if (e.types.count(name)) return name;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (absl::EndsWith(name, suffix)) {
      const std::string base = name.substr(0, name.size() - strlen(suffix));
      auto type = e.types.find(base);
      if (type != e.types.end() &&
          (type->second == "histogram" || type->second == "summary")) {
        return base;
      }
    }
  }
  return "";
}

std::string LabelsKey(std::map<std::string, std::string> labels,
                      const std::string& without = "") {
  if (!without.empty()) labels.erase(without);
  return absl::StrJoin(labels, ",", absl::PairFormatter("="));
}

// Everything wrong with the exposition's form; empty when nothing is.
std::vector<std::string> Problems(const Exposition& e) {
  std::vector<std::string> problems;
  for (const auto& [family, type] : e.types) {
    if (!absl::StartsWith(family, "mpilearn_")) {
      problems.push_back(family + ": does not start with mpilearn_");
    }
    if (type == "counter" && !absl::EndsWith(family, "_total")) {
      problems.push_back(family + ": a counter whose name does not end in _total");
    }
    if (type != "counter" && absl::EndsWith(family, "_total")) {
      problems.push_back(family + ": ends in _total but is a " + type);
    }
    if (!e.helps.count(family)) problems.push_back(family + ": no HELP");
  }
  // Histograms: per series (labels without le) the buckets in order.
  struct Buckets {
    std::vector<std::pair<double, double>> bounds;  // (le, cumulative count)
    std::optional<double> count;
  };
  std::map<std::string, std::map<std::string, Buckets>> histograms;
  std::set<std::string> seen;
  for (const Sample& sample : e.samples) {
    if (!absl::StartsWith(sample.name, "mpilearn_")) {
      problems.push_back(sample.name + ": does not start with mpilearn_");
    }
    const std::string family = FamilyOf(e, sample.name);
    if (family.empty()) {
      problems.push_back(sample.name + ": no TYPE line for its family");
      continue;
    }
    const std::string series = sample.name + "{" + LabelsKey(sample.labels) + "}";
    if (!seen.insert(series).second) problems.push_back(series + ": twice");
    if (e.types.at(family) != "histogram") continue;
    Buckets& buckets = histograms[family][LabelsKey(sample.labels, "le")];
    if (absl::EndsWith(sample.name, "_bucket")) {
      auto le = sample.labels.find("le");
      if (le == sample.labels.end()) {
        problems.push_back(series + ": a bucket without le");
        continue;
      }
      absl::StatusOr<double> bound = ParseValue(le->second);
      if (!bound.ok()) {
        problems.push_back(series + ": bad le");
        continue;
      }
      buckets.bounds.emplace_back(*bound, sample.value);
    } else if (absl::EndsWith(sample.name, "_count")) {
      buckets.count = sample.value;
    }
  }
  for (const auto& [family, series] : histograms) {
    for (const auto& [labels, buckets] : series) {
      const std::string where = family + "{" + labels + "}";
      if (buckets.bounds.empty()) {
        problems.push_back(where + ": no buckets");
        continue;
      }
      for (size_t i = 1; i < buckets.bounds.size(); ++i) {
        if (!(buckets.bounds[i].first > buckets.bounds[i - 1].first)) {
          problems.push_back(where + ": bucket bounds not increasing");
        }
        if (buckets.bounds[i].second < buckets.bounds[i - 1].second) {
          problems.push_back(where + ": buckets not cumulative");
        }
      }
      if (!std::isinf(buckets.bounds.back().first)) {
        problems.push_back(where + ": the last bucket is not le=\"+Inf\"");
      }
      if (!buckets.count.has_value() ||
          *buckets.count != buckets.bounds.back().second) {
        problems.push_back(where + ": +Inf bucket differs from _count");
      }
    }
  }
  return problems;
}

// The samples of `name` whose labels include `match`.
std::vector<Sample> Find(const Exposition& e, const std::string& name,
                         const std::map<std::string, std::string>& match = {}) {
  std::vector<Sample> found;
  for (const Sample& sample : e.samples) {
    if (sample.name != name) continue;
    bool all = true;
    for (const auto& [key, value] : match) {
      auto it = sample.labels.find(key);
      all = all && it != sample.labels.end() && it->second == value;
    }
    if (all) found.push_back(sample);
  }
  return found;
}

// The one sample of `name` with `match`; fails the test otherwise.
double Value(const Exposition& e, const std::string& name,
             const std::map<std::string, std::string>& match = {}) {
  const std::vector<Sample> found = Find(e, name, match);
  EXPECT_EQ(found.size(), 1u) << name << " {" << LabelsKey(match) << "}";
  return found.empty() ? std::nan("") : found[0].value;
}

// Job ids that have a series of `name`.
std::set<std::string> JobsOf(const Exposition& e, const std::string& name) {
  std::set<std::string> jobs;
  for (const Sample& sample : Find(e, name)) {
    auto job = sample.labels.find(kJobLabel);
    if (job != sample.labels.end()) jobs.insert(job->second);
  }
  return jobs;
}

// The checker itself: it accepts well-formed text and finds each kind of
// problem it is meant to find.
TEST(ExpositionCheckerTest, AcceptsGoodTextAndFindsProblems) {
  const std::string good =
      "# HELP mpilearn_a_total A.\n"
      "# TYPE mpilearn_a_total counter\n"
      "mpilearn_a_total{job=\"j \\\"1\\\" \\\\ x\\ny\",g=\"2\"} 3\n"
      "# HELP mpilearn_h H.\n"
      "# TYPE mpilearn_h histogram\n"
      "mpilearn_h_bucket{le=\"0.5\"} 1\n"
      "mpilearn_h_bucket{le=\"+Inf\"} 2\n"
      "mpilearn_h_sum 1.25\n"
      "mpilearn_h_count 2\n";
  absl::StatusOr<Exposition> parsed = Parse(good);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(Problems(*parsed).empty()) << absl::StrJoin(Problems(*parsed), "\n");
  ASSERT_EQ(parsed->samples.size(), 5u);
  EXPECT_EQ(parsed->samples[0].labels.at("job"), "j \"1\" \\ x\ny");
  EXPECT_EQ(parsed->samples[0].value, 3.0);

  const std::pair<const char*, const char*> bad[] = {
      {"# HELP mpilearn_c C.\n# TYPE mpilearn_c counter\nmpilearn_c 1\n",
       "does not end in _total"},
      {"# HELP other_total O.\n# TYPE other_total counter\nother_total 1\n",
       "does not start with mpilearn_"},
      {"mpilearn_untyped 1\n", "no TYPE line"},
      {"# HELP mpilearn_h H.\n# TYPE mpilearn_h histogram\n"
       "mpilearn_h_bucket{le=\"1\"} 2\nmpilearn_h_bucket{le=\"+Inf\"} 1\n"
       "mpilearn_h_count 1\n",
       "not cumulative"},
      {"# HELP mpilearn_h H.\n# TYPE mpilearn_h histogram\n"
       "mpilearn_h_bucket{le=\"1\"} 1\nmpilearn_h_count 1\n",
       "not le=\"+Inf\""},
      {"# HELP mpilearn_h H.\n# TYPE mpilearn_h histogram\n"
       "mpilearn_h_bucket{le=\"+Inf\"} 2\nmpilearn_h_count 3\n",
       "differs from _count"},
  };
  for (const auto& [text, problem] : bad) {
    absl::StatusOr<Exposition> e = Parse(text);
    ASSERT_TRUE(e.ok()) << e.status();
    const std::string found = absl::StrJoin(Problems(*e), "\n");
    EXPECT_TRUE(absl::StrContains(found, problem)) << text << "\n->\n" << found;
  }
  EXPECT_FALSE(Parse("mpilearn_x{a=\"unterminated} 1\n").ok());
  EXPECT_FALSE(Parse("mpilearn_x{a=\"\\q\"} 1\n").ok());
  EXPECT_FALSE(Parse("mpilearn_x one\n").ok());
}

// ---------------------------------------------------------------------------

class MasterMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = std::string(getenv("TEST_TMPDIR")) + "/" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(state_dir_);
    Start(MasterMetrics::Options{});
  }

  void Start(MasterMetrics::Options options) {
    registry_.reset();
    metrics_ = std::make_shared<MasterMetrics>(options);
    JobRegistry::Options registry_options;
    registry_options.state_dir = state_dir_;
    registry_options.group_timeout = absl::Seconds(10);
    registry_options.clock = [this] { return now_; };
    registry_options.observers = {metrics_.get()};
    registry_options.resume_jobs = false;
    auto registry = JobRegistry::Create(registry_options);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = std::move(registry).value();
    JobRegistry* raw = registry_.get();
    metrics_->SetStatusProvider([raw] { return raw->ListForMetrics(); });
  }

  std::string Text() const {
    return prometheus::TextSerializer().Serialize(metrics_->Collect());
  }

  // Scrapes, parses and checks the form; fails the test on any problem.
  Exposition Scrape() const {
    const std::string text = Text();
    absl::StatusOr<Exposition> parsed = Parse(text);
    EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
    if (!parsed.ok()) return Exposition();
    const std::vector<std::string> problems = Problems(*parsed);
    EXPECT_TRUE(problems.empty())
        << absl::StrJoin(problems, "\n") << "\n---\n" << text;
    return std::move(parsed).value();
  }

  std::string Submit(const std::string& name = "test job") {
    v1::JobSpec spec;
    spec.set_name(name);
    spec.mutable_data()->set_train_images("images.gz");
    spec.mutable_data()->set_train_labels("labels.gz");
    spec.mutable_optimizer()->set_name("sgd");
    spec.mutable_optimizer()->set_learning_rate(0.1);
    spec.set_epochs(2);
    spec.set_data_unit_size(10);
    auto id = registry_->Submit(Normalized(spec));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or("");
  }

  std::string Register(const std::string& job_id, int ranks = 2) {
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id);
    request.set_ranks(ranks);
    request.set_host("test");
    auto response = registry_->RegisterGroup(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->group_id() : "";
  }

  void InitWeights(const std::string& job_id, const std::string& group_id) {
    auto response = registry_->InitWeights(
        job_id, group_id, MakeFloat32Header(0, {"w"}, {{4}}), {{1, 2, 3, 4}});
    ASSERT_TRUE(response.ok()) << response.status();
  }

  void Push(const std::string& job_id, const std::string& group_id,
            uint64_t base_version) {
    auto job = registry_->FindJob(job_id).value();
    GradientUpdate update;
    update.group_id = group_id;
    update.base_version = base_version;
    update.values = {{0.1f, 0.2f, 0.3f, 0.4f}};
    ASSERT_TRUE(registry_->ApplyGradient(*job, update).ok());
  }

  // Completes `held` (if any; loss 0.5 per sample), sends `telemetry`, and
  // returns the next unit.
  v1::NextDataUnitResponse Next(const std::string& job_id,
                                const std::string& group_id,
                                const std::optional<v1::DataUnit>& held,
                                const v1::GroupTelemetry& telemetry) {
    v1::NextDataUnitRequest request;
    request.set_job_id(job_id);
    request.set_group_id(group_id);
    request.set_train_samples(40);
    if (held.has_value()) {
      v1::CompletedUnit* done = request.add_completed();
      done->set_unit_id(held->unit_id());
      done->set_samples(static_cast<uint64_t>(held->end() - held->begin()));
      done->set_loss_sum(0.5 * static_cast<double>(done->samples()));
    }
    *request.mutable_telemetry() = telemetry;
    auto response = registry_->NextDataUnit(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.value_or(v1::NextDataUnitResponse());
  }

  void Leave(const std::string& job_id, const std::string& group_id,
             bool completed, const std::string& error = "") {
    v1::LeaveRequest request;
    request.set_job_id(job_id);
    request.set_group_id(group_id);
    request.set_completed(completed);
    request.set_error(error);
    ASSERT_TRUE(registry_->Leave(request).ok());
  }

  std::string state_dir_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::shared_ptr<MasterMetrics> metrics_;
  std::unique_ptr<JobRegistry> registry_;
};

v1::GroupTelemetry Telemetry(double scale) {
  v1::GroupTelemetry telemetry;
  telemetry.set_data_seconds(1.5 * scale);
  telemetry.set_compute_seconds(10.25 * scale);
  telemetry.set_master_seconds(2.0 * scale);
  telemetry.set_mpi_seconds(0.75 * scale);
  telemetry.set_cpu_seconds(20.5 * scale);
  telemetry.set_resident_bytes(123456789);
  telemetry.set_wall_seconds(8 * scale);
  return telemetry;
}

TEST_F(MasterMetricsTest, EmptyMasterHasProcessFamiliesAndAllJobStates) {
  const Exposition e = Scrape();
  for (const char* state : {"queued", "running", "completed", "failed"}) {
    EXPECT_EQ(Value(e, "mpilearn_jobs", {{"state", state}}), 0.0) << state;
  }
  EXPECT_GE(Value(e, "mpilearn_process_cpu_seconds_total"), 0.0);
  EXPECT_GT(Value(e, "mpilearn_process_resident_memory_bytes"), 1e6);
  const double start = Value(e, "mpilearn_process_start_time_seconds");
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_LE(start, now);
  EXPECT_GT(start, now - 600);
  EXPECT_EQ(Value(e, "mpilearn_build_info", {{"version", kMpiLearnVersion}}), 1.0);
  for (const char* method :
       {"PushGradient", "PullWeights", "InitWeights", "SubscribeSnapshots"}) {
    EXPECT_EQ(Value(e, "mpilearn_open_streams", {{"method", method}}), 0.0);
  }
  EXPECT_TRUE(Find(e, "mpilearn_job_info").empty());
}

// A sharded job on its lead: how many shards hold its weights, and the
// update counters its shards reported (MasterCore fills them in).
TEST_F(MasterMetricsTest, ShardedJobShowsItsShards) {
  metrics_->SetStatusProvider([] {
    JobMetricsView view;
    view.status.set_job_id("job-000001");
    view.status.set_state(v1::JOB_STATE_RUNNING);
    view.status.set_updates_applied(40);
    for (int s = 0; s < 2; ++s) view.status.add_shards()->set_shard(s);
    return std::vector<JobMetricsView>{view};
  });
  const Exposition e = Scrape();
  const std::map<std::string, std::string> j = {{kJobLabel, "job-000001"}};
  EXPECT_EQ(Value(e, "mpilearn_job_shards", j), 2.0);
  EXPECT_EQ(Value(e, "mpilearn_job_updates_applied_total", j), 40.0);
}

// MPI Opt's studies: counted by state; running ones have their progress
// and best value (absent until a trial has one), ended ones no series.
TEST_F(MasterMetricsTest, StudiesByStateAndRunningStudiesProgress) {
  std::vector<v1::StudyStatus> studies(3);
  studies[0].set_study_id("s-1");
  studies[0].set_state(v1::STUDY_STATE_RUNNING);
  studies[0].mutable_spec()->set_trials(16);
  studies[0].set_trials_created(5);
  studies[0].set_trials_running(2);
  studies[0].set_epochs_trained(11);
  studies[0].set_best_value(0.83);
  studies[1].set_study_id("s-2");
  studies[1].set_state(v1::STUDY_STATE_RUNNING);
  studies[1].mutable_spec()->set_trials(4);
  studies[1].set_trials_created(1);
  studies[1].set_trials_running(1);
  studies[2].set_study_id("s-3");
  studies[2].set_state(v1::STUDY_STATE_COMPLETED);
  metrics_->SetStudyProvider([studies] { return studies; });
  const Exposition e = Scrape();
  EXPECT_EQ(Value(e, "mpilearn_studies", {{"state", "running"}}), 2.0);
  EXPECT_EQ(Value(e, "mpilearn_studies", {{"state", "completed"}}), 1.0);
  EXPECT_EQ(Value(e, "mpilearn_studies", {{"state", "cancelled"}}), 0.0);
  EXPECT_EQ(Value(e, "mpilearn_study_trials_running", {{"study", "s-1"}}), 2.0);
  EXPECT_EQ(Value(e, "mpilearn_study_trials_created", {{"study", "s-1"}}), 5.0);
  EXPECT_EQ(Value(e, "mpilearn_study_trials_budget", {{"study", "s-1"}}), 16.0);
  EXPECT_EQ(Value(e, "mpilearn_study_epochs_trained", {{"study", "s-1"}}), 11.0);
  EXPECT_DOUBLE_EQ(Value(e, "mpilearn_study_best_value", {{"study", "s-1"}}), 0.83);
  EXPECT_EQ(Value(e, "mpilearn_study_trials_budget", {{"study", "s-2"}}), 4.0);
  EXPECT_TRUE(Find(e, "mpilearn_study_best_value", {{"study", "s-2"}}).empty());
  EXPECT_TRUE(Find(e, "mpilearn_study_trials_created", {{"study", "s-3"}}).empty());
}

// Each owner's load as the provider gives it, and its share of every live
// group computed from all owners'.
TEST_F(MasterMetricsTest, OwnerFamiliesFollowTheProvider) {
  metrics_->SetOwnerProvider([] {
    return std::vector<MasterMetrics::OwnerView>{{"alice", 3, 2, 2.5, 2.0},
                                                 {"bob", 1, 0, 0.25, 1.0},
                                                 {"carol", 0, 4, 0.0, 1.0}};
  });
  const Exposition e = Scrape();
  EXPECT_EQ(Value(e, "mpilearn_owner_groups", {{"owner", "alice"}}), 3.0);
  EXPECT_EQ(Value(e, "mpilearn_owner_queued_jobs", {{"owner", "carol"}}), 4.0);
  EXPECT_EQ(Value(e, "mpilearn_owner_recent_groups", {{"owner", "bob"}}), 0.25);
  EXPECT_EQ(Value(e, "mpilearn_owner_share_weight", {{"owner", "alice"}}), 2.0);
  EXPECT_EQ(Value(e, "mpilearn_owner_group_share", {{"owner", "alice"}}), 0.75);
  EXPECT_EQ(Value(e, "mpilearn_owner_group_share", {{"owner", "bob"}}), 0.25);
  EXPECT_EQ(Value(e, "mpilearn_owner_group_share", {{"owner", "carol"}}), 0.0);
}

// The job's and group's figures equal the registry's own and the telemetry
// the group sent; the instrumented families count what was recorded.
TEST_F(MasterMetricsTest, ValuesMatchTheRegistry) {
  // A name that needs every escape of the exposition format.
  const std::string name = "fashion \"mnist\" \\ run\nB";
  const std::string job = Submit(name);
  const std::string group = Register(job, 3);
  InitWeights(job, group);
  // Bases 0, 0, 0, 3, 1: staleness 0, 1, 2, 0, 3.
  for (uint64_t base : {0, 0, 0, 3, 1}) Push(job, group, base);
  std::optional<v1::DataUnit> held;
  for (int i = 0; i < 3; ++i) {
    const v1::NextDataUnitResponse next = Next(job, group, held, Telemetry(i + 1));
    held = next.action() == v1::NextDataUnitResponse::TRAIN
               ? std::optional<v1::DataUnit>(next.unit())
               : std::nullopt;
  }
  v1::ValidationRecord validation;
  validation.set_version(5);
  validation.set_val_loss(0.75);
  validation.set_val_accuracy(0.625);
  ASSERT_TRUE(registry_->ReportValidation(job, validation).ok());
  metrics_->AddReceivedBytes(job, 1000);
  metrics_->AddReceivedBytes(job, 24);
  metrics_->AddSentBytes(job, 4096);
  metrics_->ObserveRpc("PushGradient", "OK", 0.002);
  metrics_->ObserveRpc("PushGradient", "OK", 0.5);
  metrics_->ObserveRpc("NextDataUnit", "NOT_FOUND", 0.0001);
  metrics_->StreamOpened("PullWeights");
  metrics_->StreamOpened("PullWeights");
  metrics_->StreamClosed("PullWeights");

  const v1::JobStatus status = registry_->Status(job).value();
  const Exposition e = Scrape();
  const std::map<std::string, std::string> j = {{kJobLabel, job}};
  const std::vector<Sample> info = Find(e, "mpilearn_job_info", j);
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].labels.at("name"), name);  // escaped and unescaped
  EXPECT_EQ(info[0].labels.at("algorithm"), "downpour");
  EXPECT_EQ(info[0].labels.at("model"), "mlp");
  EXPECT_EQ(info[0].labels.at("optimizer"), "sgd");
  EXPECT_EQ(info[0].labels.at("state"), "running");
  EXPECT_EQ(Value(e, "mpilearn_jobs", {{"state", "running"}}), 1.0);

  EXPECT_EQ(status.updates_applied(), 5u);
  EXPECT_EQ(Value(e, "mpilearn_job_updates_applied_total", j),
            static_cast<double>(status.updates_applied()));
  EXPECT_EQ(status.samples_trained(), 20u);
  EXPECT_EQ(Value(e, "mpilearn_job_samples_trained_total", j),
            static_cast<double>(status.samples_trained()));
  EXPECT_EQ(Value(e, "mpilearn_job_epochs_completed", j), 0.0);
  EXPECT_EQ(Value(e, "mpilearn_job_epochs", j), 2.0);
  EXPECT_DOUBLE_EQ(Value(e, "mpilearn_job_progress_ratio", j), 20.0 / 80.0);
  EXPECT_DOUBLE_EQ(Value(e, "mpilearn_job_train_loss", j), 0.5);
  EXPECT_DOUBLE_EQ(Value(e, "mpilearn_job_validation_loss", j), 0.75);
  EXPECT_DOUBLE_EQ(Value(e, "mpilearn_job_validation_accuracy", j), 0.625);
  EXPECT_EQ(Value(e, "mpilearn_job_validations_total", j), 1.0);
  EXPECT_TRUE(Find(e, "mpilearn_job_test_accuracy", j).empty());
  EXPECT_EQ(Value(e, "mpilearn_job_stale_rejected_total", j), 0.0);
  EXPECT_EQ(Value(e, "mpilearn_job_units_requeued_total", j), 0.0);
  EXPECT_EQ(Value(e, "mpilearn_job_updates_rejected_total", j), 0.0);
  EXPECT_EQ(Value(e, "mpilearn_job_storage_pending", j), 0.0);
  EXPECT_EQ(Value(e, "mpilearn_job_groups", j), 1.0);
  EXPECT_EQ(Value(e, "mpilearn_job_ranks", j), 3.0);
  EXPECT_EQ(Value(e, "mpilearn_job_shards", j), 0.0);  // on this master
  EXPECT_DOUBLE_EQ(Value(e, "mpilearn_job_learning_rate", j), 0.1);  // constant
  EXPECT_EQ(Value(e, "mpilearn_job_snapshots_published_total", j), 0.0);
  EXPECT_EQ(Value(e, "mpilearn_job_received_bytes_total", j), 1024.0);
  EXPECT_EQ(Value(e, "mpilearn_job_sent_bytes_total", j), 4096.0);

  // The apply histogram, labelled with the device and optimizer.
  const std::map<std::string, std::string> apply = {
      {kJobLabel, job}, {"device", "cpu"}, {"optimizer", "sgd"}};
  EXPECT_EQ(Value(e, "mpilearn_apply_duration_seconds_count", apply), 5.0);
  EXPECT_GE(Value(e, "mpilearn_apply_duration_seconds_sum", apply), 0.0);
  EXPECT_EQ(Value(e, "mpilearn_update_staleness_count", j), 5.0);
  EXPECT_EQ(Value(e, "mpilearn_update_staleness_sum", j), 6.0);  // 0+1+2+0+3
  std::map<std::string, std::string> le = j;
  le["le"] = "0";
  EXPECT_EQ(Value(e, "mpilearn_update_staleness_bucket", le), 2.0);
  le["le"] = "2";
  EXPECT_EQ(Value(e, "mpilearn_update_staleness_bucket", le), 4.0);

  // The group's figures: the registry's counts, the telemetry it sent last.
  const v1::GroupTelemetry sent = Telemetry(3);
  const std::map<std::string, std::string> g = {{kJobLabel, job}, {"group", group}};
  const std::pair<const char*, double> phases[] = {
      {"data", sent.data_seconds()},
      {"compute", sent.compute_seconds()},
      {"master", sent.master_seconds()},
      {"mpi", sent.mpi_seconds()}};
  for (const auto& [phase, seconds] : phases) {
    std::map<std::string, std::string> labels = g;
    labels["phase"] = phase;
    EXPECT_DOUBLE_EQ(Value(e, "mpilearn_group_step_seconds_total", labels), seconds)
        << phase;
  }
  EXPECT_EQ(Find(e, "mpilearn_group_step_seconds_total").size(), 4u);
  EXPECT_DOUBLE_EQ(Value(e, "mpilearn_group_cpu_seconds_total", g),
                   sent.cpu_seconds());
  EXPECT_EQ(Value(e, "mpilearn_group_resident_memory_bytes", g), 123456789.0);
  EXPECT_EQ(Value(e, "mpilearn_group_ranks", g), 3.0);
  EXPECT_EQ(Value(e, "mpilearn_group_samples_trained_total", g), 20.0);
  EXPECT_EQ(Value(e, "mpilearn_group_units_completed_total", g), 2.0);
  EXPECT_EQ(Value(e, "mpilearn_group_updates_applied_total", g), 5.0);

  // RPCs and streams.
  EXPECT_EQ(Value(e, "mpilearn_rpc_duration_seconds_count",
                  {{"method", "PushGradient"}, {"code", "OK"}}),
            2.0);
  EXPECT_DOUBLE_EQ(Value(e, "mpilearn_rpc_duration_seconds_sum",
                         {{"method", "PushGradient"}, {"code", "OK"}}),
                   0.502);
  EXPECT_EQ(Value(e, "mpilearn_rpc_duration_seconds_count",
                  {{"method", "NextDataUnit"}, {"code", "NOT_FOUND"}}),
            1.0);
  EXPECT_EQ(Value(e, "mpilearn_open_streams", {{"method", "PullWeights"}}), 1.0);

  // The job ends: the test result appears, the state moves.
  v1::LeaveRequest leave;
  leave.set_job_id(job);
  leave.set_group_id(group);
  leave.set_completed(true);
  leave.set_test_loss(0.25);
  leave.set_test_accuracy(0.875);
  ASSERT_TRUE(registry_->Leave(leave).ok());
  const Exposition ended = Scrape();
  EXPECT_DOUBLE_EQ(Value(ended, "mpilearn_job_test_loss", j), 0.25);
  EXPECT_DOUBLE_EQ(Value(ended, "mpilearn_job_test_accuracy", j), 0.875);
  EXPECT_EQ(Value(ended, "mpilearn_jobs", {{"state", "completed"}}), 1.0);
  EXPECT_EQ(Value(ended, "mpilearn_jobs", {{"state", "running"}}), 0.0);
  EXPECT_EQ(Find(ended, "mpilearn_job_info", j)[0].labels.at("state"), "completed");
  // A group that left has no series.
  EXPECT_TRUE(Find(ended, "mpilearn_group_ranks").empty());
  EXPECT_EQ(Value(ended, "mpilearn_job_groups", j), 0.0);
}

// 50 groups, one after another, on one job (half leave, half are declared
// lost): never more series than with one group.
TEST_F(MasterMetricsTest, GroupSeriesDoNotAccumulate) {
  const std::string job = Submit();
  std::string group = Register(job);
  InitWeights(job, group);
  std::optional<v1::DataUnit> held;
  auto work = [&](const std::string& g) {
    Push(job, g, registry_->FindJob(job).value()->Weights().value()->header.version());
    const v1::NextDataUnitResponse next = Next(job, g, std::nullopt, Telemetry(1));
    ASSERT_EQ(next.action(), v1::NextDataUnitResponse::TRAIN);
  };
  work(group);
  const size_t with_one_group = Scrape().samples.size();
  for (int i = 1; i < 50; ++i) {
    if (i % 2 == 0) {
      Leave(job, group, /*completed=*/false);
    } else {
      now_ += absl::Seconds(11);
      ASSERT_EQ(registry_->ReapLostGroups(), 1);
    }
    group = Register(job);
    work(group);
    const Exposition e = Scrape();
    ASSERT_EQ(e.samples.size(), with_one_group) << "after group " << i + 1;
    EXPECT_EQ(Find(e, "mpilearn_group_ranks").size(), 1u);
  }
  const v1::JobStatus status = registry_->Status(job).value();
  EXPECT_EQ(status.groups_size(), 50);  // the registry remembers them all
  EXPECT_EQ(status.units_requeued(), 49u);
  EXPECT_EQ(Value(Scrape(), "mpilearn_job_units_requeued_total",
                  {{kJobLabel, job}}),
            49.0);
}

// More ended jobs than ended_jobs: only the most recent ones keep series,
// in the built and in the instrumented families; queued and running jobs
// always do.
TEST_F(MasterMetricsTest, EndedJobSeriesAreBounded) {
  MasterMetrics::Options options;
  options.ended_jobs = 3;
  Start(options);
  const std::string queued = Submit();
  const std::string running = Submit();
  Register(running);
  std::vector<std::string> ended;
  size_t series_at_three = 0;
  for (int i = 0; i < 10; ++i) {
    const std::string job = Submit();
    const std::string group = Register(job);
    InitWeights(job, group);
    Push(job, group, 0);
    metrics_->AddSentBytes(job, 100);
    if (i % 3 == 2) {
      Leave(job, group, /*completed=*/false, "out of memory");  // FAILED
    } else {
      Leave(job, group, /*completed=*/true);
    }
    ended.push_back(job);
    const Exposition e = Scrape();
    if (ended.size() == 3) series_at_three = e.samples.size();
    if (ended.size() > 3) {
      EXPECT_EQ(e.samples.size(), series_at_three);
    }
    const std::set<std::string> expected_recent(
        ended.end() - std::min<size_t>(ended.size(), 3), ended.end());
    std::set<std::string> expected = expected_recent;
    expected.insert(queued);
    expected.insert(running);
    EXPECT_EQ(JobsOf(e, "mpilearn_job_info"), expected);
    EXPECT_EQ(JobsOf(e, "mpilearn_job_sent_bytes_total"), expected);
    EXPECT_EQ(JobsOf(e, "mpilearn_apply_duration_seconds_count"), expected_recent);
    EXPECT_EQ(JobsOf(e, "mpilearn_update_staleness_count"), expected_recent);
  }
  const Exposition e = Scrape();
  EXPECT_EQ(Value(e, "mpilearn_jobs", {{"state", "queued"}}), 1.0);
  EXPECT_EQ(Value(e, "mpilearn_jobs", {{"state", "running"}}), 1.0);
  EXPECT_EQ(Value(e, "mpilearn_jobs", {{"state", "completed"}}), 7.0);
  EXPECT_EQ(Value(e, "mpilearn_jobs", {{"state", "failed"}}), 3.0);

  // ended_jobs 0: ended jobs have no series at all.
  options.ended_jobs = 0;
  Start(options);
  const std::string job = Submit();
  const std::string group = Register(job);
  Leave(job, group, /*completed=*/true);
  const Exposition none = Scrape();
  EXPECT_TRUE(Find(none, "mpilearn_job_info").empty());
  EXPECT_TRUE(Find(none, "mpilearn_job_sent_bytes_total").empty());
}

// A deleted job's instrumented series go at once, not at the next scrape
// (a master nobody scrapes would otherwise keep them for every job it ever
// ran). Here the job is still listed, so the scrape keeps what is left:
// the byte counters start again at 0 and the update histograms are gone.
TEST_F(MasterMetricsTest, DeletedJobSeriesGoWithoutAScrape) {
  const std::string job = Submit();
  const std::string group = Register(job);
  InitWeights(job, group);
  Push(job, group, 0);
  metrics_->AddSentBytes(job, 100);
  Leave(job, group, /*completed=*/true);
  const Exposition before = Scrape();
  EXPECT_EQ(Value(before, "mpilearn_job_sent_bytes_total", {{kJobLabel, job}}),
            100.0);
  EXPECT_EQ(JobsOf(before, "mpilearn_apply_duration_seconds_count"),
            std::set<std::string>{job});
  metrics_->OnJobDeleted(job);
  metrics_->OnJobDeleted("never-seen");  // harmless
  const Exposition after = Scrape();
  EXPECT_EQ(Value(after, "mpilearn_job_sent_bytes_total", {{kJobLabel, job}}),
            0.0);
  EXPECT_TRUE(JobsOf(after, "mpilearn_apply_duration_seconds_count").empty());
  EXPECT_TRUE(JobsOf(after, "mpilearn_update_staleness_count").empty());
}

// A job whose records cannot be written shows it until a retry writes
// them. The fault is real: the job's directory is a regular file meanwhile.
TEST_F(MasterMetricsTest, StoragePendingWhileRecordsAreUnwritten) {
  const std::string job = Submit();
  const std::map<std::string, std::string> j = {{kJobLabel, job}};
  EXPECT_EQ(Value(Scrape(), "mpilearn_job_storage_pending", j), 0.0);
  const std::string dir = state_dir_ + "/jobs/" + job;
  std::filesystem::rename(dir, dir + ".aside");
  std::ofstream(dir) << "not a directory";
  Register(job);  // its history.json cannot be written
  EXPECT_EQ(Value(Scrape(), "mpilearn_job_storage_pending", j), 1.0);
  EXPECT_FALSE(registry_->Status(job).value().storage_error().empty());
  std::filesystem::remove(dir);
  std::filesystem::rename(dir + ".aside", dir);
  now_ += absl::Seconds(2);  // past the first retry's time
  registry_->Tick();
  EXPECT_EQ(Value(Scrape(), "mpilearn_job_storage_pending", j), 0.0);
  EXPECT_TRUE(registry_->Status(job).value().storage_error().empty());
}

TEST_F(MasterMetricsTest, PromtoolAcceptsTheText) {
  if (access(kPromtool, X_OK) != 0) {
    GTEST_SKIP() << kPromtool << " is not installed (Debian's `prometheus`); "
                 << "skipping `promtool check metrics`";
  }
  // Every family with samples.
  const std::string job = Submit("a \"quoted\" name");
  const std::string group = Register(job);
  InitWeights(job, group);
  Push(job, group, 0);
  Next(job, group, std::nullopt, Telemetry(1));
  v1::ValidationRecord validation;
  validation.set_val_accuracy(0.5);
  ASSERT_TRUE(registry_->ReportValidation(job, validation).ok());
  metrics_->AddReceivedBytes(job, 10);
  metrics_->ObserveRpc("Heartbeat", "OK", 0.001);
  const std::string other = Submit();
  Leave(other, Register(other), /*completed=*/true);

  const std::string text = Text();
  const std::string input = state_dir_ + ".prom";
  const std::string output = state_dir_ + ".promtool";
  std::ofstream(input) << text;
  const int rc = std::system(
      absl::StrCat(kPromtool, " check metrics < ", input, " > ", output, " 2>&1")
          .c_str());
  std::ifstream in(output);
  const std::string said((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0)
      << "promtool check metrics:\n" << said << "\n---\n" << text;
  EXPECT_EQ(said, "") << text;
}

}  // namespace
}  // namespace mpilearn::server
