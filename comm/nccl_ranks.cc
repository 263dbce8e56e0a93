#include "absl/strings/str_cat.h"
#include "comm/device_ranks.h"
#include "comm/nccl_collective.h"
#include "comm/nccl_reducer.h"

namespace stoker {

absl::StatusOr<DeviceRank> ConnectDeviceRank(const DeviceRankOptions& options,
                                             KeyValueStore& store) {
  if (options.compute_stream == nullptr) {
    return absl::InvalidArgumentError(
        "this model exposes no device compute stream for the NCCL reducer");
  }
  NcclOptions nccl;
  nccl.rank = options.rank;
  nccl.size = options.size;
  nccl.device = options.device;
  nccl.store_prefix = options.store_prefix;
  nccl.timeout = options.timeout;
  absl::StatusOr<std::unique_ptr<NcclCollective>> connected = ConnectNccl(nccl, store);
  const std::string where = absl::StrCat("nccl on device ", options.device);
  if (!connected.ok()) {
    return absl::Status(
        absl::IsInvalidArgument(connected.status()) ? absl::StatusCode::kInternal
                                                    : connected.status().code(),
        absl::StrCat("connecting the ranks (", where, "): ", connected.status().message()));
  }
  NcclCollective& communicator = **connected;
  DeviceRank rank;
  rank.device = std::move(*connected);
  absl::StatusOr<std::unique_ptr<Collective>> host = CreateHostStagedCollective(communicator);
  if (!host.ok()) return absl::InternalError(host.status().message());
  rank.host = std::move(*host);
  NcclReducerOptions reducer_options;
  reducer_options.buckets = options.buckets;
  reducer_options.compute_stream = static_cast<cudaStream_t>(options.compute_stream);
  absl::StatusOr<std::unique_ptr<BucketedReducer>> reducer =
      CreateNcclReducer(communicator, reducer_options);
  if (!reducer.ok()) return absl::InternalError(reducer.status().message());
  rank.reducer = std::move(*reducer);
  rank.description = where;
  return rank;
}

}  // namespace stoker
