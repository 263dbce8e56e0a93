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

}  // namespace stoker
