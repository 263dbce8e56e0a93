// The shared-memory collective of shm_collective.cc as its own type, for the two-level collective
// (cpu_ranks.cc), which needs two things a Collective does not offer: a sum delivered to one rank
// only (the machine's leader, who then sums with the other machines' leaders over Gloo) and a way
// to tell the rest of the machine that this rank gave up (so they stop waiting at once).
#ifndef STOKER_COMM_SHM_GROUP_H_
#define STOKER_COMM_SHM_GROUP_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/collective.h"

namespace stoker {

class SharedMemoryGroup : public Collective {
 public:
  // The sum over the group's ranks, in rank order, into `data` of rank `root` only (the others'
  // `data` is left as it was). The same bits as AllReduceSum gives.
  virtual absl::Status ReduceSum(float* data, size_t count, int root) = 0;
  virtual absl::Status ReduceSum(double* data, size_t count, int root) = 0;
  using Collective::Broadcast;
  virtual absl::Status Broadcast(double* data, size_t count, int root) = 0;
  // Every rank of the group waiting at a barrier, now or later, fails UNAVAILABLE quoting `why`
  // (this rank's part failed elsewhere: its Gloo sum with the other machines).
  virtual void Abandon(absl::string_view why) = 0;
};

// ConnectSharedMemory (collective.h) as a SharedMemoryGroup; the same agreement and errors.
absl::StatusOr<std::unique_ptr<SharedMemoryGroup>> ConnectSharedMemoryGroup(
    const SharedMemoryOptions& options, KeyValueStore& store);

}  // namespace stoker

#endif  // STOKER_COMM_SHM_GROUP_H_
