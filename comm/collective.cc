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

std::string GradientAddress(const void* pointer) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(pointer)));
}

absl::Status CheckSameGradient(int64_t step, int index, size_t first_step_count,
                               const float* first_gradient, int64_t first_count,
                               const float* gradient, int64_t count) {
  if (index < 0 || static_cast<size_t>(index) >= first_step_count) {
    return absl::InternalError(absl::StrCat("step ", step, ": gradient ", index,
                                            " is one more than the first step's ",
                                            first_step_count));
  }
  if (first_gradient != gradient || first_count != count) {
    return absl::InternalError(
        absl::StrCat("step ", step, ": gradient ", index, " is ", count, " elements at ",
                     GradientAddress(gradient), ", the first step's was ", first_count, " at ",
                     GradientAddress(first_gradient),
                     " (the order, buffers and sizes must not change between steps)"));
  }
  return absl::OkStatus();
}

}  // namespace stoker
