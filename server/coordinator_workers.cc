// Coordinator (coordinator.h): workers. Registration (a restarted worker's jobs requeued),
// heartbeats (assignments handed out, stops told), lease expiry, and requeueing what a lost or
// restarted worker held.
#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/scheduler.h"
#include "spec/job_spec.h"

namespace stoker {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  STOKER_RETURN_IF_ERROR(RequireId(request.worker_id(), "worker_id"));
  // Shown in tables and logs, and named in job files' errors: no spaces or control characters.
  for (char c : request.worker_id()) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker_id: '", absl::CHexEscape(request.worker_id()),
          "' holds a space or a control character; use letters, digits and - _ . : @"));
    }
  }
  if (request.devices_size() == 0 || request.devices_size() > 64) {
    return absl::InvalidArgumentError("devices: a worker registers 1 to 64 devices");
  }
  // A worker that advertises no cores or memory (one older than this server) counts as one core
  // and no memory: it takes one job at a time, and no job that asks for memory.
  if (request.cpus() < 0 || request.cpus() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpus: a worker advertises 0 to 4096 cores, not ", request.cpus()));
  }
  if (request.memory_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_bytes: must not be negative, not ", request.memory_bytes()));
  }
  {
    std::set<int> gpu_indices;
    for (const v1::Device& device : request.devices()) {
      if (device.kind() == "cuda" && !gpu_indices.insert(device.index()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("devices: GPU index ", device.index(), " appears twice"));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (auto it = workers_.find(request.worker_id()); it != workers_.end() && !it->second.lost &&
                                                    !it->second.restored &&
                                                    it->second.instance != request.instance()) {
    const WorkerEntry& holder = it->second;
    const absl::Duration left = options_.lease - (now - holder.last_heartbeat);
    if (!request.previous_instance().empty() && request.previous_instance() == holder.instance) {
      // Its successor on the same work directory: the old process is gone (it held the lock).
      ServerLog(absl::StrCat("worker ", request.worker_id(), " restarted (instance ",
                             request.instance(), " replaces ", holder.instance, ")"));
    } else if (left > absl::ZeroDuration()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker id ", request.worker_id(), " is in use by a live worker",
          holder.info.hostname().empty() ? "" : absl::StrCat(" on ", holder.info.hostname()),
          " (last heartbeat ", Rounded(now - holder.last_heartbeat), " ago; its lease expires in ",
          Rounded(left),
          " unless it sends another); stop that worker or choose another "
          "--worker-id"));
    }
  }
  WorkerEntry& worker = workers_[request.worker_id()];
  worker.info = request;
  worker.capacity = CapacityOf(request);
  worker.instance = request.instance();
  worker.last_heartbeat = now;
  worker.lost = false;
  worker.restored = false;
  worker.free_slots = 0;  // until its first heartbeat says
  // Jobs the server believes run there but the worker does not have are lost: requeue them.
  std::set<RankKey> reported;
  for (const v1::RunningAttempt& attempt : request.running()) {
    reported.insert({attempt.job_id(), attempt.attempt(), attempt.rank()});
  }
  STOKER_RETURN_IF_ERROR(
      RequeueUnreported(request.worker_id(), reported, "restarted without the job", false));
  v1::RegisterWorkerResponse response;
  response.set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

absl::Status Coordinator::Requeue(v1::Job job, const std::string& reason,
                                  const std::string& ended_worker, int ended_rank) {
  const int attempts_allowed = 1 + job.spec().max_retries() + job.released_attempts();
  std::vector<v1::JobEvent> events;
  job.clear_waiting_reason();
  if (job.attempt() >= attempts_allowed) {
    job.set_state(v1::JOB_STATE_FAILED);
    job.set_end_time_unix_ms(NowMs());
    job.set_error(absl::StrCat(reason, " (attempt ", job.attempt(), " of ", attempts_allowed, ")"));
    events.push_back(
        MakeEvent(v1::EVENT_TYPE_FINISHED, absl::StrCat("failed: ", job.error()), job.attempt()));
  } else {
    job.set_state(v1::JOB_STATE_QUEUED);
    job.set_error(reason);
    if (observer_ != nullptr) observer_->JobRequeued();
    events.push_back(MakeEvent(
        v1::EVENT_TYPE_LOG,
        absl::StrCat("attempt ", job.attempt(), " ended: ", reason, "; requeued"), job.attempt()));
  }
  EndAttempt(job, ended_worker, ended_rank);
  return SaveAndNotify(job, std::move(events));
}

absl::Status Coordinator::RequeueUnreported(const std::string& worker_id,
                                            const std::set<RankKey>& reported,
                                            absl::string_view why, bool grace_for_gangs) {
  WorkerEntry& worker = workers_[worker_id];
  std::vector<RankKey> placed;
  for (const auto& [key, held] : worker.running) {
    if (held.delivered && !reported.contains(key)) placed.push_back(key);
  }
  const absl::Time now = absl::Now();
  for (const RankKey& key : placed) {
    auto entry = worker.running.find(key);
    if (entry == worker.running.end()) continue;  // dropped with an attempt ended before
    absl::StatusOr<v1::Job> job = store_->Get(key.job_id);
    if (job.ok() && job->state() == v1::JOB_STATE_RUNNING &&
        RunsRank(*job, worker_id, key.attempt, key.rank)) {
      const bool gang = IsGang(job->spec());
      // A rank handed over moments ago may not be in this report yet.
      if (gang && grace_for_gangs && now - entry->second.delivered_at < options_.lease) continue;
      // Requeue also drops it from worker.running.
      STOKER_RETURN_IF_ERROR(
          Requeue(*job,
                  absl::StrCat("worker ", worker_id, " ", why,
                               gang ? absl::StrCat(" (rank ", key.rank, ")") : ""),
                  worker_id, key.rank));
    } else {
      worker.running.Erase(entry);
    }
  }
  return absl::OkStatus();
}

WorkerView Coordinator::ViewOf(const std::string& worker_id, const WorkerEntry& worker) {
  std::vector<const v1::Placement*> held;
  for (const auto& [key, rank] : worker.running) held.push_back(&rank.placement);
  return WorkerView{worker_id, worker.capacity, FreeResources(worker.capacity, held),
                    std::max(0, worker.free_slots)};
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  STOKER_RETURN_IF_ERROR(RequireId(request.worker_id(), "worker_id"));
  if (request.free_slots() < 0) {
    return absl::InvalidArgumentError("free_slots: must not be negative");
  }
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end() || it->second.lost || it->second.restored) {
    return absl::NotFoundError(absl::StrCat("worker ", request.worker_id(),
                                            " is not registered (server restarted or lease "
                                            "expired); register again"));
  }
  if (it->second.instance != request.instance()) {
    return absl::NotFoundError(absl::StrCat("worker ", request.worker_id(),
                                            " is registered by another process (instance ",
                                            it->second.instance, "); register again"));
  }
  WorkerEntry& worker = it->second;
  worker.last_heartbeat = absl::Now();
  v1::HeartbeatResponse response;
  std::set<RankKey> reported;
  for (const v1::RunningAttempt& attempt : request.running()) {
    reported.insert({attempt.job_id(), attempt.attempt(), attempt.rank()});
    absl::StatusOr<v1::Job> job =
        FencedJob(request.worker_id(), attempt.job_id(), attempt.attempt(), attempt.rank());
    if (!job.ok()) *response.add_stop() = attempt;
  }
  // A job placed on this worker that it no longer reports was lost there (e.g. it restarted).
  STOKER_RETURN_IF_ERROR(
      RequeueUnreported(request.worker_id(), reported, "no longer runs the job", true));
  // Ranks of gangs placed here while other workers heartbeated.
  std::vector<v1::Assignment> delivered = DeliverPending(request.worker_id());
  worker.free_slots = std::max(0, request.free_slots() - static_cast<int>(delivered.size()));
  const absl::Time pass_start = absl::Now();
  STOKER_ASSIGN_OR_RETURN(std::vector<v1::Assignment> assignments, Assign(request.worker_id()));
  if (observer_ != nullptr) {
    observer_->SchedulingPass("assign", absl::ToDoubleSeconds(absl::Now() - pass_start));
  }
  for (v1::Assignment& assignment : delivered) *response.add_assignments() = std::move(assignment);
  for (v1::Assignment& assignment : assignments) {
    *response.add_assignments() = std::move(assignment);
  }
  // Preempted attempts on this worker: give back at a checkpoint (until the attempt ends).
  for (const auto& [key, held] : worker.running) {
    const auto p = preempting_.find(key.job_id);
    if (!held.delivered || p == preempting_.end() || p->second.attempt != key.attempt) continue;
    v1::RunningAttempt* preempt = response.add_preempt();
    preempt->set_job_id(key.job_id);
    preempt->set_attempt(key.attempt);
    preempt->set_rank(key.rank);
  }
  return response;
}

