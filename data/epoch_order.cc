// Reproducible shuffles. Everything here is specified exactly by the C++ standard (seed_seq's
// mixing, mt19937_64's output) or by this file (the bounded mapping), so a seed gives the same
// order with every compiler and standard library.
#include <numeric>
#include <random>

#include "data/dataset.h"

namespace stoker {

uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  unsigned __int128 product = static_cast<unsigned __int128>(rng()) * bound;
  uint64_t low = static_cast<uint64_t>(product);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    while (low < threshold) {
      product = static_cast<unsigned __int128>(rng()) * bound;
      low = static_cast<uint64_t>(product);
    }
  }
  return static_cast<uint64_t>(product >> 64);
}

std::vector<uint32_t> EpochPermutation(int64_t count, uint64_t seed, uint64_t epoch) {
  if (count <= 0) return {};
  std::vector<uint32_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), 0u);
  // Seed and epoch enter separately (not seed + epoch), so (seed 1, epoch 1) and (seed 2,
  // epoch 0) give unrelated orders.
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32)};
  std::mt19937_64 rng(seq);
  for (size_t i = order.size() - 1; i > 0; --i) {
    const size_t j = static_cast<size_t>(UniformBelow(rng, i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace stoker
