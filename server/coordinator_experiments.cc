// Coordinator (coordinator.h): experiments, i.e. hyperparameter searches (spec/search.h). The
// server owns a search: it is stored at submit, its trials are ordinary jobs made as the
// concurrency cap allows (from the lease sweep, once a second), and ASHA's decisions are made
// when a trial reports an epoch. Every change of an experiment is stored in one transaction with
// the jobs it touches, so a restart loses no decision and makes none twice.
#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/submit_checks.h"
#include "spec/job_spec.h"
#include "spec/search.h"

namespace stoker {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// Trial `index`'s job: the base with the trial's values, named after the experiment.
absl::StatusOr<v1::JobSpec> TrialSpec(const v1::JobSpec& base, const v1::SearchSpec& search,
                                      int index) {
  STOKER_ASSIGN_OR_RETURN(v1::JobSpec spec, TrialJob(base, TrialAt(search, index)));
  spec.set_name(absl::StrCat(base.name().empty() ? "trial" : base.name(), "-t", index));
  ApplyJobDefaults(&spec);
  return spec;
}

// The metric a trial's epoch event gives the search (larger is better), or nothing.
std::optional<double> SearchMetric(const v1::SearchSpec& search,
                                   const v1::TrainingProgress& progress) {
  if (MetricIsMinimised(search)) {
    if (progress.test_loss() < 0) return std::nullopt;
    return -progress.test_loss();
  }
  if (progress.test_accuracy() < 0) return std::nullopt;
  return progress.test_accuracy();
}

}  // namespace

absl::StatusOr<v1::SubmitJobResponse> Coordinator::SubmitExperiment(
    const v1::SubmitJobRequest& request, const std::string& owner,
    const std::optional<v1::AuditRecord>& audit) {
  if (request.request_id().size() > 256) {
    return absl::InvalidArgumentError("request_id: longer than 256 characters");
  }
  const v1::SearchSpec& search = request.search();
  if (search.method() != "grid" && search.method() != "random" && search.method() != "asha") {
    return absl::InvalidArgumentError("search.method: one of grid, random, asha");
  }
  if (search.max_trials() < 0 || search.max_trials() > kMaxTrials ||
      search.max_concurrent_trials() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("search.max_trials: between 1 and ", kMaxTrials));
  }
  if (!search.metric().empty() && search.metric() != "test_accuracy" &&
      search.metric() != "test_loss") {
    return absl::InvalidArgumentError("search.metric: test_accuracy or test_loss");
  }
  STOKER_ASSIGN_OR_RETURN(const int count, TrialCount(search));
  if (count < 1) return absl::InvalidArgumentError("search: no trial to run (max_trials)");
  v1::JobSpec base = request.spec();
  ApplyJobDefaults(&base);
  const Quotas quotas = quota_source_ ? quota_source_() : Quotas{};
  const auto quota = quotas.find(base.team());
  // Every trial is checked as a submitted job is (the probes of its data are remembered, so a
  // search over one dataset reads it once).
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<v1::JobSpec> spec = TrialSpec(base, search, i);
    absl::Status valid = spec.status();
    if (valid.ok()) valid = ValidateJobSpec(*spec);
    v1::JobSpec resolved;
    if (valid.ok()) {
      resolved = *spec;
      valid = ResolveDatasetPaths(options_.data_root, &resolved);
    }
    if (valid.ok()) valid = CheckModelAgainstData(*spec, resolved, options_.data_root);
    // A trial its team's quota could never hold (a search over resources) is refused now too.
    if (valid.ok() && quota != quotas.end()) {
      valid = QuotaCanHold(base.team(), quota->second, LeastChargeOf(*spec));
    }
    if (!valid.ok()) {
      return absl::Status(valid.code(),
                          absl::StrCat("search: trial ", i, " (", TrialSummary(TrialAt(search, i)),
                                       "): ", valid.message()));
    }
  }
  v1::Experiment experiment;
  experiment.set_name(base.name());
  experiment.set_owner(owner);
  experiment.set_team(base.team());
  *experiment.mutable_base() = base;
  *experiment.mutable_search() = search;
  if (experiment.search().metric().empty())
    experiment.mutable_search()->set_metric("test_accuracy");
  experiment.set_state(v1::EXPERIMENT_STATE_RUNNING);
  experiment.set_submit_time_unix_ms(NowMs());
  experiment.set_trial_count(count);
  experiment.set_request_id(request.request_id());
  absl::MutexLock lock(&mu_);
  STOKER_ASSIGN_OR_RETURN(JobStore::InsertedExperiment inserted,
                          store_->InsertExperiment(std::move(experiment), audit));
  v1::SubmitJobResponse response;
  response.set_deduplicated(inserted.deduplicated);
  if (!inserted.deduplicated) {
    const std::string id = inserted.experiment.id();
    running_experiments_[id] = std::move(inserted.experiment);
    STOKER_RETURN_IF_ERROR(AdvanceExperiment(running_experiments_[id]));
    *response.mutable_experiment() = running_experiments_[id];
    ServerLog(absl::StrCat("experiment ", id, " (", search.method(), ", ", count,
                           " trials) submitted", owner.empty() ? "" : " by " + owner));
  } else {
    *response.mutable_experiment() = std::move(inserted.experiment);
  }
  return response;
}

