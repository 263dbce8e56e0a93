// stoker-server: the job service. Parses flags, opens the store, serves gRPC until SIGINT/SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "grpcpp/grpcpp.h"
#include "server/coordinator.h"
#include "server/grpc_services.h"
#include "server/job_store.h"
#include "server/metrics/rpc_metrics_interceptor.h"
#include "server/metrics/server_metrics.h"

int main(int argc, char** argv) {
  CLI::App app{"stoker-server: accepts training jobs and schedules them onto workers"};
  std::string listen = "127.0.0.1:50051";
  std::string state_dir = ".stoker/server";
  std::string data_root = "/usr/share/datasets";
  std::string port_file;
  double lease_seconds = 10;
  double restart_grace_seconds = 30;
  app.add_option("--listen", listen, "address:port to serve gRPC on (port 0 picks a free one)")
      ->capture_default_str();
  app.add_option("--state-dir", state_dir, "directory of the job store (jobs.db)")
      ->capture_default_str();
  app.add_option("--data-root", data_root,
                 "dataset paths of jobs must resolve under this directory")
      ->capture_default_str();
  app.add_option("--lease-seconds", lease_seconds,
                 "a worker silent this long loses its jobs back to the queue")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--restart-grace-seconds", restart_grace_seconds,
                 "after a restart, workers that ran jobs have this long (at least one lease) to "
                 "register again before their jobs are requeued")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound port to this file once serving");
  std::string token_file, metrics_listen;
  app.add_option("--metrics-listen", metrics_listen,
                 "serve Prometheus /metrics on HOST:PORT (port 0 picks one; empty = off)");
  stoker::TlsFiles tls;
  bool insecure = false;
  app.add_option("--token-file", token_file,
                 "require this shared bearer token from users and workers");
  app.add_option("--tls-cert", tls.cert, "serve TLS with this certificate chain (PEM)");
  app.add_option("--tls-key", tls.key, "private key of --tls-cert (PEM)");
  app.add_flag("--insecure", insecure,
               "allow plaintext and/or no token on a non-loopback address (trusted networks only)");
  stoker::StreamLimits stream_limits;
  app.add_option("--max-streams-per-client", stream_limits.per_client,
                 "open WatchJob/GetArtifact streams one client address may hold; more are "
                 "refused (RESOURCE_EXHAUSTED)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--max-streams", stream_limits.total,
                 "open WatchJob/GetArtifact streams on the whole server")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::string token;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> read = stoker::ReadTokenFile(token_file);
    if (!read.ok()) {
      std::cerr << "stoker-server: " << read.status().message() << "\n";
      return 2;
    }
    token = *read;
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      stoker::MakeServerCredentials(tls);
  if (!credentials.ok()) {
    std::cerr << "stoker-server: " << credentials.status().message() << "\n";
    return 2;
  }
  if (!stoker::IsLoopbackAddress(listen) && (tls.cert.empty() || token.empty()) && !insecure) {
    std::cerr << "stoker-server: refusing to serve " << listen << " without "
              << (tls.cert.empty() ? "TLS (--tls-cert/--tls-key)" : "a token (--token-file)")
              << "; pass --insecure to allow it on a trusted network\n";
    return 2;
  }

  // Signals are taken by a dedicated thread (sigwait), so block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::error_code error;
  std::filesystem::create_directories(state_dir, error);
  if (error) {
    std::cerr << "stoker-server: cannot create state directory '" << state_dir
              << "': " << error.message() << "\n";
    return 1;
  }
  // One server per state directory: two would both schedule the same queue. The lock is held
  // until the process exits (however it exits).
  const std::string lock_path = state_dir + "/server.lock";
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder;
    std::ifstream(lock_path) >> holder;
    std::cerr << "stoker-server: state directory '" << state_dir << "' is in use by another "
              << "stoker-server" << (holder.empty() ? "" : " (pid " + holder + ")")
              << "; stop it or pass another --state-dir\n";
    return 1;
  }
  if (ftruncate(lock_fd, 0) == 0) {
    const std::string pid = std::to_string(getpid()) + "\n";
    (void)!write(lock_fd, pid.data(), pid.size());
  }
  absl::StatusOr<std::unique_ptr<stoker::JobStore>> store =
      stoker::JobStore::Open(state_dir + "/jobs.db");
  if (!store.ok()) {
    std::cerr << "stoker-server: " << store.status().message() << "\n";
    return 1;
  }
  stoker::CoordinatorOptions options;
  options.data_root = data_root;
  options.lease = absl::Seconds(lease_seconds);
  options.restart_grace = absl::Seconds(restart_grace_seconds);
  options.checkpoint_dir = state_dir + "/checkpoints";
  stoker::Coordinator coordinator(std::move(*store), options);
  if (absl::Status s = coordinator.Recover(); !s.ok()) {
    std::cerr << "stoker-server: recovering jobs: " << s.message() << "\n";
    return 1;
  }

  // Metrics: counters from the coordinator's events, gauges from a snapshot on each scrape.
  class MetricsObserver final : public stoker::CoordinatorObserver {
   public:
    explicit MetricsObserver(stoker::ServerMetrics* metrics) : metrics_(metrics) {}
    void JobAssigned(double queue_wait_seconds) override {
      metrics_->ObserveQueueWait(queue_wait_seconds);
    }
    void JobRequeued() override { metrics_->JobRequeued(); }
    void CheckpointWriteFailed() override { metrics_->CheckpointWriteFailed(); }

   private:
    stoker::ServerMetrics* metrics_;
  };
  std::unique_ptr<stoker::ServerMetrics> metrics;
  std::unique_ptr<MetricsObserver> observer;
  if (!metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<stoker::ServerMetrics>> created =
        stoker::ServerMetrics::Create(metrics_listen);
    if (!created.ok()) {
      std::cerr << "stoker-server: metrics: " << created.status().message() << "\n";
      return 1;
    }
    metrics = std::move(*created);
    metrics->SetScrapeHook([&coordinator](stoker::ServerMetrics& m) {
      const stoker::CoordinatorSnapshot snapshot = coordinator.Snapshot();
      m.SetJobCounts(snapshot.jobs_by_state);
      m.SetOldestQueuedJobAge(snapshot.oldest_queued_job_age_seconds);
      m.SetWorkerCounts(snapshot.workers_by_state);
      m.SetHeartbeatAges(snapshot.heartbeat_age_seconds);
      m.SetCheckpointDirFreeBytes(snapshot.checkpoint_dir_free_bytes);
    });
    observer = std::make_unique<MetricsObserver>(metrics.get());
    coordinator.SetObserver(observer.get());
    std::cerr << "stoker-server: metrics on port " << metrics->Port() << "\n";
  }

  const stoker::ServerAuth auth(token);
  stoker::JobServiceImpl job_service(&coordinator, &auth, stream_limits);
  stoker::WorkerServiceImpl worker_service(&coordinator, &auth);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  // Without this gRPC sets SO_REUSEPORT, and a second server on the same port starts "fine" and
  // takes half the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen, *credentials, &bound_port);
  builder.RegisterService(&job_service);
  builder.RegisterService(&worker_service);
  // Checkpoint chunks are 1 MiB; job specs are far smaller.
  builder.SetMaxReceiveMessageSize(4 << 20);
  if (metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(stoker::MakeRpcMetricsInterceptorFactory(metrics.get()));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    std::cerr << "stoker-server: cannot listen on " << listen
              << " (is the port in use, or the address not one of this machine's?)\n";
    return 1;
  }
  std::cerr << "stoker-server: serving on port " << bound_port
            << (tls.cert.empty() ? " (plaintext" : " (TLS")
            << (auth.enabled() ? ", token required)" : ", no token)") << ", store " << state_dir
            << "/jobs.db, data root " << data_root << "\n";
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << bound_port << "\n";
    std::filesystem::rename(tmp, port_file, error);
  }

  std::atomic<bool> stopping{false};
  std::thread lease_sweeper([&] {
    while (!stopping.load()) {
      coordinator.ExpireLeases();
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::cerr << "stoker-server: " << strsignal(signal_number) << ", shutting down\n";
  stopping = true;
  coordinator.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  lease_sweeper.join();
  return 0;
}
