// SplitMix64's step (add the golden-ratio increment, then its finaliser): a bijective 64-bit mix
// with good avalanche, specified exactly here. The loaders derive every per-sample random choice
// (crop offsets, flips, the image transforms' seeds) by chaining it over (seed, batch, position),
// so a sample's randomness does not depend on which loader makes it.
#ifndef STOKER_DATA_SPLIT_MIX_H_
#define STOKER_DATA_SPLIT_MIX_H_

#include <cstdint>

namespace stoker {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace stoker

#endif  // STOKER_DATA_SPLIT_MIX_H_
