// The Coordinator's placement and the ranks of data-parallel jobs (see coordinator.h and
// gang.h): walking the queue at a heartbeat (Assign), placing a gang whole, delivering its ranks
// to the workers that did not ask, ending an attempt's ranks, and the attempts' rendezvous
// stores. Kept apart from coordinator.cc, which holds the lifecycle every job shares.
#include <algorithm>
#include <deque>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/scheduler.h"

namespace stoker {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// The longest a RendezvousGet waits, whatever it asks for.
constexpr absl::Duration kMaxRendezvousWait = absl::Seconds(10);

}  // namespace

absl::StatusOr<std::vector<v1::Assignment>> Coordinator::Assign(const std::string& worker_id) {
  std::vector<v1::Assignment> assignments;
  // The live workers' free resources and slots, updated as jobs are placed.
  std::map<std::string, WorkerView> views;
  for (const auto& [id, worker] : workers_) {
    if (!worker.lost && !worker.restored) views.emplace(id, ViewOf(id, worker));
  }
  WorkerView& view = views.at(worker_id);
  // A worker with no room takes nothing: no need to read the queue (a gang that fits elsewhere
  // is placed by those workers' heartbeats).
  if (view.slots <= 0 || (view.free.gpus.empty() && view.free.cpus <= 0)) {
    workers_[worker_id].free_slots = view.slots;
    return assignments;
  }
  absl::StatusOr<std::vector<v1::Job>> queue = store_->QueuedInOrder();
  if (!queue.ok()) return queue.status();
  std::set<std::string> queued;
  for (const v1::Job& job : *queue) queued.insert(job.id());
  std::erase_if(gang_waiting_since_,
                [&](const auto& entry) { return !queued.contains(entry.first); });
  const absl::Time now = absl::Now();
  QuotaState quotas = CurrentQuotaState();
  // The fair-share walk (policy/fair_share.h): the queue split by team, each team's jobs in the
  // store's (priority, submit) order; the next job is the first of the teams' first jobs by
  // SchedulesBefore with the shares as they stand, a placed job's team's share raised at once.
  std::map<std::string, std::deque<v1::Job*>> by_team;
  for (v1::Job& job : *queue) by_team[job.spec().team()].push_back(&job);
  auto next = [&]() -> v1::Job* {
    std::deque<v1::Job*>* best = nullptr;
    QueuedJob best_key;
    for (auto& [team, jobs] : by_team) {
      if (jobs.empty()) continue;
      const v1::Job& head = *jobs.front();
      QueuedJob key{head.id(), team, head.spec().priority(), head.submit_time_unix_ms()};
      if (best == nullptr || SchedulesBefore(key, best_key, quotas.shares)) {
        best = &jobs;
        best_key = std::move(key);
      }
    }
    if (best == nullptr) return nullptr;
    v1::Job* job = best->front();
    best->pop_front();
    return job;
  };
  while (v1::Job* next_job = next()) {
    v1::Job& job = *next_job;
    if (IsGang(job.spec())) {
      absl::Status why_not;
      absl::StatusOr<bool> placed =
          PlaceGangJob(job, worker_id, views, assignments, &why_not, quotas);
      if (!placed.ok()) return placed.status();
      if (*placed) {
        gang_waiting_since_.erase(job.id());
        continue;
      }
      // Could it run on these workers idle (FAILED_PRECONDITION says not)? Then it waits for
      // room, and after a while no job behind it takes any (the cluster drains for it).
      if (absl::IsFailedPrecondition(why_not)) continue;
      const absl::Time since = gang_waiting_since_.try_emplace(job.id(), now).first->second;
      if (now - since >= options_.gang_backfill_limit) break;
      continue;
    }
    if (view.slots <= 0) continue;
    absl::StatusOr<v1::Placement> placed = PlaceOnWorker(job.spec().resources(), view);
    if (!placed.ok()) continue;
    const v1::Placement placement = std::move(*placed);
    // Charged what it is granted; past its team's quota it waits (FillQueueInfo says so).
    const std::string& team = job.spec().team();
    if (auto quota = quotas.quotas.find(team); quota != quotas.quotas.end()) {
      if (!QuotaAdmits(team, quota->second, quotas.usage[team], ChargeOf(placement)).ok()) {
        continue;
      }
    }
    Charge(quotas, team, ChargeOf(placement));
    if (observer_ != nullptr) {
      observer_->JobAssigned(std::max<int64_t>(0, NowMs() - job.submit_time_unix_ms()) / 1000.0);
    }
    job.set_state(v1::JOB_STATE_RUNNING);
    job.set_attempt(job.attempt() + 1);
    job.set_worker_id(worker_id);
    if (job.start_time_unix_ms() == 0) job.set_start_time_unix_ms(NowMs());
    job.clear_queue_position();
    job.clear_waiting_reason();
    *job.mutable_placement() = placement;
    job.clear_rank_placements();
    STOKER_RETURN_IF_ERROR(
        SaveAndNotify(job, {MakeEvent(v1::EVENT_TYPE_LOG,
                                      absl::StrCat("attempt ", job.attempt(), " started on worker ",
                                                   worker_id, " with ", PlacementText(placement)),
                                      job.attempt())}));
    workers_[worker_id].running[{job.id(), job.attempt(), 0}] = {placement, true, now};
    Hold(placement, view);
    view.slots -= 1;
    assignments.push_back(AssignmentFor(job, placement, 0));
  }
  workers_[worker_id].free_slots = view.slots;
  return assignments;
}

