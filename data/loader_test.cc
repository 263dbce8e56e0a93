// The loader's batch contents (BatchMaker); the stoker-loader process is tested in
// worker/loader_process_test.cc.
#include "data/loader.h"

#include <algorithm>
#include <string>
#include <vector>

#include "data/test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

constexpr int kCount = 103;
constexpr int kBatchSize = 8;  // 13 batches per epoch, the last one of 7
constexpr uint64_t kSeed = 7;

// Byte 0 of a sample is its index.
LabeledSamples SmallData() {
  return testing::PatternSamples(kCount, {2, 3}, [](int i, int j) { return i + 37 * j; });
}

TEST(BatchMakerTest, EachEpochCoversEverySampleOnce) {
  const LabeledSamples data = SmallData();
  BatchMaker maker(data, kBatchSize, kSeed);
  ASSERT_EQ(maker.batches_per_epoch(), 13);
  std::vector<uint8_t> samples(kBatchSize * 6), labels(kBatchSize);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> seen(kCount);
    for (uint64_t i = 0; i < 13; ++i) {
      const uint32_t count = *maker.Make(epoch * 13 + i, samples.data(), labels.data());
      EXPECT_EQ(count, i < 12 ? 8u : 7u);
      for (uint32_t s = 0; s < count; ++s) {
        const int index = samples[s * 6];
        ASSERT_LT(index, kCount);
        ++seen[index];
        EXPECT_TRUE(std::equal(samples.begin() + s * 6, samples.begin() + s * 6 + 6,
                               data.samples.begin() + index * 6));
        EXPECT_EQ(labels[s], data.labels[index]);
      }
    }
    EXPECT_EQ(seen, std::vector<int>(kCount, 1)) << "epoch " << epoch;
  }
  // The order follows EpochPermutation of the epoch.
  const std::vector<uint32_t> order = EpochPermutation(kCount, kSeed, 1);
  ASSERT_TRUE(maker.Make(13 + 2, samples.data(), labels.data()).ok());
  EXPECT_EQ(samples[0], order[2 * kBatchSize]);
}

}  // namespace
}  // namespace stoker
