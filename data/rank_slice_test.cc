// Data-parallel slices of the batch stream (loader.h): SliceOfRank, and decoded-sample sources
// (BatchMaker in memory, the mapped prepared file) whose N ranks together make the batches of one
// rank with N times the batch, augmentation included.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/dataset.h"
#include "data/job_region.h"
#include "data/loader.h"
#include "data/prepared_dataset.h"
#include "data/rank_slice_test_util.h"
#include "data/test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

TEST(SliceOfRankTest, SlicesAGlobalBatchInRankOrder) {
  // 10 samples, batches of 3 for each of 3 ranks: global batches of 9 and of 1.
  auto expect = [](uint32_t rank, int64_t batch, int64_t first, int64_t end, int64_t global) {
    const RankSlice slice = SliceOfRank(10, 3, rank, 3, batch);
    EXPECT_EQ(slice.first, first) << "rank " << rank << " batch " << batch;
    EXPECT_EQ(slice.end, end) << "rank " << rank << " batch " << batch;
    EXPECT_EQ(slice.global_first, global) << "rank " << rank << " batch " << batch;
    EXPECT_EQ(slice.global_end, batch == 0 ? 9 : 10) << "rank " << rank << " batch " << batch;
  };
  expect(0, 0, 0, 3, 0);
  expect(1, 0, 3, 6, 0);
  expect(2, 0, 6, 9, 0);
  expect(0, 1, 9, 10, 9);   // the short last global batch: rank 0 takes all of it
  expect(1, 1, 10, 10, 9);  // and ranks 1 and 2 get nothing
  expect(2, 1, 10, 10, 9);
  // 11 samples, 2 ranks of 4: the last global batch of 3 leaves rank 1 empty; 13: rank 1 has 1.
  EXPECT_EQ(SliceOfRank(11, 4, 1, 2, 1).first, 11);
  EXPECT_EQ(SliceOfRank(11, 4, 1, 2, 1).end, 11);
  EXPECT_EQ(SliceOfRank(13, 4, 1, 2, 1).first, 12);
  EXPECT_EQ(SliceOfRank(13, 4, 1, 2, 1).end, 13);
}

// For every small shape: the ranks' slices of a global batch tile it in rank order, each at most
// batch_size, and the global batches tile the epoch; replicas 1 is the plain batch.
TEST(SliceOfRankTest, SlicesTileEveryEpoch) {
  for (int64_t count = 1; count <= 40; ++count) {
    for (uint32_t batch_size = 1; batch_size <= 5; ++batch_size) {
      for (uint32_t replicas = 1; replicas <= 4; ++replicas) {
        const int64_t per_epoch = BatchesPerEpoch(count, int64_t{batch_size} * replicas);
        int64_t next = 0;
        for (int64_t b = 0; b < per_epoch; ++b) {
          for (uint32_t r = 0; r < replicas; ++r) {
            const RankSlice slice = SliceOfRank(count, batch_size, r, replicas, b);
            ASSERT_EQ(slice.first, next)
                << count << " samples, " << replicas << "x" << batch_size << " rank " << r;
            ASSERT_GE(slice.end, slice.first);
            ASSERT_LE(slice.end - slice.first, batch_size);
            ASSERT_EQ(slice.global_first, b * batch_size * replicas);
            ASSERT_EQ(slice.global_end, std::min<int64_t>((b + 1) * batch_size * replicas, count));
            // Full slices for every rank but in the epoch's last global batch.
            if (b + 1 < per_epoch) {
              ASSERT_EQ(slice.end - slice.first, batch_size);
            }
            next = slice.end;
          }
          if (replicas == 1) {
            const RankSlice slice = SliceOfRank(count, batch_size, 0, 1, b);
            ASSERT_EQ(slice.first, b * batch_size);
            ASSERT_EQ(slice.end, std::min<int64_t>((b + 1) * batch_size, count));
          }
        }
        ASSERT_EQ(next, count) << count << " samples, " << replicas << "x" << batch_size;
      }
    }
  }
}

