#include "common/schedule/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mpilearn {
namespace {

constexpr char kField[] = "optimizer.schedule.";
constexpr int64_t kMaxPosition = int64_t{1} << 40;
constexpr double kPi = 3.14159265358979323846;

absl::Status Invalid(absl::string_view field, absl::string_view rule, double value) {
  return absl::InvalidArgumentError(absl::StrCat(kField, field, " must be ", rule, ", got ", value));
}

absl::Status CheckCount(absl::string_view field, int64_t value, int64_t lo) {
  if (value < lo || value > kMaxPosition) {
    return Invalid(field, absl::StrCat("in [", lo, ", 2^40]"), static_cast<double>(value));
  }
  return absl::OkStatus();
}

// In (0, 1] (`closed`) or (0, 1).
absl::Status CheckFactor(absl::string_view field, double value, bool closed) {
  if (!(value > 0) || value > 1 || (!closed && value == 1)) {
    return Invalid(field, closed ? "in (0, 1]" : "in (0, 1)", value);
  }
  return absl::OkStatus();
}

// The fields a schedule does not use must be absent: a misspelt schedule
// name otherwise trains with a constant rate.
absl::Status Unused(const v1::LrScheduleSpec& s, bool step_size, bool milestones, bool gamma,
                    bool t_max, bool min_lr, bool plateau) {
  std::vector<std::string> extra;
  if (!step_size && s.has_step_size()) extra.push_back("step_size");
  if (!milestones && s.milestones_size() > 0) extra.push_back("milestones");
  if (!gamma && s.has_gamma()) extra.push_back("gamma");
  if (!t_max && s.has_t_max()) extra.push_back("t_max");
  if (!min_lr && s.has_min_lr()) extra.push_back("min_lr");
  if (!plateau && (s.has_factor() || s.has_patience() || s.has_threshold() || s.has_cooldown() ||
                   !s.metric().empty())) {
    extra.push_back("factor/patience/threshold/cooldown/metric");
  }
  if (extra.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      kField, absl::StrJoin(extra, ", "), ": not used by schedule '", s.name(),
      "'; remove it, or pick the schedule that uses it"));
}

}  // namespace

absl::Status NormalizeLrSchedule(v1::LrScheduleSpec* s) {
  if (s->name().empty()) s->set_name("constant");
  if (s->unit().empty()) s->set_unit("updates");
  if (s->unit() != "updates" && s->unit() != "epochs") {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, "unit must be 'updates' or 'epochs', got '", s->unit(), "'"));
  }
  if (!s->has_warmup()) s->set_warmup(0);
  if (absl::Status st = CheckCount("warmup", s->warmup(), 0); !st.ok()) return st;
  if (!s->has_warmup_start_factor()) s->set_warmup_start_factor(0.1);
  if (absl::Status st = CheckFactor("warmup_start_factor", s->warmup_start_factor(), true);
      !st.ok()) {
    return st;
  }
  const std::string& name = s->name();
  if (name == "constant") {
    return Unused(*s, false, false, false, false, false, false);
  }
  if (name == "step") {
    if (!s->has_step_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, "step_size is required by schedule 'step' (positions between decays)"));
    }
    if (absl::Status st = CheckCount("step_size", s->step_size(), 1); !st.ok()) return st;
    if (!s->has_gamma()) s->set_gamma(0.1);
    if (absl::Status st = CheckFactor("gamma", s->gamma(), true); !st.ok()) return st;
    return Unused(*s, true, false, true, false, false, false);
  }
  if (name == "multistep") {
    if (s->milestones_size() == 0 || s->milestones_size() > 1000) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, "milestones: schedule 'multistep' needs 1 to 1000 positions, got ",
          s->milestones_size()));
    }
    for (int i = 0; i < s->milestones_size(); ++i) {
      if (absl::Status st = CheckCount(absl::StrCat("milestones[", i, "]"), s->milestones(i), 1);
          !st.ok()) {
        return st;
      }
      if (i > 0 && s->milestones(i) <= s->milestones(i - 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            kField, "milestones must increase; [", i, "] is ", s->milestones(i), " after ",
            s->milestones(i - 1)));
      }
    }
    if (!s->has_gamma()) s->set_gamma(0.1);
    if (absl::Status st = CheckFactor("gamma", s->gamma(), true); !st.ok()) return st;
    return Unused(*s, false, true, true, false, false, false);
  }
  if (name == "exponential") {
    if (!s->has_gamma()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, "gamma is required by schedule 'exponential' (the factor per position)"));
    }
    if (absl::Status st = CheckFactor("gamma", s->gamma(), true); !st.ok()) return st;
    return Unused(*s, false, false, true, false, false, false);
  }
  if (!s->has_min_lr()) s->set_min_lr(0);
  if (!std::isfinite(s->min_lr()) || s->min_lr() < 0) {
    return Invalid("min_lr", "finite and >= 0", s->min_lr());
  }
  if (name == "cosine") {
    if (!s->has_t_max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, "t_max is required by schedule 'cosine' (positions from the rate to min_lr)"));
    }
    if (absl::Status st = CheckCount("t_max", s->t_max(), 1); !st.ok()) return st;
    return Unused(*s, false, false, false, true, true, false);
  }
  if (name == "plateau") {
    if (!s->has_factor()) s->set_factor(0.1);
    if (absl::Status st = CheckFactor("factor", s->factor(), false); !st.ok()) return st;
    if (!s->has_patience()) s->set_patience(10);
    if (absl::Status st = CheckCount("patience", s->patience(), 0); !st.ok()) return st;
    if (!s->has_threshold()) s->set_threshold(1e-4);
    if (!std::isfinite(s->threshold()) || s->threshold() < 0 || s->threshold() >= 1) {
      return Invalid("threshold", "in [0, 1)", s->threshold());
    }
    if (!s->has_cooldown()) s->set_cooldown(0);
    if (absl::Status st = CheckCount("cooldown", s->cooldown(), 0); !st.ok()) return st;
    if (s->metric().empty()) s->set_metric("val_loss");
    return Unused(*s, false, false, false, false, true, true);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      kField, "name: unknown schedule '", name,
      "'; available: constant, step, multistep, exponential, cosine, plateau"));
}

