// The sample order of an epoch over an index. Like data/epoch_order.cc, everything is specified
// by the C++ standard (seed_seq, mt19937_64) or by this file, so every build gives the same order.
#include <algorithm>
#include <random>

#include "data/dataset.h"
#include "data/index/sample_index.h"

namespace stoker {
namespace {

// Distinguishes the buffer's random stream from EpochPermutation's for the same (seed, epoch).
constexpr uint32_t kShuffleBufferStream = 0x5348'5546;  // "SHUF"

}  // namespace

std::vector<uint32_t> EpochSampleOrder(const SampleIndex& index, uint64_t seed, uint64_t epoch,
                                       int shuffle_buffer) {
  if (!index.sharded()) return EpochPermutation(index.count(), seed, epoch);
  const size_t capacity = static_cast<size_t>(shuffle_buffer < 1 ? 1 : shuffle_buffer);
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32),
                    kShuffleBufferStream};
  std::mt19937_64 rng(seq);

  std::vector<uint32_t> order;
  order.reserve(static_cast<size_t>(index.count()));
  std::vector<uint32_t> buffer;
  buffer.reserve(std::min(capacity, static_cast<size_t>(index.count())));
  for (uint32_t shard : EpochPermutation(index.source_count(), seed, epoch)) {
    const int64_t end = index.shard_begin(shard + 1);
    for (int64_t i = index.shard_begin(shard); i < end; ++i) {
      const uint32_t sample = static_cast<uint32_t>(i);
      if (buffer.size() < capacity) {
        buffer.push_back(sample);
        continue;
      }
      uint32_t& slot = buffer[UniformBelow(rng, capacity)];
      order.push_back(slot);
      slot = sample;
    }
  }
  // Drain in random order (Fisher-Yates, as EpochPermutation).
  for (size_t i = buffer.size(); i > 1; --i) {
    std::swap(buffer[i - 1], buffer[UniformBelow(rng, i)]);
  }
  order.insert(order.end(), buffer.begin(), buffer.end());
  return order;
}

}  // namespace stoker
