// stoker-server: the job service. Parses flags, locks the state directory and serves gRPC until
// SIGINT/SIGTERM (RunServer). Exit codes: 2 for a bad configuration (token file, TLS files, an
// unprotected non-loopback address), 1 when the server cannot start, 0 after a signal.
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "common/auth.h"
#include "common/exit_codes.h"
#include "server/server_runner.h"
#include "server/state_dir_lock.h"

int main(int argc, char** argv) {
  CLI::App app{"stoker-server: accepts training jobs and schedules them onto workers"};
  stoker::ServerOptions options;
  double lease_seconds = 10;
  double restart_grace_seconds = 30;
  double gang_backfill_seconds = 120;
  app.add_option("--listen", options.listen,
                 "address:port to serve gRPC on (port 0 picks a free one)")
      ->capture_default_str();
  app.add_option("--state-dir", options.state_dir, "directory of the job store (jobs.db)")
      ->capture_default_str();
  app.add_option("--data-root", options.data_root,
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
  app.add_option("--gang-backfill-seconds", gang_backfill_seconds,
                 "a data-parallel job that has waited this long for room stops smaller jobs "
                 "from starting ahead of it, so that the cluster drains for it")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--port-file", options.port_file,
                 "write the bound port to this file once serving");
  std::string token_file;
  app.add_option("--metrics-listen", options.metrics_listen,
                 "serve Prometheus /metrics on HOST:PORT (port 0 picks one; empty = off)");
  stoker::TlsFiles tls;
  bool insecure = false;
  app.add_option("--token-file", token_file,
                 "require this shared bearer token from users and workers");
  app.add_option("--tls-cert", tls.cert, "serve TLS with this certificate chain (PEM)");
  app.add_option("--tls-key", tls.key, "private key of --tls-cert (PEM)");
  app.add_flag("--insecure", insecure,
               "allow plaintext and/or no token on a non-loopback address (trusted networks only)");
  app.add_option("--max-streams-per-client", options.stream_limits.per_client,
                 "open WatchJob/GetArtifact streams one client address may hold; more are "
                 "refused (RESOURCE_EXHAUSTED)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--max-streams", options.stream_limits.total,
                 "open WatchJob/GetArtifact streams on the whole server")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad flag exits 2 (bad input), as the stoker CLI does.
    return app.exit(e) == 0 ? 0 : stoker::kExitBadInput;
  }
  options.lease = absl::Seconds(lease_seconds);
  options.restart_grace = absl::Seconds(restart_grace_seconds);
  options.gang_backfill_limit = absl::Seconds(gang_backfill_seconds);

  if (!token_file.empty()) {
    absl::StatusOr<std::string> read = stoker::ReadTokenFile(token_file);
    if (!read.ok()) {
      std::cerr << "stoker-server: " << read.status().message() << "\n";
      return 2;
    }
    options.token = *read;
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      stoker::MakeServerCredentials(tls);
  if (!credentials.ok()) {
    std::cerr << "stoker-server: " << credentials.status().message() << "\n";
    return 2;
  }
  options.credentials = *credentials;
  options.tls = !tls.cert.empty();
  if (!stoker::IsLoopbackAddress(options.listen) && (tls.cert.empty() || options.token.empty()) &&
      !insecure) {
    std::cerr << "stoker-server: refusing to serve " << options.listen << " without "
              << (tls.cert.empty() ? "TLS (--tls-cert/--tls-key)" : "a token (--token-file)")
              << "; pass --insecure to allow it on a trusted network\n";
    return 2;
  }

  stoker::BlockShutdownSignals();  // before any thread starts
  // Held until the process exits (however it exits).
  absl::StatusOr<stoker::StateDirLock> lock = stoker::LockStateDir(options.state_dir);
  if (!lock.ok()) {
    std::cerr << "stoker-server: " << lock.status().message() << "\n";
    return 1;
  }
  if (absl::Status served = stoker::RunServer(options); !served.ok()) {
    std::cerr << "stoker-server: " << served.message() << "\n";
    return 1;
  }
  return 0;
}
