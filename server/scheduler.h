// Placement policy: which queued job a worker should run next, and what it holds there (which
// GPUs, how many cores, how much memory). Pure functions over the queue and a worker's ledger, so
// the policy is tested without a server.
//
// The rules: a job (each rank of a data-parallel job) is placed whole on one worker; each GPU
// belongs to one job at a time; the cpus and memory of a worker's jobs add up to at most what the
// worker advertised (nothing is over-committed, whatever the defaults). A job's defaults are
// resolved against the worker that takes it (ResolveRequest). Workers pull work with their
// heartbeats, so placement is first fit: the first worker with room that asks gets the job (its
// lowest free GPU indices). A job that does not fit does not block smaller jobs behind it
// (backfill; the coordinator stops backfilling behind a gang that has waited too long, see
// coordinator.h).
//
// A data-parallel job (resources.replicas > 1, a gang) needs one placement per rank, all at once
// or none: PlaceGang places rank after rank on copies of the workers' free resources and returns
// either every placement or an error, so a gang never holds part of the cluster while it waits
// and two gangs cannot deadlock each other. Each rank gets the job's resources (resolved against
// the worker that takes it); a worker with room for several ranks takes several.
#ifndef STOKER_SERVER_SCHEDULER_H_
#define STOKER_SERVER_SCHEDULER_H_

#include <cstdint>
#include <limits>
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
  // How many more jobs (or ranks) it takes now (HeartbeatRequest.free_slots, less what was placed
  // there since); PlaceGang puts at most this many ranks on it.
  int slots = std::numeric_limits<int>::max();
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

// The number of ranks a job runs: resources.replicas, 0 meaning 1.
int ReplicasOf(const v1::JobSpec& spec);

// Places `replicas` ranks of `request` on `workers` (their free resources and slots; the caller's
// copies are not changed): one placement per rank, by rank, each with its rank set. Ranks are
// packed onto as few workers as possible (fewer network hops): the workers with room for the
// most ranks are filled first, and the last rank(s) go to the worker with the least room that
// still holds them, leaving larger holes for others; ties go to the lower worker id, so the
// result depends only on the input. Consecutive ranks share a worker, rank 0 on the first.
// FAILED_PRECONDITION when the workers could not hold the gang even idle, RESOURCE_EXHAUSTED when
// they cannot now; the message names the ranks and what each needs ("needs 4 ranks of 1 cpus;
// the live workers have room for 2").
absl::StatusOr<std::vector<v1::Placement>> PlaceGang(const v1::ResourceSpec& request, int replicas,
                                                     const std::vector<WorkerView>& workers);

// Sorts `jobs` into scheduling order: higher priority first, then earlier submit (job id order for
// equal submit times).
void SortForScheduling(std::vector<v1::Job>& jobs);

// Index in `queue` (already in scheduling order) of the first job that fits `worker` now, with
// its placement in `*placement`; -1 when none does.
int PickJob(const std::vector<v1::Job>& queue, const WorkerView& worker, v1::Placement* placement);

// Why `job` is still queued, for people, naming the resource that holds it back: "needs 2 GPUs
// on one worker; the largest worker has 1" (it can never run as things are), "needs 2 GPUs, the
// most free on one worker is 1" (it waits for jobs to finish), preceded by the jobs ahead of it.
// `workers` are the live workers. A gang (replicas > 1) says what PlaceGang says: "needs 4 ranks
// of 1 cpus; the live workers have room for 2".
std::string WaitingReason(const v1::Job& job, int jobs_ahead,
                          const std::vector<WorkerView>& workers);

// "1.5 GiB" / "512 MiB".
std::string FormatBytes(int64_t bytes);

}  // namespace stoker

#endif  // STOKER_SERVER_SCHEDULER_H_
