#include "server/coordinator.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/scheduler.h"
#include "server/submit_checks.h"
#include "spec/job_spec.h"

namespace stoker {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

std::string Rounded(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(100)));
}

void ServerLog(const std::string& message) {
  std::cerr << "stoker-server: " << message << std::endl;
}

absl::Status RequireId(const std::string& value, const char* field) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": is required"));
  if (value.size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": longer than 256 characters"));
  }
  return absl::OkStatus();
}

v1::JobEvent MakeEvent(v1::EventType type, const std::string& message, int attempt) {
  v1::JobEvent event;
  event.set_type(type);
  event.set_message(message);
  event.set_attempt(attempt);
  event.set_time_unix_ms(NowMs());
  return event;
}

Coordinator::Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options)
    : options_(std::move(options)),
      checkpoints_(options_.checkpoint_dir),
      store_(std::move(store)),
      fair_usage_(options_.fair_share_half_life > absl::ZeroDuration()
                      ? options_.fair_share_half_life
                      : absl::Hours(168)) {}

absl::Status Coordinator::Recover() {
  absl::MutexLock lock(&mu_);
  STOKER_ASSIGN_OR_RETURN(const std::vector<v1::Job> queued, store_->QueuedInOrder());
  queue_.Reset(queued);
  STOKER_RETURN_IF_ERROR(LoadExperiments());
  STOKER_ASSIGN_OR_RETURN(const std::vector<v1::Job> running,
                          store_->InState(v1::JOB_STATE_RUNNING));
  for (const v1::Job& job : running) {
    std::vector<v1::Placement> ranks(job.rank_placements().begin(), job.rank_placements().end());
    if (ranks.empty()) {
      ranks.push_back(job.placement());
      ranks[0].set_worker_id(job.worker_id());
      ranks[0].set_rank(0);
    }
    for (const v1::Placement& placement : ranks) {
      WorkerEntry& worker = workers_[placement.worker_id()];
      worker.info.set_worker_id(placement.worker_id());
      worker.last_heartbeat = absl::Now();
      worker.restored = true;
      worker.grace_until = absl::Now() + std::max(options_.restart_grace, options_.lease);
      worker.running.Put({job.id(), job.attempt(), placement.rank()},
                         {placement, true, absl::Now(), absl::InfinitePast(), job.spec().team()});
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::SaveAndNotify(const v1::Job& job, std::vector<v1::JobEvent> events,
                                        const std::optional<v1::AuditRecord>& audit) {
  absl::Status status = store_->Save(job, std::move(events), audit);
  if (status.ok()) queue_.Update(job);
  events_changed_.SignalAll();
  return status;
}

absl::Status Coordinator::SaveAllAndNotify(std::vector<JobStore::Change>& changes) {
  absl::Status status = store_->SaveMany(changes);
  if (status.ok()) {
    for (const JobStore::Change& change : changes) queue_.Update(change.job);
  }
  events_changed_.SignalAll();
  return status;
}

absl::StatusOr<v1::SubmitJobResponse> Coordinator::Submit(
    const v1::SubmitJobRequest& request, const std::string& owner,
    const std::optional<v1::AuditRecord>& audit) {
  if (request.request_id().size() > 256) {
    return absl::InvalidArgumentError("request_id: longer than 256 characters");
  }
  // A field the client left unset takes the default a job file's user gets (ApplyJobDefaults);
  // the job is stored with them.
  v1::JobSpec spec = request.spec();
  ApplyJobDefaults(&spec);
  STOKER_RETURN_IF_ERROR(ValidateJobSpec(spec));
  // The paths must exist under the server's data root (which deploy/ shares with the workers).
  v1::JobSpec resolved = spec;
  STOKER_RETURN_IF_ERROR(ResolveDatasetPaths(options_.data_root, &resolved));
  STOKER_RETURN_IF_ERROR(CheckModelAgainstData(spec, resolved, options_.data_root));

  PendingSubmit me{&request, &spec, &owner, &audit};
  submit_mu_.Lock();
  submit_queue_.push_back(&me);
  struct Turn {
    PendingSubmit* me;
    std::deque<PendingSubmit*>* queue;
    static bool Ready(Turn* t) { return t->me->done || t->queue->front() == t->me; }
  } turn{&me, &submit_queue_};
  submit_mu_.Await(absl::Condition(&Turn::Ready, &turn));
  if (!me.done) {
    // This submit leads: commit it and every one queued behind it in one transaction.
    std::vector<PendingSubmit*> group(
        submit_queue_.begin(), submit_queue_.begin() + std::min<size_t>(submit_queue_.size(), 512));
    submit_mu_.Unlock();
    std::vector<JobStore::NewJob> new_jobs;
    for (PendingSubmit* pending : group) {
      new_jobs.push_back(
          {pending->spec, pending->request->request_id(), NowMs(),
           MakeEvent(v1::EVENT_TYPE_LOG, pending->owner->empty()
                                             ? std::string("submitted")
                                             : absl::StrCat("submitted by ", *pending->owner)),
           *pending->owner, *pending->audit});
    }
    absl::StatusOr<std::vector<JobStore::Inserted>> inserted;
    {
      absl::MutexLock lock(&mu_);
      inserted = store_->InsertMany(std::move(new_jobs));
      if (inserted.ok()) {
        for (const JobStore::Inserted& job : *inserted) queue_.Update(job.job);
      }
      events_changed_.SignalAll();
    }
    submit_mu_.Lock();
    for (size_t i = 0; i < group.size(); ++i) {
      group[i]->result = inserted.ok() ? absl::StatusOr<JobStore::Inserted>((*inserted)[i])
                                       : absl::StatusOr<JobStore::Inserted>(inserted.status());
      group[i]->done = true;
      submit_queue_.pop_front();
    }
  }
  submit_mu_.Unlock();
  absl::StatusOr<JobStore::Inserted>& inserted = me.result;
  if (!inserted.ok()) return inserted.status();
  absl::MutexLock lock(&mu_);
  v1::SubmitJobResponse response;
  *response.mutable_job() = std::move(inserted->job);
  response.set_deduplicated(inserted->deduplicated);
  std::optional<QuotaState> quotas;
  FillQueueInfo(response.mutable_job(), quotas, /*fair_share_position=*/false);
  return response;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id) {
  STOKER_RETURN_IF_ERROR(RequireId(job_id, "job_id"));
  absl::MutexLock lock(&mu_);
  absl::StatusOr<v1::Job> job = store_->Get(job_id);
  std::optional<QuotaState> quotas;
  if (job.ok()) FillQueueInfo(&*job, quotas);
  return job;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request,
                                                           JobFilter filter) {
  if (request.limit() < 0 || request.limit() > 10000) {
    return absl::InvalidArgumentError("limit: must be between 0 and 10000");
  }
  std::vector<v1::JobState> states;
  for (int state : request.states()) states.push_back(static_cast<v1::JobState>(state));
  if (!request.team().empty()) filter.team = request.team();
  if (!request.user().empty()) filter.owner = request.user();
  if (!request.experiment().empty()) filter.experiment = request.experiment();
  std::vector<std::pair<std::string, std::string>> labels;
  for (const std::string& label : request.labels()) {
    const size_t eq = label.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("labels: '", label, "' is not key=value (e.g. experiment=e-000001)"));
    }
    labels.emplace_back(label.substr(0, eq), label.substr(eq + 1));
  }
  const int limit = request.limit() == 0 ? 100 : request.limit();
  if (!request.before_id().empty()) filter.before_id = request.before_id();
  absl::MutexLock lock(&mu_);
  if (filter.before_id.has_value() && !store_->Get(*filter.before_id).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("before_id: no job '", *filter.before_id, "' (a page starts after a job)"));
  }
  // Labels are inside the job rows: filtered here, after the store's other filters. One more
  // than asked tells whether another page follows.
  STOKER_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs,
                          store_->List(states, labels.empty() ? limit + 1 : 0, filter));
  if (!labels.empty()) {
    std::erase_if(jobs, [&](const v1::Job& job) {
      return std::any_of(labels.begin(), labels.end(), [&](const auto& label) {
        const auto it = job.labels().find(label.first);
        return it == job.labels().end() || it->second != label.second;
      });
    });
  }
  v1::ListJobsResponse response;
  if (static_cast<int>(jobs.size()) > limit) {
    jobs.resize(limit);
    response.set_next_before_id(jobs.back().id());
  }
  std::optional<QuotaState> quotas;  // summed once, for the first queued job
  for (v1::Job& job : jobs) {
    FillQueueInfo(&job, quotas);  // queued jobs: position and why they wait
    *response.add_jobs() = std::move(job);
  }
  return response;
}

