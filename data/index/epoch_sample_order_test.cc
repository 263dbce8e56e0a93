// EpochSampleOrder over real shard and folder indexes: permutations, determinism, shard order,
// the shuffle buffer's extremes, and how far the buffer moves a sample.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data/dataset.h"
#include "data/index/index_test_util.h"
#include "data/index/sample_index.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using ::stoker::testing::TempDir;
using ::stoker::testing::WriteShard;

constexpr int kShards = 10;
constexpr int kPerShard = 100;

// kShards shards of kPerShard samples; sample i of the index is key i with class i % 7.
SampleIndex ShardIndex(const TempDir& dir) {
  for (int s = 0; s < kShards; ++s) {
    std::vector<std::pair<std::string, std::string>> members;
    for (int k = 0; k < kPerShard; ++k) {
      const std::string key = absl::StrFormat("%06d", s * kPerShard + k);
      members.emplace_back(key + ".jpg", "image " + key);
      members.emplace_back(key + ".cls", std::to_string((s * kPerShard + k) % 7));
    }
    WriteShard(dir.File(absl::StrFormat("s-%02d.tar", s)), members);
  }
  absl::StatusOr<SampleIndex> index =
      BuildShardIndex(dir.File(absl::StrFormat("s-{00..%02d}.tar", kShards - 1)), nullptr);
  EXPECT_TRUE(index.ok()) << index.status();
  return *std::move(index);
}

bool IsPermutation(std::vector<uint32_t> order, size_t n) {
  if (order.size() != n) return false;
  std::sort(order.begin(), order.end());
  for (size_t i = 0; i < n; ++i) {
    if (order[i] != i) return false;
  }
  return true;
}

// The shuffled-shard stream before the buffer: the shards in their epoch order, each in order.
std::vector<uint32_t> ShardStream(const SampleIndex& index, uint64_t seed, uint64_t epoch) {
  std::vector<uint32_t> stream;
  for (uint32_t shard : EpochPermutation(index.source_count(), seed, epoch)) {
    for (int64_t i = index.shard_begin(shard); i < index.shard_begin(shard + 1); ++i) {
      stream.push_back(static_cast<uint32_t>(i));
    }
  }
  return stream;
}

// Fraction of neighbours in `order` that come from the same shard.
double SameShardNeighbours(const std::vector<uint32_t>& order) {
  int same = 0;
  for (size_t i = 1; i < order.size(); ++i)
    same += order[i] / kPerShard == order[i - 1] / kPerShard;
  return static_cast<double>(same) / static_cast<double>(order.size() - 1);
}

TEST(EpochSampleOrder, ShardsArePermutationsDeterministicAndVaryBySeedAndEpoch) {
  TempDir dir;
  const SampleIndex index = ShardIndex(dir);
  ASSERT_EQ(index.count(), kShards * kPerShard);
  const std::vector<uint32_t> order = EpochSampleOrder(index, 1, 0, 50);
  EXPECT_TRUE(IsPermutation(order, index.count()));
  EXPECT_EQ(order, EpochSampleOrder(index, 1, 0, 50));
  EXPECT_NE(order, EpochSampleOrder(index, 1, 1, 50));
  EXPECT_NE(order, EpochSampleOrder(index, 2, 0, 50));
  EXPECT_NE(order, EpochSampleOrder(index, 1, 0, 51));
  for (int buffer : {-3, 0, 1, 7, 999, 1000, 5000}) {
    EXPECT_TRUE(IsPermutation(EpochSampleOrder(index, 3, 2, buffer), index.count())) << buffer;
  }
  // Values below 1 mean 1.
  EXPECT_EQ(EpochSampleOrder(index, 3, 2, 0), EpochSampleOrder(index, 3, 2, 1));
}

