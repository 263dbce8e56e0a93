#include "server/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"

namespace stoker {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Which resource stops a job, in the order they are checked.
enum class Resource { kGpus = 0, kCpus = 1, kMemory = 2 };

const char* ResourceName(Resource r) {
  static constexpr const char* kNames[] = {"GPUs", "cpus", "memory"};
  return EnumName(r, kNames, "?");
}

std::string Amount(Resource r, int64_t amount) {
  return r == Resource::kMemory ? FormatBytes(amount) : absl::StrCat(amount);
}

int64_t Of(const WorkerResources& resources, Resource r) {
  switch (r) {
    case Resource::kGpus:
      return static_cast<int64_t>(resources.gpus.size());
    case Resource::kCpus:
      return resources.cpus;
    case Resource::kMemory:
      return resources.memory_bytes;
  }
  return 0;
}

int64_t Of(const ResolvedRequest& request, Resource r) {
  switch (r) {
    case Resource::kGpus:
      return request.gpus;
    case Resource::kCpus:
      return request.cpus;
    case Resource::kMemory:
      return request.memory_bytes;
  }
  return 0;
}

constexpr Resource kResources[] = {Resource::kGpus, Resource::kCpus, Resource::kMemory};

// The most ranks a job has (spec: resources.replicas <= 256).
constexpr int kMaxRanks = 256;

// How many ranks of `request` (resolved against `capacity`) fit in `resources` at once, at most
// `limit`: as many as PlaceOnWorker and Hold place one after the other, without placing them.
int CountRanksThatFit(const v1::ResourceSpec& request, const WorkerResources& capacity,
                      const WorkerResources& resources, int limit);

// `count` ranks of `request` placed one after the other on `worker`'s free resources (the caller
// knows they fit: CountRanksThatFit).
std::vector<v1::Placement> PlaceRanks(const v1::ResourceSpec& request, WorkerView worker,
                                      int count) {
  std::vector<v1::Placement> placed;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<v1::Placement> placement = PlaceOnWorker(request, worker);
    if (!placement.ok()) break;
    Hold(*placement, worker);
    placed.push_back(std::move(*placement));
  }
  return placed;
}

// What one rank asks for, for messages: "1 cpus", "1 GPUs, 2.0 GiB memory"; the defaults ("a
// whole worker's cpus") when it names nothing.
std::string RankNeeds(const v1::ResourceSpec& request) {
  std::vector<std::string> parts;
  if (request.gpus() > 0) parts.push_back(absl::StrCat(request.gpus(), " GPUs"));
  if (request.cpus() > 0) parts.push_back(absl::StrCat(request.cpus(), " cpus"));
  if (request.memory_mib() > 0) {
    parts.push_back(absl::StrCat(FormatBytes(request.memory_mib() * kMiB), " memory"));
  }
  if (parts.empty()) return "a whole worker's cpus";
  return absl::StrJoin(parts, ", ");
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  if (bytes >= 1024 * kMiB) return absl::StrFormat("%.1f GiB", bytes / double(1024 * kMiB));
  return absl::StrFormat("%d MiB", bytes / kMiB);
}

WorkerResources CapacityOf(const v1::RegisterWorkerRequest& registration) {
  WorkerResources capacity;
  capacity.cpus = std::max(1, registration.cpus());  // 0: an older worker, one job at a time
  capacity.memory_bytes = std::max<int64_t>(0, registration.memory_bytes());
  for (const v1::Device& device : registration.devices()) {
    if (device.kind() == "cuda") capacity.gpus.push_back({device.index(), device.uuid()});
  }
  std::sort(capacity.gpus.begin(), capacity.gpus.end(),
            [](const GpuId& a, const GpuId& b) { return a.index < b.index; });
  return capacity;
}

WorkerResources FreeResources(const WorkerResources& capacity,
                              const std::vector<const v1::Placement*>& held) {
  WorkerResources free = capacity;
  for (const v1::Placement* placement : held) {
    free.cpus -= placement->cpus();
    free.memory_bytes -= placement->memory_bytes();
    for (int index : placement->gpu_indices()) {
      free.gpus.erase(std::remove_if(free.gpus.begin(), free.gpus.end(),
                                     [index](const GpuId& gpu) { return gpu.index == index; }),
                      free.gpus.end());
    }
  }
  free.cpus = std::max(0, free.cpus);
  free.memory_bytes = std::max<int64_t>(0, free.memory_bytes);
  return free;
}

