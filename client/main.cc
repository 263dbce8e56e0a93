// stoker: the command-line client. Human-readable tables by default, --output json for scripts.
//
// Exit codes: 0 success; 1 the job failed or was cancelled, or the server refused the request;
// 2 bad input (job file, arguments); 3 the server cannot be reached.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/access_commands.h"
#include "client/cli_common.h"
#include "client/dry_run.h"
#include "client/experiment_commands.h"
#include "client/render.h"
#include "client/tensorboard.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "rpc/chunk_stream.h"
#include "spec/job_file.h"
#include "spec/job_spec.h"
#include "stoker.grpc.pb.h"

namespace stoker {
namespace {

class Client {
 public:
  Client(const Options& options, std::shared_ptr<grpc::ChannelCredentials> credentials,
         std::string token)
      : options_(options),
        token_(std::move(token)),
        channel_(grpc::CreateChannel(options.server, std::move(credentials))),
        jobs_(v1::JobService::NewStub(channel_)) {}

  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(timeout));
    AddToken(*context, token_);
    return context;
  }

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  const std::string& token() const { return token_; }

  int Submit(const std::string& path, bool follow, const std::string& request_id,
             const std::string& team) {
    if (absl::Status s = CheckUtf8("--request-id", request_id); !s.ok()) {
      std::cerr << "stoker: " << s.message() << "\n";
      return kExitBadInput;
    }
    absl::StatusOr<JobFile> file = ReadJobFile(path);
    if (!file.ok()) {
      std::cerr << "stoker: " << file.status().message() << "\n";
      return kExitBadInput;
    }
    if (absl::Status s = ValidateJobSpec(file->spec); !s.ok()) {
      std::cerr << "stoker: " << WithFileLocation(*file, s).message() << "\n";
      return kExitBadInput;
    }
    v1::SubmitJobRequest request;
    *request.mutable_spec() = file->spec;
    if (!team.empty()) request.mutable_spec()->set_team(team);
    request.set_request_id(request_id);
    if (file->search.has_value()) *request.mutable_search() = *file->search;
    v1::SubmitJobResponse response;
    grpc::Status status = jobs_->SubmitJob(Context().get(), request, &response);
    if (!status.ok()) {
      if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        // The server names the field; point at its line in the file too.
        std::cerr << "stoker: submit refused: "
                  << WithFileLocation(*file, FromGrpcStatus(status)).message() << "\n";
        return kExitBadInput;
      }
      return ReportRpcError(options_, status, "submit");
    }
    if (response.has_experiment()) {
      const v1::Experiment& e = response.experiment();
      if (options_.json()) {
        std::cout << ToJson(response, true) << "\n";
      } else {
        std::cout << (response.deduplicated() ? "already submitted as experiment "
                                              : "submitted experiment ")
                  << e.id() << " (" << e.name() << "): " << e.trial_count() << " trials by "
                  << e.search().method() << ", " << e.trials_size() << " queued now\n"
                  << "watch it with: stoker experiment status " << e.id() << "\n";
      }
      if (follow)
        std::cerr << "stoker: --follow follows one job; an experiment is watched with "
                     "stoker experiment status\n";
      return kExitOk;
    }
    const v1::Job& job = response.job();
    if (options_.json() && !follow) {
      std::cout << ToJson(response, true) << "\n";
      return kExitOk;
    }
    if (!options_.json()) {
      std::cout << (response.deduplicated() ? "already submitted as " : "submitted ") << job.id()
                << " (" << job.spec().name() << ")\n";
      // Why it cannot start now (no worker, no GPU, jobs ahead), so that a follow that shows
      // nothing for a while is not a mystery; `stoker status` tells it again later.
      if (job.state() == v1::JOB_STATE_QUEUED && !job.waiting_reason().empty() &&
          !absl::StartsWith(job.waiting_reason(), "starting at the next heartbeat")) {
        std::cout << "waiting: " << job.waiting_reason() << "\n";
      }
    }
    return follow ? Follow(job.id(), 0) : kExitOk;
  }

  // Streams a job's events; with follow, until it finishes. Reconnects if the server restarts.
  int Watch(const std::string& job_id, bool follow) {
    if (!follow) {
      int64_t after = 0;
      v1::WatchJobRequest request;
      request.set_job_id(job_id);
      auto context = Context(absl::Seconds(60));
      auto reader = jobs_->WatchJob(context.get(), request);
      v1::JobEvent event;
      while (reader->Read(&event)) {
        after = event.seq();
        PrintEvent(event, /*live=*/false);
      }
      grpc::Status status = reader->Finish();
      if (!status.ok()) return ReportRpcError(options_, status, "logs");
      (void)after;
      return kExitOk;
    }
    return Follow(job_id, 0);
  }

  int Follow(const std::string& job_id, int64_t after_seq) {
    ProgressLine line(isatty(STDOUT_FILENO) && !options_.json());
    absl::Time reconnect_deadline = absl::InfinitePast();
    std::optional<v1::JobEvent> finished;
    while (!finished) {
      grpc::ClientContext context;
      AddToken(context, token_);
      v1::WatchJobRequest request;
      request.set_job_id(job_id);
      request.set_after_seq(after_seq);
      request.set_follow(true);
      auto reader = jobs_->WatchJob(&context, request);
      v1::JobEvent event;
      while (reader->Read(&event)) {
        reconnect_deadline = absl::InfinitePast();
        after_seq = event.seq();
        if (options_.json()) {
          std::cout << ToJson(event, false) << std::endl;
        } else if (event.type() == v1::EVENT_TYPE_PROGRESS) {
          // The live line follows rank 0 (other ranks' progress is named "rank N").
          if (event.message().empty()) line.Update(event.progress());
        } else {
          line.Clear();
          PrintEvent(event, /*live=*/true);
        }
        if (event.type() == v1::EVENT_TYPE_FINISHED) finished = event;
      }
      grpc::Status status = reader->Finish();
      if (finished) break;
      if (status.ok()) {
        // The stream ended without a FINISHED event: the job was already final.
        break;
      }
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) {
        line.Clear();
        return ReportRpcError(options_, status, "watch");
      }
      // The server went away: keep trying for a while, it may be restarting.
      if (reconnect_deadline == absl::InfinitePast()) {
        reconnect_deadline = absl::Now() + absl::Seconds(120);
        line.Clear();
        std::cerr << "stoker: lost the server (" << status.error_message()
                  << "); reconnecting for up to 120 s\n";
      } else if (absl::Now() > reconnect_deadline) {
        return ReportRpcError(options_, status, "watch");
      }
      absl::SleepFor(absl::Seconds(1));
    }
    line.Clear();
    v1::Job job;
    grpc::Status status = jobs_->GetJob(Context().get(), MakeGetRequest(job_id), &job);
    if (!status.ok()) return ReportRpcError(options_, status, "status");
    if (!options_.json()) std::cout << FinalSummary(job) << "\n";
    return job.state() == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitFailed;
  }

  int List(const std::vector<std::string>& states, int limit, const std::string& team,
           const std::string& user, bool all, const std::string& experiment,
           const std::vector<std::string>& labels, const std::string& before) {
    v1::ListJobsRequest request;
    request.set_limit(limit);
    request.set_before_id(before);
    request.set_team(team);
    request.set_user(user);
    request.set_all(all);
    request.set_experiment(experiment);
    for (const std::string& label : labels) request.add_labels(label);
    for (const std::string& name : states) {
      v1::JobState state;
      if (!v1::JobState_Parse("JOB_STATE_" + absl::AsciiStrToUpper(name), &state) ||
          state == v1::JOB_STATE_UNSPECIFIED) {
        std::cerr << "stoker: unknown state '" << name
                  << "' (expected queued, running, succeeded, failed, cancelled or stopped)\n";
        return kExitBadInput;
      }
      request.add_states(state);
    }
    v1::ListJobsResponse response;
    grpc::Status status = jobs_->ListJobs(Context().get(), request, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "list");
    std::cout << (options_.json() ? ToJson(response, true) : JobTable(response)) << "\n";
    if (!options_.json() && !response.next_before_id().empty()) {
      std::cerr << "older jobs: stoker list --before " << response.next_before_id()
                << " (with the same filters)\n";
    }
    return kExitOk;
  }

  int Status(const std::string& job_id) {
    v1::Job job;
    grpc::Status status = jobs_->GetJob(Context().get(), MakeGetRequest(job_id), &job);
    if (!status.ok()) return ReportRpcError(options_, status, "status");
    std::cout << (options_.json() ? ToJson(job, true) : JobDetails(job)) << "\n";
    return kExitOk;
  }

  int Cancel(const std::string& job_id) {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::Status status = jobs_->CancelJob(Context().get(), request, &job);
    if (!status.ok()) return ReportRpcError(options_, status, "cancel");
    std::cout << (options_.json() ? ToJson(job, true) : absl::StrCat("cancelled ", job.id()))
              << "\n";
    return kExitOk;
  }

  int Artifact(const std::string& job_id, const std::string& output) {
    grpc::ClientContext context;
    AddToken(context, token_);
    v1::GetArtifactRequest request;
    request.set_job_id(job_id);
    auto reader = jobs_->GetArtifact(&context, request);
    absl::StatusOr<int64_t> bytes =
        ReceiveChunksToFile([&reader](v1::CheckpointChunk* chunk) { return reader->Read(chunk); },
                            [&reader] { return FromGrpcStatus(reader->Finish()); }, output);
    if (!bytes.ok()) {
      if (absl::IsDataLoss(bytes.status()) || absl::IsInternal(bytes.status())) {
        std::cerr << "stoker: artifact: " << bytes.status().message() << "\n";
        return kExitFailed;
      }
      return ReportRpcError(options_, ToGrpcStatus(bytes.status()), "artifact");
    }
    if (!options_.json()) std::cout << "wrote " << output << " (" << *bytes << " bytes)\n";
    return kExitOk;
  }

  // The job's whole metric history, paged: epochs, or with `steps` the sampled steps.
  int Metrics(const std::string& job_id, bool steps, const std::string& format,
              const std::string& tensorboard) {
    // Each kind is paged on its own: the next page starts after the last step of a kind whose
    // page was full; points seen twice are kept once (by step).
    constexpr int kPage = 1000;
    std::map<int64_t, v1::MetricPoint> epoch_points, step_points;
    int64_t after = 0;
    while (true) {
      v1::GetMetricsRequest request;
      request.set_job_id(job_id);
      request.set_after_step(after);
      request.set_limit(kPage);
      v1::GetMetricsResponse page;
      grpc::Status status = jobs_->GetMetrics(Context().get(), request, &page);
      if (!status.ok()) return ReportRpcError(options_, status, "metrics");
      for (const v1::MetricPoint& p : page.epochs()) epoch_points[p.step()] = p;
      for (const v1::MetricPoint& p : page.steps()) step_points[p.step()] = p;
      int64_t next = -1;
      for (const auto* kind : {&page.epochs(), &page.steps()}) {
        if (kind->size() < kPage) continue;
        const int64_t last = kind->rbegin()->step();
        next = next < 0 ? last : std::min(next, last);
      }
      if (next <= after) break;
      after = next;
    }
    v1::GetMetricsResponse all;
    for (const auto& [step, p] : epoch_points) *all.add_epochs() = p;
    for (const auto& [step, p] : step_points) *all.add_steps() = p;
    const auto& chosen = steps ? all.steps() : all.epochs();
    const std::vector<v1::MetricPoint> points(chosen.begin(), chosen.end());
    if (!tensorboard.empty()) {
      absl::StatusOr<std::string> written =
          WriteTensorBoardEvents(tensorboard, job_id, {all.epochs().begin(), all.epochs().end()},
                                 {all.steps().begin(), all.steps().end()});
      if (!written.ok()) {
        std::cerr << "stoker: metrics: " << written.status().message() << "\n";
        return kExitBadInput;
      }
      std::cout << "wrote " << *written << " (" << all.epochs_size() << " epochs, "
                << all.steps_size() << " steps)\n";
      return kExitOk;
    }
    if (options_.json() || format == "json") {
      std::cout << ToJson(all, true) << "\n";
    } else {
      std::cout << MetricsText(points, format) << "\n";
    }
    return kExitOk;
  }

  int Workers() {
    v1::ListWorkersResponse response;
    grpc::Status status = jobs_->ListWorkers(Context().get(), {}, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "workers");
    std::cout << (options_.json() ? ToJson(response, true) : WorkerTable(response)) << "\n";
    return kExitOk;
  }

 private:
  static v1::GetJobRequest MakeGetRequest(const std::string& job_id) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    return request;
  }

  void PrintEvent(const v1::JobEvent& event, bool live) {
    if (options_.json()) {
      std::cout << ToJson(event, false) << std::endl;
      return;
    }
    (void)live;
    std::cout << EventLine(event) << std::endl;
  }

  Options options_;
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

