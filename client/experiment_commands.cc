#include "client/experiment_commands.h"

#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/experiment_render.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "stoker.grpc.pb.h"

namespace stoker {
namespace {

std::unique_ptr<grpc::ClientContext> Context(const std::string& token,
                                             absl::Duration timeout = absl::Seconds(30)) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(timeout));
  AddToken(*context, token);
  return context;
}

// The experiment and a row per trial (restricted to `only` when given): each made trial's job and
// the search metric over its epochs, from the job's metric history.
absl::StatusOr<std::pair<v1::Experiment, std::vector<TrialRow>>> Load(
    v1::JobService::Stub& jobs, const std::string& token, const std::string& id,
    const std::vector<std::string>& only = {}) {
  v1::GetExperimentRequest get;
  get.set_experiment_id(id);
  v1::Experiment experiment;
  if (grpc::Status s = jobs.GetExperiment(Context(token).get(), get, &experiment); !s.ok()) {
    return FromGrpcStatus(s);
  }
  v1::ListJobsRequest list;
  list.set_experiment(id);
  list.set_limit(10000);
  v1::ListJobsResponse listed;
  if (grpc::Status s = jobs.ListJobs(Context(token).get(), list, &listed); !s.ok()) {
    return FromGrpcStatus(s);
  }
  std::map<std::string, v1::Job> by_id;
  for (const v1::Job& job : listed.jobs()) by_id[job.id()] = job;
  for (const std::string& job_id : only) {
    if (!by_id.contains(job_id)) {
      return absl::NotFoundError(absl::StrCat(job_id, " is not a trial of ", id));
    }
  }
  std::vector<TrialRow> rows;
  for (const v1::ExperimentTrial& trial : experiment.trials()) {
    if (!only.empty() && std::find(only.begin(), only.end(), trial.job_id()) == only.end()) {
      continue;
    }
    TrialRow& row = rows.emplace_back();
    row.trial = trial;
    auto job = by_id.find(trial.job_id());
    if (job == by_id.end()) continue;
    row.job = job->second;
    // The epoch points, a page at a time (a job has one per epoch).
    std::vector<v1::MetricPoint> epochs;
    v1::GetMetricsRequest request;
    request.set_job_id(trial.job_id());
    while (true) {
      v1::GetMetricsResponse page;
      if (grpc::Status s = jobs.GetMetrics(Context(token).get(), request, &page); !s.ok()) {
        return FromGrpcStatus(s);
      }
      epochs.insert(epochs.end(), page.epochs().begin(), page.epochs().end());
      if (!page.more() || page.epochs().empty()) break;
      request.set_after_step(page.epochs().rbegin()->step());
    }
    SetTrialMetric(experiment, epochs, &row);
  }
  return std::make_pair(std::move(experiment), std::move(rows));
}

}  // namespace

bool ExperimentCommands::Parsed() const {
  for (const CLI::App* command : {list, status, cancel, compare}) {
    if (command != nullptr && command->parsed()) return true;
  }
  return false;
}

void AddExperimentCommands(CLI::App& app, ExperimentCommands& c) {
  CLI::App* experiment = app.add_subcommand(
      "experiment", "hyperparameter searches (a job file with a search: section)");
  experiment->require_subcommand(1);
  c.list = experiment->add_subcommand("list", "list experiments, newest first");
  c.list->add_option("--limit", c.limit, "at most this many")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  c.list->add_flag("--all", c.all, "every experiment, whoever may see it (cluster admins)");
  c.status = experiment->add_subcommand("status", "show an experiment and its trials");
  c.status->add_option("experiment_id", c.id, "experiment id, e.g. e-000001")->required();
  c.cancel = experiment->add_subcommand(
      "cancel", "cancel an experiment: its queued and running trials, and the trials to come");
  c.cancel->add_option("experiment_id", c.id, "experiment id")->required();
  c.compare = experiment->add_subcommand(
      "compare", "the trials side by side: the hyperparameters that differ, best and final metric");
  c.compare->add_option("experiment_id", c.id, "experiment id")->required();
  c.compare->add_option("job_ids", c.jobs, "only these trials (job ids)");
  c.compare->add_option("-o,--output", c.format, "table, csv or json")
      ->check(CLI::IsMember({"table", "csv", "json"}))
      ->capture_default_str();
}

int RunExperimentCommand(const ExperimentCommands& c, const Options& options,
                         const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  auto jobs = v1::JobService::NewStub(channel);
  if (c.list->parsed()) {
    v1::ListExperimentsRequest request;
    request.set_limit(c.limit);
    request.set_all(c.all);
    v1::ListExperimentsResponse response;
    grpc::Status status = jobs->ListExperiments(Context(token).get(), request, &response);
    if (!status.ok()) return ReportRpcError(options, status, "experiment list");
    std::cout << (options.json() ? ToJson(response, true) : ExperimentTable(response)) << "\n";
    return kExitOk;
  }
  if (c.cancel->parsed()) {
    v1::CancelExperimentRequest request;
    request.set_experiment_id(c.id);
    v1::Experiment experiment;
    grpc::Status status = jobs->CancelExperiment(Context(token).get(), request, &experiment);
    if (!status.ok()) return ReportRpcError(options, status, "experiment cancel");
    std::cout << (options.json() ? ToJson(experiment, true)
                                 : absl::StrCat("cancelled ", experiment.id()))
              << "\n";
    return kExitOk;
  }
  auto loaded = Load(*jobs, token, c.id, c.compare->parsed() ? c.jobs : std::vector<std::string>{});
  if (!loaded.ok()) {
    return ReportRpcError(options, ToGrpcStatus(loaded.status()),
                          c.status->parsed() ? "experiment status" : "experiment compare");
  }
  const auto& [experiment, rows] = *loaded;
  if (c.status->parsed()) {
    std::cout << (options.json() ? ToJson(experiment, true) : ExperimentDetails(experiment, rows))
              << "\n";
    return kExitOk;
  }
  std::cout << CompareTrials(experiment, rows, options.json() ? "json" : c.format) << "\n";
  return kExitOk;
}

absl::StatusOr<std::string> BestTrialJob(const std::shared_ptr<grpc::Channel>& channel,
                                         const std::string& token,
                                         const std::string& experiment_id) {
  auto jobs = v1::JobService::NewStub(channel);
  auto loaded = Load(*jobs, token, experiment_id);
  if (!loaded.ok()) return loaded.status();
  const int best = BestTrial(loaded->first, loaded->second);
  if (best < 0) {
    return absl::NotFoundError(
        absl::StrCat("experiment ", experiment_id, " has no trial with stored weights yet"));
  }
  return loaded->second[best].job->id();
}

}  // namespace stoker