absl::StatusOr<v1::GetMetricsResponse> Coordinator::GetMetrics(
    const v1::GetMetricsRequest& request) {
  STOKER_RETURN_IF_ERROR(RequireId(request.job_id(), "job_id"));
  if (request.limit() < 0 || request.limit() > 10000) {
    return absl::InvalidArgumentError("limit: must be between 0 and 10000");
  }
  const int limit = request.limit() == 0 ? 1000 : request.limit();
  absl::MutexLock lock(&mu_);
  STOKER_RETURN_IF_ERROR(store_->Get(request.job_id()).status());
  v1::GetMetricsResponse response;
  for (const bool epochs : {true, false}) {
    // One more than asked tells whether another page follows.
    STOKER_ASSIGN_OR_RETURN(
        std::vector<v1::MetricPoint> points,
        store_->Metrics(request.job_id(), epochs, request.after_step(), limit + 1));
    if (static_cast<int>(points.size()) > limit) {
      response.set_more(true);
      points.resize(limit);
    }
    for (v1::MetricPoint& point : points) {
      *(epochs ? response.add_epochs() : response.add_steps()) = std::move(point);
    }
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& job_id,
                                            const std::optional<v1::AuditRecord>& audit) {
  STOKER_RETURN_IF_ERROR(RequireId(job_id, "job_id"));
  absl::MutexLock lock(&mu_);
  STOKER_ASSIGN_OR_RETURN(v1::Job job, store_->Get(job_id));
  if (IsFinal(job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ", JobStateName(job.state())));
  }
  // The worker learns of it from its next heartbeat or progress report and stops the trainer.
  job.set_state(v1::JOB_STATE_CANCELLED);
  job.set_end_time_unix_ms(NowMs());
  const std::string why = audit.has_value() && audit->principal() != "open"
                              ? absl::StrCat("cancelled by user (", audit->principal(), ")")
                              : std::string("cancelled by user");
  job.set_error(why);
  // Delivered ranks keep what they hold until their workers stopped them.
  EndAttempt(job, "", -1);
  STOKER_RETURN_IF_ERROR(
      SaveAndNotify(job, {MakeEvent(v1::EVENT_TYPE_FINISHED, why, job.attempt())}, audit));
  return job;
}

v1::ListWorkersResponse Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  v1::ListWorkersResponse response;
  const absl::Time now = absl::Now();
  for (const auto& [id, worker] : workers_) {
    v1::WorkerStatus* status = response.add_workers();
    status->set_worker_id(id);
    status->set_state(worker.lost ? "lost" : (worker.restored ? "reconnecting" : "alive"));
    *status->mutable_devices() = worker.info.devices();
    const WorkerView view = ViewOf(id, worker);
    status->set_cpus(view.capacity.cpus);
    status->set_cpus_used(view.capacity.cpus - view.free.cpus);
    status->set_memory_bytes(view.capacity.memory_bytes);
    status->set_memory_used_bytes(view.capacity.memory_bytes - view.free.memory_bytes);
    for (const auto& [key, held] : worker.running) {
      if (status->job_ids().empty() || *status->job_ids().rbegin() != key.job_id) {
        status->add_job_ids(key.job_id);
      }
      v1::Placement* placement = status->add_placements();
      *placement = held.placement;
      placement->set_job_id(key.job_id);
      placement->set_rank(key.rank);
    }
    status->set_heartbeat_age_ms(absl::ToInt64Milliseconds(now - worker.last_heartbeat));
    status->set_hostname(worker.info.hostname());
    status->set_metrics_url(worker.info.metrics_url());
  }
  return response;
}

absl::StatusOr<std::vector<v1::JobEvent>> Coordinator::WaitForEvents(const std::string& job_id,
                                                                     int64_t after_seq,
                                                                     absl::Duration wait,
                                                                     bool* job_finished) {
  STOKER_RETURN_IF_ERROR(RequireId(job_id, "job_id"));
  *job_finished = false;
  const absl::Time deadline = absl::Now() + wait;
  absl::MutexLock lock(&mu_);
  while (true) {
    // Read the state before the events, so a job that finishes in between is not reported as
    // finished with its last events unsent.
    absl::StatusOr<v1::Job> job = store_->Get(job_id);
    if (!job.ok()) return job.status();
    absl::StatusOr<std::vector<v1::JobEvent>> events = store_->Events(job_id, after_seq, 1000);
    if (!events.ok()) return events.status();
    if (!events->empty()) return events;
    if (IsFinal(job->state()) || shutting_down_) {
      *job_finished = true;
      return events;
    }
    if (events_changed_.WaitWithDeadline(&mu_, deadline)) return events;  // timed out
  }
}

absl::StatusOr<std::vector<v1::JobEvent>> Coordinator::RecentEvents(const std::string& job_id,
                                                                    int limit) {
  STOKER_RETURN_IF_ERROR(RequireId(job_id, "job_id"));
  absl::MutexLock lock(&mu_);
  STOKER_RETURN_IF_ERROR(store_->Get(job_id).status());
  STOKER_ASSIGN_OR_RETURN(std::vector<v1::JobEvent> events,
                          store_->LatestEvents(job_id, 20 * limit));
  std::erase_if(events,
                [](const v1::JobEvent& event) { return event.type() == v1::EVENT_TYPE_PROGRESS; });
  if (static_cast<int>(events.size()) > limit) {
    events.erase(events.begin(), events.end() - limit);
  }
  return events;
}

void Coordinator::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  events_changed_.SignalAll();
  rendezvous_changed_.SignalAll();
}

