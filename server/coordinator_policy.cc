// The Coordinator's scheduling policy state (see coordinator.h and server/policy/): the teams'
// quotas, usage and fair shares as one pass or listing sees them, a queued job's place and why it
// waits, and preemption (choosing victims, draining them, stopping the slow ones). Kept apart
// from coordinator.cc, which holds the lifecycle every job shares.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/scheduler.h"

namespace stoker {

Coordinator::QuotaState Coordinator::CurrentQuotaState() {
  QuotaState state;
  if (quota_source_) state.quotas = quota_source_();
  state.usage = TeamUsageLocked();
  fair_usage_.Advance(absl::Now(), state.usage);
  for (const auto& [id, worker] : workers_) {
    if (worker.lost || worker.restored) continue;
    state.capacity += {static_cast<int64_t>(worker.capacity.gpus.size()), worker.capacity.cpus,
                       worker.capacity.memory_bytes};
  }
  std::map<std::string, double> weights;
  for (const auto& [team, quota] : state.quotas) weights[team] = quota.weight;
  state.shares = Shares(fair_usage_, state.usage, state.capacity, weights);
  return state;
}

void Coordinator::Charge(QuotaState& state, const std::string& team,
                         const ResourceAmounts& charge) {
  ResourceAmounts& usage = state.usage[team];
  usage += charge;
  const auto quota = state.quotas.find(team);
  const auto past = fair_usage_.usage().find(team);
  state.shares[team] = DominantShare(
      past == fair_usage_.usage().end() ? DecayedAmounts{} : past->second, usage, state.capacity,
      fair_usage_.half_life(), quota == state.quotas.end() ? 1.0 : quota->second.weight);
}

std::map<std::string, int> Coordinator::QueuePositions(const QuotaState& state) {
  std::vector<QueuedJob> order;
  order.reserve(queue_.size());
  for (const QueueEntry* entry : queue_.InStoreOrder()) {
    order.push_back(QueueIndex::AsQueuedJob(*entry));
  }
  OrderByFairShare(order, state.shares);
  std::map<std::string, int> positions;
  for (size_t i = 0; i < order.size(); ++i) positions[order[i].job_id] = static_cast<int>(i);
  return positions;
}

std::map<std::string, double> Coordinator::TeamShares() {
  absl::MutexLock lock(&mu_);
  return CurrentQuotaState().shares;
}

void Coordinator::FillQueueInfo(v1::Job* job, std::optional<QuotaState>& quotas,
                                bool fair_share_position) {
  if (job->state() != v1::JOB_STATE_QUEUED) return;
  if (!quotas.has_value()) quotas = CurrentQuotaState();
  int store_position = 0;
  const int* position = &store_position;
  if (fair_share_position) {
    if (!quotas->positions.has_value()) quotas->positions = QueuePositions(*quotas);
    const auto found = quotas->positions->find(job->id());
    if (found == quotas->positions->end()) return;
    position = &found->second;
  } else {
    const int64_t counted = queue_.StorePosition(job->id());
    if (counted < 0) return;
    store_position = static_cast<int>(counted);
  }
  std::vector<WorkerView> alive;
  for (const auto& [id, worker] : workers_) {
    // A restored worker has not said what it has since the server restarted.
    if (worker.lost || worker.restored) continue;
    alive.push_back(ViewOf(id, worker));
    // Why it waits is about resources; slots are known only at heartbeats.
    alive.back().slots = std::numeric_limits<int>::max();
  }
  job->set_queue_position(*position);
  job->set_waiting_reason(WaitingReason(*job, *position, alive));
  // Its team's quota holds it back before anything else does.
  const std::string& team = job->spec().team();
  if (auto quota = quotas->quotas.find(team); quota != quotas->quotas.end()) {
    if (absl::Status admitted =
            QuotaAdmits(team, quota->second, quotas->usage[team], LeastChargeOf(job->spec()));
        !admitted.ok()) {
      job->set_waiting_reason(std::string(admitted.message()));
      return;
    }
  }
  // A gang ahead of it that waited too long keeps it from starting (see gang_backfill_limit).
  const absl::Time now = absl::Now();
  for (const auto& [gang_id, since] : gang_waiting_since_) {
    if (gang_id == job->id() || now - since < options_.gang_backfill_limit) continue;
    int gang_position = 0;
    if (quotas->positions.has_value()) {
      const auto found = quotas->positions->find(gang_id);
      if (found == quotas->positions->end()) continue;
      gang_position = found->second;
    } else {
      const int64_t counted = queue_.StorePosition(gang_id);
      if (counted < 0) continue;
      gang_position = static_cast<int>(counted);
    }
    if (gang_position >= *position) continue;
    job->set_waiting_reason(absl::StrCat(
        "data-parallel job ", gang_id, " ahead of it has waited ", Rounded(now - since),
        " for room, so no job behind it starts until it does; ", job->waiting_reason()));
    break;
  }
}

void Coordinator::SnapshotTeams(CoordinatorSnapshot& snapshot) {
  QuotaState state = CurrentQuotaState();
  auto& teams = snapshot.teams;
  for (const auto& [team, quota] : state.quotas) {
    CoordinatorSnapshot::Team& t = teams[team];
    t.weight = quota.weight;
    const std::pair<const char*, const std::optional<QuotaLimit>*> limits[] = {
        {"gpus", &quota.gpus}, {"cpus", &quota.cpus}, {"memory", &quota.memory_bytes}};
    for (const auto& [resource, limit] : limits) {
      if (limit->has_value()) t.quota[resource] = {(*limit)->nominal, (*limit)->borrow};
    }
  }
  for (const auto& [team, used] : state.usage) {
    CoordinatorSnapshot::Team& t = teams[team];
    t.usage = {{"gpus", used.gpus}, {"cpus", used.cpus}, {"memory", used.memory_bytes}};
  }
  for (const auto& [team, share] : state.shares) teams[team].share = share;
  for (const auto& [team, count] : preemptions_by_team_) teams[team].preemptions = count;
  for (const auto& [team, jobs] : queue_.by_team()) {
    teams[team].waiting_jobs = static_cast<int64_t>(jobs.size());
  }
  for (auto& [team, t] : teams) {
    if (t.usage.empty()) t.usage = {{"gpus", 0}, {"cpus", 0}, {"memory", 0}};
  }
}

std::string Coordinator::PreemptedText(const Preempting& p) {
  return absl::StrCat("preempted by ", p.by, " (", p.reason, ")");
}

absl::Status Coordinator::PreemptionPass() {
  const absl::Time now = absl::Now();
  // Victims whose attempt ended (given back, finished, cancelled, lost), and those that did not
  // give back in time: stopped, back to the queue, to resume from their last stored checkpoint.
  std::vector<std::string> done;
  for (const auto& [id, p] : preempting_) {
    absl::StatusOr<v1::Job> job = store_->Get(id);
    if (!job.ok() || job->state() != v1::JOB_STATE_RUNNING || job->attempt() != p.attempt) {
      done.push_back(id);
      continue;
    }
    if (now - p.since < options_.preemption_grace) continue;
    job->set_released_attempts(job->released_attempts() + 1);
    STOKER_RETURN_IF_ERROR(Requeue(
        *job,
        absl::StrCat(PreemptedText(p), "; it did not give back within ",
                     Rounded(options_.preemption_grace),
                     ": stopped, it resumes from its last stored checkpoint (not counted against "
                     "max_retries)"),
        "", -1));
    done.push_back(id);
  }
  for (const std::string& id : done) preempting_.erase(id);

  // The first queued jobs that cannot start choose victims, once a second at most.
  if (now - last_preemption_pass_ < absl::Seconds(1)) return absl::OkStatus();
  last_preemption_pass_ = now;
  std::vector<WorkerView> views;
  for (const auto& [id, worker] : workers_) {
    if (worker.lost || worker.restored) continue;
    views.push_back(ViewOf(id, worker));
    views.back().slots = std::numeric_limits<int>::max();  // a victim's end frees its slot
  }
  if (views.empty()) return absl::OkStatus();
  if (queue_.empty()) return absl::OkStatus();
  QuotaState quotas = CurrentQuotaState();
  std::set<std::string> waiting_for_victims;
  for (const auto& [id, p] : preempting_) waiting_for_victims.insert(p.by);

  // The running jobs, read on first need: every rank's placement, from the workers' ledgers.
  std::optional<std::vector<RunningJob>> running;
  auto running_jobs = [&]() -> absl::StatusOr<std::vector<RunningJob>*> {
    if (running) return &*running;
    std::map<std::string, RunningJob> jobs;
    for (const auto& [worker_id, worker] : workers_) {
      if (worker.lost) continue;
      for (const auto& [key, held] : worker.running) {
        auto [it, fresh] = jobs.try_emplace(key.job_id);
        RunningJob& r = it->second;
        if (fresh) {
          const PlacedJob& placed = PlacedJobInfo(key.job_id);
          r = {key.job_id,
               placed.team,
               placed.priority,
               held.placed_at == absl::InfinitePast()
                   ? absl::FromUnixMillis(placed.start_time_unix_ms)
                   : held.placed_at,
               placed.preemptions,
               preempting_.contains(key.job_id),
               {}};
        }
        r.started = std::min(r.started,
                             held.placed_at == absl::InfinitePast() ? r.started : held.placed_at);
        r.placements.push_back(held.placement);
      }
    }
    running.emplace();
    for (auto& [id, r] : jobs) running->push_back(std::move(r));
    return &*running;
  };

  constexpr int kPreemptorsPerPass = 8;
  int considered = 0;
  std::map<std::pair<std::string, int>, bool> fits;
  FairShareWalk walk(queue_, quotas.shares);
  while (const QueueEntry* next = walk.Next()) {
    if (considered >= kPreemptorsPerPass) break;
    const QueueEntry& entry = *next;
    if (waiting_for_victims.contains(entry.job_id)) continue;  // its victims are giving back
    Preemptor p;
    p.job_id = entry.job_id;
    p.team = entry.team;
    p.priority = entry.priority;
    p.request = entry.resources;
    p.replicas = entry.replicas;
    const auto quota = quotas.quotas.find(p.team);
    const bool admitted =
        quota == quotas.quotas.end() || QuotaAdmits(p.team, quota->second, quotas.usage[p.team],
                                                    LeastChargeOf(entry.resources, entry.replicas))
                                            .ok();
    if (admitted) {
      // The views do not change in this loop: one Fits per distinct request.
      const auto [known, fresh] = fits.try_emplace({entry.resources_key, entry.replicas}, false);
      if (fresh) known->second = Fits(p, views);
      if (known->second) continue;  // it starts at a heartbeat
    }
    ++considered;
    STOKER_ASSIGN_OR_RETURN(const v1::Job job, store_->Get(entry.job_id));
    p.preempted_by = {job.preempted_by().begin(), job.preempted_by().end()};
    STOKER_ASSIGN_OR_RETURN(std::vector<RunningJob> * candidates, running_jobs());
    std::optional<VictimChoice> choice =
        ChooseVictims(p, *candidates, views, quotas.quotas, quotas.usage, options_.preemption, now);
    if (!choice) continue;
    for (const std::string& victim_id : choice->victims) {
      STOKER_ASSIGN_OR_RETURN(v1::Job victim, store_->Get(victim_id));
      const Preempting preempting{victim.attempt(), job.id(), choice->reasons.at(victim_id), now};
      preempting_[victim_id] = preempting;
      ++preemptions_by_team_[victim.spec().team()];
      victim.set_preemptions(victim.preemptions() + 1);
      placed_jobs_[victim_id] = PlacedJobOf(victim);
      victim.add_preempted_by(job.id());
      constexpr int kKeptPreemptors = 16;
      if (victim.preempted_by_size() > kKeptPreemptors) {
        victim.mutable_preempted_by()->DeleteSubrange(0,
                                                      victim.preempted_by_size() - kKeptPreemptors);
      }
      STOKER_RETURN_IF_ERROR(SaveAndNotify(
          victim,
          {MakeEvent(v1::EVENT_TYPE_LOG,
                     absl::StrCat(PreemptedText(preempting), ": giving back at a checkpoint"),
                     victim.attempt())}));
      for (RunningJob& r : *candidates) {
        if (r.job_id == victim_id) r.giving_back = true;
      }
      ServerLog(absl::StrCat("job ", victim_id, " ", PreemptedText(preempting)));
    }
    STOKER_RETURN_IF_ERROR(SaveAndNotify(
        job,
        {MakeEvent(v1::EVENT_TYPE_LOG,
                   absl::StrCat("preempting ", absl::StrJoin(choice->victims, ", "), " to start"),
                   job.attempt())}));
  }
  return absl::OkStatus();
}

}  // namespace stoker