TEST(SliceOfRankTest, OutsideTheEpochOrTheRanksIsEmpty) {
  auto expect_empty_at = [](const RankSlice& slice, int64_t at) {
    EXPECT_EQ(slice.first, at);
    EXPECT_EQ(slice.end, at);
    EXPECT_EQ(slice.global_first, at);
    EXPECT_EQ(slice.global_end, at);
  };
  expect_empty_at(SliceOfRank(10, 3, 0, 3, 2), 10);   // past the epoch's 2 global batches
  expect_empty_at(SliceOfRank(10, 3, 0, 3, -1), 10);  // before it
  expect_empty_at(SliceOfRank(10, 3, 3, 3, 0), 10);   // rank >= replicas
  expect_empty_at(SliceOfRank(10, 3, 0, 0, 0), 10);   // no replicas
  expect_empty_at(SliceOfRank(10, 0, 0, 2, 0), 10);   // batch size 0
  expect_empty_at(SliceOfRank(0, 3, 0, 1, 0), 0);     // no samples
  expect_empty_at(SliceOfRank(-5, 3, 0, 1, 0), 0);
  // Sizes whose products pass 2^63 do not overflow.
  constexpr uint32_t kMax = std::numeric_limits<uint32_t>::max();
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  RankSlice slice = SliceOfRank(kHuge, kMax, kMax - 1, kMax, 0);
  EXPECT_EQ(slice.first, kHuge);  // (kMax - 1) * kMax samples before it: past the set
  EXPECT_EQ(slice.end, kHuge);
  EXPECT_EQ(slice.global_first, 0);
  EXPECT_EQ(slice.global_end, kHuge);
  slice = SliceOfRank(kHuge, kMax, 1, kMax, 0);
  EXPECT_EQ(slice.first, int64_t{kMax});
  EXPECT_EQ(slice.end, 2 * int64_t{kMax});
  expect_empty_at(SliceOfRank(kHuge, kMax, 0, kMax, 1), kHuge);
  slice = SliceOfRank(kHuge, 1, 0, 1, kHuge - 1);  // the last batch of 1 sample
  EXPECT_EQ(slice.first, kHuge - 1);
  EXPECT_EQ(slice.end, kHuge);
}

TEST(CheckRankTest, AcceptsRanksBelowReplicasUpTo256) {
  EXPECT_TRUE(CheckRank(0, 1).ok());
  EXPECT_TRUE(CheckRank(2, 3).ok());
  EXPECT_TRUE(CheckRank(255, 256).ok());
  const absl::Status rank = CheckRank(3, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(rank));
  EXPECT_EQ(rank.message(), "rank 3 is out of range: a job of 3 replicas has ranks 0 to 2");
  EXPECT_EQ(CheckRank(0, 0).message(), "replicas 0 is out of range: 1 to 256");
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRank(0, 257)));
}

// 64 distinct bytes per sample of 8x8; byte 0 of sample i is i (count < 256).
LabeledSamples Images(int count) {
  return testing::PatternSamples(count, {8, 8},
                                 [](int i, int j) { return j == 0 ? i : (i * 31 + j * 7) % 251; });
}

constexpr uint64_t kSeed = 11;
constexpr uint32_t kBatch = 4;

// Counts: 103 leaves a last global batch of 7 for 2 ranks of 4 (4 + 3) and of 7 for 3 (4 + 3 +
// an empty rank 2); 99 leaves 3 for either (rank 0 only: the others are empty).
constexpr int kCounts[] = {103, 99};

TEST(RankSliceTest, InMemoryRanksMakeTheSingleRankStreamAndAreDisjoint) {
  for (const int count : kCounts) {
    const LabeledSamples data = Images(count);
    for (const uint32_t replicas : {2u, 3u}) {
      SCOPED_TRACE(::testing::Message() << count << " samples, " << replicas << " ranks");
      BatchMaker single(data, replicas * kBatch, kSeed);
      std::vector<std::unique_ptr<BatchMaker>> makers;
      std::vector<BatchSource*> ranks;
      for (uint32_t r = 0; r < replicas; ++r) {
        makers.push_back(
            std::make_unique<BatchMaker>(data, kBatch, kSeed, AugmentOptions{}, r, replicas));
        ranks.push_back(makers.back().get());
      }
      const int64_t per_epoch = BatchesPerEpoch(count, replicas * kBatch);
      ASSERT_EQ(single.batches_per_epoch(), per_epoch);
      const auto made =
          testing::ExpectRanksMakeTheSingleStream(single, ranks, kBatch, count, 2 * per_epoch);
      // Disjoint: each sample once per epoch over all ranks and batches; some slice is empty.
      bool some_empty = false;
      for (int64_t epoch = 0; epoch < 2; ++epoch) {
        std::multiset<int> seen;
        for (uint32_t r = 0; r < replicas; ++r) {
          for (int64_t b = epoch * per_epoch; b < (epoch + 1) * per_epoch; ++b) {
            const testing::MadeBatch& batch = made[r][b];
            some_empty |= batch.count == 0;
            for (uint32_t s = 0; s < batch.count; ++s) seen.insert(batch.samples[s * 64]);
          }
        }
        std::multiset<int> all;
        for (int i = 0; i < count; ++i) all.insert(i);
        EXPECT_EQ(seen, all) << "epoch " << epoch;
      }
      EXPECT_TRUE(some_empty || (count == 103 && replicas == 2));
    }
  }
}