// The global flags (also taken after the command: a subcommand passes options it does not know
// to the app) and their environment variables.
void AddGlobalFlags(CLI::App& app, Options& options) {
  if (const char* env = std::getenv("STOKER_SERVER"); env != nullptr && *env != '\0') {
    options.server = env;
  }
  app.add_option("--server", options.server, "server address (env STOKER_SERVER)")
      ->capture_default_str();
  if (const char* env = std::getenv("STOKER_TOKEN_FILE"); env != nullptr) options.token_file = env;
  if (const char* env = std::getenv("STOKER_TLS_CA"); env != nullptr) options.tls_ca = env;
  app.add_option("--token-file", options.token_file,
                 "file holding the server's bearer token (env STOKER_TOKEN_FILE)");
  app.add_option("--tls-ca", options.tls_ca,
                 "connect with TLS, trusting this CA certificate (env STOKER_TLS_CA)");
  app.add_option("-o,--output", options.output, "output format")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
}

// The commands and what they were given.
struct Commands {
  CLI::App* submit = nullptr;
  CLI::App* list = nullptr;
  CLI::App* status = nullptr;
  CLI::App* logs = nullptr;
  CLI::App* cancel = nullptr;
  CLI::App* artifact = nullptr;
  CLI::App* metrics = nullptr;
  bool steps = false;
  std::string metrics_format = "table";
  std::string tensorboard;
  std::string job_file, job_id, request_id, artifact_output, team, user, experiment, before;
  std::vector<std::string> labels;
  bool all = false;
  bool best = false;
  bool follow = false;
  bool dry_run = false;
  DryRunOptions dry_run_options;
  std::vector<std::string> states;
  int limit = 50;
};

