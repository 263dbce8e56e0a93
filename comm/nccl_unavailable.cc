// ConnectDeviceRank in a build without NCCL (no CUDA toolkit, or NCCL not found).
#include "comm/device_ranks.h"

namespace stoker {

absl::StatusOr<DeviceRank> ConnectDeviceRank(const DeviceRankOptions& options,
                                             KeyValueStore& store) {
  (void)options;
  (void)store;
  return absl::FailedPreconditionError(
      "this trainer was built without NCCL (rebuild with the CUDA toolkit and NCCL, or set "
      "NCCL_ROOT)");
}

}  // namespace stoker
