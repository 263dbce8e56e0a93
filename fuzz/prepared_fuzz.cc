// libFuzzer target: prepared samples files (the agent's train.samples, which every loader maps)
// through the parser the loaders use, as given and with the header checksum made right (so that
// the fields behind it are reached). Whatever the bytes say, the parser reads none outside them
// (ASan), and what it accepts holds together: the labels and in-file samples lie inside the
// bytes, every label is below the classes, and the dims give the sample size.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "data/prepared_dataset.h"

namespace {

constexpr size_t kCrcAt = 16;

void Check(std::vector<uint8_t>& bytes) {
  absl::StatusOr<stoker::PreparedLayout> layout =
      stoker::ParsePreparedSamples("fuzz.samples", bytes.data(), bytes.size());
  if (!layout.ok()) {
    if (layout.status().message().find("fuzz.samples") == absl::string_view::npos) std::abort();
    return;
  }
  const uint64_t size = bytes.size();
  const uint64_t count = static_cast<uint64_t>(layout->count);
  if (count == 0 || layout->labels_offset > size || count > size - layout->labels_offset) {
    std::abort();
  }
  uint64_t features = 1;
  for (int d : layout->sample_dims) {
    if (d <= 0) std::abort();
    features *= static_cast<uint64_t>(d);
  }
  if (features != static_cast<uint64_t>(layout->features) ||
      features * stoker::SampleTypeBytes(layout->sample_type) !=
          static_cast<uint64_t>(layout->sample_bytes)) {
    std::abort();
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (bytes[layout->labels_offset + i] >= layout->classes) std::abort();
  }
  if (layout->source_path.empty()) {
    const uint64_t samples = count * static_cast<uint64_t>(layout->sample_bytes);
    if (layout->samples_offset > size || samples != size - layout->samples_offset) std::abort();
    // The first and last sample bytes are readable (ASan).
    volatile uint8_t first = bytes[layout->samples_offset];
    volatile uint8_t last = bytes[size - 1];
    (void)first;
    (void)last;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact copy: reading past it is caught.
  std::vector<uint8_t> bytes(data, data + size);
  Check(bytes);
  // The header's checksum as the writer would set it, where the header's length lies inside.
  if (size >= 20) {
    uint32_t header_bytes;
    std::memcpy(&header_bytes, data + 12, 4);  // little-endian hosts (x86-64, arm64)
    if (header_bytes >= 20 && header_bytes <= size) {
      static constexpr uint8_t kZero[4] = {};
      uLong crc = crc32(0L, Z_NULL, 0);
      crc = crc32(crc, data, kCrcAt);
      crc = crc32(crc, kZero, 4);
      crc = crc32(crc, data + kCrcAt + 4, header_bytes - kCrcAt - 4);
      const uint32_t value = static_cast<uint32_t>(crc);
      std::vector<uint8_t> fixed(data, data + size);
      std::memcpy(fixed.data() + kCrcAt, &value, 4);
      Check(fixed);
    }
  }
  return 0;
}
