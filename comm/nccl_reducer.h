// The GradientReducer of a GPU rank (engine/backend.h): gradients that stay on the device, summed
// over the ranks with NCCL while backward still computes.
//
// The model calls GradientReady(i, gradient, count) from its host thread right after it has
// enqueued, on its compute stream, the work that finalises `gradient` (a device pointer). The
// reducer packs the gradients, in that order, into buckets of about BucketOptions::bucket_bytes
// (PyTorch DDP's 25 MiB); when a bucket's last gradient is ready it records a CUDA event on the
// compute stream, makes its own communication stream wait for it, and enqueues there the copies
// into the bucket's device buffer, the NCCL all-reduce and the copies back (a bucket of one
// gradient is summed in place, without copies). Nothing waits on the host until Finish(), so the
// sums run while the compute stream computes the layers below. Finish() waits (host side, at most
// the collective's timeout) until the communication stream has run everything and NCCL reports
// no error, then orders the compute stream after it with an event: the model's update that
// follows reads the sums. The wait is on the host because an error must fail the step before the
// update: DEADLINE_EXCEEDED (a rank did not arrive, stopped, died) or UNAVAILABLE (NCCL or a
// stream failed) aborts the communicator, and every later step fails too (the attempt is over).
// Contract errors (gradients out of order, a layout that changed after the first step) are
// INTERNAL, as in the cpu BucketedReducer.
//
// Counters (ReducerCounters): allreduce_seconds is the device time between each bucket's NCCL
// call's start and end (events on the communication stream), exposed_seconds the time the
// communication stream ran past the end of backward (the compute stream's position at Finish):
// what the overlap did not hide. Built only where CUDA and NCCL are (target stoker_comm_nccl).
#ifndef STOKER_COMM_NCCL_REDUCER_H_
#define STOKER_COMM_NCCL_REDUCER_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "comm/collective.h"
#include "comm/nccl_collective.h"

namespace stoker {

struct NcclReducerOptions {
  BucketOptions buckets;
  // The model's compute stream, on the collective's device: GradientReady's buffers are final on
  // it once the work enqueued before the call has run. Required.
  cudaStream_t compute_stream = nullptr;
};

// INVALID_ARGUMENT without a compute stream; INTERNAL when the communication stream or the
// events cannot be created. `collective` must outlive the reducer; the reducer serves one model
// and is driven from one thread (counters() may be read from any).
absl::StatusOr<std::unique_ptr<BucketedReducer>> CreateNcclReducer(
    NcclCollective& collective, const NcclReducerOptions& options);

}  // namespace stoker

#endif  // STOKER_COMM_NCCL_REDUCER_H_
