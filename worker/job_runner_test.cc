#include "worker/job_runner.h"

#include "gtest/gtest.h"

namespace stoker {
namespace {

// Issue 12: a stopped trainer or loader held a job for 10 minutes; a silent pipeline is now
// stopped in tens of seconds (evaluations and checkpoints beat, so they do not trip it).
TEST(RunnerOptionsTest, ASilentPipelineIsStoppedWithinTensOfSeconds) {
  EXPECT_EQ(RunnerOptions().trainer_stall_timeout, absl::Seconds(30));
}

TEST(AutoLoaderLimitTest, TwoPerCoreBetweenTwoAndSixteen) {
  EXPECT_EQ(AutoLoaderLimit(1), 2);
  EXPECT_EQ(AutoLoaderLimit(2), 4);
  EXPECT_EQ(AutoLoaderLimit(6), 12);
  EXPECT_EQ(AutoLoaderLimit(64), 16);
}

TEST(AutotuneLoaderCountTest, DoublesWhileTheTrainerWaitsUpToTheLimit) {
  EXPECT_EQ(AutotuneLoaderCount(1, 8, 0.50, 1.0), 2);
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.11, 2.0), 4);
  EXPECT_EQ(AutotuneLoaderCount(4, 6, 0.30, 4.0), 6) << "capped at the limit";
  EXPECT_EQ(AutotuneLoaderCount(6, 6, 0.30, 6.0), 6);
}

// Issue 12: autotune went 1 -> 2 -> 4 while reporting "loaders busy 0% each". When the loaders
// idle while the trainer waits, the stall is not theirs and more loaders cannot help.
TEST(AutotuneLoaderCountTest, GrowsOnlyWhenTheLoadersAreTheBottleneck) {
  EXPECT_EQ(AutotuneLoaderCount(1, 8, 0.90, 0.0), 1) << "loaders idle: the stall is elsewhere";
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.50, 0.4), 2) << "20% busy each";
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.50, 1.2), 2) << "60% busy each is not enough";
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.50, 1.3), 4) << "65% busy each";
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.30, 3.9), 8);
}

TEST(AutotuneLoaderCountTest, KeepsTheCountBetweenTheTwoThresholds) {
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.10, 0.1), 4);
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.05, 0.1), 4);
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.02, 0.1), 4);
}

TEST(AutotuneLoaderCountTest, HalvesOnlyWhenHalfTheLoadersWouldStillBeHalfIdle) {
  // 8 loaders, 1.5 loader-seconds of work per second: 4 loaders would be 38% busy.
  EXPECT_EQ(AutotuneLoaderCount(8, 8, 0.0, 1.5), 4);
  // 4 loaders with the same work: 2 would be 75% busy, so keep 4.
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.0, 1.5), 4);
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.01, 0.5), 1);
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.01, 0.6), 2);
  EXPECT_EQ(AutotuneLoaderCount(1, 8, 0.0, 0.0), 1) << "never below one loader";
  EXPECT_EQ(AutotuneLoaderCount(3, 8, 0.0, 0.2), 1) << "3 -> 1: integer half";
}

// The rules cannot chase each other: a count reached by halving does not double again on the
// same load unless the trainer then waits.
TEST(AutotuneLoaderCountTest, ShrinkingThenGrowingNeedsTheTrainerToWait) {
  const int shrunk = AutotuneLoaderCount(8, 16, 0.0, 1.0);
  EXPECT_EQ(shrunk, 4);
  EXPECT_EQ(AutotuneLoaderCount(shrunk, 16, 0.0, 1.0), 2) << "still plenty: 2 are 50% busy";
  EXPECT_EQ(AutotuneLoaderCount(2, 16, 0.0, 1.0), 2) << "1 would be 100% busy";
}

}  // namespace
}  // namespace stoker