// Defines every command on `app`, each storing into `c` (which must outlive the parse).
void AddCommands(CLI::App& app, Commands& c) {
  c.submit = app.add_subcommand("submit", "validate a job file and queue the job");
  c.submit->add_option("job_file", c.job_file, "YAML job file")->required();
  c.submit->add_flag("-f,--follow", c.follow, "stream progress until the job finishes");
  c.submit->add_option("--team", c.team,
                       "the team the job runs for (overrides the job file's team:; default: "
                       "your only team)");
  c.submit->add_option("--request-id", c.request_id,
                       "idempotency key: a retried submit with the same id returns the same job");
  c.submit->add_flag("--dry-run", c.dry_run,
                     "check the job file as the server would and print the network it trains (a "
                     "resnet's layers as YAML, shapes, parameter count); submit nothing");
  c.submit->add_option("--sample-shape", c.dry_run_options.sample_shape,
                       "--dry-run: one sample's shape, e.g. 1x28x28 (default: an image dataset's "
                       "channels and size, an idx dataset's header under --data-root)");
  c.submit->add_option("--classes", c.dry_run_options.classes,
                       "--dry-run: the classes (default: dataset.classes)");
  c.submit
      ->add_option("--data-root", c.dry_run_options.data_root,
                   "--dry-run: where an idx dataset's files are read")
      ->capture_default_str();
  c.list = app.add_subcommand("list", "list jobs, newest first");
  c.list->add_option("--state", c.states, "only jobs in these states (repeatable)");
  c.list->add_option("--limit", c.limit, "at most this many")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  c.list->add_option("--team", c.team, "only this team's jobs");
  c.list->add_option("--user", c.user, "only this user's jobs");
  c.list->add_flag("--all", c.all, "every job, whoever may see it (cluster admins)");
  c.list->add_option("--experiment", c.experiment, "only this experiment's trials");
  c.list->add_option("--label", c.labels,
                     "only jobs with this label, key=value (repeatable), e.g. "
                     "train.optimizer.type=adamw");
  c.list->add_option("--before", c.before,
                     "only jobs submitted before this one: the next page (the job id the list "
                     "names when more are older)");
  c.status = app.add_subcommand("status", "show one job");
  c.status->add_option("job_id", c.job_id, "job id, e.g. j-000001")->required();
  c.logs = app.add_subcommand("logs", "print a job's event history");
  c.logs->add_option("job_id", c.job_id, "job id")->required();
  c.logs->add_flag("-f,--follow", c.follow, "keep streaming until the job finishes");
  c.cancel = app.add_subcommand("cancel", "cancel a queued or running job");
  c.cancel->add_option("job_id", c.job_id, "job id")->required();
  app.add_subcommand("workers", "list registered workers");
  c.metrics = app.add_subcommand("metrics", "a job's metric history: a row per epoch (or step)");
  c.metrics->add_option("job_id", c.job_id, "job id")->required();
  c.metrics->add_flag("--steps", c.steps,
                      "the sampled training steps (about 1,000 a job) instead of the epochs");
  c.metrics->add_option("-o,--output", c.metrics_format, "table, csv or json")
      ->check(CLI::IsMember({"table", "csv", "json"}))
      ->capture_default_str();
  c.metrics->add_option("--tensorboard", c.tensorboard,
                        "write the history as a TensorBoard event file in this directory");
  c.artifact = app.add_subcommand("artifact", "download a job's latest checkpoint (safetensors)");
  c.artifact->add_option("job_id", c.job_id, "job id (with --best: an experiment id)")->required();
  c.artifact->add_flag("--best", c.best,
                       "JOB_ID is an experiment: download its best trial's weights (the trial "
                       "with the best final metric)");
  c.artifact
      ->add_option("-o,--output", c.artifact_output,
                   "file to write (an existing directory gets JOB_ID.safetensors)")
      ->required();
}