absl::StatusOr<v1::Job> Coordinator::FencedJob(const std::string& worker_id,
                                               const std::string& job_id, int attempt, int rank) {
  absl::StatusOr<v1::Job> job = store_->Get(job_id);
  if (!job.ok()) return job.status();
  if (!IsGang(job->spec())) {
    if (job->worker_id() != worker_id || job->attempt() != attempt || rank != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stale report for job ", job_id, " attempt ", attempt,
          rank != 0 ? absl::StrCat(" rank ", rank) : "", " from worker ", worker_id,
          ": the current attempt is ", job->attempt(), " on worker ", job->worker_id()));
    }
  } else if (!RunsRank(*job, worker_id, attempt, rank)) {
    const std::string holder = WorkerOfRank(*job, rank);
    return absl::FailedPreconditionError(absl::StrCat(
        "stale report for job ", job_id, " attempt ", attempt, " rank ", rank, " from worker ",
        worker_id, ": the current attempt is ", job->attempt(),
        holder.empty() ? absl::StrCat(", which has ", ReplicasOf(job->spec()), " ranks")
                       : absl::StrCat(", its rank ", rank, " on worker ", holder)));
  }
  if (job->state() != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", JobStateName(job->state()), ", not running"));
  }
  if (IsGang(job->spec())) {
    // A rank that finished (its placement freed) reports nothing more.
    auto worker = workers_.find(worker_id);
    if (worker == workers_.end() || !worker->second.running.contains({job_id, attempt, rank})) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " attempt ", attempt, " rank ", rank, " already ended"));
    }
  }
  return job;
}

