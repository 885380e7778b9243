// The pruners against hand-derived decisions (ASHA on known learning
// curves, the median rule on small tables) and against Optuna 3.1 itself:
// optuna_pruner_reference.py replays the same scenarios (several trials open
// at once, reports interleaved) through SuccessiveHalvingPruner and
// MedianPruner, and every decision must match. Those tests skip when
// /usr/bin/python3 cannot import optuna. (Over 500 lines: the hand
// derivations are kept beside the scenarios they check.)
#include <gtest/gtest.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/opt/pruner.h"

namespace mpilearn::opt {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One step of a study: a trial reports the value of an epoch (then asks
// whether to stop), or the trial completes.
struct Event {
  int trial = 0;
  int epoch = 0;
  double value = 0;
  bool complete = false;
};

struct Scenario {
  v1::PrunerSpec pruner;
  std::vector<Event> events;
};

// A report the pruner judged: (trial, epoch, pruned).
using Decision = std::tuple<int, int, bool>;

std::string DecisionsText(const std::vector<Decision>& decisions) {
  return absl::StrJoin(decisions, " ", [](std::string* out, const Decision& d) {
    absl::StrAppend(out, std::get<0>(d), "@", std::get<1>(d),
                    std::get<2>(d) ? "P" : "-");
  });
}

// Replays `scenario` through our pruner the way the study table and the
// Optuna script do: a pruned or completed trial's later events are
// skipped. Returns the decisions; `curves` (one per trial number) is left
// as the study would hold it.
std::vector<Decision> ReplayOurs(const Scenario& scenario,
                                 std::vector<TrialCurve>* curves) {
  auto pruner = NewPruner(scenario.pruner);
  EXPECT_TRUE(pruner.ok()) << pruner.status();
  if (!pruner.ok()) return {};
  int trials = 0;
  for (const Event& e : scenario.events) trials = std::max(trials, e.trial + 1);
  curves->assign(trials, TrialCurve());
  for (int i = 0; i < trials; ++i) (*curves)[i].number = i;
  std::set<int> ended;
  std::vector<Decision> decisions;
  for (const Event& e : scenario.events) {
    if (ended.count(e.trial) > 0) continue;
    TrialCurve& curve = (*curves)[e.trial];
    if (e.complete) {
      curve.complete = true;
      ended.insert(e.trial);
      continue;
    }
    curve.values[e.epoch] = e.value;
    const bool pruned = (*pruner)->ShouldPrune(&curve, *curves);
    decisions.emplace_back(e.trial, e.epoch, pruned);
    if (pruned) ended.insert(e.trial);
  }
  return decisions;
}

std::vector<std::pair<int, int>> Pruned(const std::vector<Decision>& all) {
  std::vector<std::pair<int, int>> pruned;
  for (const auto& [trial, epoch, p] : all) {
    if (p) pruned.emplace_back(trial, epoch);
  }
  return pruned;
}

// The scenario as the reference script reads it; values with 17 digits
// (exact doubles), NaN as Python's json writes it.
std::string ScenarioJson(const Scenario& scenario) {
  const v1::PrunerSpec& p = scenario.pruner;
  std::string json = absl::StrCat("{\"pruner\": {\"name\": \"", p.name(), "\"");
  auto field = [&json](const char* name, bool has, int value) {
    if (has) absl::StrAppend(&json, ", \"", name, "\": ", value);
  };
  field("min_resource", p.has_min_resource(), p.min_resource());
  field("reduction_factor", p.has_reduction_factor(), p.reduction_factor());
  field("min_early_stopping_rate", p.has_min_early_stopping_rate(),
        p.min_early_stopping_rate());
  field("startup_trials", p.has_startup_trials(), p.startup_trials());
  field("warmup_epochs", p.has_warmup_epochs(), p.warmup_epochs());
  absl::StrAppend(&json, "}, \"events\": [");
  for (size_t i = 0; i < scenario.events.size(); ++i) {
    const Event& e = scenario.events[i];
    if (i > 0) json += ", ";
    if (e.complete) {
      absl::StrAppend(&json, "{\"trial\": ", e.trial, ", \"complete\": true}");
    } else {
      absl::StrAppend(&json, "{\"trial\": ", e.trial, ", \"epoch\": ", e.epoch,
                      ", \"value\": ",
                      std::isnan(e.value) ? std::string("NaN")
                                          : absl::StrFormat("%.17g", e.value),
                      "}");
    }
  }
  return json + "]}";
}

bool HaveOptuna() {
  return std::system("/usr/bin/python3 -c 'import optuna' >/dev/null 2>&1") ==
         0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The decisions Optuna makes on `scenario` (optuna_pruner_reference.py).
std::vector<Decision> ReplayOptuna(const Scenario& scenario,
                                   const std::string& name) {
  const std::string dir = ::testing::TempDir();
  const std::string in = absl::StrCat(dir, "/", name, ".json");
  const std::string out = absl::StrCat(dir, "/", name, ".out");
  {
    std::ofstream file(in, std::ios::trunc);
    file << ScenarioJson(scenario);
  }
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string script = absl::StrCat(
      srcdir != nullptr ? srcdir : ".",
      "/mpilearn/server/opt/optuna_pruner_reference.py");
  const std::string command = absl::StrCat("/usr/bin/python3 '", script,
                                           "' <'", in, "' >'", out, "'");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  google::protobuf::Struct result;
  const std::string json = ReadFile(out);
  const auto status = google::protobuf::util::JsonStringToMessage(json, &result);
  EXPECT_TRUE(status.ok()) << status.ToString() << ": " << json;
  std::vector<Decision> decisions;
  const auto list = result.fields().find("decisions");
  if (list == result.fields().end()) return decisions;
  for (const auto& d : list->second.list_value().values()) {
    const auto& v = d.list_value().values();
    decisions.emplace_back(static_cast<int>(v[0].number_value()),
                           static_cast<int>(v[1].number_value()),
                           v[2].bool_value());
  }
  return decisions;
}

v1::PrunerSpec Asha(int min_resource, int reduction_factor,
                    int min_early_stopping_rate) {
  v1::PrunerSpec spec;
  spec.set_name("asha");
  spec.set_min_resource(min_resource);
  spec.set_reduction_factor(reduction_factor);
  spec.set_min_early_stopping_rate(min_early_stopping_rate);
  return spec;
}

v1::PrunerSpec Median(int startup_trials, int warmup_epochs) {
  v1::PrunerSpec spec;
  spec.set_name("median");
  spec.set_startup_trials(startup_trials);
  spec.set_warmup_epochs(warmup_epochs);
  return spec;
}

// Twelve trials, value(epoch) = a + b / epoch, 4 epochs each. Trial i starts
// at tick i and reports epoch t - i + 1 at tick t, trials in number order
// within a tick, so up to four run at once (at tick 3: trial 0 epoch 4,
// trial 1 epoch 3, trial 2 epoch 2, trial 3 epoch 1); it completes after
// epoch 4. Values at epochs 1, 2, 3, 4 (all but epoch 3 exact):
//   0 (1, 8):    9  5    3.67  3        6 (0, 8):     8  4  2.67  2
//   1 (2, 4):    6  4    3.33  3        7 (2, 12):   14  8  6     5
//   2 (0, 16):  16  8    5.33  4        8 (1, 2):     3  2  1.67  1.5
//   3 (3, 0):    3  3    3     3        9 (5, -2):    3  4  4.33  4.5
//   4 (1, 4):    5  3    2.33  2       10 (3.25, -0.5): 2.75 3 3.08 3.125
//   5 (4, 8):   12  8    6.67  6       11 (3, 4):     7  5  4.33  4
// Each trial reaches a rung after every earlier survivor of the rung below
// did, so rung k's competitors are the earlier trials that reached it.
Scenario LearningCurves(v1::PrunerSpec pruner) {
  const std::vector<std::pair<double, double>> curves = {
      {1, 8}, {2, 4}, {0, 16}, {3, 0},  {1, 4},     {4, 8},
      {0, 8}, {2, 12}, {1, 2}, {5, -2}, {3.25, -0.5}, {3, 4}};
  constexpr int kEpochs = 4;
  const int n = static_cast<int>(curves.size());
  Scenario scenario;
  scenario.pruner = std::move(pruner);
  for (int tick = 0; tick < n + kEpochs; ++tick) {
    for (int i = 0; i < n; ++i) {
      const int epoch = tick - i + 1;
      if (epoch < 1 || epoch > kEpochs) continue;
      const auto [a, b] = curves[i];
      scenario.events.push_back({i, epoch, a + b / epoch, false});
      if (epoch == kEpochs) scenario.events.push_back({i, 0, 0, true});
    }
  }
  return scenario;
}

// eta = 2, rungs at epochs 1, 2, 4. With n values at a rung a trial goes on
// when its value is <= the (n/2)-th smallest (the smallest for n = 1).
//  Rung 0 (epoch 1), n = i + 1 for trial i:
//   0: {9} -> 9 <= 9 on.  1: {9,6} 1st=6, on.  2: 16 vs 1st of 3 (6): PRUNE.
//   3: 3 vs 2nd of {3,6,9,16} = 6: on.  4: 5 vs 2nd of {3,5,..} = 5: on.
//   5: 12 vs 3rd of {3,5,6,9,12,16} = 6: PRUNE.  6: 8 vs 3rd (6): PRUNE.
//   7: 14 vs 4th of {3,5,6,8,9,12,14,16} = 8: PRUNE.
//   8: 3 vs 4th of {3,3,5,6,..} = 6: on.  9: 3 vs 5th of {3,3,3,5,6} = 6: on.
//   10: 2.75 vs 5th of {2.75,3,3,3,5} = 5: on.
//   11: 7 vs 6th of {2.75,3,3,3,5,6,7,..} = 6: PRUNE.
//  Rung 1 (epoch 2), survivors 0 1 3 4 8 9 10 with 5 4 3 3 2 4 3:
//   0: {5} on.  1: 4 vs 1st of {4,5}: on.  3: 3 vs 1st of 3: on.
//   4: 3 vs 2nd of {3,3,4,5} = 3: on (a tie goes on).
//   8: 2 vs 2nd of {2,3,3,4,5} = 3: on.
//   9: 4 vs 3rd of {2,3,3,4,4,5} = 3: PRUNE at epoch 2.
//   10: 3 vs 3rd of {2,3,3,3,4,4,5} = 3: on.
//  Rung 2 (epoch 4), survivors 0 1 3 4 8 10 with 3 3 3 2 1.5 3.125:
//   0, 1, 3 (n <= 3: each <= the smallest, 3), 4: 2 vs 2nd of {2,3,3,3}: on.
//   8: 1.5 vs 2nd of {1.5,2,3,3,3}: on.
//   10: 3.125 vs 3rd of {1.5,2,3,3,3,3.125} = 3: PRUNE at epoch 4.
TEST(SuccessiveHalvingTest, HandDerivedEta2) {
  std::vector<TrialCurve> curves;
  const auto decisions = ReplayOurs(LearningCurves(Asha(1, 2, 0)), &curves);
  const std::vector<std::pair<int, int>> expected = {
      {2, 1}, {5, 1}, {6, 1}, {7, 1}, {9, 2}, {11, 1}, {10, 4}};
  EXPECT_EQ(Pruned(decisions), expected) << DecisionsText(decisions);
  // Every rung passed or lost records the value there; epoch 3 is no rung.
  EXPECT_EQ(curves[3].rungs, (std::map<int, double>{{0, 3}, {1, 3}, {2, 3}}));
  EXPECT_EQ(curves[10].rungs,
            (std::map<int, double>{{0, 2.75}, {1, 3}, {2, 3.125}}));
  EXPECT_EQ(curves[2].rungs, (std::map<int, double>{{0, 16}}));
  EXPECT_EQ(curves[9].rungs, (std::map<int, double>{{0, 3}, {1, 4}}));
}

// eta = 3, rungs at epochs 1, 3 (9 is never reached). With n < 3 values
// the index n/3 - 1 is -1, taken as 0: the trial must be the best so far.
//  Rung 0: 0: alone, on.  1: 6 vs best of {9,6}: on.  2: 16 vs 6: PRUNE.
//   3: 3 vs 1st of 4 = 3: on.  4: 5 vs 3: PRUNE.  5 (12), 6 (8), 7 (14):
//   vs 2nd of {3,5,..} = 5: PRUNE.  8: 3 vs 3rd of {3,3,5,..} = 5: on.
//   9: 3 vs 3rd of {3,3,3,..} = 3: on.  10: 2.75 vs 3rd = 3: on.
//   11: 7 vs 4th of {2.75,3,3,3,..} = 3: PRUNE.
//  Rung 1 (epoch 3), survivors 0 1 3 8 9 10 with 3.67 3.33 3 1.67 4.33 3.08:
//   0 on; 1: best of 2, on; 3: best of 3, on; 8: best of 4, on;
//   9: 4.33 vs best of 5 (1.67): PRUNE at 3; 10: 3.08 vs 2nd of 6 (3): PRUNE.
TEST(SuccessiveHalvingTest, HandDerivedEta3) {
  std::vector<TrialCurve> curves;
  const auto decisions = ReplayOurs(LearningCurves(Asha(1, 3, 0)), &curves);
  // In report order: trial 9 reaches epoch 3 at tick 11, before trial 11's
  // epoch 1; trial 10 reaches it at tick 12.
  const std::vector<std::pair<int, int>> expected = {
      {2, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}, {9, 3}, {11, 1}, {10, 3}};
  EXPECT_EQ(Pruned(decisions), expected) << DecisionsText(decisions);
}

// Fewer than eta values at a rung: the trial must be the best of them
// (Optuna turns promotable index -1 into 0; Python's [-1] would instead
// promote the worst).
TEST(SuccessiveHalvingTest, FirstTrialsMustBeBest) {
  auto pruner = NewPruner(Asha(1, 3, 0));
  ASSERT_TRUE(pruner.ok()) << pruner.status();
  std::vector<TrialCurve> all(3);
  for (int i = 0; i < 3; ++i) all[i].number = i;
  all[0].values[1] = 5;
  EXPECT_FALSE((*pruner)->ShouldPrune(&all[0], all));  // alone
  all[1].values[1] = 6;
  EXPECT_TRUE((*pruner)->ShouldPrune(&all[1], all));  // 6 > min(5, 6)
  all[2].values[1] = 4;
  EXPECT_FALSE((*pruner)->ShouldPrune(&all[2], all));  // best of 3
  EXPECT_EQ(all[1].rungs, (std::map<int, double>{{0, 6}}));
}

// A report past several rungs passes them all at once with one value; a
// NaN is pruned only where a rung is judged, and records nothing.
TEST(SuccessiveHalvingTest, SkippedRungsAndNaN) {
  auto pruner = NewPruner(Asha(1, 2, 0));
  ASSERT_TRUE(pruner.ok());
  std::vector<TrialCurve> all(3);
  for (int i = 0; i < 3; ++i) all[i].number = i;
  EXPECT_FALSE((*pruner)->ShouldPrune(&all[0], all));  // no values
  all[0].values[5] = 1;  // rungs at 1, 2, 4 passed; 8 not reached
  EXPECT_FALSE((*pruner)->ShouldPrune(&all[0], all));
  EXPECT_EQ(all[0].rungs, (std::map<int, double>{{0, 1}, {1, 1}, {2, 1}}));
  all[1].values[4] = 2;  // loses at rung 0 against {1, 2}
  EXPECT_TRUE((*pruner)->ShouldPrune(&all[1], all));
  EXPECT_EQ(all[1].rungs, (std::map<int, double>{{0, 2}}));
  all[2].values[1] = kNaN;
  EXPECT_TRUE((*pruner)->ShouldPrune(&all[2], all));
  EXPECT_TRUE(all[2].rungs.empty());

  // min_resource 2, eta 3, rate 1: the first rung is at epoch 6.
  auto late = NewPruner(Asha(2, 3, 1));
  ASSERT_TRUE(late.ok());
  TrialCurve nan_curve;
  for (int epoch = 1; epoch <= 5; ++epoch) {
    nan_curve.values[epoch] = kNaN;
    EXPECT_FALSE((*late)->ShouldPrune(&nan_curve, {nan_curve})) << epoch;
  }
  nan_curve.values[6] = kNaN;
  EXPECT_TRUE((*late)->ShouldPrune(&nan_curve, {nan_curve}));
}

// Completed trials 0-3: epoch 1 values 4 2 3 1 (median 2.5), epoch 2
// values 3 1 2 NaN (NaN ignored: median 2); trial 4 is pruned, trial 5
// runs.
std::vector<TrialCurve> MedianTable() {
  std::vector<TrialCurve> all(6);
  const double epoch1[] = {4, 2, 3, 1};
  const double epoch2[] = {3, 1, 2, kNaN};
  for (int i = 0; i < 6; ++i) all[i].number = i;
  for (int i = 0; i < 4; ++i) {
    all[i].complete = true;
    all[i].values = {{1, epoch1[i]}, {2, epoch2[i]}};
  }
  all[4].values = {{1, 0.5}, {2, 0.5}};  // pruned: not complete
  return all;
}

TEST(MedianTest, BestValueAgainstMedianOfCompleted) {
  auto pruner = NewPruner(Median(4, 0));
  ASSERT_TRUE(pruner.ok());
  std::vector<TrialCurve> all = MedianTable();
  TrialCurve& me = all[5];
  EXPECT_FALSE((*pruner)->ShouldPrune(&me, all));  // no values
  me.values[1] = 2.5;  // not above the median
  EXPECT_FALSE((*pruner)->ShouldPrune(&me, all));
  me.values[1] = 2.625;
  EXPECT_TRUE((*pruner)->ShouldPrune(&me, all));
  me.values[1] = 1.5;
  me.values[2] = 5;  // worse now, but the best so far (1.5) is below 2
  EXPECT_FALSE((*pruner)->ShouldPrune(&me, all));
  me.values[1] = 2.25;  // best 2.25 > 2
  EXPECT_TRUE((*pruner)->ShouldPrune(&me, all));
  me.values[7] = 9;  // no completed trial reached epoch 7
  EXPECT_FALSE((*pruner)->ShouldPrune(&me, all));
}

TEST(MedianTest, StartupTrialsCountCompletedOthers) {
  std::vector<TrialCurve> all = MedianTable();
  all[5].values[1] = 9;
  auto five = NewPruner(Median(5, 0));
  ASSERT_TRUE(five.ok());
  EXPECT_FALSE((*five)->ShouldPrune(&all[5], all));  // 4 completed
  all[5].complete = true;  // the trial itself does not count
  EXPECT_FALSE((*five)->ShouldPrune(&all[5], all));
  all[5].complete = false;
  all[4].complete = true;
  EXPECT_TRUE((*five)->ShouldPrune(&all[5], all));

  // Startup 0 still needs one completed trial.
  auto zero = NewPruner(Median(0, 0));
  ASSERT_TRUE(zero.ok());
  for (TrialCurve& c : all) c.complete = false;
  EXPECT_FALSE((*zero)->ShouldPrune(&all[5], all));
}

TEST(MedianTest, WarmupEpochs) {
  std::vector<TrialCurve> all = MedianTable();
  auto pruner = NewPruner(Median(4, 2));
  ASSERT_TRUE(pruner.ok());
  all[5].values[1] = 9;
  EXPECT_FALSE((*pruner)->ShouldPrune(&all[5], all));  // epoch 1 < 2
  all[5].values[2] = 9;
  EXPECT_TRUE((*pruner)->ShouldPrune(&all[5], all));
}

TEST(MedianTest, NaN) {
  std::vector<TrialCurve> all = MedianTable();
  auto pruner = NewPruner(Median(4, 0));
  ASSERT_TRUE(pruner.ok());
  TrialCurve& me = all[5];
  me.values[1] = kNaN;  // nothing but NaN: pruned
  EXPECT_TRUE((*pruner)->ShouldPrune(&me, all));
  me.values[1] = 1;
  me.values[2] = kNaN;  // the best ignores NaN: 1 <= 2
  EXPECT_FALSE((*pruner)->ShouldPrune(&me, all));
  // Completed trials all NaN at the epoch: no median, no pruning.
  for (int i = 0; i < 4; ++i) all[i].values[3] = kNaN;
  me.values = {{3, 7}};
  EXPECT_FALSE((*pruner)->ShouldPrune(&me, all));
  // Within warmup a NaN is not judged.
  auto warm = NewPruner(Median(4, 3));
  ASSERT_TRUE(warm.ok());
  me.values = {{1, kNaN}, {2, kNaN}};
  EXPECT_FALSE((*warm)->ShouldPrune(&me, all));
}

TEST(NewPrunerTest, NamesAndDefaults) {
  v1::PrunerSpec spec;
  auto none = NewPruner(spec);  // empty name: none
  ASSERT_TRUE(none.ok());
  TrialCurve nan_curve;
  nan_curve.values[1] = kNaN;
  EXPECT_FALSE((*none)->ShouldPrune(&nan_curve, {nan_curve}));

  // asha defaults (min_resource 1, eta 4): with 4 values at epoch 1 the
  // trial must be the best (eta 2 would keep the better half).
  spec.set_name("asha");
  auto asha = NewPruner(spec);
  ASSERT_TRUE(asha.ok());
  std::vector<TrialCurve> all(4);
  const double values[] = {1, 2, 3, 1.5};
  for (int i = 0; i < 4; ++i) {
    all[i].number = i;
    all[i].values[1] = values[i];
    EXPECT_EQ((*asha)->ShouldPrune(&all[i], all), i > 0) << i;
  }

  // median defaults: 5 startup trials.
  spec.set_name("median");
  auto median = NewPruner(spec);
  ASSERT_TRUE(median.ok());
  std::vector<TrialCurve> table = MedianTable();
  table[5].values[1] = 9;
  EXPECT_FALSE((*median)->ShouldPrune(&table[5], table));
  table[4].complete = true;
  EXPECT_TRUE((*median)->ShouldPrune(&table[5], table));
}

TEST(NewPrunerTest, RejectsBadSettings) {
  auto message = [](v1::PrunerSpec spec) {
    auto pruner = NewPruner(spec);
    EXPECT_EQ(pruner.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(pruner.status().message());
  };
  v1::PrunerSpec spec;
  spec.set_name("foo");
  EXPECT_EQ(message(spec), "pruner.name: \"foo\"; use none, asha or median");
  spec = Asha(1, 1, 0);
  EXPECT_EQ(message(spec), "pruner.reduction_factor: 1; must be >= 2");
  EXPECT_EQ(message(Asha(0, 2, 0)), "pruner.min_resource: 0; must be >= 1");
  EXPECT_EQ(message(Asha(1, 2, -1)),
            "pruner.min_early_stopping_rate: -1; must be >= 0");
  EXPECT_EQ(message(Median(-1, 0)), "pruner.startup_trials: -1; must be >= 0");
  EXPECT_EQ(message(Median(0, -2)), "pruner.warmup_epochs: -2; must be >= 0");
}

// A study with `trials` trials, at most 4 open at once; each step a random
// open trial reports its next epoch (every 1, 2 or 3 epochs, so reports can
// skip rungs), up to its own last epoch (1 to 12), then completes. Values
// a + b / epoch + noise on a 1/8 grid (ties happen), 3% of them NaN.
// std::mt19937_64 is fully specified, so the numbers are the same
// everywhere.
Scenario RandomStudy(v1::PrunerSpec pruner, uint64_t seed, int trials) {
  std::mt19937_64 rng(seed);
  auto uniform = [&rng](int n) { return static_cast<int>(rng() % n); };
  struct Open {
    int trial, stride, last, epoch;
    double a, b;
  };
  Scenario scenario;
  scenario.pruner = std::move(pruner);
  std::vector<Open> open;
  int started = 0;
  while (started < trials || !open.empty()) {
    while (started < trials && open.size() < 4) {
      const int stride = uniform(4) == 0 ? 2 + uniform(2) : 1;
      open.push_back({started++, stride, 1 + uniform(12), 0,
                      uniform(32) / 8.0, uniform(48) / 8.0 - 1});
    }
    const int k = uniform(static_cast<int>(open.size()));
    Open& o = open[k];
    o.epoch = std::min(o.epoch + o.stride, o.last);
    double value =
        std::round((o.a + o.b / o.epoch + (uniform(5) - 2) / 8.0) * 8) / 8;
    if (uniform(100) < 3) value = kNaN;
    scenario.events.push_back({o.trial, o.epoch, value, false});
    if (o.epoch == o.last) {
      scenario.events.push_back({o.trial, 0, 0, true});
      open.erase(open.begin() + k);
    }
  }
  return scenario;
}

void ExpectSameAsOptuna(const Scenario& scenario, const std::string& name) {
  std::vector<TrialCurve> curves;
  const auto ours = ReplayOurs(scenario, &curves);
  const auto optuna = ReplayOptuna(scenario, name);
  EXPECT_EQ(DecisionsText(ours), DecisionsText(optuna)) << name;
  EXPECT_EQ(ours.size(), optuna.size()) << name;
}

TEST(OptunaReferenceTest, LearningCurves) {
  if (!HaveOptuna()) GTEST_SKIP() << "/usr/bin/python3 cannot import optuna";
  ExpectSameAsOptuna(LearningCurves(Asha(1, 2, 0)), "curves_asha_2");
  ExpectSameAsOptuna(LearningCurves(Asha(1, 3, 0)), "curves_asha_3");
  ExpectSameAsOptuna(LearningCurves(Median(3, 1)), "curves_median");
}

TEST(OptunaReferenceTest, RandomStudiesAsha) {
  if (!HaveOptuna()) GTEST_SKIP() << "/usr/bin/python3 cannot import optuna";
  const v1::PrunerSpec specs[] = {Asha(1, 2, 0), Asha(1, 3, 0), Asha(1, 4, 0),
                                  Asha(2, 2, 1), Asha(3, 3, 0)};
  uint64_t seed = 11;
  for (const v1::PrunerSpec& spec : specs) {
    const Scenario scenario = RandomStudy(spec, seed, 40);
    std::vector<TrialCurve> curves;
    // The scenario must exercise pruning for the comparison to mean much.
    EXPECT_FALSE(Pruned(ReplayOurs(scenario, &curves)).empty()) << seed;
    ExpectSameAsOptuna(scenario, absl::StrCat("asha_", seed++));
  }
}

TEST(OptunaReferenceTest, RandomStudiesMedian) {
  if (!HaveOptuna()) GTEST_SKIP() << "/usr/bin/python3 cannot import optuna";
  const v1::PrunerSpec specs[] = {Median(5, 0), Median(2, 3), Median(0, 0),
                                  Median(1, 1)};
  uint64_t seed = 21;
  for (const v1::PrunerSpec& spec : specs) {
    const Scenario scenario = RandomStudy(spec, seed, 40);
    std::vector<TrialCurve> curves;
    EXPECT_FALSE(Pruned(ReplayOurs(scenario, &curves)).empty()) << seed;
    ExpectSameAsOptuna(scenario, absl::StrCat("median_", seed++));
  }
}

}  // namespace
}  // namespace mpilearn::opt
