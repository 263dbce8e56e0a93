// A fixed-size, zero-initialised, 64-byte aligned array: buffers handed to oneDNN and to the
// vectorised loops are allocated once, at model creation.
#ifndef STOKER_ENGINE_CPU_ALIGNED_ARRAY_H_
#define STOKER_ENGINE_CPU_ALIGNED_ARRAY_H_

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

  AlignedArray() = default;
  explicit AlignedArray(size_t size) : size_(size) {
    if (size == 0) return;
    const size_t bytes =
        (size * sizeof(T) + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes;
    void* memory = std::aligned_alloc(kAlignmentBytes, bytes);
    if (memory == nullptr) throw std::bad_alloc();
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