// A parse error's exit code: an unknown command is named with the list of commands.
int ParseError(CLI::App& app, const CLI::ParseError& e) {
  if (app.get_subcommands().empty() && !app.remaining().empty() &&
      app.remaining().front().rfind('-', 0) != 0) {
    std::vector<std::string> names;
    for (const CLI::App* command : app.get_subcommands({})) names.push_back(command->get_name());
    std::cerr << "stoker: unknown command '" << app.remaining().front()
              << "' (commands: " << absl::StrJoin(names, ", ") << "; see --help)\n";
    return kExitBadInput;
  }
  const int code = app.exit(e);
  return code == 0 ? kExitOk : kExitBadInput;
}

// submit --dry-run: local only (no server, token or TLS).
int DryRun(const Commands& c, const Options& options) {
  absl::StatusOr<JobFile> file = ReadJobFile(c.job_file);
  absl::StatusOr<std::string> report =
      file.ok() ? DryRunReport(*file, c.dry_run_options, options.json()) : file.status();
  if (!report.ok()) {
    std::cerr << "stoker: " << report.status().message() << "\n";
    return kExitBadInput;
  }
  std::cout << *report;
  return kExitOk;
}

// The client for `options`: the token read, the channel's credentials made. INVALID_ARGUMENT
// (bad input) naming the file otherwise.
absl::StatusOr<std::unique_ptr<Client>> Connect(const Options& options) {
  STOKER_ASSIGN_OR_RETURN(const ClientCredentials credentials,
                          LoadClientCredentials(options.token_file, options.tls_ca));
  return std::make_unique<Client>(options, credentials.channel, credentials.token);
}

