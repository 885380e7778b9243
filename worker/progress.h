// The group leader's progress line: where the job stands, from the master's
// JobProgress in every NextDataUnit answer.
//
//   ProgressReporter progress({ProgressMode::kAuto, absl::Seconds(30)});
//   progress.Update(response.progress());   // after every NextDataUnit
//   progress.ClearLine();                   // before printing anything else
//   progress.Finish();                      // at the end of the run
//
// A line reads
//
//   progress: epoch 2/5  43.1%  samples/s=9650  loss=0.4123  eta=0m21s
//
// with the current epoch (1-based), the share of it trained, the job-wide
// training rate (all groups) over the last ~15 s, the master's training loss
// and the time left at that rate ("--" where a figure is not known yet).
//
// Modes: kPlain prints newline-terminated lines, one per `interval` (the
// first one interval after the reporter was made); kLive rewrites one line in
// place (`\r`, text, erase to the end of the line) at most every 0.5 s, for a
// terminal; kAuto is kLive when the output reaches a terminal
// (OutputReachesTerminal) and kPlain otherwise; kOff prints nothing. Answers without progress (a master that
// does not fill it: samples_per_epoch 0) are ignored.
//
// Threading: not thread-safe; the leader's MPI thread uses it.
#ifndef MPILEARN_WORKER_PROGRESS_H_
#define MPILEARN_WORKER_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::worker {

enum class ProgressMode { kAuto, kLive, kPlain, kOff };

// "auto", "plain" or "off" (the --progress values); nullopt otherwise.
std::optional<ProgressMode> ParseProgressMode(absl::string_view text);

struct ProgressOptions {
  ProgressMode mode = ProgressMode::kAuto;
  // Between plain lines.
  absl::Duration interval = absl::Seconds(30);
};

// What one progress line shows.
struct ProgressFigures {
  int epoch = 0;   // the current epoch, 1-based, at most `epochs`
  int epochs = 0;
  double percent = 0.0;  // of the current epoch trained, 0..100
  double samples_per_second = -1.0;  // job-wide; negative: not known yet
  double eta_seconds = -1.0;         // negative: not known
  std::optional<double> loss;        // the master's training loss
};

// The figures for `progress`, given the job-wide rate (negative: unknown).
// nullopt when `progress` carries no usable figures (no samples per epoch).
std::optional<ProgressFigures> ComputeProgress(const v1::JobProgress& progress,
                                               double samples_per_second);

// "1m05s" below an hour, "2h03m" from an hour on, "--" when unknown
// (negative, not finite or absurdly large).
std::string FormatEta(double seconds);

// The line's text, without `\r` or newline.
std::string FormatProgressLine(const ProgressFigures& figures);

// Whether lines written to `out` end up on a terminal. Open MPI gives each
// rank a pseudo-terminal for stdout even when mpirun's own stdout is a pipe
// or a file (`mpirun ... | tee log`, batch jobs), so under mpirun a rank's
// isatty says nothing about where its output goes; for stdout, when mpirun
// is this process's parent (ranks on mpirun's node), mpirun's stdout
// decides. Where that cannot be read (a remote daemon), the rank's own
// isatty does.
bool OutputReachesTerminal(std::FILE* out);

class ProgressReporter {
 public:
  using Clock = std::function<absl::Time()>;

  // `terminal` says whether `out` reaches a terminal (kAuto's choice);
  // unset, the reporter asks OutputReachesTerminal. `clock` and `out` are seams for tests.
  explicit ProgressReporter(ProgressOptions options, std::FILE* out = stdout,
                            Clock clock = &absl::Now,
                            std::optional<bool> terminal = std::nullopt);
  ~ProgressReporter();  // Finish()
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // The master's latest figures; prints when the mode's cadence says so.
  void Update(const v1::JobProgress& progress);
  // Erases the live line, if one is shown, so other output starts on a clean
  // line; the next Update draws it again.
  void ClearLine();
  // Ends the live line (draws the latest figures, then a newline).
  void Finish();

  // The mode in effect: kLive, kPlain or kOff (kAuto resolved).
  ProgressMode mode() const { return mode_; }
  // The figures of the latest usable Update, if any.
  const std::optional<ProgressFigures>& latest() const { return latest_; }
  // The job-wide samples/s over the window; negative when not known.
  double Rate() const;

  // The rate is measured over about this long, and needs at least kMinSpan.
  static constexpr absl::Duration kWindow = absl::Seconds(15);
  static constexpr absl::Duration kMinSpan = absl::Milliseconds(500);
  // A live line is redrawn at most this often.
  static constexpr absl::Duration kLiveRefresh = absl::Milliseconds(500);

 private:
  void DrawLive();

  ProgressMode mode_;
  const absl::Duration interval_;
  std::FILE* const out_;
  const Clock clock_;
  absl::Time next_plain_;
  absl::Time last_drawn_ = absl::InfinitePast();
  bool line_shown_ = false;  // a live line is on screen
  bool drawn_latest_ = true;  // the live line shows `latest_`
  std::optional<ProgressFigures> latest_;
  // (time, job-wide samples trained), oldest first.
  std::deque<std::pair<absl::Time, uint64_t>> points_;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_PROGRESS_H_
