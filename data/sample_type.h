// The element type of a dataset's features, as it travels through the ring.
#ifndef STOKER_DATA_SAMPLE_TYPE_H_
#define STOKER_DATA_SAMPLE_TYPE_H_

#include <cstdint>

namespace stoker {

// Values are stored in the ring's header: never renumber them.
enum class SampleType : uint32_t {
  kUint8 = 0,    // raw pixels (IDX, uint8 NPY); normalised by the consumer
  kFloat32 = 1,  // little-endian IEEE float32 (float32 NPY, CSV)
};

// Bytes per feature.
inline int SampleTypeBytes(SampleType type) { return type == SampleType::kFloat32 ? 4 : 1; }

inline const char* SampleTypeName(SampleType type) {
  return type == SampleType::kFloat32 ? "float32" : "uint8";
}

// True for the values above (a ring header read from shared memory may hold anything).
inline bool IsKnownSampleType(uint32_t value) { return value <= 1; }

}  // namespace stoker

#endif  // STOKER_DATA_SAMPLE_TYPE_H_
