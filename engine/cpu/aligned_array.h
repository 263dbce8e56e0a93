// A fixed-size, zero-initialised, 64-byte aligned array: buffers handed to oneDNN and to the
// vectorised loops are allocated once, at model creation. Arrays of 2 MiB and more start on a
// 2 MiB boundary and ask for transparent huge pages over their whole 2 MiB pages (madvise: where
// the kernel's THP mode is "madvise", as on the machines measured, nothing else gets them): a
// training step streams every activation and gradient (ResNet-20 at batch 128: ~100 MB a
// step), and with 4 KiB pages each pass walks the page tables every 4 KiB (with huge pages:
// ResNet-20 fp32 on one thread +4.4 % a step, docs/decisions.md). The tail past the last whole
// 2 MiB keeps small pages, so the memory used does not grow.
#ifndef STOKER_ENGINE_CPU_ALIGNED_ARRAY_H_
#define STOKER_ENGINE_CPU_ALIGNED_ARRAY_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

namespace stoker {

template <typename T>
class AlignedArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  static constexpr size_t kAlignmentBytes = 64;
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  AlignedArray() = default;
  explicit AlignedArray(size_t size) : size_(size) {
    if (size == 0) return;
    const size_t bytes =
        (size * sizeof(T) + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes;
    const bool huge = bytes >= kHugePageBytes;
    const size_t align = huge ? kHugePageBytes : kAlignmentBytes;
    // aligned_alloc wants a multiple of the alignment; the rounding is never touched.
    void* memory = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    if (memory == nullptr) throw std::bad_alloc();
    // Advice: where THP is off ("never") or the call fails, the array simply keeps small pages.
    if (huge) madvise(memory, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
    std::memset(memory, 0, bytes);
    data_.reset(static_cast<T*>(memory));
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }

 private:
  struct Free {
    void operator()(T* memory) const { std::free(memory); }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0;
};

}  // namespace stoker

#endif  // STOKER_ENGINE_CPU_ALIGNED_ARRAY_H_