LrSchedule::LrSchedule(const v1::LrScheduleSpec& schedule, double base, bool higher_is_better)
    : spec_(schedule), base_(base), higher_is_better_(higher_is_better) {
  state_.set_rate(base);
}

bool LrSchedule::constant() const {
  return spec_.warmup() == 0 && (spec_.name().empty() || spec_.name() == "constant");
}

double LrSchedule::MainRate(int64_t k) const {
  const std::string& name = spec_.name();
  if (name == "step") {
    return base_ * std::pow(spec_.gamma(), static_cast<double>(k / spec_.step_size()));
  }
  if (name == "multistep") {
    const auto passed = std::upper_bound(spec_.milestones().begin(), spec_.milestones().end(), k) -
                        spec_.milestones().begin();
    return base_ * std::pow(spec_.gamma(), static_cast<double>(passed));
  }
  if (name == "exponential") return base_ * std::pow(spec_.gamma(), static_cast<double>(k));
  if (name == "cosine") {
    if (k >= spec_.t_max()) return spec_.min_lr();
    const double phase = kPi * static_cast<double>(k) / static_cast<double>(spec_.t_max());
    return spec_.min_lr() + (base_ - spec_.min_lr()) * (1 + std::cos(phase)) / 2;
  }
  if (name == "plateau") return state_.rate();
  return base_;
}

double LrSchedule::RateAt(int64_t at) const {
  at = std::max<int64_t>(at, 0);
  const int64_t warmup = spec_.warmup();
  if (at < warmup) {
    const double start = spec_.warmup_start_factor();
    const double factor =
        start + (1 - start) * static_cast<double>(at) / static_cast<double>(warmup);
    // During the warm-up a plateau's reductions already apply.
    const double base = spec_.name() == "plateau" ? state_.rate() : base_;
    return base * factor;
  }
  return MainRate(at - warmup);
}

bool LrSchedule::Observe(double value) {
  if (spec_.name() != "plateau" || !std::isfinite(value)) return false;
  const double threshold = spec_.threshold();
  const bool better =
      !state_.has_best() ||
      (higher_is_better_ ? value > state_.best() * (1 + threshold)
                         : value < state_.best() * (1 - threshold));
  if (better) {
    state_.set_has_best(true);
    state_.set_best(value);
    state_.set_bad(0);
  } else {
    state_.set_bad(state_.bad() + 1);
  }
  if (state_.cooldown() > 0) {
    state_.set_cooldown(state_.cooldown() - 1);
    state_.set_bad(0);
  }
  if (state_.bad() <= spec_.patience()) return false;
  state_.set_cooldown(spec_.cooldown());
  state_.set_bad(0);
  const double old_rate = state_.rate();
  const double new_rate = std::max(old_rate * spec_.factor(), spec_.min_lr());
  // PyTorch's eps: a change smaller than 1e-8 is not made.
  if (old_rate - new_rate <= 1e-8) return false;
  state_.set_rate(new_rate);
  return true;
}

absl::Status LrSchedule::Restore(const v1::LrScheduleState& state) {
  if (!std::isfinite(state.rate()) || !(state.rate() > 0) || state.rate() > base_ ||
      state.bad() < 0 || state.cooldown() < 0 || (state.has_best() && std::isnan(state.best()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning-rate schedule state does not fit the job (rate ", state.rate(), ", base rate ",
        base_, ")"));
  }
  state_ = state;
  return absl::OkStatus();
}

}  // namespace mpilearn
