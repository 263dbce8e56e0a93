// stoker-server's serving part, after its flags are read and its state directory is locked:
// opens the job store, recovers the coordinator, starts the metrics exposer (if asked) and the
// gRPC services, and serves until SIGINT or SIGTERM. Kept out of main() so that main only parses
// flags and decides the exit code.
#ifndef STOKER_SERVER_SERVER_RUNNER_H_
#define STOKER_SERVER_SERVER_RUNNER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"
#include "server/grpc_services.h"
#include "server/policy/preemption.h"

namespace stoker {

struct ServerOptions {
  // address:port to serve gRPC on (port 0 picks a free one).
  std::string listen = "127.0.0.1:50051";
  // Holds jobs.db and checkpoints/; locked by the caller (LockStateDir).
  std::string state_dir = ".stoker/server";
  std::string data_root = "/usr/share/datasets";
  // When set, the bound port is written here (atomically) once serving.
  std::string port_file;
  absl::Duration lease = absl::Seconds(10);
  absl::Duration restart_grace = absl::Seconds(30);
  // A data-parallel job that waited this long for room stops backfill behind it (see
  // CoordinatorOptions::gang_backfill_limit).
  absl::Duration gang_backfill_limit = absl::Minutes(2);
  // CoordinatorOptions::fair_share_half_life.
  absl::Duration fair_share_half_life = absl::Hours(168);
  // CoordinatorOptions::preemption and preemption_grace.
  PreemptionOptions preemption;
  absl::Duration preemption_grace = absl::Minutes(2);
  // HOST:PORT for Prometheus /metrics; empty = no metrics.
  std::string metrics_listen;
  // HOST:PORT for the web page (server/web/web_server.h); empty = none. It serves HTTPS with
  // `tls_cert` and `tls_key` when they are set.
  std::string web_listen;
  std::string tls_cert;
  std::string tls_key;
  // The legacy shared bearer token (--token-file): a cluster admin and a worker; empty = none.
  std::string token;
  // Refuse to serve (INVALID_ARGUMENT) unless calls need a token: a non-loopback address without
  // --insecure.
  bool require_tokens = false;
  // Deployments: when the store has no cluster admin yet, create `bootstrap_admin` with the token
  // `bootstrap_token` (a secret made by deploy/make-secrets.sh) and, when set, a join token
  // `bootstrap_join_token` for any worker id, usable for an hour. Ignored once an admin exists.
  std::string bootstrap_admin;
  std::string bootstrap_token;
  std::string bootstrap_join_token;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Whether `credentials` are TLS (for the startup line).
  bool tls = false;
  StreamLimits stream_limits;
};

// Blocks SIGINT and SIGTERM in the calling thread and so in every thread started after it:
// RunServer takes them with sigwait. Call before anything starts a thread.
void BlockShutdownSignals();

// Serves until SIGINT or SIGTERM (which must be blocked: BlockShutdownSignals), then shuts down
// and returns OK. Logs its progress to stderr ("stoker-server: serving on port ..."). An error
// is returned before serving starts, its message ready to print after "stoker-server: ": the
// store cannot be opened, jobs cannot be recovered ("recovering jobs: ..."), the metrics port
// cannot be bound ("metrics: ..."), nor the web page's ("web: ...") or the gRPC address cannot
// ("cannot listen on ...").
absl::Status RunServer(const ServerOptions& options);

}  // namespace stoker

#endif  // STOKER_SERVER_SERVER_RUNNER_H_
