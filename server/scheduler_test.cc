#include "server/scheduler.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

v1::Job MakeJob(const std::string& id, int priority, int64_t submit_ms, int gpus = 0) {
  v1::Job job;
  job.set_id(id);
  job.mutable_spec()->set_priority(priority);
  job.mutable_spec()->mutable_resources()->set_gpus(gpus);
  job.set_submit_time_unix_ms(submit_ms);
  return job;
}

std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const v1::Job& job : jobs) ids.push_back(job.id());
  return ids;
}

TEST(SchedulerTest, PriorityThenSubmitOrder) {
  std::vector<v1::Job> jobs = {MakeJob("j-000001", 0, 100), MakeJob("j-000002", 5, 300),
                               MakeJob("j-000003", 0, 50),  MakeJob("j-000004", 5, 200),
                               MakeJob("j-000005", -1, 10), MakeJob("j-000006", 0, 100)};
  SortForScheduling(jobs);
  EXPECT_EQ(Ids(jobs), (std::vector<std::string>{"j-000004", "j-000002", "j-000003", "j-000001",
                                                 "j-000006", "j-000005"}));
}

constexpr int64_t kGiB = int64_t{1} << 30;

WorkerView Worker(const std::string& id, int cpus, int64_t memory_bytes, int gpus) {
  WorkerView view;
  view.worker_id = id;
  view.capacity.cpus = cpus;
  view.capacity.memory_bytes = memory_bytes;
  for (int i = 0; i < gpus; ++i) view.capacity.gpus.push_back({i, absl::StrCat("GPU-", i)});
  view.free = view.capacity;
  return view;
}

v1::ResourceSpec Request(int gpus, int cpus = 0, int64_t memory_mib = 0) {
  v1::ResourceSpec spec;
  spec.set_gpus(gpus);
  spec.set_cpus(cpus);
  spec.set_memory_mib(memory_mib);
  return spec;
}

