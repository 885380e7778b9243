#include "worker/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mpilearn::worker {

std::optional<ProgressMode> ParseProgressMode(absl::string_view text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "plain") return ProgressMode::kPlain;
  if (text == "off") return ProgressMode::kOff;
  return std::nullopt;
}

bool OutputReachesTerminal(std::FILE* out) {
  if (out == nullptr || isatty(fileno(out)) != 1) return false;
  if (fileno(out) != STDOUT_FILENO ||
      std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {
    return true;
  }
  char target[256];
  const std::string link = absl::StrCat("/proc/", getppid(), "/fd/1");
  const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return true;
  const absl::string_view parent_stdout(target, static_cast<size_t>(n));
  return absl::StartsWith(parent_stdout, "/dev/pts/") ||
         absl::StartsWith(parent_stdout, "/dev/tty");
}

std::optional<ProgressFigures> ComputeProgress(const v1::JobProgress& progress,
                                               double samples_per_second) {
  if (progress.samples_per_epoch() == 0 || progress.epochs() <= 0) {
    return std::nullopt;
  }
  const double per_epoch = static_cast<double>(progress.samples_per_epoch());
  const double trained = static_cast<double>(progress.samples_trained());
  const int done = std::max(0, progress.epochs_done());
  ProgressFigures figures;
  figures.epochs = progress.epochs();
  figures.epoch = std::min(done + 1, figures.epochs);
  if (done >= figures.epochs) {
    figures.percent = 100.0;
  } else {
    figures.percent = std::clamp(
        100.0 * (trained - static_cast<double>(done) * per_epoch) / per_epoch,
        0.0, 100.0);
  }
  figures.samples_per_second = samples_per_second;
  const double remaining =
      std::max(0.0, static_cast<double>(figures.epochs) * per_epoch - trained);
  if (remaining == 0.0) {
    figures.eta_seconds = 0.0;
  } else if (samples_per_second > 0.0) {
    figures.eta_seconds = remaining / samples_per_second;
  }
  if (progress.has_train_loss()) figures.loss = progress.train_loss();
  return figures;
}

std::string FormatEta(double seconds) {
  // Beyond ~100 days an estimate says nothing useful.
  if (!std::isfinite(seconds) || seconds < 0 || seconds >= 1e7) return "--";
  const int64_t total = std::llround(seconds);
  if (total < 3600) {
    return absl::StrFormat("%dm%02ds", total / 60, total % 60);
  }
  return absl::StrFormat("%dh%02dm", total / 3600, total % 3600 / 60);
}

std::string FormatProgressLine(const ProgressFigures& figures) {
  const std::string rate =
      figures.samples_per_second >= 0
          ? absl::StrFormat("%.0f", figures.samples_per_second)
          : std::string("--");
  const std::string loss =
      figures.loss.has_value() ? absl::StrFormat("%.4f", *figures.loss)
                               : std::string("--");
  return absl::StrFormat("progress: epoch %d/%d  %.1f%%  samples/s=%s  loss=%s  eta=%s",
                         figures.epoch, figures.epochs, figures.percent, rate,
                         loss, FormatEta(figures.eta_seconds));
}

ProgressReporter::ProgressReporter(ProgressOptions options, std::FILE* out,
                                   Clock clock, std::optional<bool> terminal)
    : mode_(options.mode),
      interval_(options.interval),
      out_(out),
      clock_(std::move(clock)) {
  if (out_ == nullptr) mode_ = ProgressMode::kOff;
  if (mode_ == ProgressMode::kAuto) {
    const bool tty =
        terminal.has_value() ? *terminal : OutputReachesTerminal(out_);
    mode_ = tty ? ProgressMode::kLive : ProgressMode::kPlain;
  }
  next_plain_ = clock_() + interval_;
}

ProgressReporter::~ProgressReporter() { Finish(); }

double ProgressReporter::Rate() const {
  if (points_.size() < 2) return -1.0;
  const absl::Duration span = points_.back().first - points_.front().first;
  if (span < kMinSpan) return -1.0;
  return static_cast<double>(points_.back().second - points_.front().second) /
         absl::ToDoubleSeconds(span);
}

void ProgressReporter::Update(const v1::JobProgress& progress) {
  if (mode_ == ProgressMode::kOff) return;
  if (progress.samples_per_epoch() == 0 || progress.epochs() <= 0) return;
  const absl::Time now = clock_();
  const uint64_t trained = progress.samples_trained();
  // The count only grows, unless the master went back to a checkpoint.
  if (!points_.empty() &&
      (trained < points_.back().second || now < points_.back().first)) {
    points_.clear();
  }
  points_.emplace_back(now, trained);
  // Keep the newest point at or before the window's start, so the rate
  // spans the whole window once the run is that old.
  while (points_.size() > 2 && points_[1].first <= now - kWindow) {
    points_.pop_front();
  }
  latest_ = ComputeProgress(progress, Rate());
  if (!latest_.has_value()) return;

  if (mode_ == ProgressMode::kPlain) {
    if (now < next_plain_) return;
    std::fprintf(out_, "%s\n", FormatProgressLine(*latest_).c_str());
    std::fflush(out_);
    next_plain_ = now + interval_;
    return;
  }
  drawn_latest_ = false;
  if (line_shown_ && now - last_drawn_ < kLiveRefresh) return;
  DrawLive();
  last_drawn_ = now;
}

void ProgressReporter::DrawLive() {
  std::fprintf(out_, "\r%s\033[K", FormatProgressLine(*latest_).c_str());
  std::fflush(out_);
  line_shown_ = true;
  drawn_latest_ = true;
}

void ProgressReporter::ClearLine() {
  if (!line_shown_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  line_shown_ = false;
  drawn_latest_ = false;
}

void ProgressReporter::Finish() {
  if (mode_ != ProgressMode::kLive || !latest_.has_value()) return;
  if (!drawn_latest_) DrawLive();
  if (line_shown_) {
    std::fputs("\n", out_);
    std::fflush(out_);
    line_shown_ = false;
  }
}

}  // namespace mpilearn::worker
