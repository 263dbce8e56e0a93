// Test helper for data-parallel batch sources: checks that N ranks' batches, put together in rank
// order, are the batches of one rank whose batch is N times as large (loader.h, SliceOfRank).
#ifndef STOKER_DATA_RANK_SLICE_TEST_UTIL_H_
#define STOKER_DATA_RANK_SLICE_TEST_UTIL_H_

#include <cstdint>
#include <vector>

#include "data/loader.h"
#include "gtest/gtest.h"

namespace stoker::testing {

// What one Make() wrote: `count` samples and labels (the rest of the buffers is not kept).
struct MadeBatch {
  uint32_t count = 0;
  std::vector<uint8_t> samples;
  std::vector<uint8_t> labels;
};

// Makes batch `batch` of `source` into buffers of room for `capacity` samples, filled beforehand
// with a marker; expects Make to succeed and to leave every byte past its count untouched.
inline MadeBatch MakeInto(BatchSource& source, uint64_t batch, uint32_t capacity) {
  constexpr uint8_t kUntouched = 0xa5;
  const size_t sample_bytes = static_cast<size_t>(source.sample_bytes());
  std::vector<uint8_t> samples(capacity * sample_bytes, kUntouched);
  std::vector<uint8_t> labels(capacity, kUntouched);
  absl::StatusOr<uint32_t> count = source.Make(batch, samples.data(), labels.data());
  EXPECT_TRUE(count.ok()) << "batch " << batch << ": " << count.status();
  MadeBatch made;
  made.count = count.value_or(0);
  EXPECT_LE(made.count, capacity) << "batch " << batch;
  if (made.count > capacity) return made;
  for (size_t i = made.count * sample_bytes; i < samples.size(); ++i) {
    if (samples[i] != kUntouched) {
      ADD_FAILURE() << "batch " << batch << ": byte " << i << " written past the " << made.count
                    << " samples made";
      break;
    }
  }
  for (size_t i = made.count; i < labels.size(); ++i) {
    EXPECT_EQ(labels[i], kUntouched) << "batch " << batch << ": label " << i << " written";
  }
  made.samples.assign(samples.begin(), samples.begin() + made.count * sample_bytes);
  made.labels.assign(labels.begin(), labels.begin() + made.count);
  return made;
}

// For every batch b < `batches` (the ranks make theirs last batch first, `single` first batch
// first: the order must not matter): rank r's batch b holds as many samples as its SliceOfRank of
// `count` samples, and the ranks' batches b, concatenated in rank order, equal `single`'s batch b
// (made with batch ranks.size() x batch_size) byte for byte, samples and labels. Every source
// counts the same global batches per epoch. Returns each rank's batches, [rank][batch].
inline std::vector<std::vector<MadeBatch>> ExpectRanksMakeTheSingleStream(
    BatchSource& single, const std::vector<BatchSource*>& ranks, uint32_t batch_size, int64_t count,
    uint64_t batches, bool counts_are_slices = true) {
  const uint32_t replicas = static_cast<uint32_t>(ranks.size());
  std::vector<std::vector<MadeBatch>> made(ranks.size(), std::vector<MadeBatch>(batches));
  for (uint32_t r = 0; r < replicas; ++r) {
    EXPECT_EQ(ranks[r]->batches_per_epoch(), single.batches_per_epoch()) << "rank " << r;
    EXPECT_EQ(ranks[r]->sample_bytes(), single.sample_bytes());
    for (uint64_t b = batches; b-- > 0;) made[r][b] = MakeInto(*ranks[r], b, batch_size);
  }
  const int64_t per_epoch = single.batches_per_epoch();
  for (uint64_t b = 0; b < batches; ++b) {
    const MadeBatch whole = MakeInto(single, b, replicas * batch_size);
    MadeBatch joined;
    for (uint32_t r = 0; r < replicas; ++r) {
      const MadeBatch& part = made[r][b];
      if (counts_are_slices) {
        const RankSlice slice =
            SliceOfRank(count, batch_size, r, replicas, static_cast<int64_t>(b % per_epoch));
        EXPECT_EQ(part.count, slice.end - slice.first) << "rank " << r << " batch " << b;
        EXPECT_EQ(whole.count, slice.global_end - slice.global_first) << "batch " << b;
      }
      joined.count += part.count;
      joined.samples.insert(joined.samples.end(), part.samples.begin(), part.samples.end());
      joined.labels.insert(joined.labels.end(), part.labels.begin(), part.labels.end());
    }
    EXPECT_EQ(joined.count, whole.count) << "batch " << b << " of " << replicas << " ranks";
    EXPECT_TRUE(joined.samples == whole.samples)
        << "batch " << b << " of " << replicas << " ranks: samples differ";
    EXPECT_EQ(joined.labels, whole.labels) << "batch " << b << " of " << replicas << " ranks";
  }
  return made;
}

}  // namespace stoker::testing

#endif  // STOKER_DATA_RANK_SLICE_TEST_UTIL_H_
