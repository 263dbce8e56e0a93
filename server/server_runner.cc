#include "server/server_runner.h"

#include <signal.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "server/access/access_store.h"
#include "server/access/authenticator.h"
#include "server/access_service.h"
#include "server/checkpoint_store.h"
#include "server/coordinator.h"
#include "server/job_store.h"
#include "server/metrics/rpc_metrics_interceptor.h"
#include "server/metrics/server_metrics.h"
#include "server/web/web_server.h"

namespace stoker {
namespace {

sigset_t ShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

// Metrics: counters from the coordinator's events, gauges from a snapshot on each scrape.
class MetricsObserver final : public CoordinatorObserver {
 public:
  explicit MetricsObserver(ServerMetrics* metrics) : metrics_(metrics) {}
  void JobAssigned(double queue_wait_seconds) override {
    metrics_->ObserveQueueWait(queue_wait_seconds);
  }
  void JobRequeued() override { metrics_->JobRequeued(); }
  void CheckpointWriteFailed() override { metrics_->CheckpointWriteFailed(); }
  void SchedulingPass(const char* pass, double seconds) override {
    metrics_->ObserveSchedulingPass(pass, seconds);
  }

 private:
  ServerMetrics* metrics_;
};

absl::StatusOr<std::unique_ptr<ServerMetrics>> StartMetrics(const std::string& listen,
                                                            Coordinator* coordinator) {
  absl::StatusOr<std::unique_ptr<ServerMetrics>> metrics = ServerMetrics::Create(listen);
  if (!metrics.ok()) {
    return absl::Status(metrics.status().code(),
                        absl::StrCat("metrics: ", metrics.status().message()));
  }
  (*metrics)->SetScrapeHook([coordinator](ServerMetrics& m) {
    const CoordinatorSnapshot snapshot = coordinator->Snapshot();
    m.SetJobCounts(snapshot.jobs_by_state);
    m.SetOldestQueuedJobAge(snapshot.oldest_queued_job_age_seconds);
    m.SetWorkerCounts(snapshot.workers_by_state);
    m.SetHeartbeatAges(snapshot.heartbeat_age_seconds);
    m.SetCheckpointDirFreeBytes(snapshot.checkpoint_dir_free_bytes);
    std::map<std::string, ServerMetrics::TeamValues> teams;
    for (const auto& [name, team] : snapshot.teams) {
      teams[name] = {team.quota, team.usage,        team.weight,
                     team.share, team.waiting_jobs, team.preemptions};
    }
    m.SetTeams(teams);
  });
  return metrics;
}

void WritePortFile(const std::string& port_file, int port) {
  const std::string tmp = port_file + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::error_code error;
  std::filesystem::rename(tmp, port_file, error);
}

}  // namespace

void BlockShutdownSignals() {
  const sigset_t signals = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

absl::Status RunServer(const ServerOptions& options) {
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
                          JobStore::Open(options.state_dir + "/jobs.db"));
  CoordinatorOptions coordinator_options;
  coordinator_options.data_root = options.data_root;
  coordinator_options.lease = options.lease;
  coordinator_options.restart_grace = options.restart_grace;
  coordinator_options.gang_backfill_limit = options.gang_backfill_limit;
  coordinator_options.fair_share_half_life = options.fair_share_half_life;
  coordinator_options.preemption = options.preemption;
  coordinator_options.preemption_grace = options.preemption_grace;
  coordinator_options.checkpoint_dir = options.state_dir + "/checkpoints";
  if (const CheckpointStore::Removed removed =
          CheckpointStore(coordinator_options.checkpoint_dir).RemoveUnfinishedUploads();
      removed.files > 0) {
    std::cerr << "stoker-server: removed " << removed.files << " unfinished checkpoint upload(s) ("
              << removed.bytes / (1 << 20) << " MiB) left by an earlier run\n";
  }
  Coordinator coordinator(std::move(store), coordinator_options);
  if (absl::Status s = coordinator.Recover(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("recovering jobs: ", s.message()));
  }

  std::unique_ptr<ServerMetrics> metrics;
  std::unique_ptr<MetricsObserver> observer;
  if (!options.metrics_listen.empty()) {
    STOKER_ASSIGN_OR_RETURN(metrics, StartMetrics(options.metrics_listen, &coordinator));
    observer = std::make_unique<MetricsObserver>(metrics.get());
    coordinator.SetObserver(observer.get());
    std::cerr << "stoker-server: metrics on port " << metrics->Port() << "\n";
  }

  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<AccessStore> access,
                          AccessStore::Open(options.state_dir + "/jobs.db"));
  if (!options.bootstrap_admin.empty()) {
    absl::StatusOr<AccessStore::NewToken> created = access->Bootstrap(
        options.bootstrap_admin, options.bootstrap_token, options.bootstrap_join_token,
        absl::ToUnixMillis(absl::Now() + absl::Hours(1)));
    if (created.ok()) {
      std::cerr << "stoker-server: created the first cluster admin '" << options.bootstrap_admin
                << "' with the token of --bootstrap-token-file (" << created->info.id() << ")"
                << (options.bootstrap_join_token.empty()
                        ? ""
                        : " and a join token for workers, usable for an hour")
                << "\n";
    } else if (absl::IsFailedPrecondition(created.status())) {
      std::cerr << "stoker-server: --bootstrap-admin ignored: " << created.status().message()
                << "\n";
    } else {
      return absl::Status(created.status().code(),
                          absl::StrCat("--bootstrap-admin: ", created.status().message()));
    }
  }
  Authenticator auth(access.get(), options.token);
  if (options.require_tokens && !auth.required()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to serve ", options.listen,
        " without tokens: create the first admin (stoker-server bootstrap-admin) or pass "
        "--token-file; pass --insecure to allow it on a trusted network"));
  }
  JobServiceImpl job_service(&coordinator, &auth, access.get(), options.stream_limits);
  JobQueries web_queries(&coordinator);
  std::unique_ptr<web::WebServer> web_server;
  if (!options.web_listen.empty()) {
    STOKER_ASSIGN_OR_RETURN(web_server, web::WebServer::Start({.listen = options.web_listen,
                                                               .tls_cert = options.tls_cert,
                                                               .tls_key = options.tls_key},
                                                              &web_queries, &auth));
    std::cerr << "stoker-server: web page on port " << web_server->port()
              << (options.tls_cert.empty() ? " (http)" : " (https)") << "\n";
  }
  WorkerServiceImpl worker_service(&coordinator, &auth, access.get());
  AccessServiceImpl access_service(&auth, access.get(), &coordinator);
  coordinator.SetQuotaSource([store = access.get()] { return store->AllQuotas(); });
  grpc::ServerBuilder builder;
  int bound_port = 0;
  // Without this gRPC sets SO_REUSEPORT, and a second server on the same port starts "fine" and
  // takes half the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, options.credentials, &bound_port);
  builder.RegisterService(&job_service);
  builder.RegisterService(&worker_service);
  builder.RegisterService(&access_service);
  // Checkpoint chunks are 1 MiB; job specs are far smaller.
  builder.SetMaxReceiveMessageSize(4 << 20);
  if (metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(MakeRpcMetricsInterceptorFactory(metrics.get()));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen,
                     " (is the port in use, or the address not one of this machine's?)"));
  }
  std::cerr << "stoker-server: serving on port " << bound_port
            << (options.tls ? " (TLS" : " (plaintext")
            << (auth.legacy()     ? ", tokens required, legacy token accepted)"
                : auth.required() ? ", tokens required)"
                                  : ", no token: open to anyone who reaches it)")
            << ", store " << options.state_dir << "/jobs.db, data root " << options.data_root
            << "\n";
  if (!options.port_file.empty()) WritePortFile(options.port_file, bound_port);

  std::atomic<bool> stopping{false};
  std::thread lease_sweeper([&] {
    constexpr absl::Duration kSweepInterval = absl::Milliseconds(250);
    absl::Time last_sweep = absl::Now();
    while (!stopping.load()) {
      // A sweep far later than its interval means this process did not run in between (stopped,
      // a stalled VM, a starved machine): the workers' heartbeats could not be heard then, and
      // must not count as missed.
      const absl::Time now = absl::Now();
      if (const absl::Duration late = now - last_sweep - kSweepInterval; late > absl::Seconds(1)) {
        coordinator.ExtendLeases(late);
        std::cerr << "stoker-server: did not run for "
                  << absl::FormatDuration(absl::Trunc(late, absl::Milliseconds(100)))
                  << " (paused or starved); worker leases extended by as much\n";
      }
      last_sweep = now;
      coordinator.ExpireLeases();
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(kSweepInterval));
    }
  });
  const sigset_t signals = ShutdownSignals();
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::cerr << "stoker-server: " << strsignal(signal_number) << ", shutting down\n";
  stopping = true;
  coordinator.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  lease_sweeper.join();
  return absl::OkStatus();
}

}  // namespace stoker