absl::StatusOr<v1::ReportProgressResponse> Coordinator::ReportProgress(
    const v1::ReportProgressRequest& request) {
  STOKER_RETURN_IF_ERROR(RequireId(request.job_id(), "job_id"));
  if (request.events_size() > 1000) {
    return absl::InvalidArgumentError("events: at most 1000 per report");
  }
  absl::MutexLock lock(&mu_);
  if (auto it = workers_.find(request.worker_id()); it != workers_.end() && !it->second.lost) {
    it->second.last_heartbeat = absl::Now();
  }
  absl::StatusOr<v1::Job> job =
      FencedJob(request.worker_id(), request.job_id(), request.attempt(), request.rank());
  v1::ReportProgressResponse response;
  if (!job.ok()) {
    // A cancelled job's own attempt is told to stop rather than refused.
    absl::StatusOr<v1::Job> current = store_->Get(request.job_id());
    if (current.ok() &&
        (current->state() == v1::JOB_STATE_CANCELLED ||
         current->state() == v1::JOB_STATE_STOPPED) &&
        RunsRank(*current, request.worker_id(), request.attempt(), request.rank())) {
      response.set_cancel_requested(true);
      return response;
    }
    return job.status();
  }
  std::vector<v1::JobEvent> events;
  for (const v1::JobEvent& reported : request.events()) {
    if (reported.type() == v1::EVENT_TYPE_FINISHED) {
      return absl::InvalidArgumentError("events: FINISHED is reported through CompleteJob");
    }
    v1::JobEvent& event = events.emplace_back(reported);
    event.set_time_unix_ms(NowMs());
    event.set_attempt(request.attempt());
    // Every rank's events are kept, named by rank (a log line's message starts "rank N: ", an
    // epoch or progress event's message is "rank N"); the job's progress is rank 0's.
    if (request.rank() != 0) {
      if (event.type() == v1::EVENT_TYPE_LOG) {
        event.set_message(absl::StrCat("rank ", request.rank(), ": ", event.message()));
      } else if (event.type() == v1::EVENT_TYPE_EPOCH || event.type() == v1::EVENT_TYPE_PROGRESS) {
        event.set_message(absl::StrCat("rank ", request.rank()));
      }
    }
    if (event.has_progress() && request.rank() == 0) *job->mutable_progress() = event.progress();
  }
  // A trial of an ASHA search: its epochs are the search's rungs.
  if (auto experiment = running_experiments_.find(job->experiment_id());
      request.rank() == 0 && experiment != running_experiments_.end() &&
      experiment->second.search().method() == "asha") {
    v1::Experiment decided = experiment->second;  // kept only once stored
    const std::optional<std::string> stop = AshaDecision(decided, *job, events);
    if (decided.asha_records_size() != experiment->second.asha_records_size()) {
      int64_t judged_step = 0;
      for (const v1::JobEvent& event : events) {
        if (event.type() == v1::EVENT_TYPE_EPOCH) judged_step = event.progress().step();
      }
      std::vector<JobStore::Change> changes = {{*job, std::move(events)}};
      STOKER_RETURN_IF_ERROR(store_->SaveExperiment(decided, changes));
      experiment->second = std::move(decided);
      events_changed_.SignalAll();
      if (stop.has_value()) {
        // It ends once the checkpoint of the epoch it was judged at is stored (the trainer
        // uploads it right after the epoch's event), so that it keeps those weights.
        pending_stops_[job->id()] = {*stop, judged_step, absl::Now() + absl::Seconds(30)};
        if (job->checkpoint_step() >= judged_step) {
          STOKER_RETURN_IF_ERROR(StopTrial(job->id()));
          response.set_cancel_requested(true);
        }
      }
      return response;
    }
  }
  STOKER_RETURN_IF_ERROR(SaveAndNotify(*job, std::move(events)));
  return response;
}

