// A data-parallel rank whose gradients live on a GPU: its NCCL communicator on the device, the
// same communicator behind host copies (for the few collectives between steps: the starting
// parameters, evaluation sums, stop votes), and the device reducer that sums a model's gradients
// after the model's compute stream. One call for the trainer, the same in every build: with NCCL
// (nccl_ranks.cc) or without it (nccl_unavailable.cc, FAILED_PRECONDITION).
#ifndef STOKER_COMM_DEVICE_RANKS_H_
#define STOKER_COMM_DEVICE_RANKS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/collective.h"

namespace stoker {

struct DeviceRankOptions {
  int rank = 0;
  int size = 1;
  int device = 0;            // the CUDA device, of those CUDA_VISIBLE_DEVICES leaves
  std::string store_prefix;  // the attempt's keys in the rendezvous store
  absl::Duration timeout = absl::Seconds(60);
  BucketOptions buckets;
  // The model's compute stream (Model::device_stream(), a cudaStream_t): the reducer orders its
  // reads after it.
  void* compute_stream = nullptr;
};

// Destroyed bottom up: the reducer, then the host face, then the communicator under both.
struct DeviceRank {
  std::unique_ptr<Collective> device;  // NCCL on device buffers
  std::unique_ptr<Collective> host;    // the same ranks through host copies
  std::unique_ptr<BucketedReducer> reducer;
  std::string description;  // for the log: "nccl on device 0"
};

// INVALID_ARGUMENT without a compute stream (a host model); FAILED_PRECONDITION in a build
// without NCCL; the communicator's error (a rank that never came, a timeout) otherwise, an
// invalid-argument one from NCCL as INTERNAL (it is not the job's fault).
absl::StatusOr<DeviceRank> ConnectDeviceRank(const DeviceRankOptions& options,
                                             KeyValueStore& store);

}  // namespace stoker

#endif  // STOKER_COMM_DEVICE_RANKS_H_