ResolvedRequest ResolveRequest(const v1::ResourceSpec& request, const WorkerResources& capacity) {
  ResolvedRequest resolved;
  resolved.gpus = std::max(0, request.gpus());
  const int worker_gpus = static_cast<int>(capacity.gpus.size());
  // The job's share of the worker: its GPUs' share of the GPUs, else its cores' share.
  double share = 1;
  if (resolved.gpus > 0 && worker_gpus > 0) {
    share = std::min(1.0, double(resolved.gpus) / worker_gpus);
    resolved.cpus = request.cpus() > 0
                        ? request.cpus()
                        : std::max(1, static_cast<int>(capacity.cpus * share));  // floor
  } else {
    resolved.cpus = request.cpus() > 0 ? request.cpus() : std::max(1, capacity.cpus);
    if (capacity.cpus > 0) share = std::min(1.0, double(resolved.cpus) / capacity.cpus);
  }
  resolved.memory_bytes = request.memory_mib() > 0
                              ? request.memory_mib() * kMiB
                              : static_cast<int64_t>(double(capacity.memory_bytes) * share);
  return resolved;
}

absl::StatusOr<v1::Placement> PlaceOnWorker(const v1::ResourceSpec& request,
                                            const WorkerView& worker) {
  const ResolvedRequest need = ResolveRequest(request, worker.capacity);
  for (Resource r : kResources) {
    if (Of(need, r) > Of(worker.capacity, r)) {
      return absl::FailedPreconditionError(
          absl::StrCat("needs ", Amount(r, Of(need, r)), " ", ResourceName(r), "; worker ",
                       worker.worker_id, " has ", Amount(r, Of(worker.capacity, r))));
    }
  }
  for (Resource r : kResources) {
    if (Of(need, r) > Of(worker.free, r)) {
      return absl::ResourceExhaustedError(absl::StrCat("needs ", Amount(r, Of(need, r)), " ",
                                                       ResourceName(r), ", ",
                                                       Amount(r, Of(worker.free, r)), " free"));
    }
  }
  v1::Placement placement;
  placement.set_worker_id(worker.worker_id);
  for (int i = 0; i < need.gpus; ++i) {
    placement.add_gpu_indices(worker.free.gpus[i].index);
    placement.add_gpu_uuids(worker.free.gpus[i].uuid);
  }
  placement.set_cpus(need.cpus);
  placement.set_memory_bytes(need.memory_bytes);
  return placement;
}

void Hold(const v1::Placement& placement, WorkerView& worker) {
  worker.free = FreeResources(worker.free, {&placement});
}

namespace {

int CountRanksThatFit(const v1::ResourceSpec& request, const WorkerResources& capacity,
                      const WorkerResources& resources, int limit) {
  const ResolvedRequest need = ResolveRequest(request, capacity);
  int64_t fit = std::max(0, limit);
  for (Resource r : kResources) {
    if (Of(need, r) > Of(capacity, r)) return 0;  // never on this worker
    if (Of(need, r) > 0) fit = std::min(fit, Of(resources, r) / Of(need, r));
  }
  return static_cast<int>(fit);
}

}  // namespace

int ReplicasOf(const v1::JobSpec& spec) { return std::max(1, spec.resources().replicas()); }

absl::StatusOr<std::vector<v1::Placement>> PlaceGang(const v1::ResourceSpec& request, int replicas,
                                                     const std::vector<WorkerView>& workers) {
  if (replicas < 1) {
    return absl::InvalidArgumentError(absl::StrCat("replicas: at least 1, not ", replicas));
  }
  const std::string needs = absl::StrCat("needs ", replicas, " ranks of ", RankNeeds(request));
  // Could the workers hold it at all, idle?
  int idle_room = 0;
  for (const WorkerView& worker : workers) {
    idle_room += CountRanksThatFit(request, worker.capacity, worker.capacity, replicas);
  }
  if (idle_room < replicas) {
    return absl::FailedPreconditionError(absl::StrCat(needs, "; the live workers could hold ",
                                                      idle_room, " even with nothing running"));
  }
  struct Room {
    const WorkerView* worker;
    int ranks;  // that fit now: counted beyond `replicas` so that best fit sees the real room
  };
  std::vector<Room> rooms;
  int room_now = 0;
  for (const WorkerView& worker : workers) {
    const int ranks = CountRanksThatFit(request, worker.capacity, worker.free,
                                        std::min(kMaxRanks, std::max(0, worker.slots)));
    room_now += ranks;
    if (ranks > 0) rooms.push_back({&worker, ranks});
  }
  if (room_now < replicas) {
    return absl::ResourceExhaustedError(
        absl::StrCat(needs, "; the live workers have room for ", room_now));
  }
  // Most room first: the fewest workers that hold every rank are the first k of this order.
  std::sort(rooms.begin(), rooms.end(), [](const Room& a, const Room& b) {
    if (a.ranks != b.ranks) return a.ranks > b.ranks;
    return a.worker->worker_id < b.worker->worker_id;
  });
  size_t first_k = 0;  // workers filled whole
  int placed = 0;
  while (placed + rooms[first_k].ranks < replicas) {
    placed += rooms[first_k].ranks;
    ++first_k;
  }
  // The rest goes to the worker with the least room that holds it all (best fit).
  const int rest = replicas - placed;
  size_t last = first_k;
  for (size_t i = first_k; i < rooms.size(); ++i) {
    if (rooms[i].ranks >= rest && (rooms[i].ranks < rooms[last].ranks ||
                                   (rooms[i].ranks == rooms[last].ranks &&
                                    rooms[i].worker->worker_id < rooms[last].worker->worker_id))) {
      last = i;
    }
  }
  std::vector<v1::Placement> gang;
  auto take = [&](const Room& room, int count) {
    for (v1::Placement& placement : PlaceRanks(request, *room.worker, count)) {
      placement.set_rank(static_cast<int>(gang.size()));
      gang.push_back(std::move(placement));
    }
  };
  for (size_t i = 0; i < first_k; ++i) take(rooms[i], rooms[i].ranks);
  take(rooms[last], rest);
  return gang;
}

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

