#include "data/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace stoker {

namespace {
// Below this, streaming stores cost more than they save (they bypass a cache the consumer may
// still share, and a partial write-combining buffer is flushed as several small writes).
constexpr size_t kMinStreamBytes = 256;
}  // namespace

void StreamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  if (bytes >= kMinStreamBytes) {
    auto* out = static_cast<uint8_t*>(dst);
    const auto* in = static_cast<const uint8_t*>(src);
    const size_t head = (16 - reinterpret_cast<uintptr_t>(out) % 16) % 16;
    std::memcpy(out, in, head);
    out += head;
    in += head;
    bytes -= head;
    // Four 16-byte stores per iteration: one 64-byte line per write-combining buffer.
    for (; bytes >= 64; bytes -= 64, in += 64, out += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(out), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 48), d);
    }
    for (; bytes >= 16; bytes -= 16, in += 16, out += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(out),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
    }
    std::memcpy(out, in, bytes);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void StreamFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace stoker