TEST(SchedulerTest, PlacesWholeJobsAndBackfills) {
  std::vector<v1::Job> queue = {MakeJob("big", 9, 1, 4), MakeJob("two", 5, 2, 2),
                                MakeJob("cpu", 0, 3, 0)};
  v1::Placement placement;
  WorkerView eight = Worker("w8", 16, 64 * kGiB, 8);
  EXPECT_EQ(PickJob(queue, eight, &placement), 0);  // room for the 4-GPU job
  EXPECT_EQ(std::vector<int>(placement.gpu_indices().begin(), placement.gpu_indices().end()),
            (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(placement.gpu_uuids(0), "GPU-0");
  WorkerView two = Worker("w2", 4, 16 * kGiB, 2);
  EXPECT_EQ(PickJob(queue, two, &placement), 1);  // the 4-GPU job does not fit; the 2-GPU one does
  WorkerView cpu = Worker("c", 2, 8 * kGiB, 0);
  EXPECT_EQ(PickJob(queue, cpu, &placement), 2);  // a CPU worker takes the CPU job
  EXPECT_EQ(placement.worker_id(), "c");
  EXPECT_EQ(PickJob({}, eight, &placement), -1);
}

TEST(SchedulerTest, DefaultsResolveAgainstTheWorker) {
  const WorkerResources capacity = Worker("w", 16, 64 * kGiB, 8).capacity;
  // A CPU job by default has the worker to itself, as when one job ran per worker.
  ResolvedRequest cpu = ResolveRequest(Request(0), capacity);
  EXPECT_EQ(cpu.cpus, 16);
  EXPECT_EQ(cpu.memory_bytes, 64 * kGiB);
  // Asking for cores gets their share of the memory.
  ResolvedRequest four = ResolveRequest(Request(0, 4), capacity);
  EXPECT_EQ(four.cpus, 4);
  EXPECT_EQ(four.memory_bytes, 16 * kGiB);
  // A GPU job gets its GPUs' share of cores and memory.
  ResolvedRequest gpu = ResolveRequest(Request(2), capacity);
  EXPECT_EQ(gpu.gpus, 2);
  EXPECT_EQ(gpu.cpus, 4);
  EXPECT_EQ(gpu.memory_bytes, 16 * kGiB);
  // At least one core, even with more GPUs than cores.
  EXPECT_EQ(ResolveRequest(Request(1), Worker("w", 2, kGiB, 8).capacity).cpus, 1);
  // Explicit values are taken as written.
  ResolvedRequest explicit_request = ResolveRequest(Request(1, 3, 512), capacity);
  EXPECT_EQ(explicit_request.cpus, 3);
  EXPECT_EQ(explicit_request.memory_bytes, 512 << 20);
}

TEST(SchedulerTest, PacksUntilFullAndNeverOverCommits) {
  WorkerView worker = Worker("w", 2, 8 * kGiB, 2);
  // One-core CPU jobs: two fit on two cores, a third does not.
  absl::StatusOr<v1::Placement> a = PlaceOnWorker(Request(0, 1), worker);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->cpus(), 1);
  EXPECT_EQ(a->memory_bytes(), 4 * kGiB);
  Hold(*a, worker);
  absl::StatusOr<v1::Placement> b = PlaceOnWorker(Request(0, 1), worker);
  ASSERT_TRUE(b.ok()) << b.status();
  Hold(*b, worker);
  absl::StatusOr<v1::Placement> c = PlaceOnWorker(Request(0, 1), worker);
  EXPECT_TRUE(absl::IsResourceExhausted(c.status())) << c.status();
  EXPECT_EQ(c.status().message(), "needs 1 cpus, 0 free");
  // A default CPU job wants the whole worker: it waits for both.
  EXPECT_TRUE(absl::IsResourceExhausted(PlaceOnWorker(Request(0), worker).status()));

  // Memory is checked on its own: cores left, memory not.
  WorkerView memory = Worker("m", 4, 4 * kGiB, 0);
  absl::StatusOr<v1::Placement> big = PlaceOnWorker(Request(0, 1, 3 * 1024), memory);
  ASSERT_TRUE(big.ok());
  Hold(*big, memory);
  absl::StatusOr<v1::Placement> more = PlaceOnWorker(Request(0, 1, 2 * 1024), memory);
  EXPECT_EQ(more.status().message(), "needs 2.0 GiB memory, 1.0 GiB free");
  EXPECT_TRUE(PlaceOnWorker(Request(0, 1, 1024), memory).ok());
}

TEST(SchedulerTest, EachGpuBelongsToOneJob) {
  WorkerView worker = Worker("w", 8, 32 * kGiB, 3);
  std::set<int> seen;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::Placement> placed = PlaceOnWorker(Request(1), worker);
    ASSERT_TRUE(placed.ok()) << placed.status();
    ASSERT_EQ(placed->gpu_indices_size(), 1);
    EXPECT_TRUE(seen.insert(placed->gpu_indices(0)).second) << placed->gpu_indices(0);
    Hold(*placed, worker);
  }
  EXPECT_EQ(PlaceOnWorker(Request(1), worker).status().message(), "needs 1 GPUs, 0 free");
  // A job that ends gives its GPU back: the free list is the capacity less the held placements.
  v1::Placement held_one, held_two;
  held_one.add_gpu_indices(0);
  held_two.add_gpu_indices(2);
  WorkerResources free = FreeResources(worker.capacity, {&held_one, &held_two});
  ASSERT_EQ(free.gpus.size(), 1u);
  EXPECT_EQ(free.gpus[0].index, 1);
  // More GPUs than the worker has can never fit.
  EXPECT_TRUE(absl::IsFailedPrecondition(PlaceOnWorker(Request(4), worker).status()));
}

TEST(SchedulerTest, WaitingReasonNamesTheResource) {
  v1::Job job = MakeJob("j", 0, 1, 4);
  EXPECT_EQ(WaitingReason(job, 0, {}), "no worker is registered");
  EXPECT_EQ(WaitingReason(job, 0, {Worker("a", 4, kGiB, 2), Worker("b", 4, kGiB, 1)}),
            "needs 4 GPUs on one worker; the largest worker has 2");
  // Fits an idle worker: only the queue holds it back.
  EXPECT_EQ(WaitingReason(job, 3, {Worker("a", 8, kGiB, 8)}), "3 job(s) ahead in the queue");

  v1::Job two = MakeJob("j", 0, 1, 2);
  WorkerView busy = Worker("a", 8, 8 * kGiB, 2);
  v1::Placement held;
  held.add_gpu_indices(0);
  held.set_cpus(1);
  Hold(held, busy);
  WorkerView other = Worker("b", 8, 8 * kGiB, 0);
  EXPECT_EQ(WaitingReason(two, 0, {busy, other}), "needs 2 GPUs, the most free on one worker is 1");
  EXPECT_EQ(WaitingReason(two, 1, {busy, other}),
            "1 job(s) ahead in the queue; needs 2 GPUs, the most free on one worker is 1");

  v1::Job cores = MakeJob("c", 0, 1, 0);
  cores.mutable_spec()->mutable_resources()->set_cpus(8);
  EXPECT_EQ(WaitingReason(cores, 0, {busy}), "needs 8 cpus, the most free on one worker is 7");
  cores.mutable_spec()->mutable_resources()->set_cpus(16);
  EXPECT_EQ(WaitingReason(cores, 0, {busy}),
            "needs 16 cpus on one worker; the largest worker has 8");
}

