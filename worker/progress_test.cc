#include "worker/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace mpilearn::worker {
namespace {

// What a reporter writes, through a real FILE*.
class CapturedOutput {
 public:
  CapturedOutput() : file_(open_memstream(&data_, &size_)) {}
  ~CapturedOutput() {
    std::fclose(file_);
    std::free(data_);
  }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(data_, size_);
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

// A clock the test moves by hand.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1700000000);
  ProgressReporter::Clock AsClock() {
    return [this] { return now; };
  }
};

v1::JobProgress Progress(int epochs_done, int epochs, uint64_t samples_trained,
                         uint64_t samples_per_epoch) {
  v1::JobProgress progress;
  progress.set_epochs_done(epochs_done);
  progress.set_epochs(epochs);
  progress.set_samples_trained(samples_trained);
  progress.set_samples_per_epoch(samples_per_epoch);
  return progress;
}

TEST(ProgressTest, ParsesModes) {
  EXPECT_EQ(ParseProgressMode("auto"), ProgressMode::kAuto);
  EXPECT_EQ(ParseProgressMode("plain"), ProgressMode::kPlain);
  EXPECT_EQ(ParseProgressMode("off"), ProgressMode::kOff);
  EXPECT_FALSE(ParseProgressMode("live").has_value());
  EXPECT_FALSE(ParseProgressMode("").has_value());
}

TEST(ProgressTest, FormatsEta) {
  EXPECT_EQ(FormatEta(0), "0m00s");
  EXPECT_EQ(FormatEta(21.4), "0m21s");
  EXPECT_EQ(FormatEta(65), "1m05s");
  EXPECT_EQ(FormatEta(3599.4), "59m59s");
  EXPECT_EQ(FormatEta(3599.6), "1h00m");
  EXPECT_EQ(FormatEta(2 * 3600 + 3 * 60 + 40), "2h03m");
  EXPECT_EQ(FormatEta(250 * 3600), "250h00m");
  EXPECT_EQ(FormatEta(-1), "--");
  EXPECT_EQ(FormatEta(1.0 / 0.0), "--");
  EXPECT_EQ(FormatEta(std::nan("")), "--");
}

TEST(ProgressTest, ComputesPercentAndEta) {
  // Epoch 2 of 5, 60000 samples per epoch, 85860 trained: 25860 into epoch
  // 2 = 43.1%; 300000 - 85860 = 214140 left at 9650/s = 22.19 s.
  v1::JobProgress progress = Progress(1, 5, 85860, 60000);
  progress.set_train_loss(0.41234);
  std::optional<ProgressFigures> figures = ComputeProgress(progress, 9650);
  ASSERT_TRUE(figures.has_value());
  EXPECT_EQ(figures->epoch, 2);
  EXPECT_EQ(figures->epochs, 5);
  EXPECT_NEAR(figures->percent, 43.1, 1e-9);
  EXPECT_NEAR(figures->eta_seconds, 214140.0 / 9650.0, 1e-9);
  EXPECT_EQ(FormatProgressLine(*figures),
            "progress: epoch 2/5  43.1%  samples/s=9650  loss=0.4123  eta=0m22s");

  // Unknown rate: no ETA; no loss: "--".
  figures = ComputeProgress(Progress(0, 2, 0, 1000), -1);
  ASSERT_TRUE(figures.has_value());
  EXPECT_EQ(figures->epoch, 1);
  EXPECT_EQ(figures->percent, 0.0);
  EXPECT_EQ(FormatProgressLine(*figures),
            "progress: epoch 1/2  0.0%  samples/s=--  loss=--  eta=--");

  // Units of the next epoch done before the epoch's last one: capped at 100%.
  figures = ComputeProgress(Progress(0, 2, 1500, 1000), 100);
  EXPECT_EQ(figures->percent, 100.0);
  EXPECT_NEAR(figures->eta_seconds, 5.0, 1e-9);

  // Done: the last epoch, complete, nothing left.
  figures = ComputeProgress(Progress(2, 2, 2000, 1000), 0);
  EXPECT_EQ(figures->epoch, 2);
  EXPECT_EQ(figures->percent, 100.0);
  EXPECT_EQ(figures->eta_seconds, 0.0);

  // A master that does not fill progress.
  EXPECT_FALSE(ComputeProgress(v1::JobProgress(), 100).has_value());
}

TEST(ProgressTest, RateOverSlidingWindow) {
  FakeClock clock;
  CapturedOutput out;
  ProgressReporter reporter({ProgressMode::kPlain, absl::Seconds(1000)},
                            out.file(), clock.AsClock());
  reporter.Update(Progress(0, 10, 0, 100000));
  EXPECT_LT(reporter.Rate(), 0) << "one point is no rate";
  clock.now += absl::Milliseconds(400);
  reporter.Update(Progress(0, 10, 100, 100000));
  EXPECT_LT(reporter.Rate(), 0) << "0.4 s is too short";
  // About 1000 samples/s for 10 s.
  for (int i = 1; i <= 19; ++i) {
    clock.now += absl::Milliseconds(500);
    reporter.Update(Progress(0, 10, 100 + 500 * i, 100000));
  }
  EXPECT_NEAR(reporter.Rate(), 9600.0 / 9.9, 1e-6);
  // Then 3000 samples/s for 20 s: the old points leave the window, and the
  // rate is the new one.
  uint64_t trained = 9600;
  for (int i = 0; i < 40; ++i) {
    clock.now += absl::Milliseconds(500);
    trained += 1500;
    reporter.Update(Progress(0, 10, trained, 100000));
  }
  EXPECT_NEAR(reporter.Rate(), 3000.0, 1e-6);
  ASSERT_TRUE(reporter.latest().has_value());
  EXPECT_NEAR(reporter.latest()->eta_seconds, (1000000.0 - trained) / 3000.0, 1e-6);
  // A master back at a checkpoint (fewer samples): measuring starts over.
  clock.now += absl::Milliseconds(500);
  reporter.Update(Progress(0, 10, 5000, 100000));
  EXPECT_LT(reporter.Rate(), 0);
  EXPECT_EQ(out.text(), "") << "no line before the interval";
}

TEST(ProgressTest, PlainLinesEveryInterval) {
  FakeClock clock;
  CapturedOutput out;
  ProgressReporter reporter({ProgressMode::kPlain, absl::Seconds(30)}, out.file(),
                            clock.AsClock(), /*terminal=*/true);
  EXPECT_EQ(reporter.mode(), ProgressMode::kPlain);
  // An update every 5 s for 100 s, 1000 samples/s.
  for (int i = 0; i <= 20; ++i) {
    reporter.Update(Progress(0, 1, 5000 * i, 200000));
    clock.now += absl::Seconds(5);
  }
  reporter.Finish();
  const std::string text = out.text();
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  // At 30 s, 60 s and 90 s; none at the start.
  ASSERT_EQ(lines.size(), 3u) << text;
  // 30000 of 200000 samples; 170000 left at 1000/s.
  EXPECT_EQ(lines[0], "progress: epoch 1/1  15.0%  samples/s=1000  loss=--  eta=2m50s");
  EXPECT_TRUE(absl::StartsWith(lines[1], "progress: epoch 1/1  30.0%  ")) << lines[1];
  EXPECT_TRUE(absl::StartsWith(lines[2], "progress: epoch 1/1  45.0%  ")) << lines[2];
  EXPECT_FALSE(absl::StrContains(text, "\r"));
  EXPECT_FALSE(absl::StrContains(text, "\033"));
}

TEST(ProgressTest, AutoIsPlainWhenNotATerminal) {
  CapturedOutput out;  // a memory stream is no terminal
  ProgressReporter reporter({ProgressMode::kAuto, absl::Seconds(30)}, out.file());
  EXPECT_EQ(reporter.mode(), ProgressMode::kPlain);
}

TEST(ProgressTest, LiveLineOnATerminal) {
  FakeClock clock;
  CapturedOutput out;
  ProgressReporter reporter({ProgressMode::kAuto, absl::Seconds(30)}, out.file(),
                            clock.AsClock(), /*terminal=*/true);
  ASSERT_EQ(reporter.mode(), ProgressMode::kLive);
  reporter.Update(Progress(0, 2, 0, 1000));
  std::string text = out.text();
  EXPECT_EQ(text, "\rprogress: epoch 1/2  0.0%  samples/s=--  loss=--  eta=--\033[K");
  // Within 0.5 s of the last drawing: not redrawn.
  clock.now += absl::Milliseconds(200);
  reporter.Update(Progress(0, 2, 100, 1000));
  EXPECT_EQ(out.text(), text);
  // 200 samples in 0.6 s; 1800 left.
  clock.now += absl::Milliseconds(400);
  reporter.Update(Progress(0, 2, 200, 1000));
  text = out.text();
  EXPECT_TRUE(absl::EndsWith(
      text, "\rprogress: epoch 1/2  20.0%  samples/s=333  loss=--  eta=0m05s\033[K"))
      << text;
  EXPECT_FALSE(absl::StrContains(text, "\n"));

  // Other output clears the line first; the next update draws it again.
  reporter.ClearLine();
  EXPECT_TRUE(absl::EndsWith(out.text(), "\033[K\r\033[K"));
  std::fputs("epoch 1/2 ...\n", out.file());
  // 1000 samples in 1.9 s: 526/s, 1000 left.
  clock.now += absl::Milliseconds(1300);
  reporter.Update(Progress(1, 2, 1000, 1000));
  EXPECT_TRUE(absl::EndsWith(out.text(), "epoch 1/2 ...\n\rprogress: epoch 2/2  0.0%  "
                                         "samples/s=526  loss=--  eta=0m02s\033[K"))
      << out.text();

  // The end of the run: the newest figures (not drawn yet: too soon after
  // the last drawing), then a newline. 2000 samples in 2 s.
  clock.now += absl::Milliseconds(100);
  reporter.Update(Progress(2, 2, 2000, 1000));
  reporter.Finish();
  EXPECT_TRUE(absl::EndsWith(out.text(), "\rprogress: epoch 2/2  100.0%  "
                                         "samples/s=1000  loss=--  eta=0m00s\033[K\n"))
      << out.text();
  const size_t length = out.text().size();
  reporter.Finish();
  EXPECT_EQ(out.text().size(), length) << "Finish twice writes nothing more";
}

TEST(ProgressTest, OffWritesNothing) {
  FakeClock clock;
  CapturedOutput out;
  {
    ProgressReporter reporter({ProgressMode::kOff, absl::Seconds(1)}, out.file(),
                              clock.AsClock(), /*terminal=*/true);
    for (int i = 0; i < 10; ++i) {
      clock.now += absl::Seconds(2);
      reporter.Update(Progress(0, 1, 100 * i, 1000));
    }
    reporter.ClearLine();
    reporter.Finish();
  }
  EXPECT_EQ(out.text(), "");
}

TEST(ProgressTest, NoProgressFromTheMasterPrintsNothing) {
  FakeClock clock;
  CapturedOutput plain_out, live_out;
  ProgressReporter plain({ProgressMode::kPlain, absl::Seconds(1)}, plain_out.file(),
                         clock.AsClock());
  ProgressReporter live({ProgressMode::kAuto, absl::Seconds(1)}, live_out.file(),
                        clock.AsClock(), /*terminal=*/true);
  for (int i = 0; i < 10; ++i) {
    clock.now += absl::Seconds(2);
    plain.Update(v1::JobProgress());
    live.Update(v1::JobProgress());
  }
  live.Finish();
  EXPECT_EQ(plain_out.text(), "");
  EXPECT_EQ(live_out.text(), "");
}

TEST(ProgressTest, PipesAndFilesAreNotTerminals) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::FILE* pipe_out = fdopen(fds[1], "w");
  EXPECT_FALSE(OutputReachesTerminal(pipe_out));
  std::fclose(pipe_out);
  close(fds[0]);
  std::FILE* file = std::tmpfile();
  EXPECT_FALSE(OutputReachesTerminal(file));
  std::fclose(file);
  EXPECT_FALSE(OutputReachesTerminal(nullptr));
}

}  // namespace
}  // namespace mpilearn::worker
