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
  std::erase_if(gang_waiting_since_,
                [&](const auto& entry) { return queue_.Find(entry.first) == nullptr; });
  // The live workers' free resources and slots, updated as jobs are placed: the caller's, and
  // every live worker's once a gang is to be placed.
  std::map<std::string, WorkerView> views;
  WorkerView& view =
      views.emplace(worker_id, ViewOf(worker_id, workers_.at(worker_id))).first->second;
  // A worker with no room takes nothing: no need to walk the queue (a gang that fits elsewhere
  // is placed by those workers' heartbeats).
  if (queue_.empty() || view.slots <= 0 || (view.free.gpus.empty() && view.free.cpus <= 0)) {
    workers_[worker_id].free_slots = view.slots;
    return assignments;
  }
  bool all_views = false;
  auto every_view = [&]() -> std::map<std::string, WorkerView>& {
    if (!all_views) {
      for (const auto& [id, worker] : workers_) {
        if (!worker.lost && !worker.restored) views.try_emplace(id, ViewOf(id, worker));
      }
      all_views = true;
    }
    return views;
  };
  const absl::Time now = absl::Now();
  QuotaState quotas = CurrentQuotaState();
  // The fair-share walk (policy/fair_share.h) over the queue index, a placed job's team's share
  // raised at once.
  FairShareWalk walk(queue_, quotas.shares);
  auto charge = [&](const std::string& team, const ResourceAmounts& amounts) {
    Charge(quotas, team, amounts);
    walk.SetShare(team, quotas.shares[team]);
  };
  // What this pass found cannot be placed here, or is past its team's quota: the worker's free
  // resources and the teams' usage only shrink and grow during a pass, so a request that failed
  // once fails again (jobs mostly ask alike: a long queue is walked at map-lookup cost).
  std::set<std::string> no_room;
  std::set<std::pair<std::string, std::string>> over_quota;
  std::vector<Start> starts;
  while (const QueueEntry* entry = walk.Next()) {
    if (entry->replicas > 1) {
      absl::Status why_not;
      STOKER_ASSIGN_OR_RETURN(std::optional<Start> start,
                              PlaceGangJob(*entry, every_view(), &why_not, quotas));
      if (start.has_value()) {
        charge(entry->team, start->charge);
        starts.push_back(std::move(*start));
        continue;
      }
      // Could it run on these workers idle (FAILED_PRECONDITION says not)? Then it waits for
      // room, and after a while no job behind it takes any (the cluster drains for it).
      if (absl::IsFailedPrecondition(why_not)) continue;
      const absl::Time since = gang_waiting_since_.try_emplace(entry->job_id, now).first->second;
      if (now - since >= options_.gang_backfill_limit) break;
      continue;
    }
    if (view.slots <= 0) {
      if (queue_.gangs() == 0) break;  // only gangs could still be placed (elsewhere)
      continue;
    }
    const std::string& team = entry->team;
    if (no_room.contains(entry->resources_key) ||
        over_quota.contains({team, entry->resources_key})) {
      continue;
    }
    absl::StatusOr<v1::Placement> placed = PlaceOnWorker(entry->resources, view);
    if (!placed.ok()) {
      no_room.insert(entry->resources_key);
      continue;
    }
    v1::Placement placement = std::move(*placed);
    placement.set_rank(0);
    // Charged what it is granted; past its team's quota it waits (FillQueueInfo says so).
    const ResourceAmounts granted = ChargeOf(placement);
    if (auto quota = quotas.quotas.find(team); quota != quotas.quotas.end()) {
      if (!QuotaAdmits(team, quota->second, quotas.usage[team], granted).ok()) {
        over_quota.insert({team, entry->resources_key});
        continue;
      }
    }
    STOKER_ASSIGN_OR_RETURN(v1::Job job, store_->Get(entry->job_id));
    charge(team, granted);
    job.set_state(v1::JOB_STATE_RUNNING);
    job.set_attempt(job.attempt() + 1);
    job.set_worker_id(worker_id);
    if (job.start_time_unix_ms() == 0) job.set_start_time_unix_ms(NowMs());
    job.clear_queue_position();
    job.clear_waiting_reason();
    *job.mutable_placement() = placement;
    job.clear_rank_placements();
    Hold(placement, view);
    view.slots -= 1;
    Start& start = starts.emplace_back();
    start.event = MakeEvent(v1::EVENT_TYPE_LOG,
                            absl::StrCat("attempt ", job.attempt(), " started on worker ",
                                         worker_id, " with ", PlacementText(placement)),
                            job.attempt());
    start.job = std::move(job);
    start.ranks.push_back(std::move(placement));
  }
  // Every start of the pass in one transaction; only then do the ledgers hold them.
  std::vector<JobStore::Change> changes;
  changes.reserve(starts.size());
  for (const Start& start : starts) {
    // The attempt resumes from the stored checkpoint: the lost attempt's points past it go.
    changes.push_back({start.job, {start.event}, start.job.checkpoint_step()});
  }
  STOKER_RETURN_IF_ERROR(SaveAllAndNotify(changes));
  for (const Start& start : starts) {
    const v1::Job& job = start.job;
    gang_waiting_since_.erase(job.id());
    placed_jobs_[job.id()] = PlacedJobOf(job);
    if (observer_ != nullptr) {
      observer_->JobAssigned(std::max<int64_t>(0, NowMs() - job.submit_time_unix_ms()) / 1000.0);
    }
    for (const v1::Placement& placement : start.ranks) {
      // Ranks for other workers wait in their ledgers for those workers' next heartbeats.
      const bool here = placement.worker_id() == worker_id;
      WorkerEntry& worker = workers_[placement.worker_id()];
      worker.running.Put(
          {job.id(), job.attempt(), placement.rank()},
          {placement, here, here ? now : absl::InfinitePast(), now, job.spec().team()});
      if (here) {
        assignments.push_back(AssignmentFor(job, placement, placement.rank()));
      } else {
        worker.free_slots = views.at(placement.worker_id()).slots;
      }
    }
  }
  workers_[worker_id].free_slots = view.slots;
  return assignments;
}

