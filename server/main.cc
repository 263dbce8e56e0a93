// stoker-server: the job service. Parses flags, locks the state directory and serves gRPC until
// SIGINT/SIGTERM (RunServer). Exit codes: 2 for a bad configuration (token file, TLS files, an
// unprotected non-loopback address), 1 when the server cannot start, 0 after a signal.
#include <filesystem>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "common/auth.h"
#include "common/exit_codes.h"
#include "server/access/access_store.h"
#include "server/server_runner.h"
#include "server/state_dir_lock.h"

namespace {

// `stoker-server bootstrap-admin`: the first cluster admin and its token, straight into the
// state directory's store (the server may be running: SQLite serialises the writers). The secret
// goes to stdout (or --token-out, mode 0600) and nowhere else.
int BootstrapAdmin(const std::string& state_dir, const std::string& user,
                   const std::string& token_out) {
  std::error_code error;
  std::filesystem::create_directories(state_dir, error);
  absl::StatusOr<std::unique_ptr<stoker::AccessStore>> store =
      stoker::AccessStore::Open(state_dir + "/jobs.db");
  if (!store.ok()) {
    std::cerr << "stoker-server: " << store.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<stoker::AccessStore::NewToken> created = (*store)->Bootstrap(user);
  if (!created.ok()) {
    std::cerr << "stoker-server: bootstrap-admin: " << created.status().message() << "\n";
    return absl::IsInvalidArgument(created.status()) ? stoker::kExitBadInput : 1;
  }
  if (!token_out.empty()) {
    if (!stoker::WriteSecretFile(token_out, created->secret, stoker::SecretFileMode::kNew).ok()) {
      std::cerr << "stoker-server: cannot write the new token to " << token_out
                << " (it must not exist yet); the admin was created: revoke token "
                << created->info.id() << " and make another with `stoker token create`\n";
      return 1;
    }
    std::cerr << "stoker-server: cluster admin '" << user << "' created; its token ("
              << created->info.id() << ") is in " << token_out
              << ". Tokens are now required: pass it with stoker --token-file.\n";
    return 0;
  }
  std::cerr << "stoker-server: cluster admin '" << user << "' created, token " << created->info.id()
            << ". The secret below is shown once; keep it in a file only you can read and pass "
               "it with stoker --token-file. Tokens are now required.\n";
  std::cout << created->secret << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stoker-server: accepts training jobs and schedules them onto workers"};
  stoker::ServerOptions options;
  double lease_seconds = 10;
  double restart_grace_seconds = 30;
  double gang_backfill_seconds = 120;
  double fair_share_half_life_hours = 168;
  double preemption_min_runtime_seconds = 300;
  double preemption_grace_seconds = 120;
  int max_preemptions = 3;
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
  app.add_option("--fair-share-half-life-hours", fair_share_half_life_hours,
                 "fair share among teams: a team's past usage counts half as much after this "
                 "long (docs/decisions.md)")
      ->check(CLI::Range(0.01, 87600.0))
      ->capture_default_str();
  app.add_option("--preemption-min-runtime-seconds", preemption_min_runtime_seconds,
                 "a job runs at least this long in an attempt before it can be preempted")
      ->check(CLI::Range(0.0, 604800.0))
      ->capture_default_str();
  app.add_option("--max-preemptions", max_preemptions,
                 "a job preempted this many times is not preempted again (0: no preemption)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--preemption-grace-seconds", preemption_grace_seconds,
                 "a preempted job that has not checkpointed and given back within this long is "
                 "stopped and resumes from its last stored checkpoint")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_option("--port-file", options.port_file,
                 "write the bound port to this file once serving");
  std::string token_file;
  app.add_option("--web-listen", options.web_listen,
                 "serve the web page (jobs, curves, experiments, workers) on HOST:PORT, over "
                 "HTTPS with --tls-cert; users sign in with their token (port 0 picks one; "
                 "empty = off)");
  app.add_option("--metrics-listen", options.metrics_listen,
                 "serve Prometheus /metrics on HOST:PORT (port 0 picks one; empty = off)");
  stoker::TlsFiles tls;
  bool insecure = false;
  app.add_option("--token-file", token_file,
                 "legacy mode: accept this shared bearer token as a cluster admin and as a worker "
                 "(every use audited as 'legacy'); drop the flag once users and worker join "
                 "tokens are in place");
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
  std::string bootstrap_token_file, bootstrap_join_token_file;
  app.add_option("--bootstrap-admin", options.bootstrap_admin,
                 "deployments: at start, when the store has no cluster admin, create this one "
                 "with the token in --bootstrap-token-file (ignored once an admin exists)");
  app.add_option("--bootstrap-token-file", bootstrap_token_file,
                 "the first admin's token (stku_ and 64 hex digits, e.g. from make-secrets.sh)");
  app.add_option("--bootstrap-join-token-file", bootstrap_join_token_file,
                 "also a join token for workers (stkj_...), usable for an hour after the start "
                 "that creates the admin");
  std::string bootstrap_user;
  std::string bootstrap_token_out;
  CLI::App* bootstrap = app.add_subcommand(
      "bootstrap-admin",
      "create the first cluster admin in --state-dir and print its token once (then every call "
      "needs a token); works while the server runs");
  bootstrap->add_option("--user", bootstrap_user, "the admin's user name")->required();
  bootstrap->fallthrough();  // --state-dir after the command too
  bootstrap->add_option("--token-out", bootstrap_token_out,
                        "write the token to this new file (mode 0600) instead of stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad flag exits 2 (bad input), as the stoker CLI does.
    return app.exit(e) == 0 ? 0 : stoker::kExitBadInput;
  }
  if (bootstrap->parsed()) {
    return BootstrapAdmin(options.state_dir, bootstrap_user, bootstrap_token_out);
  }
  options.lease = absl::Seconds(lease_seconds);
  options.restart_grace = absl::Seconds(restart_grace_seconds);
  options.gang_backfill_limit = absl::Seconds(gang_backfill_seconds);
  options.fair_share_half_life = absl::Hours(fair_share_half_life_hours);
  options.preemption.min_runtime = absl::Seconds(preemption_min_runtime_seconds);
  options.preemption.max_preemptions = max_preemptions;
  options.preemption_grace = absl::Seconds(preemption_grace_seconds);

  for (auto [file, secret] : {std::pair<const std::string*, std::string*>{&bootstrap_token_file,
                                                                          &options.bootstrap_token},
                              {&bootstrap_join_token_file, &options.bootstrap_join_token}}) {
    if (file->empty()) continue;
    absl::StatusOr<std::string> read = stoker::ReadTokenFile(*file);
    if (!read.ok()) {
      std::cerr << "stoker-server: " << read.status().message() << "\n";
      return 2;
    }
    *secret = *read;
  }
  if (options.bootstrap_admin.empty() != options.bootstrap_token.empty() ||
      (options.bootstrap_admin.empty() && !options.bootstrap_join_token.empty())) {
    std::cerr << "stoker-server: --bootstrap-admin and --bootstrap-token-file go together (and "
                 "--bootstrap-join-token-file needs them)\n";
    return 2;
  }
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
  options.tls_cert = tls.cert;
  options.tls_key = tls.key;
  for (const std::string* address : {&options.listen, &options.web_listen}) {
    if (address->empty() || stoker::IsLoopbackAddress(*address) || !tls.cert.empty() || insecure) {
      continue;
    }
    std::cerr << "stoker-server: refusing to serve " << *address
              << " without TLS (--tls-cert/--tls-key); pass --insecure to allow it on a trusted "
                 "network\n";
    return 2;
  }
  // Tokens: the legacy --token-file, or users in the store (checked once it is open).
  options.require_tokens = !stoker::IsLoopbackAddress(options.listen) && !insecure;

  stoker::BlockShutdownSignals();  // before any thread starts
  // Held until the process exits (however it exits).
  absl::StatusOr<stoker::StateDirLock> lock = stoker::LockStateDir(options.state_dir);
  if (!lock.ok()) {
    std::cerr << "stoker-server: " << lock.status().message() << "\n";
    return 1;
  }
  if (absl::Status served = stoker::RunServer(options); !served.ok()) {
    std::cerr << "stoker-server: " << served.message() << "\n";
    return absl::IsInvalidArgument(served) ? stoker::kExitBadInput : 1;
  }
  return 0;
}