// Issue 16: data-parallel jobs are placed whole (every rank) or not at all.
std::vector<std::pair<std::string, int>> WorkersAndRanks(
    const std::vector<v1::Placement>& placements) {
  std::vector<std::pair<std::string, int>> out;
  for (const v1::Placement& p : placements) out.emplace_back(p.worker_id(), p.rank());
  return out;
}

TEST(SchedulerTest, AGangFitsAcrossTwoWorkers) {
  const std::vector<WorkerView> workers = {Worker("a", 1, 2 * kGiB, 0),
                                           Worker("b", 1, 2 * kGiB, 0)};
  absl::StatusOr<std::vector<v1::Placement>> gang = PlaceGang(Request(0, 1), 2, workers);
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ(WorkersAndRanks(*gang), (std::vector<std::pair<std::string, int>>{{"a", 0}, {"b", 1}}));
  EXPECT_EQ((*gang)[1].cpus(), 1);
  EXPECT_EQ((*gang)[1].memory_bytes(), 2 * kGiB);  // its cores' share of b's memory
  // Several ranks share a worker with room for them: 2 free cores take two 1-core ranks.
  gang = PlaceGang(Request(0, 1), 2, {Worker("c", 2, 2 * kGiB, 0)});
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ(WorkersAndRanks(*gang), (std::vector<std::pair<std::string, int>>{{"c", 0}, {"c", 1}}));
  // GPUs are distinct per rank on one worker.
  gang = PlaceGang(Request(1), 2, {Worker("g", 4, 4 * kGiB, 2)});
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ((*gang)[0].gpu_indices(0), 0);
  EXPECT_EQ((*gang)[1].gpu_indices(0), 1);
}

TEST(SchedulerTest, APartialFitHoldsNothingAndSaysWhy) {
  std::vector<WorkerView> workers = {Worker("a", 2, 2 * kGiB, 0), Worker("b", 2, 2 * kGiB, 0)};
  v1::Placement busy;
  busy.set_cpus(2);
  Hold(busy, workers[1]);
  absl::StatusOr<std::vector<v1::Placement>> gang = PlaceGang(Request(0, 1), 4, workers);
  EXPECT_TRUE(absl::IsResourceExhausted(gang.status())) << gang.status();
  EXPECT_EQ(gang.status().message(), "needs 4 ranks of 1 cpus; the live workers have room for 2");
  // More than the workers could hold even idle can never run.
  gang = PlaceGang(Request(0, 1), 5, workers);
  EXPECT_TRUE(absl::IsFailedPrecondition(gang.status())) << gang.status();
  EXPECT_EQ(gang.status().message(),
            "needs 5 ranks of 1 cpus; the live workers could hold 4 even with nothing running");
  // Every resource bounds the room: memory (3 GiB for 1 GiB ranks), GPUs (3 for 2-GPU ranks).
  EXPECT_EQ(PlaceGang(Request(0, 1, 1024), 4, {Worker("m", 8, 3 * kGiB, 0)}).status().message(),
            "needs 4 ranks of 1 cpus, 1.0 GiB memory; the live workers could hold 3 even with "
            "nothing running");
  EXPECT_EQ(PlaceGang(Request(2), 2, {Worker("g", 8, 8 * kGiB, 3)}).status().message(),
            "needs 2 ranks of 2 GPUs; the live workers could hold 1 even with nothing running");
  // A worker's slots bound the ranks it takes.
  workers[0].slots = 1;
  gang = PlaceGang(Request(0, 1), 2, workers);
  EXPECT_EQ(gang.status().message(), "needs 2 ranks of 1 cpus; the live workers have room for 1");
  EXPECT_EQ(PlaceGang(Request(0, 1), 0, workers).status().code(),
            absl::StatusCode::kInvalidArgument);

  v1::Job job = MakeJob("g", 0, 1);
  job.mutable_spec()->mutable_resources()->set_cpus(1);
  job.mutable_spec()->mutable_resources()->set_replicas(4);
  EXPECT_EQ(WaitingReason(job, 1, workers),
            "1 job(s) ahead in the queue; needs 4 ranks of 1 cpus; the live workers have room for "
            "1");
  job.mutable_spec()->mutable_resources()->set_replicas(2);
  workers[0].slots = 2;
  EXPECT_EQ(WaitingReason(job, 0, workers), "starting at the next heartbeat of a worker");
}

