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
//
// Besides the synchronous Collective calls, NcclCollective offers what a device-side gradient
// reducer (nccl_reducer.h) needs: an all-reduce enqueued on a stream of the caller's without
// waiting, and a bounded wait for such a stream. CreateHostStagedCollective wraps it for callers
// whose buffers are in host memory (the trainer's parameter broadcast, evaluation sums, stop
// votes).
#ifndef STOKER_COMM_NCCL_COLLECTIVE_H_
#define STOKER_COMM_NCCL_COLLECTIVE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
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

// A Collective over NCCL whose buffers are device pointers on device(). Calls come from one
// thread at a time (they are serialised by a mutex in any case).
class NcclCollective : public Collective {
 public:
  // The CUDA device of this rank (NcclOptions::device).
  virtual int device() const = 0;
  // The options' timeout: each wait's bound.
  virtual absl::Duration timeout() const = 0;
  // Enqueues an in-place sum of `count` floats at device pointer `data` on `stream` (a stream of
  // the caller's, on device()) and returns without waiting for it to run; `what` names it in
  // errors. The sum is final once `stream` has reached it (WaitForStream). INVALID_ARGUMENT for a
  // null buffer; other errors as AllReduceSum's (the communicator is aborted).
  virtual absl::Status EnqueueAllReduceSum(float* data, size_t count, cudaStream_t stream,
                                           const std::string& what) = 0;
  // Waits until `stream` has run everything enqueued on it and the communicator reports no error,
  // for at most timeout(). DEADLINE_EXCEEDED (a rank did not arrive, stopped or died; or the work
  // `stream` waits for never finished) or UNAVAILABLE (NCCL or the stream failed): the
  // communicator is aborted and every later call fails with that error.
  virtual absl::Status WaitForStream(cudaStream_t stream, const std::string& what) = 0;
};

// FAILED_PRECONDITION without a usable CUDA device; INVALID_ARGUMENT for bad options;
// DEADLINE_EXCEEDED when rank 0's id or a peer does not come within the timeout.
absl::StatusOr<std::unique_ptr<NcclCollective>> ConnectNccl(const NcclOptions& options,
                                                            KeyValueStore& store);

// A Collective over host buffers on top of `device` (which must outlive it): each call copies
// its buffer to device memory, runs the device collective's call, and copies the result back
// (on a stream of its own, waited for). Device memory grows to the largest call's buffer. For
// the few small host-side collectives of a GPU rank; errors are the device collective's, or
// INTERNAL / RESOURCE_EXHAUSTED for a copy or an allocation that failed.
absl::StatusOr<std::unique_ptr<Collective>> CreateHostStagedCollective(NcclCollective& device);

}  // namespace stoker

#endif  // STOKER_COMM_NCCL_COLLECTIVE_H_