Coordinator::PlacedJob Coordinator::PlacedJobOf(const v1::Job& job) {
  return {job.spec().team(), job.spec().priority(), job.preemptions(), job.start_time_unix_ms()};
}

const Coordinator::PlacedJob& Coordinator::PlacedJobInfo(const std::string& job_id) {
  auto [it, fresh] = placed_jobs_.try_emplace(job_id);
  if (fresh) {
    if (absl::StatusOr<v1::Job> job = store_->Get(job_id); job.ok()) it->second = PlacedJobOf(*job);
  }
  return it->second;
}

std::map<std::string, ResourceAmounts> Coordinator::TeamUsageLocked() {
  std::map<std::string, ResourceAmounts> usage;
  for (const auto& [id, worker] : workers_) {
    for (const auto& [team, amounts] : worker.running.usage()) usage[team] += amounts;
  }
  return usage;
}

void Coordinator::PrunePlacedJobs() {
  std::set<std::string> placed;
  for (const auto& [id, worker] : workers_) {
    for (const auto& [key, held] : worker.running) placed.insert(key.job_id);
  }
  std::erase_if(placed_jobs_, [&](const auto& entry) { return !placed.contains(entry.first); });
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

absl::StatusOr<std::optional<Coordinator::Start>> Coordinator::PlaceGangJob(
    const QueueEntry& entry, std::map<std::string, WorkerView>& views, absl::Status* why_not,
    const QuotaState& quotas) {
  std::vector<WorkerView> live;
  for (const auto& [id, view] : views) live.push_back(view);
  absl::StatusOr<std::vector<v1::Placement>> gang =
      PlaceGang(entry.resources, entry.replicas, live);
  if (!gang.ok()) {
    *why_not = gang.status();
    return std::nullopt;  // nothing is held: the gang waits whole
  }
  const std::string& team = entry.team;
  Start start;
  for (const v1::Placement& placement : *gang) start.charge += ChargeOf(placement);
  if (auto quota = quotas.quotas.find(team); quota != quotas.quotas.end()) {
    const auto usage = quotas.usage.find(team);
    if (absl::Status admitted = QuotaAdmits(
            team, quota->second, usage == quotas.usage.end() ? ResourceAmounts{} : usage->second,
            start.charge);
        !admitted.ok()) {
      *why_not = absl::FailedPreconditionError(admitted.message());
      return std::nullopt;
    }
  }
  STOKER_ASSIGN_OR_RETURN(start.job, store_->Get(entry.job_id));
  v1::Job& job = start.job;
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempt(job.attempt() + 1);
  job.set_worker_id(gang->front().worker_id());
  if (job.start_time_unix_ms() == 0) job.set_start_time_unix_ms(NowMs());
  job.clear_queue_position();
  job.clear_waiting_reason();
  *job.mutable_placement() = gang->front();
  job.clear_rank_placements();
  for (const v1::Placement& placement : *gang) *job.add_rank_placements() = placement;
  start.event = MakeEvent(v1::EVENT_TYPE_LOG,
                          absl::StrCat("attempt ", job.attempt(), " started with ", gang->size(),
                                       " ranks: ", GangPlacementText(job)),
                          job.attempt());
  for (const v1::Placement& placement : *gang) {
    WorkerView& view = views.at(placement.worker_id());
    Hold(placement, view);
    view.slots -= 1;
  }
  start.ranks = std::move(*gang);
  return start;
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
      it = ledger.Erase(it);  // the attempt ended before this rank started
      continue;
    }
    ledger.MarkDelivered(it, now);
    delivered.push_back(AssignmentFor(*job, it->second.placement, key.rank));
    ++it;
  }
  return delivered;
}

void Coordinator::EndAttempt(const v1::Job& job, const std::string& ended_worker, int ended_rank) {
  // The attempt's ranks are on the workers its placements name.
  std::set<std::string> holders = {job.worker_id()};
  for (const v1::Placement& placement : job.rank_placements()) {
    holders.insert(placement.worker_id());
  }
  for (const std::string& worker_id : holders) {
    const auto found = workers_.find(worker_id);
    if (found == workers_.end()) continue;
    found->second.running.EraseIf([&](const auto& entry) {
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