absl::Status Coordinator::AdvanceExperiment(v1::Experiment& experiment) {
  if (experiment.state() != v1::EXPERIMENT_STATE_RUNNING) return absl::OkStatus();
  bool changed = false;
  int live = 0;
  for (v1::ExperimentTrial& trial : *experiment.mutable_trials()) {
    if (trial.job_id().empty() || IsFinal(trial.state())) continue;
    absl::StatusOr<v1::Job> job = store_->Get(trial.job_id());
    if (!job.ok()) return job.status();
    if (job->state() != trial.state()) {
      trial.set_state(job->state());
      changed = true;
    }
    if (!IsFinal(job->state())) ++live;
  }
  const v1::SearchSpec& search = experiment.search();
  const int cap = search.max_concurrent_trials() > 0 ? search.max_concurrent_trials()
                                                     : experiment.trial_count();
  std::deque<v1::JobSpec> specs;  // the new jobs' specs (NewJob points at them)
  std::vector<JobStore::NewJob> jobs;
  // At most 500 new trials a pass (the rest a second later), so that a 10,000-trial search does
  // not hold the scheduler for its whole insert.
  constexpr size_t kTrialsPerPass = 500;
  while (experiment.trials_size() < experiment.trial_count() && live < cap &&
         jobs.size() < kTrialsPerPass) {
    const int index = experiment.trials_size();
    const v1::TrialParameters values = TrialAt(search, index);
    v1::ExperimentTrial* trial = experiment.add_trials();
    trial->set_index(index);
    trial->mutable_values()->insert(values.values().begin(), values.values().end());
    absl::StatusOr<v1::JobSpec> spec = TrialSpec(experiment.base(), search, index);
    if (!spec.ok()) {
      // Checked at submit; a server of another version could disagree. The trial fails alone.
      trial->set_state(v1::JOB_STATE_FAILED);
      ServerLog(absl::StrCat("experiment ", experiment.id(), " trial ", index, ": ",
                             spec.status().message()));
      changed = true;
      continue;
    }
    specs.push_back(std::move(*spec));
    JobStore::NewJob& job = jobs.emplace_back();
    job.spec = &specs.back();
    job.now_unix_ms = NowMs();
    job.first_event =
        MakeEvent(v1::EVENT_TYPE_LOG, absl::StrCat("trial ", index, " of experiment ",
                                                   experiment.id(), ": ", TrialSummary(values)));
    job.owner = experiment.owner();
    job.experiment_id = experiment.id();
    job.labels = {{"experiment", experiment.id()}, {"trial", absl::StrCat(index)}};
    for (const auto& [path, value] : values.values()) job.labels[path] = value;
    ++live;
  }
  if (live == 0 && experiment.trials_size() == experiment.trial_count()) {
    experiment.set_state(v1::EXPERIMENT_STATE_COMPLETED);
    experiment.set_end_time_unix_ms(NowMs());
    ServerLog(absl::StrCat("experiment ", experiment.id(), " completed"));
    changed = true;
  }
  if (!jobs.empty()) {
    STOKER_ASSIGN_OR_RETURN(std::vector<JobStore::Inserted> inserted,
                            store_->InsertTrials(&experiment, std::move(jobs)));
    for (const JobStore::Inserted& job : inserted) queue_.Update(job.job);
    events_changed_.SignalAll();
    return absl::OkStatus();
  }
  if (!changed) return absl::OkStatus();
  std::vector<JobStore::Change> none;
  return store_->SaveExperiment(experiment, none);
}

