#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include "data/dataset.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

bool IsPermutation(std::vector<uint32_t> order) {
  std::sort(order.begin(), order.end());
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != i) return false;
  }
  return true;
}

TEST(EpochPermutationTest, IsAPermutation) {
  for (int64_t count : {1, 2, 7, 128, 1000, 60000}) {
    const std::vector<uint32_t> order = EpochPermutation(count, 42, 3);
    ASSERT_EQ(order.size(), static_cast<size_t>(count));
    EXPECT_TRUE(IsPermutation(order)) << "count " << count;
  }
  EXPECT_TRUE(EpochPermutation(0, 1, 0).empty());
}

TEST(EpochPermutationTest, IsDeterministic) {
  EXPECT_EQ(EpochPermutation(1000, 7, 2), EpochPermutation(1000, 7, 2));
}

TEST(EpochPermutationTest, DiffersAcrossEpochsAndSeeds) {
  const std::vector<uint32_t> base = EpochPermutation(1000, 1, 1);
  EXPECT_NE(base, EpochPermutation(1000, 1, 2));
  EXPECT_NE(base, EpochPermutation(1000, 2, 1));
  // Seed and epoch are not simply added.
  EXPECT_NE(base, EpochPermutation(1000, 2, 0));
  EXPECT_NE(base, EpochPermutation(1000, 0, 2));
  std::vector<uint32_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0u);
  EXPECT_NE(base, identity);
}

// Pins the order so that a change of generator, seeding or bounded mapping (which would change
// every job's data order) is noticed. The expected values also come out of
// epoch_order_reference.py, written from the C++ standard's definitions of seed_seq and
// mt19937_64, so they hold for every standard library.
TEST(EpochPermutationTest, MatchesGoldenOrder) {
  EXPECT_EQ(EpochPermutation(10, 1, 0), (std::vector<uint32_t>{9, 5, 3, 8, 6, 0, 7, 1, 2, 4}));
  const std::vector<uint32_t> big = EpochPermutation(60000, 1, 3);
  EXPECT_EQ((std::vector<uint32_t>(big.begin(), big.begin() + 5)),
            (std::vector<uint32_t>{33682, 35294, 36334, 48023, 9707}));
}

// Every order of 3 elements must be equally likely (a biased bounded mapping or an off-by-one
// in Fisher-Yates skews this).
TEST(EpochPermutationTest, OrdersAreUniform) {
  constexpr int kTrials = 12000;
  std::map<std::vector<uint32_t>, int> seen;
  for (int epoch = 0; epoch < kTrials; ++epoch) ++seen[EpochPermutation(3, 99, epoch)];
  ASSERT_EQ(seen.size(), 6u);
  // Expected 2000 each; the standard deviation is about 41, so +-250 is over 6 sigma.
  for (const auto& [order, times] : seen) EXPECT_NEAR(times, kTrials / 6, 250);
}

}  // namespace
}  // namespace stoker