int PickJob(const std::vector<v1::Job>& queue, const WorkerView& worker, v1::Placement* placement) {
  for (size_t i = 0; i < queue.size(); ++i) {
    absl::StatusOr<v1::Placement> placed = PlaceOnWorker(queue[i].spec().resources(), worker);
    if (placed.ok()) {
      *placement = std::move(*placed);
      return static_cast<int>(i);
    }
  }
  return -1;
}

std::string WaitingReason(const v1::Job& job, int jobs_ahead,
                          const std::vector<WorkerView>& workers) {
  if (workers.empty()) return "no worker is registered";
  const std::string ahead =
      jobs_ahead > 0 ? absl::StrCat(jobs_ahead, " job(s) ahead in the queue") : "";
  const v1::ResourceSpec& request = job.spec().resources();
  if (const int replicas = ReplicasOf(job.spec()); replicas > 1) {
    absl::StatusOr<std::vector<v1::Placement>> gang = PlaceGang(request, replicas, workers);
    if (gang.ok()) return ahead.empty() ? "starting at the next heartbeat of a worker" : ahead;
    return absl::StrCat(ahead, ahead.empty() ? "" : "; ", gang.status().message());
  }
  // Workers that could hold the job once their jobs finish, and the one closest to it: the
  // resource that stops it there comes latest in the checking order, with the most of it free.
  bool fits_somewhere = false;
  const WorkerView* closest = nullptr;
  Resource closest_stop = Resource::kGpus;
  for (const WorkerView& worker : workers) {
    absl::StatusOr<v1::Placement> placed = PlaceOnWorker(request, worker);
    if (placed.ok()) return ahead.empty() ? "starting at the next heartbeat of a worker" : ahead;
    if (!absl::IsResourceExhausted(placed.status())) continue;
    fits_somewhere = true;
    const ResolvedRequest need = ResolveRequest(request, worker.capacity);
    Resource stop = Resource::kGpus;
    for (Resource r : kResources) {
      if (Of(need, r) > Of(worker.free, r)) {
        stop = r;
        break;
      }
    }
    if (closest == nullptr || stop > closest_stop ||
        (stop == closest_stop && Of(worker.free, stop) > Of(closest->free, stop))) {
      closest = &worker;
      closest_stop = stop;
    }
  }
  const std::string prefix = ahead.empty() ? "" : absl::StrCat(ahead, "; ");
  if (fits_somewhere) {
    const ResolvedRequest need = ResolveRequest(request, closest->capacity);
    return absl::StrCat(prefix, "needs ", Amount(closest_stop, Of(need, closest_stop)), " ",
                        ResourceName(closest_stop), ", the most free on one worker is ",
                        Amount(closest_stop, Of(closest->free, closest_stop)));
  }
  // No worker could ever hold it: name the first resource no worker has enough of.
  for (Resource r : kResources) {
    int64_t largest = 0;
    int64_t need_there = 0;
    for (const WorkerView& worker : workers) {
      if (Of(worker.capacity, r) >= largest) {
        largest = Of(worker.capacity, r);
        need_there = Of(ResolveRequest(request, worker.capacity), r);
      }
    }
    bool any = false;
    for (const WorkerView& worker : workers) {
      any = any || Of(ResolveRequest(request, worker.capacity), r) <= Of(worker.capacity, r);
    }
    if (!any) {
      return absl::StrCat(prefix, "needs ", Amount(r, need_there), " ", ResourceName(r),
                          " on one worker; the largest worker has ", Amount(r, largest));
    }
  }
  return absl::StrCat(prefix, "no one worker has its gpus, cpus and memory together");
}

}  // namespace stoker