int RunCommand(Client& client, Commands& c) {
  if (c.submit->parsed()) return client.Submit(c.job_file, c.follow, c.request_id, c.team);
  if (c.list->parsed()) {
    return client.List(c.states, c.limit, c.team, c.user, c.all, c.experiment, c.labels, c.before);
  }
  if (c.status->parsed()) return client.Status(c.job_id);
  if (c.logs->parsed()) return client.Watch(c.job_id, c.follow);
  if (c.cancel->parsed()) return client.Cancel(c.job_id);
  if (c.metrics->parsed()) {
    return client.Metrics(c.job_id, c.steps, c.metrics_format, c.tensorboard);
  }
  if (c.artifact->parsed()) {
    if (c.best) {
      absl::StatusOr<std::string> best = BestTrialJob(client.channel(), client.token(), c.job_id);
      if (!best.ok()) {
        std::cerr << "stoker: artifact: " << best.status().message() << "\n";
        return absl::IsNotFound(best.status()) ? kExitFailed : kExitBadInput;
      }
      std::cerr << "best trial of " << c.job_id << ": " << *best << "\n";
      c.job_id = *best;
    }
    std::error_code ignored;
    if (std::filesystem::is_directory(c.artifact_output, ignored)) {
      c.artifact_output =
          (std::filesystem::path(c.artifact_output) / (c.job_id + ".safetensors")).string();
    }
    return client.Artifact(c.job_id, c.artifact_output);
  }
  return client.Workers();
}