void Coordinator::ExtendLeases(absl::Duration paused) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (auto& [worker_id, worker] : workers_) {
    if (worker.lost) continue;
    worker.last_heartbeat = std::min(now, worker.last_heartbeat + paused);
    if (worker.restored) worker.grace_until += paused;
  }
}

void Coordinator::ExpireLeases() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  // A lost worker stays listed (`stoker workers`, the metrics) for a while, then is forgotten:
  // with the default id (HOSTNAME-PID) every restart is a new worker, and the old ids would pile
  // up for the server's lifetime. Registering again brings one back at once.
  std::erase_if(workers_, [&](const auto& entry) {
    const WorkerEntry& worker = entry.second;
    return worker.lost && worker.running.empty() &&
           now - worker.lost_at > options_.forget_lost_worker;
  });
  for (auto& [worker_id, worker] : workers_) {
    if (worker.lost) continue;
    // A worker the server knew before its restart has the grace period to come back, however
    // short the lease.
    if (worker.restored ? now <= worker.grace_until
                        : now - worker.last_heartbeat <= options_.lease) {
      continue;
    }
    worker.lost = true;
    worker.lost_at = now;
    const std::string why =
        worker.restored
            ? absl::StrCat("worker ", worker_id, " lost (did not register again within ",
                           Rounded(std::max(options_.restart_grace, options_.lease)),
                           " of the server's restart)")
            : absl::StrCat("worker ", worker_id, " lost (no heartbeat for ",
                           absl::FormatDuration(now - worker.last_heartbeat), ")");
    std::vector<RankKey> placed;
    for (const auto& [key, held] : worker.running) placed.push_back(key);
    for (const RankKey& key : placed) {
      absl::StatusOr<v1::Job> job = store_->Get(key.job_id);
      if (!job.ok() || job->state() != v1::JOB_STATE_RUNNING ||
          !RunsRank(*job, worker_id, key.attempt, key.rank)) {
        continue;
      }
      // On a store error the job stays RUNNING and the next sweep tries again. A gang's other
      // ranks are told to stop by their workers' next heartbeats.
      (void)Requeue(*job, why, worker_id, -1);
    }
  }
  RequeueUndelivered();
  if (now - last_experiment_pass_ >= absl::Seconds(1)) {
    AdvanceExperiments();
    last_experiment_pass_ = now;
  }
  if (now - last_prune_ > absl::Seconds(10)) {
    PrunePlacedJobs();
    last_prune_ = now;
  }
  const absl::Time pass_start = absl::Now();
  const absl::Status preempted = PreemptionPass();
  if (observer_ != nullptr) {
    observer_->SchedulingPass("preemption", absl::ToDoubleSeconds(absl::Now() - pass_start));
  }
  if (const absl::Status& s = preempted; !s.ok()) {
    ServerLog(absl::StrCat("preemption pass failed: ", s.message()));
  }
}

}  // namespace stoker