bool Coordinator::RankZeroStillRuns(const v1::Job& job) {
  if (job.rank_placements_size() == 0) return false;
  auto worker = workers_.find(job.rank_placements(0).worker_id());
  if (worker == workers_.end() || worker->second.lost) return false;
  auto held = worker->second.running.find(RankKey{job.id(), job.attempt(), 0});
  return held != worker->second.running.end() && held->second.delivered;
}

absl::Status Coordinator::CompleteJob(const v1::CompleteJobRequest& request) {
  STOKER_RETURN_IF_ERROR(RequireId(request.job_id(), "job_id"));
  if (!IsFinal(request.state())) {
    return absl::InvalidArgumentError("state: must be SUCCEEDED, FAILED or CANCELLED");
  }
  absl::MutexLock lock(&mu_);
  const int rank = request.rank();
  const RankKey key{request.job_id(), request.attempt(), rank};
  absl::StatusOr<v1::Job> job =
      FencedJob(request.worker_id(), request.job_id(), request.attempt(), rank);
  if (!job.ok()) {
    absl::StatusOr<v1::Job> current = store_->Get(request.job_id());
    // The rank stopped: whatever it held on its worker is free (this attempt no longer runs it).
    if (auto it = workers_.find(request.worker_id()); it != workers_.end() && current.ok()) {
      it->second.running.Erase(key);
    }
    if (current.ok() && current->attempt() == request.attempt() &&
        RunsRank(*current, request.worker_id(), request.attempt(), rank) &&
        (current->state() == v1::JOB_STATE_CANCELLED || current->state() == v1::JOB_STATE_STOPPED ||
         (current->state() == v1::JOB_STATE_SUCCEEDED && rank != 0))) {
      return absl::OkStatus();  // the cancel (or rank 0's success) already finished it
    }
    return job.status();
  }
  const bool gang = IsGang(job->spec());
  // For people: which rank ended, where.
  const std::string who =
      gang ? absl::StrCat("rank ", rank, " on worker ", request.worker_id(), ": ") : "";
  if (request.has_progress() && rank == 0) *job->mutable_progress() = request.progress();
  if (request.state() == v1::JOB_STATE_FAILED && request.released() && gang && rank != 0 &&
      RankZeroStillRuns(*job)) {
    // A worker's shutdown stopped the gang at a vote; rank 0 writes the checkpoint the job
    // resumes from and ends the attempt when it is stored. Requeueing now would refuse that
    // upload as stale and resume from an older one.
    workers_[request.worker_id()].running.Erase(key);
    return SaveAndNotify(
        *job, {MakeEvent(v1::EVENT_TYPE_LOG,
                         absl::StrCat(who, request.error(), "; rank 0 writes the checkpoint"),
                         request.attempt())});
  }
  if (request.state() == v1::JOB_STATE_FAILED && request.released()) {
    job->set_released_attempts(job->released_attempts() + 1);
    std::string why = absl::StrCat(who, request.error());
    if (auto p = preempting_.find(job->id());
        p != preempting_.end() && p->second.attempt == request.attempt()) {
      why = absl::StrCat(who, PreemptedText(p->second), ": gave back at step ",
                         job->checkpoint_step());
      preempting_.erase(p);
    }
    return Requeue(*job, absl::StrCat(why, " (not counted against max_retries)"),
                   request.worker_id(), rank);
  }
  if (request.state() == v1::JOB_STATE_FAILED && !request.permanent()) {
    return Requeue(*job, absl::StrCat(who, request.error()), request.worker_id(), rank);
  }
  if (request.state() == v1::JOB_STATE_SUCCEEDED && rank != 0) {
    // Rank 0 decides the job; this rank's trainer is done and frees what it held.
    workers_[request.worker_id()].running.Erase(key);
    return SaveAndNotify(
        *job, {MakeEvent(v1::EVENT_TYPE_LOG, absl::StrCat(who, "finished"), request.attempt())});
  }
  if (request.state() == v1::JOB_STATE_SUCCEEDED) {
    const int64_t final_step =
        std::max<int64_t>({1, request.progress().step(), request.progress().total_steps()});
    if (job->checkpoint_step() < final_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job->id(), " attempt ", request.attempt(),
          " cannot succeed before the server stores its final weights (step ", final_step,
          "); it holds ",
          job->checkpoint_step() > 0 ? absl::StrCat("step ", job->checkpoint_step()) : "none",
          ": upload the final checkpoint first"));
    }
  }
  job->clear_waiting_reason();
  write_failure_event_time_.erase(job->id());
  job->set_state(request.state());
  job->set_end_time_unix_ms(NowMs());
  job->set_error(request.state() == v1::JOB_STATE_SUCCEEDED ? request.error()
                                                            : absl::StrCat(who, request.error()));
  std::string message;
  if (request.state() == v1::JOB_STATE_SUCCEEDED) {
    message = absl::StrCat("succeeded: test accuracy ", job->progress().test_accuracy());
  } else {
    message = absl::StrCat(JobStateName(request.state()), ": ", job->error());
  }
  // The other ranks of a gang are told to stop by their next heartbeat.
  EndAttempt(*job, request.worker_id(), rank);
  return SaveAndNotify(*job, {MakeEvent(v1::EVENT_TYPE_FINISHED, message, request.attempt())});
}

CoordinatorSnapshot Coordinator::Snapshot() {
  CoordinatorSnapshot snapshot;
  snapshot.checkpoint_dir_free_bytes = checkpoints_.FreeBytes();
  absl::MutexLock lock(&mu_);
  if (absl::StatusOr<std::map<v1::JobState, int64_t>> counts = store_->CountByState();
      counts.ok()) {
    for (const auto& [state, count] : *counts) snapshot.jobs_by_state[JobStateName(state)] = count;
  }
  if (const int64_t oldest = queue_.OldestSubmitMs(); oldest > 0) {
    snapshot.oldest_queued_job_age_seconds = std::max<int64_t>(0, NowMs() - oldest) / 1000.0;
  }
  const absl::Time now = absl::Now();
  for (const auto& [id, worker] : workers_) {
    snapshot
        .workers_by_state[worker.lost ? "lost" : (worker.restored ? "reconnecting" : "alive")]++;
    if (!worker.lost) {
      snapshot.heartbeat_age_seconds[id] = absl::ToDoubleSeconds(now - worker.last_heartbeat);
    }
  }
  SnapshotTeams(snapshot);
  return snapshot;
}

}  // namespace stoker