// With a random crop and flip: drawn for the sample's place in the global batch, so the ranks'
// augmented samples are the single rank's. Float32 samples too.
TEST(RankSliceTest, AugmentedRanksMakeTheSingleRankStream) {
  const AugmentOptions augment{.crop_padding = 2, .horizontal_flip = true};
  for (const bool float32 : {false, true}) {
    for (const int count : kCounts) {
      LabeledSamples data = Images(count);
      if (float32) {
        std::vector<float> values;
        for (uint8_t b : data.samples) values.push_back(b * 0.25f + 1);
        data.samples = testing::BytesOf(values);
        data.sample_type = SampleType::kFloat32;
        data.sample_bytes = data.features * 4;
      }
      for (const uint32_t replicas : {2u, 3u}) {
        SCOPED_TRACE(::testing::Message()
                     << count << " samples, " << replicas << " ranks, float32 " << float32);
        BatchMaker single(data, replicas * kBatch, kSeed, augment);
        std::vector<std::unique_ptr<BatchMaker>> makers;
        std::vector<BatchSource*> ranks;
        for (uint32_t r = 0; r < replicas; ++r) {
          makers.push_back(std::make_unique<BatchMaker>(data, kBatch, kSeed, augment, r, replicas));
          ranks.push_back(makers.back().get());
        }
        testing::ExpectRanksMakeTheSingleStream(single, ranks, kBatch, count,
                                                2 * single.batches_per_epoch());
      }
    }
  }
}

// Rank 0 of 1 is the maker of a job without replicas, augmentation included.
TEST(RankSliceTest, OneReplicaIsThePlainMaker) {
  const AugmentOptions augment{.crop_padding = 2, .horizontal_flip = true};
  const LabeledSamples data = Images(103);
  BatchMaker plain(data, kBatch, kSeed, augment);
  BatchMaker one(data, kBatch, kSeed, augment, 0, 1);
  for (uint64_t b = 0; b < 2 * 26; ++b) {
    const testing::MadeBatch x = testing::MakeInto(plain, b, kBatch);
    const testing::MadeBatch y = testing::MakeInto(one, b, kBatch);
    EXPECT_EQ(x.count, b % 26 == 25 ? 3u : 4u);
    EXPECT_TRUE(x.samples == y.samples) << "batch " << b;
    EXPECT_EQ(x.labels, y.labels);
  }
}

// The prepared file the loader processes map (OpenPreparedDataset), with and without
// augmentation.
TEST(RankSliceTest, MappedRanksMakeTheSingleRankStream) {
  const testing::TempDir dir;
  for (const int count : kCounts) {
    const LabeledSamples data = Images(count);
    const std::string path = dir.File(absl::StrCat(count, ".samples"));
    ASSERT_TRUE(WritePreparedSamples(View(data), path).ok());
    for (const bool augmented : {false, true}) {
      for (const uint32_t replicas : {2u, 3u}) {
        SCOPED_TRACE(::testing::Message() << count << " samples, " << replicas << " ranks"
                                          << (augmented ? ", augmented" : ""));
        LoaderOptions options;
        options.seed = kSeed;
        if (augmented) options.augment = {.crop_padding = 1, .horizontal_flip = true};
        absl::StatusOr<std::unique_ptr<BatchSource>> single =
            OpenPreparedDataset(path, replicas * kBatch, options);
        ASSERT_TRUE(single.ok()) << single.status();
        std::vector<std::unique_ptr<BatchSource>> sources;
        std::vector<BatchSource*> ranks;
        for (uint32_t r = 0; r < replicas; ++r) {
          options.rank = r;
          options.replicas = replicas;
          absl::StatusOr<std::unique_ptr<BatchSource>> source =
              OpenPreparedDataset(path, kBatch, options);
          ASSERT_TRUE(source.ok()) << source.status();
          sources.push_back(*std::move(source));
          ranks.push_back(sources.back().get());
        }
        testing::ExpectRanksMakeTheSingleStream(**single, ranks, kBatch, count,
                                                2 * (*single)->batches_per_epoch());
      }
    }
  }
}