std::string Coordinator::TeamOfJob(const std::string& job_id) {
  if (auto it = job_teams_.find(job_id); it != job_teams_.end()) return it->second;
  absl::StatusOr<v1::Job> job = store_->Get(job_id);
  std::string team = job.ok() ? job->spec().team() : "";
  job_teams_[job_id] = team;
  return team;
}

std::map<std::string, ResourceAmounts> Coordinator::TeamUsageLocked() {
  std::map<std::string, ResourceAmounts> usage;
  std::set<std::string> placed;
  for (const auto& [id, worker] : workers_) {
    for (const auto& [key, held] : worker.running) {
      usage[TeamOfJob(key.job_id)] += ChargeOf(held.placement);
      placed.insert(key.job_id);
    }
  }
  std::erase_if(job_teams_, [&](const auto& entry) { return !placed.contains(entry.first); });
  return usage;
}

std::map<std::string, ResourceAmounts> Coordinator::TeamUsage() {
  absl::MutexLock lock(&mu_);
  return TeamUsageLocked();
}

v1::Assignment Coordinator::AssignmentFor(const v1::Job& job, const v1::Placement& placement,
                                          int rank) const {
  v1::Assignment assignment;
  assignment.set_job_id(job.id());
  assignment.set_attempt(job.attempt());
  *assignment.mutable_spec() = job.spec();
  assignment.set_resume_step(job.checkpoint_step());
  *assignment.mutable_placement() = placement;
  assignment.set_rank(rank);
  assignment.set_replicas(ReplicasOf(job.spec()));
  return assignment;
}

absl::StatusOr<bool> Coordinator::PlaceGangJob(v1::Job job, const std::string& caller,
                                               std::map<std::string, WorkerView>& views,
                                               std::vector<v1::Assignment>& assignments,
                                               absl::Status* why_not, QuotaState& quotas) {
  std::vector<WorkerView> live;
  for (const auto& [id, view] : views) live.push_back(view);
  absl::StatusOr<std::vector<v1::Placement>> gang =
      PlaceGang(job.spec().resources(), ReplicasOf(job.spec()), live);
  if (!gang.ok()) {
    *why_not = gang.status();
    return false;  // nothing is held: the gang waits whole
  }
  const std::string& team = job.spec().team();
  ResourceAmounts charge;
  for (const v1::Placement& placement : *gang) charge += ChargeOf(placement);
  if (auto quota = quotas.quotas.find(team); quota != quotas.quotas.end()) {
    if (absl::Status admitted = QuotaAdmits(team, quota->second, quotas.usage[team], charge);
        !admitted.ok()) {
      *why_not = absl::FailedPreconditionError(admitted.message());
      return false;
    }
  }
  Charge(quotas, team, charge);
  if (observer_ != nullptr) {
    observer_->JobAssigned(
        std::max<int64_t>(0, absl::ToUnixMillis(absl::Now()) - job.submit_time_unix_ms()) / 1000.0);
  }
  const absl::Time now = absl::Now();
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempt(job.attempt() + 1);
  job.set_worker_id(gang->front().worker_id());
  if (job.start_time_unix_ms() == 0) job.set_start_time_unix_ms(absl::ToUnixMillis(now));
  job.clear_queue_position();
  job.clear_waiting_reason();
  *job.mutable_placement() = gang->front();
  job.clear_rank_placements();
  for (const v1::Placement& placement : *gang) *job.add_rank_placements() = placement;
  STOKER_RETURN_IF_ERROR(
      SaveAndNotify(job, {MakeEvent(v1::EVENT_TYPE_LOG,
                                    absl::StrCat("attempt ", job.attempt(), " started with ",
                                                 gang->size(), " ranks: ", GangPlacementText(job)),
                                    job.attempt())}));
  for (const v1::Placement& placement : *gang) {
    const bool here = placement.worker_id() == caller;
    WorkerEntry& worker = workers_[placement.worker_id()];
    worker.running[{job.id(), job.attempt(), placement.rank()}] = {
        placement, here, here ? now : absl::InfinitePast(), now};
    WorkerView& view = views.at(placement.worker_id());
    Hold(placement, view);
    view.slots -= 1;
    if (here) {
      assignments.push_back(AssignmentFor(job, placement, placement.rank()));
    } else {
      worker.free_slots = view.slots;
    }
  }
  return true;
}