void Coordinator::AdvanceExperiments() {
  StopLateTrials();
  for (auto it = running_experiments_.begin(); it != running_experiments_.end();) {
    if (absl::Status s = AdvanceExperiment(it->second); !s.ok()) {
      ServerLog(absl::StrCat("experiment ", it->first, ": ", s.message()));
    }
    if (it->second.state() != v1::EXPERIMENT_STATE_RUNNING) {
      it = running_experiments_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status Coordinator::LoadExperiments() {
  STOKER_ASSIGN_OR_RETURN(std::vector<v1::Experiment> running,
                          store_->ListExperiments(0, JobFilter{}, /*running_only=*/true));
  for (v1::Experiment& experiment : running) {
    // A stop decided before the restart whose trial had not ended yet ends soon (its checkpoint
    // may still arrive first).
    for (const v1::AshaRecord& record : experiment.asha_records()) {
      if (!record.stopped()) continue;
      for (const v1::ExperimentTrial& trial : experiment.trials()) {
        if (trial.index() != record.trial() || trial.job_id().empty() || IsFinal(trial.state())) {
          continue;
        }
        pending_stops_[trial.job_id()] = {
            absl::StrCat("stopped by ASHA at rung ", record.rung() + 1,
                         " (decided before the server restarted)"),
            0, absl::Now() + absl::Seconds(5)};
      }
    }
    const std::string id = experiment.id();
    running_experiments_[id] = std::move(experiment);
  }
  return absl::OkStatus();
}

std::optional<std::string> Coordinator::AshaDecision(v1::Experiment& experiment, v1::Job& job,
                                                     const std::vector<v1::JobEvent>& events) {
  const v1::SearchSpec& search = experiment.search();
  int index = -1;
  if (auto label = job.labels().find("trial");
      label == job.labels().end() || !absl::SimpleAtoi(label->second, &index)) {
    return std::nullopt;
  }
  const std::vector<int> rungs = AshaRungEpochs(search.asha(), experiment.base().train().epochs());
  AshaStopping asha(rungs,
                    search.asha().reduction_factor() > 1 ? search.asha().reduction_factor() : 3);
  for (const v1::AshaRecord& record : experiment.asha_records()) {
    asha.Replay(record.rung(), record.trial(), record.metric(), record.stopped());
  }
  for (const v1::JobEvent& event : events) {
    if (event.type() != v1::EVENT_TYPE_EPOCH) continue;
    const std::optional<double> metric = SearchMetric(search, event.progress());
    if (!metric.has_value()) continue;
    std::vector<size_t> before;
    for (const auto& rung : asha.rungs()) before.push_back(rung.size());
    const bool goes_on = asha.Report(index, event.progress().epoch(), *metric);
    int last_rung = -1;
    for (size_t r = 0; r < rungs.size(); ++r) {
      for (size_t i = before[r]; i < asha.rungs()[r].size(); ++i) {
        v1::AshaRecord* record = experiment.add_asha_records();
        record->set_rung(static_cast<int>(r));
        record->set_trial(index);
        record->set_metric(*metric);
        last_rung = static_cast<int>(r);
      }
    }
    for (v1::ExperimentTrial& trial : *experiment.mutable_trials()) {
      if (trial.index() == index && last_rung >= 0) trial.set_rungs_reached(last_rung + 1);
    }
    if (!goes_on && last_rung >= 0) {
      experiment.mutable_asha_records()->rbegin()->set_stopped(true);
      const size_t n = asha.rungs()[last_rung].size();
      const int factor =
          search.asha().reduction_factor() > 1 ? search.asha().reduction_factor() : 3;
      return absl::StrCat("stopped by ASHA at rung ", last_rung + 1, " of ", rungs.size(), " (",
                          rungs[last_rung], " epochs): ", search.metric(), " ",
                          MetricIsMinimised(search) ? -*metric : *metric, " is not in the top ",
                          std::max<size_t>(1, n / factor), " of the ", n,
                          " trials that reached it");
    }
  }
  return std::nullopt;
}

absl::Status Coordinator::StopTrial(const std::string& job_id) {
  const auto pending = pending_stops_.find(job_id);
  if (pending == pending_stops_.end()) return absl::OkStatus();
  const std::string reason = pending->second.reason;
  pending_stops_.erase(pending);
  STOKER_ASSIGN_OR_RETURN(v1::Job job, store_->Get(job_id));
  if (IsFinal(job.state())) return absl::OkStatus();
  job.set_state(v1::JOB_STATE_STOPPED);
  job.set_end_time_unix_ms(NowMs());
  job.set_error(reason);
  job.clear_waiting_reason();
  std::vector<JobStore::Change> changes = {
      {job, {MakeEvent(v1::EVENT_TYPE_FINISHED, reason, job.attempt())}}};
  auto experiment = running_experiments_.find(job.experiment_id());
  if (experiment == running_experiments_.end()) {
    STOKER_RETURN_IF_ERROR(store_->SaveMany(changes));
  } else {
    v1::Experiment updated = experiment->second;
    for (v1::ExperimentTrial& trial : *updated.mutable_trials()) {
      if (trial.job_id() == job_id) trial.set_state(v1::JOB_STATE_STOPPED);
    }
    STOKER_RETURN_IF_ERROR(store_->SaveExperiment(updated, changes));
    experiment->second = std::move(updated);
  }
  // Its worker is told to stop the trainer at its next heartbeat or report.
  EndAttempt(job, "", -1);
  queue_.Update(job);
  events_changed_.SignalAll();
  ServerLog(absl::StrCat("job ", job_id, " ", reason));
  return absl::OkStatus();
}

void Coordinator::StopLateTrials() {
  const absl::Time now = absl::Now();
  std::vector<std::string> late;
  for (const auto& [job_id, stop] : pending_stops_) {
    if (now >= stop.deadline) late.push_back(job_id);
  }
  for (const std::string& job_id : late) {
    if (absl::Status s = StopTrial(job_id); !s.ok()) {
      ServerLog(absl::StrCat("stopping ", job_id, ": ", s.message()));
    }
  }
}

absl::StatusOr<v1::Experiment> Coordinator::GetExperiment(const std::string& id) {
  STOKER_RETURN_IF_ERROR(RequireId(id, "experiment_id"));
  absl::MutexLock lock(&mu_);
  if (auto it = running_experiments_.find(id); it != running_experiments_.end()) {
    return it->second;
  }
  return store_->GetExperiment(id);
}

absl::StatusOr<v1::ListExperimentsResponse> Coordinator::ListExperiments(
    const v1::ListExperimentsRequest& request, const JobFilter& filter) {
  if (request.limit() < 0 || request.limit() > 10000) {
    return absl::InvalidArgumentError("limit: must be between 0 and 10000");
  }
  absl::MutexLock lock(&mu_);
  STOKER_ASSIGN_OR_RETURN(
      std::vector<v1::Experiment> experiments,
      store_->ListExperiments(request.limit() == 0 ? 100 : request.limit(), filter));
  v1::ListExperimentsResponse response;
  for (v1::Experiment& experiment : experiments) {
    if (auto it = running_experiments_.find(experiment.id()); it != running_experiments_.end()) {
      experiment = it->second;
    }
    *response.add_experiments() = std::move(experiment);
  }
  return response;
}

absl::StatusOr<v1::Experiment> Coordinator::CancelExperiment(
    const std::string& id, const std::optional<v1::AuditRecord>& audit) {
  STOKER_RETURN_IF_ERROR(RequireId(id, "experiment_id"));
  absl::MutexLock lock(&mu_);
  auto it = running_experiments_.find(id);
  if (it == running_experiments_.end()) {
    STOKER_ASSIGN_OR_RETURN(const v1::Experiment stored, store_->GetExperiment(id));
    return absl::FailedPreconditionError(
        absl::StrCat("experiment ", id, " already ",
                     stored.state() == v1::EXPERIMENT_STATE_CANCELLED ? "cancelled" : "completed"));
  }
  v1::Experiment experiment = it->second;
  std::vector<JobStore::Change> changes;
  const std::string why =
      audit.has_value() && audit->principal() != "open"
          ? absl::StrCat("cancelled with experiment ", id, " (", audit->principal(), ")")
          : absl::StrCat("cancelled with experiment ", id);
  std::vector<v1::Job> ended;
  for (v1::ExperimentTrial& trial : *experiment.mutable_trials()) {
    if (trial.job_id().empty()) continue;
    STOKER_ASSIGN_OR_RETURN(v1::Job job, store_->Get(trial.job_id()));
    if (IsFinal(job.state())) {
      trial.set_state(job.state());
      continue;
    }
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_end_time_unix_ms(NowMs());
    job.set_error(why);
    trial.set_state(v1::JOB_STATE_CANCELLED);
    changes.push_back({job, {MakeEvent(v1::EVENT_TYPE_FINISHED, why, job.attempt())}});
    ended.push_back(std::move(job));
  }
  experiment.set_state(v1::EXPERIMENT_STATE_CANCELLED);
  experiment.set_end_time_unix_ms(NowMs());
  STOKER_RETURN_IF_ERROR(store_->SaveExperiment(experiment, changes, audit));
  // Delivered ranks keep what they hold until their workers have stopped them.
  for (const v1::Job& job : ended) {
    EndAttempt(job, "", -1);
    queue_.Update(job);
  }
  events_changed_.SignalAll();
  running_experiments_.erase(it);
  return experiment;
}

}  // namespace stoker
