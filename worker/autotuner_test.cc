#include "worker/autotuner.h"

#include <memory>

#include "data/job_region.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

// A real region (no processes): the test plays the trainer and sets the counters the tuner reads.
std::unique_ptr<JobRegion> MakeRegion(uint32_t initial_loaders, uint32_t max_loaders,
                                      uint64_t total_batches = 100) {
  RingGeometry geometry;
  geometry.slot_count = 4;
  geometry.batch_size = 1;
  geometry.sample_bytes = 1;
  geometry.loader_count = max_loaders;
  geometry.initial_loaders = initial_loaders;
  geometry.total_batches = total_batches;
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(geometry);
  EXPECT_TRUE(region.ok()) << region.status();
  return region.ok() ? std::move(*region) : nullptr;
}

// One window's worth of counters: the trainer waited `stall_ms`, computed `busy_ms`, the loaders
// together worked `loader_ms`.
void Measure(JobRegion& region, uint64_t stall_ms, uint64_t busy_ms, uint64_t loader_ms) {
  region.stats().data_stall_ns_total.fetch_add(stall_ms * 1000000);
  region.stats().device_busy_ns_total.fetch_add(busy_ms * 1000000);
  region.stats().loader_busy_ns_total.fetch_add(loader_ms * 1000000);
}

// The trainer's side: batch `b` is made, consumed and released (which applies a requested era).
void ConsumeBatch(JobRegion& region, uint64_t b) {
  ASSERT_TRUE(region.WaitWritable(b, absl::Seconds(1)).ok());
  region.Publish(b, 1);
  ASSERT_TRUE(region.WaitReadable(b, absl::Seconds(1)).ok());
  region.Release(b);
}

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(AutotunerTest, GrowsAfterAWindowAndLogsOnceTheTrainerAppliesTheEra) {
  std::unique_ptr<JobRegion> region = MakeRegion(1, 8);
  ASSERT_NE(region, nullptr);
  Autotuner tuner(*region, 4, kStart);
  Measure(*region, 1000, 1000, 1800);  // input-bound 50%, the one loader busy 90%
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(1)), std::nullopt) << "the window is not over";
  EXPECT_EQ(region->RequestedLoaderCount(), 0u);
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(2)), std::nullopt) << "asked, not yet applied";
  EXPECT_EQ(region->RequestedLoaderCount(), 2u);
  EXPECT_TRUE(tuner.pending());
  EXPECT_EQ(region->ActiveLoaderCount(), 1u);

  // While the change is pending nothing more is asked, however long the trainer waits.
  Measure(*region, 4000, 1000, 3600);
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(5)), std::nullopt);
  EXPECT_EQ(region->RequestedLoaderCount(), 2u);

  ConsumeBatch(*region, 0);  // the trainer appends the era at batch 0 + 4 slots
  EXPECT_EQ(region->ActiveLoaderCount(), 2u);
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(6)),
            "autotune: input-bound 50% of the last window, loaders busy 90% each; loader "
            "processes 1 -> 2 from batch 4");
  EXPECT_FALSE(tuner.pending());

  // The next window is measured from the change on: 2 -> 4, never past the limit of 4.
  Measure(*region, 1000, 1000, 3000);  // both loaders 75% busy
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(7)), std::nullopt);
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(8)), std::nullopt);
  EXPECT_EQ(region->RequestedLoaderCount(), 4u);
}

TEST(AutotunerTest, ShrinksWhenTheTrainerHardlyWaits) {
  std::unique_ptr<JobRegion> region = MakeRegion(4, 4);
  ASSERT_NE(region, nullptr);
  Autotuner tuner(*region, 4, kStart);
  Measure(*region, 0, 2000, 400);  // never waited; loaders 5% busy each
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(2)), std::nullopt);
  EXPECT_EQ(region->RequestedLoaderCount(), 2u);
  ConsumeBatch(*region, 0);
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(2) + absl::Milliseconds(20)),
            "autotune: input-bound 0% of the last window, loaders busy 5% each; loader "
            "processes 4 -> 2 from batch 4");
}

TEST(AutotunerTest, AsksNothingWhileTheTrainerDidNotCompute) {
  std::unique_ptr<JobRegion> region = MakeRegion(1, 8);
  ASSERT_NE(region, nullptr);
  Autotuner tuner(*region, 8, kStart);
  Measure(*region, 2000, 0, 2000);  // still starting: waited only
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(3)), std::nullopt);
  EXPECT_EQ(region->RequestedLoaderCount(), 0u);
  EXPECT_FALSE(tuner.pending());
  // That window is gone: the next one sees only what happened after it.
  Measure(*region, 0, 2000, 100);
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(5)), std::nullopt);
  EXPECT_EQ(region->RequestedLoaderCount(), 0u) << "input-bound 0%, one loader cannot halve";
}

TEST(AutotunerTest, AsksNothingInTheLastRingOfBatches) {
  std::unique_ptr<JobRegion> region = MakeRegion(1, 8, /*total_batches=*/5);
  ASSERT_NE(region, nullptr);
  Autotuner tuner(*region, 8, kStart);
  ConsumeBatch(*region, 0);  // next batch 1; 1 + 4 slots reaches the end
  Measure(*region, 1000, 1000, 1800);
  EXPECT_EQ(tuner.Tick(kStart + absl::Seconds(2)), std::nullopt);
  EXPECT_EQ(region->RequestedLoaderCount(), 0u);
  EXPECT_FALSE(tuner.pending());
}

}  // namespace
}  // namespace stoker