TEST(SchedulerTest, TwoGangsThatEachNeedMostOfTheClusterDoNotDeadlock) {
  // 4 one-core slots on two workers; two gangs of 3 ranks each. Placed all or nothing in
  // scheduling order, the first runs whole and the second waits holding nothing.
  std::vector<WorkerView> workers = {Worker("a", 2, 2 * kGiB, 0), Worker("b", 2, 2 * kGiB, 0)};
  absl::StatusOr<std::vector<v1::Placement>> first = PlaceGang(Request(0, 1), 3, workers);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 3u);
  for (const v1::Placement& p : *first) {
    for (WorkerView& worker : workers) {
      if (worker.worker_id == p.worker_id()) Hold(p, worker);
    }
  }
  absl::StatusOr<std::vector<v1::Placement>> second = PlaceGang(Request(0, 1), 3, workers);
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  EXPECT_EQ(workers[0].free.cpus + workers[1].free.cpus, 1);  // the second gang holds nothing
  v1::Job waiting = MakeJob("second", 0, 2);
  waiting.mutable_spec()->mutable_resources()->set_cpus(1);
  waiting.mutable_spec()->mutable_resources()->set_replicas(3);
  EXPECT_EQ(WaitingReason(waiting, 0, workers),
            "needs 3 ranks of 1 cpus; the live workers have room for 1");
  // Once the first gang ends, the second fits.
  for (WorkerView& worker : workers) worker.free = worker.capacity;
  EXPECT_TRUE(PlaceGang(Request(0, 1), 3, workers).ok());
}

TEST(SchedulerTest, RanksArePackedOntoFewWorkersDeterministically) {
  const std::vector<WorkerView> workers = {
      Worker("w1", 1, 8 * kGiB, 0), Worker("w2", 4, 8 * kGiB, 0), Worker("w3", 2, 8 * kGiB, 0)};
  using Ranks = std::vector<std::pair<std::string, int>>;
  // Three ranks fit the 4-core worker alone.
  absl::StatusOr<std::vector<v1::Placement>> gang = PlaceGang(Request(0, 1, 512), 3, workers);
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ(WorkersAndRanks(*gang), (Ranks{{"w2", 0}, {"w2", 1}, {"w2", 2}}));
  // Two ranks go to the smallest worker that holds both, leaving w2's 4 cores whole.
  gang = PlaceGang(Request(0, 1, 512), 2, workers);
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ(WorkersAndRanks(*gang), (Ranks{{"w3", 0}, {"w3", 1}}));
  // Five: w2 fills up, the fifth rank takes w1 (best fit) rather than half of w3.
  gang = PlaceGang(Request(0, 1, 512), 5, workers);
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ(WorkersAndRanks(*gang), (Ranks{{"w2", 0}, {"w2", 1}, {"w2", 2}, {"w2", 3}, {"w1", 4}}));
  // The order of the workers given does not matter.
  const std::vector<WorkerView> reversed(workers.rbegin(), workers.rend());
  absl::StatusOr<std::vector<v1::Placement>> again = PlaceGang(Request(0, 1, 512), 5, reversed);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(WorkersAndRanks(*again), WorkersAndRanks(*gang));
  // Equal room: the lower worker id first.
  gang = PlaceGang(Request(0, 1), 2, {Worker("y", 1, kGiB, 0), Worker("x", 1, kGiB, 0)});
  ASSERT_TRUE(gang.ok());
  EXPECT_EQ(WorkersAndRanks(*gang), (Ranks{{"x", 0}, {"y", 1}}));
}

}  // namespace
}  // namespace stoker