int Main(int argc, char** argv) {
  CLI::App app{"stoker: submit and watch training jobs on a Stoker server"};
  app.require_subcommand(1);
  // Global flags are taken before or after the command (`stoker list -o json`); a command's own
  // option of the same name (artifact's -o FILE) wins after the command.
  app.fallthrough();
  Options options;
  Commands commands;
  AccessCommands access;
  ExperimentCommands experiments;
  AddGlobalFlags(app, options);
  AddCommands(app, commands);
  AddAccessCommands(app, access);
  AddExperimentCommands(app, experiments);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ParseError(app, e);
  }
  if (commands.submit->parsed() && commands.dry_run) return DryRun(commands, options);
  // Job ids travel as protobuf strings, which must be UTF-8.
  for (const auto& [what, text] :
       {std::pair<const char*, const std::string&>{"job id", commands.job_id},
        {"--team", commands.team},
        {"experiment id", experiments.id},
        {"--experiment", commands.experiment},
        {"--user", commands.user}}) {
    if (absl::Status s = CheckUtf8(what, text); !s.ok()) {
      std::cerr << "stoker: " << s.message() << "\n";
      return kExitBadInput;
    }
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(options);
  if (!client.ok()) {
    std::cerr << "stoker: " << client.status().message() << "\n";
    return kExitBadInput;
  }
  if (access.Parsed()) {
    return RunAccessCommand(access, options, (*client)->channel(), (*client)->token());
  }
  if (experiments.Parsed()) {
    return RunExperimentCommand(experiments, options, (*client)->channel(), (*client)->token());
  }
  return RunCommand(**client, commands);
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) { return stoker::Main(argc, argv); }
