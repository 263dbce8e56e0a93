// The checks collective.h's Connect* functions share.
#include "comm/collective.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace stoker {

absl::Status CheckGroup(int rank, int size, absl::Duration timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not a rank of a group of ", size));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("the collective timeout must be positive, not ",
                                                   absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

absl::Status CheckRoot(const char* what, int root, int size) {
  if (root >= 0 && root < size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " root ", root, " is not a rank of ", size));
}

std::string GradientAddress(const void* pointer) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(pointer)));
}

absl::Status CheckGradientArrival(int64_t step, int index, int expected, const float* gradient,
                                  int64_t count) {
  if (count < 0 || (gradient == nullptr && count > 0)) {
    return absl::InternalError(absl::StrCat("gradient ", index, " has ", count, " elements at ",
                                            GradientAddress(gradient), ": not a gradient buffer"));
  }
  if (index != expected) {
    return absl::InternalError(absl::StrCat("step ", step, ": gradient ", index,
                                            " became ready where gradient ", expected,
                                            " was expected (indices count 0, 1, ...)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameGradient(int64_t step, int index, const std::vector<BucketedTensor>& layout,
                               const float* gradient, int64_t count) {
  if (index < 0 || static_cast<size_t>(index) >= layout.size()) {
    return absl::InternalError(absl::StrCat("step ", step, ": gradient ", index,
                                            " is one more than the first step's ", layout.size()));
  }
  const BucketedTensor& first = layout[index];
  if (first.gradient != gradient || first.count != count) {
    return absl::InternalError(
        absl::StrCat("step ", step, ": gradient ", index, " is ", count, " elements at ",
                     GradientAddress(gradient), ", the first step's was ", first.count, " at ",
                     GradientAddress(first.gradient),
                     " (the order, buffers and sizes must not change between steps)"));
  }
  return absl::OkStatus();
}

}  // namespace stoker