TEST(RankSliceTest, RanksOutsideTheReplicasAreRefused) {
  const testing::TempDir dir;
  const LabeledSamples data = Images(20);
  ASSERT_TRUE(WritePreparedSamples(View(data), dir.File("d.samples")).ok());
  LoaderOptions options;
  options.rank = 2;
  options.replicas = 2;
  absl::Status status = OpenPreparedDataset(dir.File("d.samples"), 4, options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_EQ(status.message(), "rank 2 is out of range: a job of 2 replicas has ranks 0 to 1");
  options.rank = 0;
  options.replicas = 300;
  status = OpenPreparedDataset(dir.File("d.samples"), 4, options).status();
  EXPECT_EQ(status.message(), "replicas 300 is out of range: 1 to 256");

  RingGeometry g;
  g.slot_count = 2;
  g.batch_size = 4;
  g.sample_bytes = 64;
  g.total_batches = 10;
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
  ASSERT_TRUE(region.ok()) << region.status();
  options.rank = 1;
  options.replicas = 1;
  status = RunLoader(**region, data, options);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_EQ((*region)->stats().loader_batches_total.load(), 0u);
}

// RunLoader publishes a rank's empty batch (count 0) like any other: the consumer sees every
// batch of the job in order, the empty ones with count 0.
TEST(RankSliceTest, RunLoaderPublishesEmptySlices) {
  const LabeledSamples data = Images(99);  // 3 ranks of 4: the last global batch is rank 0's 3
  const uint32_t replicas = 3;
  const int64_t per_epoch = BatchesPerEpoch(99, replicas * kBatch);
  ASSERT_EQ(per_epoch, 9);
  for (uint32_t r = 0; r < replicas; ++r) {
    RingGeometry g;
    g.slot_count = 3;
    g.batch_size = kBatch;
    g.sample_bytes = 64;
    g.total_batches = static_cast<uint64_t>(2 * per_epoch);
    absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
    ASSERT_TRUE(region.ok()) << region.status();
    (*region)->SetConsumerPid(getpid());
    LoaderOptions options;
    options.seed = kSeed;
    options.rank = r;
    options.replicas = replicas;
    absl::Status loaded;
    std::thread loader([&] { loaded = RunLoader(**region, data, options); });
    BatchMaker maker(data, kBatch, kSeed, AugmentOptions{}, r, replicas);
    for (uint64_t b = 0; b < g.total_batches; ++b) {
      absl::StatusOr<ReadableBatch> batch = (*region)->WaitReadable(b, absl::Seconds(10));
      ASSERT_TRUE(batch.ok()) << "rank " << r << " batch " << b << ": " << batch.status();
      const testing::MadeBatch expected = testing::MakeInto(maker, b, kBatch);
      EXPECT_EQ(batch->count, expected.count) << "rank " << r << " batch " << b;
      EXPECT_EQ(batch->count, b % per_epoch == 8 ? (r == 0 ? 3u : 0u) : kBatch);
      EXPECT_TRUE(std::equal(expected.samples.begin(), expected.samples.end(), batch->samples));
      EXPECT_TRUE(std::equal(expected.labels.begin(), expected.labels.end(), batch->labels));
      (*region)->Release(b);
    }
    loader.join();
    EXPECT_TRUE(loaded.ok()) << loaded;
    EXPECT_EQ((*region)->stats().loader_batches_total.load(), g.total_batches);
  }
}

}  // namespace
}  // namespace stoker
