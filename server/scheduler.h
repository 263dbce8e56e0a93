// Placement policy: which queued job a worker with free capacity should run next. Pure functions
// over the queue, so the policy is tested without a server.
#ifndef STOKER_SERVER_SCHEDULER_H_
#define STOKER_SERVER_SCHEDULER_H_

#include <string>
#include <vector>

#include "stoker.pb.h"

namespace stoker {

struct WorkerCapacity {
  int free_slots = 0;  // jobs the worker can still start
  int free_gpus = 0;   // GPUs not held by a running job
};

// Sorts `jobs` into scheduling order: higher priority first, then earlier submit (job id order for
// equal submit times).
void SortForScheduling(std::vector<v1::Job>& jobs);

// Index in `queue` (already in scheduling order) of the first job that fits `capacity`, or -1.
// A job is placed whole: it needs spec.resources.gpus free GPUs on this one worker and a free slot.
// A job that does not fit does not block smaller jobs behind it (backfill).
int PickJob(const std::vector<v1::Job>& queue, const WorkerCapacity& capacity);

// Why `job` is still queued, for people: compares what it needs with the largest worker.
std::string WaitingReason(const v1::Job& job, int jobs_ahead, int alive_workers,
                          int max_worker_gpus);

}  // namespace stoker

#endif  // STOKER_SERVER_SCHEDULER_H_