TEST(EpochSampleOrder, BufferOfOneKeepsTheShuffledShardStream) {
  TempDir dir;
  const SampleIndex index = ShardIndex(dir);
  for (uint64_t epoch : {0, 1, 2}) {
    const std::vector<uint32_t> order = EpochSampleOrder(index, 9, epoch, 1);
    EXPECT_EQ(order, ShardStream(index, 9, epoch));
  }
  // The shard order changes with the epoch and is not the index's.
  const std::vector<uint32_t> epoch0 = EpochSampleOrder(index, 9, 0, 1);
  const std::vector<uint32_t> epoch1 = EpochSampleOrder(index, 9, 1, 1);
  std::vector<uint32_t> first_shards0, first_shards1;
  for (int s = 0; s < kShards; ++s) {
    first_shards0.push_back(epoch0[s * kPerShard] / kPerShard);
    first_shards1.push_back(epoch1[s * kPerShard] / kPerShard);
  }
  std::vector<uint32_t> identity(kShards);
  std::iota(identity.begin(), identity.end(), 0u);
  EXPECT_NE(first_shards0, identity);
  EXPECT_NE(first_shards0, first_shards1);
}

TEST(EpochSampleOrder, ABufferAsLargeAsTheDatasetIsAFullShuffle) {
  TempDir dir;
  const SampleIndex index = ShardIndex(dir);
  // With buffer 1 almost every neighbour shares a shard; a uniform shuffle gives about
  // (kPerShard - 1) / (count - 1) = 0.099.
  EXPECT_GT(SameShardNeighbours(EpochSampleOrder(index, 4, 0, 1)), 0.98);
  for (int buffer : {1000, 100000}) {
    const std::vector<uint32_t> order = EpochSampleOrder(index, 4, 0, buffer);
    EXPECT_LT(SameShardNeighbours(order), 0.16) << buffer;
    // Every part of the dataset reaches the start of the epoch: the first 100 samples come
    // from most shards.
    std::vector<bool> seen(kShards, false);
    for (int i = 0; i < 100; ++i) seen[order[i] / kPerShard] = true;
    EXPECT_GE(std::count(seen.begin(), seen.end(), true), 9) << buffer;
  }
}

TEST(EpochSampleOrder, ASampleMovesAboutBufferPlacesFromItsPlaceInTheShardStream) {
  TempDir dir;
  const SampleIndex index = ShardIndex(dir);
  for (int buffer : {4, 16, 64}) {
    for (uint64_t epoch : {0, 1}) {
      const std::vector<uint32_t> stream = ShardStream(index, 5, epoch);
      const std::vector<uint32_t> order = EpochSampleOrder(index, 5, epoch, buffer);
      std::vector<int64_t> place(index.count());
      for (size_t p = 0; p < stream.size(); ++p) place[stream[p]] = static_cast<int64_t>(p);
      int64_t latest = 0;
      double total = 0;
      for (size_t q = 0; q < order.size(); ++q) {
        const int64_t displacement = static_cast<int64_t>(q) - place[order[q]];
        // Never earlier than `buffer` places before its place in the stream...
        ASSERT_GE(displacement, -buffer) << "buffer " << buffer << ", position " << q;
        latest = std::max(latest, displacement);
        total += std::abs(static_cast<double>(displacement));
      }
      // ...and not much later: a sample stays a geometric number of steps (mean `buffer`) in the
      // buffer, so 16 buffers' worth is a bound it meets except with probability ~1e-7 per sample.
      EXPECT_LE(latest, 16 * buffer) << "buffer " << buffer;
      EXPECT_LE(total / static_cast<double>(order.size()), 1.5 * buffer) << "buffer " << buffer;
      EXPECT_GT(latest, buffer / 2) << "the buffer should move samples, buffer " << buffer;
    }
  }
}

TEST(EpochSampleOrder, ImageFoldersUseEpochPermutation) {
  TempDir dir;
  for (int i = 0; i < 30; ++i) {
    testing::WriteString(dir.File(absl::StrFormat("f/c%d/%02d.png", i % 3, i)), "x");
  }
  absl::StatusOr<SampleIndex> index = BuildImageFolderIndex(dir.File("f"), nullptr);
  ASSERT_TRUE(index.ok()) << index.status();
  for (uint64_t epoch : {0, 1}) {
    EXPECT_EQ(EpochSampleOrder(*index, 11, epoch, 5), EpochPermutation(30, 11, epoch));
  }
}

}  // namespace
}  // namespace stoker
