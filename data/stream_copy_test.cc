#include "data/stream_copy.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace stoker {
namespace {

// Every size around the 16-byte and 64-byte steps and the short-copy threshold, at every
// alignment of both ends: the destination must equal the source and nothing next to it may change.
TEST(StreamCopyTest, CopiesEveryByteAtEveryAlignmentAndTouchesNothingElse) {
  std::mt19937 rng(7);
  std::vector<uint8_t> source(4096 + 64);
  for (uint8_t& byte : source) byte = static_cast<uint8_t>(rng());
  const std::vector<size_t> sizes = {0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 784, 1000, 4096};
  for (size_t bytes : sizes) {
    for (size_t dst_offset = 0; dst_offset < 16; ++dst_offset) {
      for (size_t src_offset : {size_t{0}, size_t{3}, size_t{16}}) {
        std::vector<uint8_t> target(bytes + 64, 0xA5);
        StreamCopy(target.data() + dst_offset, source.data() + src_offset, bytes);
        StreamFence();
        for (size_t i = 0; i < target.size(); ++i) {
          const bool inside = i >= dst_offset && i < dst_offset + bytes;
          const uint8_t expected = inside ? source[src_offset + i - dst_offset] : 0xA5;
          ASSERT_EQ(target[i], expected) << "bytes=" << bytes << " dst_offset=" << dst_offset
                                         << " src_offset=" << src_offset << " at " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace stoker
