#include "server/job_queries.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace stoker {
namespace {

// What a listing shows `who`: open and legacy callers (and `all`, checked by the caller) the
// whole cluster; a user its teams' jobs or experiments and its own.
JobFilter VisibleTo(const Principal& who, bool all) {
  JobFilter filter;
  if (who.kind == Principal::Kind::kUser && !all) {
    filter.everything = false;
    filter.visible_owner = who.Name();
    for (const auto& [team, role] : who.teams) filter.visible_teams.push_back(team);
  }
  return filter;
}

Resource JobResource(const v1::Job& job) {
  Resource r;
  r.id = job.id();
  r.owner = job.owner();
  r.team = job.spec().team();
  return r;
}

}  // namespace

absl::StatusOr<v1::Job> JobQueries::AuthorizedJob(const Principal& who, Action action,
                                                  const std::string& job_id) {
  // The token's kind first: a worker token learns nothing about which jobs exist.
  if (absl::Status s = Authorize(who, Action::kListJobs, {}); !s.ok()) return s;
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(job_id);
  if (!job.ok()) return job.status();
  if (absl::Status s = Authorize(who, action, JobResource(*job)); !s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Experiment> JobQueries::AuthorizedExperiment(const Principal& who, Action action,
                                                                const std::string& id) {
  if (absl::Status s = Authorize(who, Action::kListJobs, {}); !s.ok()) return s;
  absl::StatusOr<v1::Experiment> experiment = coordinator_->GetExperiment(id);
  if (!experiment.ok()) return experiment.status();
  Resource resource;
  resource.id = id;
  resource.owner = experiment->owner();
  resource.team = experiment->team();
  if (absl::Status s = Authorize(who, action, resource); !s.ok()) {
    if (absl::IsNotFound(s)) return absl::NotFoundError(absl::StrCat("no experiment '", id, "'"));
    return absl::Status(s.code(), absl::StrReplaceAll(s.message(), {{"the job's",
                                                                     "the "
                                                                     "experiment's"},
                                                                    {"job", "experiment"}}));
  }
  return experiment;
}

absl::StatusOr<v1::ListJobsResponse> JobQueries::ListJobs(const Principal& who,
                                                          const v1::ListJobsRequest& request) {
  if (absl::Status s = Authorize(who, Action::kListJobs, {}); !s.ok()) return s;
  if (request.all() && !who.IsClusterAdmin()) {
    return absl::PermissionDeniedError("only cluster admins may list every job (--all)");
  }
  return coordinator_->ListJobs(request, VisibleTo(who, request.all()));
}

absl::StatusOr<v1::ListExperimentsResponse> JobQueries::ListExperiments(
    const Principal& who, const v1::ListExperimentsRequest& request) {
  if (absl::Status s = Authorize(who, Action::kListJobs, {}); !s.ok()) return s;
  if (request.all() && !who.IsClusterAdmin()) {
    return absl::PermissionDeniedError("only cluster admins may list every experiment (--all)");
  }
  return coordinator_->ListExperiments(request, VisibleTo(who, request.all()));
}

absl::StatusOr<v1::GetMetricsResponse> JobQueries::Metrics(const Principal& who,
                                                           const v1::GetMetricsRequest& request) {
  // As its logs: those who may read them.
  if (absl::StatusOr<v1::Job> job = AuthorizedJob(who, Action::kReadJob, request.job_id());
      !job.ok()) {
    return job.status();
  }
  return coordinator_->GetMetrics(request);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobQueries::RecentEvents(const Principal& who,
                                                                   const std::string& job_id,
                                                                   int limit) {
  if (absl::StatusOr<v1::Job> job = AuthorizedJob(who, Action::kReadJob, job_id); !job.ok()) {
    return job.status();
  }
  return coordinator_->RecentEvents(job_id, limit);
}

absl::StatusOr<v1::ListWorkersResponse> JobQueries::ListWorkers(const Principal& who) {
  if (absl::Status s = Authorize(who, Action::kListWorkers, {}); !s.ok()) return s;
  v1::ListWorkersResponse response = coordinator_->ListWorkers();
  if (who.IsClusterAdmin()) return response;
  // Other teams' jobs show as occupied capacity: counted, never named.
  std::map<std::string, bool> visible;
  auto may_see = [&](const std::string& job_id) {
    auto [it, fresh] = visible.emplace(job_id, false);
    if (fresh) it->second = AuthorizedJob(who, Action::kViewJob, job_id).ok();
    return it->second;
  };
  for (v1::WorkerStatus& worker : *response.mutable_workers()) {
    std::vector<std::string> shown;
    for (const std::string& id : worker.job_ids()) {
      if (may_see(id)) {
        shown.push_back(id);
      } else {
        worker.set_hidden_jobs(worker.hidden_jobs() + 1);
      }
    }
    worker.clear_job_ids();
    for (std::string& id : shown) worker.add_job_ids(std::move(id));
    for (v1::Placement& placement : *worker.mutable_placements()) {
      if (!may_see(placement.job_id())) placement.clear_job_id();
    }
  }
  return response;
}

}  // namespace stoker
