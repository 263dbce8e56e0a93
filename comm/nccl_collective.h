// A Collective (collective.h) over NCCL for GPU ranks: its buffers are device pointers on the
// rank's device. Rank 0 makes the NCCL unique id and publishes it through the KeyValueStore (the
// same rendezvous Gloo uses); every rank then joins the communicator. Built only where the CUDA
// toolkit and NCCL are found (target stoker_comm_nccl).
//
// Every call is synchronous: it returns once the operation's stream has finished, so the caller's
// buffers are final. The communicator is non-blocking, and every wait polls it against the
// options' timeout: a rank that never arrives or a peer that died gives DEADLINE_EXCEEDED (NCCL
// cannot always tell a dead peer from a slow one), an error NCCL reports from a peer or the network
// UNAVAILABLE; either way the communicator is aborted and every later call fails with that error.
#ifndef STOKER_COMM_NCCL_COLLECTIVE_H_
#define STOKER_COMM_NCCL_COLLECTIVE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/collective.h"

namespace stoker {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  // The CUDA device of this rank (as the process sees it, after CUDA_VISIBLE_DEVICES).
  int device = 0;
  // Prefixes the store key of the unique id, as GlooOptions::store_prefix.
  std::string store_prefix;
  // Connecting (every rank must arrive within it) and each collective.
  absl::Duration timeout = absl::Seconds(60);
};

// FAILED_PRECONDITION without a usable CUDA device; INVALID_ARGUMENT for bad options;
// DEADLINE_EXCEEDED when rank 0's id or a peer does not come within the timeout.
absl::StatusOr<std::unique_ptr<Collective>> ConnectNccl(const NcclOptions& options,
                                                        KeyValueStore& store);

}  // namespace stoker

#endif  // STOKER_COMM_NCCL_COLLECTIVE_H_