std::vector<v1::Assignment> Coordinator::DeliverPending(const std::string& worker_id) {
  std::vector<v1::Assignment> delivered;
  Ledger& ledger = workers_[worker_id].running;
  const absl::Time now = absl::Now();
  for (auto it = ledger.begin(); it != ledger.end();) {
    if (it->second.delivered) {
      ++it;
      continue;
    }
    const RankKey& key = it->first;
    absl::StatusOr<v1::Job> job = store_->Get(key.job_id);
    if (!job.ok() || job->state() != v1::JOB_STATE_RUNNING ||
        !RunsRank(*job, worker_id, key.attempt, key.rank)) {
      it = ledger.erase(it);  // the attempt ended before this rank started
      continue;
    }
    it->second.delivered = true;
    it->second.delivered_at = now;
    delivered.push_back(AssignmentFor(*job, it->second.placement, key.rank));
    ++it;
  }
  return delivered;
}

void Coordinator::EndAttempt(const v1::Job& job, const std::string& ended_worker, int ended_rank) {
  for (auto& [worker_id, worker] : workers_) {
    std::erase_if(worker.running, [&](const auto& entry) {
      const RankKey& key = entry.first;
      if (key.job_id != job.id() || key.attempt != job.attempt()) return false;
      if (!entry.second.delivered) return true;
      return worker_id == ended_worker && (ended_rank < 0 || key.rank == ended_rank);
    });
  }
  rendezvous_.erase({job.id(), job.attempt()});
  rendezvous_changed_.SignalAll();  // waiters of this attempt are refused from now on
}

void Coordinator::RequeueUndelivered() {
  const absl::Time now = absl::Now();
  std::vector<std::pair<std::string, RankKey>> late;
  for (const auto& [worker_id, worker] : workers_) {
    if (worker.lost) continue;  // its ranks went with it
    for (const auto& [key, held] : worker.running) {
      if (!held.delivered && now - held.placed_at > options_.lease)
        late.emplace_back(worker_id, key);
    }
  }
  for (const auto& [worker_id, key] : late) {
    absl::StatusOr<v1::Job> job = store_->Get(key.job_id);
    if (!job.ok() || job->state() != v1::JOB_STATE_RUNNING ||
        !RunsRank(*job, worker_id, key.attempt, key.rank)) {
      continue;  // dropped at the worker's next heartbeat
    }
    // The gang never ran whole: not the job's fault, so not counted.
    job->set_released_attempts(job->released_attempts() + 1);
    (void)Requeue(*job,
                  absl::StrCat("worker ", worker_id, " did not take rank ", key.rank, " within ",
                               Rounded(options_.lease),
                               " (no heartbeat since it was placed there; draining?); not counted "
                               "against max_retries"),
                  worker_id, key.rank);
  }
}

absl::Status Coordinator::RendezvousSet(const v1::RendezvousSetRequest& request) {
  STOKER_RETURN_IF_ERROR(RequireId(request.job_id(), "job_id"));
  STOKER_RETURN_IF_ERROR(CheckRendezvousKey(request.key(), "key"));
  absl::MutexLock lock(&mu_);
  STOKER_RETURN_IF_ERROR(
      FencedJob(request.worker_id(), request.job_id(), request.attempt(), request.rank()).status());
  RendezvousTable& table = rendezvous_[{request.job_id(), request.attempt()}];
  STOKER_RETURN_IF_ERROR(table.Set(request.key(), request.value()));
  rendezvous_changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<v1::RendezvousGetResponse> Coordinator::RendezvousGet(
    const v1::RendezvousGetRequest& request) {
  STOKER_RETURN_IF_ERROR(RequireId(request.job_id(), "job_id"));
  if (request.keys_size() == 0 || request.keys_size() > RendezvousTable::kMaxKeys) {
    return absl::InvalidArgumentError(absl::StrCat("keys: 1 to ", RendezvousTable::kMaxKeys,
                                                   " keys (got ", request.keys_size(), ")"));
  }
  for (int i = 0; i < request.keys_size(); ++i) {
    STOKER_RETURN_IF_ERROR(CheckRendezvousKey(request.keys(i), absl::StrCat("keys[", i, "]")));
  }
  if (request.wait_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait_ms: must not be negative (got ", request.wait_ms(), ")"));
  }
  const absl::Time deadline =
      absl::Now() + std::min(absl::Milliseconds(request.wait_ms()), kMaxRendezvousWait);
  v1::RendezvousGetResponse response;
  absl::MutexLock lock(&mu_);
  while (true) {
    // Fenced on every wake: an attempt that ended stops its waiters.
    STOKER_RETURN_IF_ERROR(
        FencedJob(request.worker_id(), request.job_id(), request.attempt(), request.rank())
            .status());
    auto table = rendezvous_.find({request.job_id(), request.attempt()});
    std::vector<std::string> values;
    if (table != rendezvous_.end() && table->second.Get(request.keys(), &values)) {
      response.set_ready(true);
      for (std::string& value : values) response.add_values(std::move(value));
      return response;
    }
    if (shutting_down_ || absl::Now() >= deadline) return response;  // ready false
    rendezvous_changed_.WaitWithDeadline(&mu_, deadline);
  }
}

}  // namespace stoker
