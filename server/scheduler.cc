#include "server/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stoker {

void SortForScheduling(std::vector<v1::Job>& jobs) {
  std::stable_sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
    if (a.spec().priority() != b.spec().priority())
      return a.spec().priority() > b.spec().priority();
    if (a.submit_time_unix_ms() != b.submit_time_unix_ms()) {
      return a.submit_time_unix_ms() < b.submit_time_unix_ms();
    }
    // Ids are zero-padded submit sequence numbers, so they order like submit order.
    return a.id() < b.id();
  });
}

int PickJob(const std::vector<v1::Job>& queue, const WorkerCapacity& capacity) {
  if (capacity.free_slots <= 0) return -1;
  for (size_t i = 0; i < queue.size(); ++i) {
    if (queue[i].spec().resources().gpus() <= capacity.free_gpus) return static_cast<int>(i);
  }
  return -1;
}

std::string WaitingReason(const v1::Job& job, int jobs_ahead, int alive_workers,
                          int max_worker_gpus) {
  const int gpus = job.spec().resources().gpus();
  if (alive_workers == 0) return "no worker is registered";
  if (gpus > max_worker_gpus) {
    return absl::StrCat("needs ", gpus, " GPUs on one worker; the largest worker has ",
                        max_worker_gpus);
  }
  if (jobs_ahead > 0) return absl::StrCat(jobs_ahead, " job(s) ahead in the queue");
  return gpus > 0 ? absl::StrCat("waiting for a worker with ", gpus, " free GPU(s)")
                  : "waiting for a free worker";
}

}  // namespace stoker
