// Placement policy: which queued job a worker should run next, and what it holds there (which
// GPUs, how many cores, how much memory). Pure functions over the queue and a worker's ledger, so
// the policy is tested without a server.
//
// The rules: a job is placed whole on one worker; each GPU belongs to one job at a time; the cpus
// and memory of a worker's jobs add up to at most what the worker advertised (nothing is
// over-committed, whatever the defaults). A job's defaults are resolved against the worker that
// takes it (ResolveRequest). Workers pull work with their heartbeats, so placement is first fit:
// the first worker with room that asks gets the job (its lowest free GPU indices). A job that does
// not fit does not block smaller jobs behind it (backfill).
//
// A data-parallel job will need N placements at once, all or nothing: PlaceOnWorker on copies of
// several workers' ledgers, committed only when every one succeeds.
#ifndef STOKER_SERVER_SCHEDULER_H_
#define STOKER_SERVER_SCHEDULER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stoker.pb.h"

namespace stoker {

struct GpuId {
  int index = 0;     // the worker's Device.index
  std::string uuid;  // Device.uuid
};

// Resources of a worker: what it advertised (capacity), or what is left of it (free).
struct WorkerResources {
  int cpus = 0;
  int64_t memory_bytes = 0;
  std::vector<GpuId> gpus;  // by index, ascending
};

// A worker as the scheduler sees it.
struct WorkerView {
  std::string worker_id;
  WorkerResources capacity;
  WorkerResources free;  // capacity less the placements of its running jobs
};

// What a worker advertised in its registration (cpus, memory_bytes, its "cuda" devices).
WorkerResources CapacityOf(const v1::RegisterWorkerRequest& registration);
// `capacity` less what `held` takes: GPUs held by a job are not free; cpus and memory never go
// below 0 (a worker that re-registered smaller keeps its running jobs).
WorkerResources FreeResources(const WorkerResources& capacity,
                              const std::vector<const v1::Placement*>& held);

// A job's request with its defaults resolved against a worker's capacity.
struct ResolvedRequest {
  int gpus = 0;
  int cpus = 0;
  int64_t memory_bytes = 0;
};
// gpus as asked. cpus 0: a CPU job gets all of the worker's cores; a GPU job its GPUs' share of
// them (at least 1). memory_mib 0: the job's share of the worker's memory, that share being its
// GPUs' share of the worker's GPUs (GPU jobs) or its cores' share of the cores (CPU jobs).
ResolvedRequest ResolveRequest(const v1::ResourceSpec& request, const WorkerResources& capacity);

// Places a job on `worker`: its lowest free GPU indices, its cpus and memory.
// FAILED_PRECONDITION when the worker could never hold it (more GPUs, cores or memory than it
// has), RESOURCE_EXHAUSTED when it cannot now; either message names the resource ("needs 2 GPUs,
// 1 free").
absl::StatusOr<v1::Placement> PlaceOnWorker(const v1::ResourceSpec& request,
                                            const WorkerView& worker);
// Takes `placement` out of `worker.free`.
void Hold(const v1::Placement& placement, WorkerView& worker);

// Sorts `jobs` into scheduling order: higher priority first, then earlier submit (job id order for
// equal submit times).
void SortForScheduling(std::vector<v1::Job>& jobs);

// Index in `queue` (already in scheduling order) of the first job that fits `worker` now, with
// its placement in `*placement`; -1 when none does.
int PickJob(const std::vector<v1::Job>& queue, const WorkerView& worker, v1::Placement* placement);

// Why `job` is still queued, for people, naming the resource that holds it back: "needs 2 GPUs
// on one worker; the largest worker has 1" (it can never run as things are), "needs 2 GPUs, the
// most free on one worker is 1" (it waits for jobs to finish), preceded by the jobs ahead of it.
// `workers` are the live workers.
std::string WaitingReason(const v1::Job& job, int jobs_ahead,
                          const std::vector<WorkerView>& workers);

// "1.5 GiB" / "512 MiB".
std::string FormatBytes(int64_t bytes);

}  // namespace stoker

#endif  // STOKER_SERVER_SCHEDULER_H_
