// Learning-rate schedules against PyTorch 1.13's torch.optim.lr_scheduler,
// run by /usr/bin/python3 on the same positions (lr_schedule_reference.py;
// skipped where torch cannot be imported), and the spec's checks.
#include "common/schedule/lr_schedule.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace {

bool TorchAvailable() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

// PyTorch's rates: the script's lines.
std::vector<double> Reference(const std::string& schedule, double base, int steps,
                              const std::vector<std::string>& args) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string command = absl::StrCat(
      "/usr/bin/python3 ", srcdir ? srcdir : ".", "/", workspace ? workspace : "",
      "/common/schedule/lr_schedule_reference.py ", schedule, " ", base, " ", steps, " ",
      absl::StrJoin(args, " "), " 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {};
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  if (pclose(pipe) != 0) return {};
  std::vector<double> rates;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    double rate = 0;
    if (!absl::SimpleAtod(line, &rate)) return {};
    rates.push_back(rate);
  }
  return rates;
}

v1::LrScheduleSpec Normalized(v1::LrScheduleSpec spec) {
  const absl::Status status = NormalizeLrSchedule(&spec);
  EXPECT_TRUE(status.ok()) << status;
  return spec;
}

void ExpectClose(const std::vector<double>& ours, const std::vector<double>& torch) {
  ASSERT_EQ(ours.size(), torch.size());
  for (size_t k = 0; k < ours.size(); ++k) {
    ASSERT_NEAR(ours[k], torch[k], 1e-9 * std::abs(torch[k]) + 1e-15) << "position " << k;
  }
}

