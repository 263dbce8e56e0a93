// stoker-worker: the worker agent process. Defines the flags and runs the worker (RunWorker,
// worker/agent_runner.h) until SIGINT/SIGTERM.
#include <signal.h>

#include <string>
#include <string_view>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "worker/agent_runner.h"

namespace {

void AddWorkerFlags(CLI::App& app, stoker::WorkerFlags& flags) {
  app.add_option("--server", flags.agent.server_address, "stoker-server address")
      ->capture_default_str();
  app.add_option("--worker-id", flags.agent.worker_id,
                 "stable name of this worker; reuse it after a restart to re-attach")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& id) -> std::string {
            if (id.empty() || id.size() > 128) return "a worker id has 1 to 128 characters";
            for (char c : id) {
              if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
                  std::string_view("-_.:@").find(c) == std::string_view::npos) {
                return absl::StrCat("'", id, "': a worker id uses letters, digits and - _ . : @");
              }
            }
            return "";
          },
          "ID"));
  app.add_option("--data-root", flags.agent.runner.data_root,
                 "dataset paths of jobs resolve under this directory")
      ->capture_default_str();
  app.add_option("--work-dir", flags.agent.runner.work_dir,
                 "per-attempt files and logs go under this directory")
      ->capture_default_str();
  app.add_option("--trainer", flags.agent.runner.trainer_path, "stoker-trainer executable")
      ->capture_default_str();
  app.add_option("--loader", flags.agent.runner.loader_path, "stoker-loader executable")
      ->capture_default_str();
  app.add_option("--jpeg-cache-dir", flags.agent.runner.jpeg_cache_dir,
                 "image folders: keep restart-indexed copies of their JPEGs here, made by the "
                 "loaders the first time a job reads each file and used by later epochs and jobs "
                 "(the same pixels; crops low in an image decode faster); empty = off");
  app.add_option("--jpeg-cache-mib", flags.jpeg_cache_mib,
                 "the --jpeg-cache-dir bound in MiB; the least recently used copies make room")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--drain-seconds", flags.drain_seconds,
                 "on SIGTERM/SIGINT, how long each trainer gets to checkpoint and stop before it "
                 "is stopped outright; its job goes back to the queue either way")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--trainer-stall-seconds", flags.stall_seconds,
                 "stop a job whose pipeline is silent this long: no step, evaluation, checkpoint "
                 "or loader batch (a stopped trainer or loader, a deadlock); the attempt fails "
                 "and is retried; 0 = never")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--cpus", flags.cpus,
                 "cores the jobs here may use together (trainer threads and loaders); the "
                 "server packs jobs until they are used up (default: all)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--memory-mib", flags.memory_mib,
                 "memory the jobs here may use together, in MiB (default 0: what is available "
                 "when the worker starts, within a container's limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--fake-gpus-for-tests", flags.fake_gpus,
                 "TESTS ONLY: advertise N fake GPUs; a GPU job's trainer logs its "
                 "CUDA_VISIBLE_DEVICES and trains on the cpu backend. Refused on a machine with "
                 "real GPUs and with a server that is not on loopback")
      ->check(CLI::Range(0, 64));
  app.add_option("--join-token-file", flags.join_token_file,
                 "file holding a single-use join token (stoker worker join-token): exchanged at "
                 "the first start for a worker token kept in WORK_DIR/worker.token (0600), used "
                 "from then on");
  app.add_option("--token-file", flags.token_file,
                 "file holding the server's legacy shared bearer token");
  app.add_option("--tls-ca", flags.tls_ca, "connect with TLS, trusting this CA certificate (PEM)");
  app.add_option("--metrics-listen", flags.metrics_listen,
                 "serve Prometheus /metrics on HOST:PORT (port 0 picks one; empty = off)")
      ->capture_default_str();
  app.add_option("--collective-host", flags.collective_host,
                 "data-parallel jobs: the address other ranks reach this worker's trainers at "
                 "(Gloo binds to it; default: 127.0.0.1 when the server is on loopback, else "
                 "this host's name)");
  app.add_option("--collective-timeout-seconds", flags.collective_timeout_seconds,
                 "data-parallel jobs: how long the ranks wait for each other (connecting, and "
                 "each collective) before the attempt fails")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--collective-transport", flags.collective_transport,
                 "data-parallel jobs: auto (the ranks on one machine sum through shared memory, "
                 "machines through Gloo over TCP between one rank of each) or gloo (never shared "
                 "memory, e.g. where /dev/shm is small)")
      ->check(CLI::IsMember({"auto", "gloo"}))
      ->capture_default_str();
  app.add_option("--collective-machine-for-tests", flags.collective_machine_for_tests,
                 "data-parallel jobs: this worker's ranks act as if on machine NAME (tests of the "
                 "two-level sum on one host)");
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything starts a thread (gRPC does): every thread inherits the mask, so SIGINT and
  // SIGTERM reach only the runner's sigwait and never kill the process outright.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  CLI::App app{"stoker-worker: runs training jobs from a stoker-server on this machine"};
  stoker::WorkerFlags flags = stoker::DefaultWorkerFlags();
  AddWorkerFlags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad flag exits 2 (bad input), as the stoker CLI does.
    return app.exit(e) == 0 ? 0 : stoker::kExitBadInput;
  }
  return stoker::RunWorker(std::move(flags), signals);
}