// Every schedule with a position count, with and without warm-up, over a
// few hundred positions.
TEST(LrScheduleTest, EveryScheduleEqualsPyTorchs) {
  if (!TorchAvailable()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch (python3-torch)";
  struct Case {
    std::string name;
    int steps;
    std::vector<std::string> args;
    v1::LrScheduleSpec spec;
  };
  std::vector<Case> cases;
  {
    Case c{"step", 300, {"step_size=30", "gamma=0.5", "warmup=20", "warmup_start_factor=0.1"}, {}};
    c.spec.set_name("step");
    c.spec.set_step_size(30);
    c.spec.set_gamma(0.5);
    c.spec.set_warmup(20);
    cases.push_back(c);
  }
  {
    Case c{"multistep", 300, {"milestones=50,120,200", "gamma=0.3"}, {}};
    c.spec.set_name("multistep");
    for (int m : {50, 120, 200}) c.spec.add_milestones(m);
    c.spec.set_gamma(0.3);
    cases.push_back(c);
  }
  {
    Case c{"exponential", 300, {"gamma=0.99", "warmup=10", "warmup_start_factor=0.25"}, {}};
    c.spec.set_name("exponential");
    c.spec.set_gamma(0.99);
    c.spec.set_warmup(10);
    c.spec.set_warmup_start_factor(0.25);
    cases.push_back(c);
  }
  {
    // Up to the end of the decay: PyTorch's cosine rises again after it.
    Case c{"cosine", 290, {"t_max=250", "min_lr=0.0001", "warmup=40", "warmup_start_factor=0.1"},
           {}};
    c.spec.set_name("cosine");
    c.spec.set_t_max(250);
    c.spec.set_min_lr(1e-4);
    c.spec.set_warmup(40);
    cases.push_back(c);
  }
  {
    Case c{"constant", 100, {"warmup=25", "warmup_start_factor=0.5"}, {}};
    c.spec.set_warmup(25);
    c.spec.set_warmup_start_factor(0.5);
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const double base = 0.05;
    const std::vector<double> torch = Reference(c.name, base, c.steps, c.args);
    ASSERT_EQ(torch.size(), static_cast<size_t>(c.steps)) << "the reference script failed";
    const LrSchedule schedule(Normalized(c.spec), base, /*higher_is_better=*/false);
    std::vector<double> ours;
    for (int k = 0; k < c.steps; ++k) ours.push_back(schedule.RateAt(k));
    ExpectClose(ours, torch);
  }
}

// ReduceLROnPlateau on the same validations, minimizing a loss and
// maximizing an accuracy; a schedule restored from its state mid-way goes
// on as the original.
TEST(LrScheduleTest, PlateauEqualsPyTorchsAndResumes) {
  if (!TorchAvailable()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch (python3-torch)";
  std::vector<double> losses;
  for (int i = 0; i < 80; ++i) {
    losses.push_back(i < 10 ? 1.0 / (1 + i) : 0.1 + 0.001 * ((i * 7) % 5) - 0.0002 * (i / 20));
  }
  for (const bool accuracy : {false, true}) {
    SCOPED_TRACE(accuracy ? "max" : "min");
    std::vector<double> values = losses;
    if (accuracy) {
      for (double& v : values) v = 1 - v;
    }
    v1::LrScheduleSpec spec;
    spec.set_name("plateau");
    spec.set_factor(0.5);
    spec.set_patience(3);
    spec.set_threshold(1e-3);
    spec.set_cooldown(2);
    spec.set_min_lr(0.004);
    spec.set_metric(accuracy ? "val_accuracy" : "val_loss");
    std::vector<std::string> printed;
    for (double v : values) printed.push_back(absl::StrCat(v));
    const std::vector<double> torch =
        Reference("plateau", 0.1, 0,
                  {"factor=0.5", "patience=3", "threshold=0.001", "cooldown=2", "min_lr=0.004",
                   absl::StrCat("mode=", accuracy ? "max" : "min"),
                   "values=" + absl::StrJoin(printed, ",")});
    ASSERT_EQ(torch.size(), values.size()) << "the reference script failed";
    LrSchedule schedule(Normalized(spec), 0.1, accuracy);
    std::vector<double> ours;
    std::optional<LrSchedule> resumed;
    std::vector<double> resumed_rates;
    int reductions = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      // PyTorch parses the printed value; so does the schedule here.
      double v = 0;
      ASSERT_TRUE(absl::SimpleAtod(printed[i], &v));
      reductions += schedule.Observe(v) ? 1 : 0;
      ours.push_back(schedule.RateAt(1000));
      if (i == 30) {
        resumed.emplace(Normalized(spec), 0.1, accuracy);
        ASSERT_TRUE(resumed->Restore(schedule.state()).ok());
      } else if (resumed.has_value()) {
        resumed->Observe(v);
        resumed_rates.push_back(resumed->RateAt(0));
      }
    }
    ExpectClose(ours, torch);
    EXPECT_GE(reductions, 3);  // the sequence plateaus: the test reaches the floor
    EXPECT_EQ(ours.back(), 0.004);
    ExpectClose(resumed_rates, std::vector<double>(ours.begin() + 31, ours.end()));
  }
}

TEST(LrScheduleTest, TheSpecIsCheckedFieldByField) {
  auto refused = [](v1::LrScheduleSpec spec) {
    const absl::Status status = NormalizeLrSchedule(&spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << spec.ShortDebugString();
    return std::string(status.message());
  };
  v1::LrScheduleSpec spec;
  spec.set_name("cosinus");
  EXPECT_NE(refused(spec).find("unknown schedule 'cosinus'"), std::string::npos);
  spec.set_name("step");
  EXPECT_NE(refused(spec).find("step_size is required"), std::string::npos);
  spec.set_step_size(10);
  spec.set_gamma(2);
  EXPECT_NE(refused(spec).find("optimizer.schedule.gamma must be in (0, 1], got 2"),
            std::string::npos);
  spec.set_gamma(0.5);
  spec.set_t_max(5);
  EXPECT_NE(refused(spec).find("t_max: not used by schedule 'step'"), std::string::npos);
  spec.clear_t_max();
  spec.set_unit("batches");
  EXPECT_NE(refused(spec).find("unit must be"), std::string::npos);
  spec.set_unit("epochs");
  spec.set_warmup(-1);
  EXPECT_NE(refused(spec).find("warmup"), std::string::npos);
  spec.clear_warmup();
  EXPECT_TRUE(NormalizeLrSchedule(&spec).ok());
  v1::LrScheduleSpec multi;
  multi.set_name("multistep");
  multi.add_milestones(30);
  multi.add_milestones(30);
  EXPECT_NE(refused(multi).find("milestones must increase"), std::string::npos);
  v1::LrScheduleSpec plateau;
  plateau.set_name("plateau");
  plateau.set_factor(1);
  EXPECT_NE(refused(plateau).find("factor must be in (0, 1)"), std::string::npos);
  plateau.set_factor(0.5);
  ASSERT_TRUE(NormalizeLrSchedule(&plateau).ok());
  EXPECT_EQ(plateau.metric(), "val_loss");
  EXPECT_EQ(plateau.patience(), 10);
  // Defaults: a constant schedule is the base rate at every position.
  v1::LrScheduleSpec none;
  ASSERT_TRUE(NormalizeLrSchedule(&none).ok());
  const LrSchedule constant(none, 0.01, false);
  EXPECT_TRUE(constant.constant());
  EXPECT_EQ(constant.RateAt(12345), 0.01);
  // A state that does not fit is refused.
  LrSchedule schedule(plateau, 0.01, false);
  v1::LrScheduleState bad;
  bad.set_rate(0.5);
  EXPECT_FALSE(schedule.Restore(bad).ok());
}

}  // namespace
}  // namespace mpilearn
