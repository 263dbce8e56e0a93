// stoker-worker: the worker agent process. Parses flags and runs the Agent until SIGINT/SIGTERM.
#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string_view>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/exit_codes.h"
#include "common/system_memory.h"
#include "worker/agent.h"
#include "worker/metrics/nvml.h"
#include "worker/metrics/worker_metrics.h"

namespace {

// Directory of this executable, where stoker-trainer and stoker-loader are installed beside it.
std::string SelfDirectory() {
  char path[PATH_MAX] = {0};
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return ".";
  return std::filesystem::path(std::string(path, n)).parent_path().string();
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything starts a thread (gRPC does): every thread inherits the mask, so SIGINT and
  // SIGTERM reach only the sigwait below and never kill the process outright.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  CLI::App app{"stoker-worker: runs training jobs from a stoker-server on this machine"};
  stoker::AgentOptions options;
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  options.worker_id = absl::StrCat(hostname, "-", getpid());
  options.runner.work_dir = ".stoker/worker";
  options.runner.data_root = "/usr/share/datasets";
  const std::string self_dir = SelfDirectory();
  options.runner.trainer_path = self_dir + "/stoker-trainer";
  options.runner.loader_path = self_dir + "/stoker-loader";
  options.runner.cpu_count = static_cast<int>(std::thread::hardware_concurrency());

  app.add_option("--server", options.server_address, "stoker-server address")
      ->capture_default_str();
  app.add_option("--worker-id", options.worker_id,
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
  app.add_option("--data-root", options.runner.data_root,
                 "dataset paths of jobs resolve under this directory")
      ->capture_default_str();
  app.add_option("--work-dir", options.runner.work_dir,
                 "per-attempt files and logs go under this directory")
      ->capture_default_str();
  app.add_option("--trainer", options.runner.trainer_path, "stoker-trainer executable")
      ->capture_default_str();
  app.add_option("--loader", options.runner.loader_path, "stoker-loader executable")
      ->capture_default_str();
  double drain_seconds = absl::ToDoubleSeconds(options.runner.drain_timeout);
  app.add_option("--drain-seconds", drain_seconds,
                 "on SIGTERM/SIGINT, how long each trainer gets to checkpoint and stop before it "
                 "is stopped outright; its job goes back to the queue either way")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  double stall_seconds = absl::ToDoubleSeconds(options.runner.trainer_stall_timeout);
  app.add_option("--trainer-stall-seconds", stall_seconds,
                 "stop a job whose pipeline is silent this long: no step, evaluation, checkpoint "
                 "or loader batch (a stopped trainer or loader, a deadlock); the attempt fails "
                 "and is retried; 0 = never")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  int cpus = options.runner.cpu_count;
  app.add_option("--cpus", cpus,
                 "cores the jobs here may use together (trainer threads and loaders); the "
                 "server packs jobs until they are used up (default: all)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  int64_t memory_mib = 0;
  app.add_option("--memory-mib", memory_mib,
                 "memory the jobs here may use together, in MiB (default 0: what is available "
                 "when the worker starts, within a container's limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  int fake_gpus = 0;
  app.add_option("--fake-gpus-for-tests", fake_gpus,
                 "TESTS ONLY: advertise N fake GPUs; a GPU job's trainer logs its "
                 "CUDA_VISIBLE_DEVICES and trains on the cpu backend. Refused on a machine with "
                 "real GPUs and with a server that is not on loopback")
      ->check(CLI::Range(0, 64));
  std::string token_file, tls_ca, metrics_listen;
  app.add_option("--token-file", token_file, "file holding the server's bearer token");
  app.add_option("--tls-ca", tls_ca, "connect with TLS, trusting this CA certificate (PEM)");
  app.add_option("--metrics-listen", metrics_listen,
                 "serve Prometheus /metrics on HOST:PORT (port 0 picks one; empty = off)")
      ->capture_default_str();
  std::string collective_host;
  app.add_option("--collective-host", collective_host,
                 "data-parallel jobs: the address other ranks reach this worker's trainers at "
                 "(Gloo binds to it; default: 127.0.0.1 when the server is on loopback, else "
                 "this host's name)");
  double collective_timeout_seconds = absl::ToDoubleSeconds(options.runner.collective_timeout);
  app.add_option("--collective-timeout-seconds", collective_timeout_seconds,
                 "data-parallel jobs: how long the ranks wait for each other (connecting, and "
                 "each collective) before the attempt fails")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a bad flag exits 2 (bad input), as the stoker CLI does.
    return app.exit(e) == 0 ? 0 : stoker::kExitBadInput;
  }
  options.runner.collective_host =
      !collective_host.empty()
          ? collective_host
          : (stoker::IsLoopbackAddress(options.server_address) ? "127.0.0.1" : hostname);
  options.runner.collective_timeout = absl::Seconds(collective_timeout_seconds);
  options.runner.drain_timeout = absl::Seconds(drain_seconds);
  options.runner.trainer_stall_timeout =
      stall_seconds > 0 ? absl::Seconds(stall_seconds) : absl::InfiniteDuration();

  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = stoker::ReadTokenFile(token_file);
    if (!token.ok()) {
      std::cerr << "stoker-worker: " << token.status().message() << "\n";
      return stoker::kExitBadInput;
    }
    options.token = *token;
    // Data-parallel trainers read the token from the file themselves.
    options.runner.token_file = std::filesystem::absolute(token_file).string();
  }
  if (!tls_ca.empty()) options.runner.tls_ca = std::filesystem::absolute(tls_ca).string();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      stoker::MakeChannelCredentials({.cert = "", .key = "", .ca = tls_ca});
  if (!credentials.ok()) {
    std::cerr << "stoker-worker: " << credentials.status().message() << "\n";
    return stoker::kExitBadInput;
  }
  options.credentials = *credentials;

  for (const std::string& path : {options.runner.trainer_path, options.runner.loader_path}) {
    if (access(path.c_str(), X_OK) != 0) {
      std::cerr << "stoker-worker: cannot execute " << path << " (use --trainer / --loader)\n";
      return stoker::kExitFailure;
    }
  }
  std::error_code error;
  std::filesystem::create_directories(options.runner.work_dir, error);
  if (error) {
    std::cerr << "stoker-worker: cannot create work directory " << options.runner.work_dir << ": "
              << error.message() << "\n";
    return stoker::kExitFailure;
  }
  options.runner.work_dir = std::filesystem::absolute(options.runner.work_dir).string();
  // One live process per worker id and work directory; the id passes to this process at once
  // when the one before it is gone (see ClaimWorkerInstance).
  absl::StatusOr<stoker::WorkerInstance> claim =
      stoker::ClaimWorkerInstance(options.runner.work_dir, options.worker_id);
  if (!claim.ok()) {
    std::cerr << "stoker-worker: " << claim.status().message() << "\n";
    return stoker::kExitFailure;
  }
  options.instance = claim->instance;
  options.previous_instance = claim->previous_instance;
  // What a killed earlier process under this id left behind (its attempts are requeued).
  if (const stoker::StaleAttemptData stale =
          stoker::RemoveStaleAttemptData(options.runner.work_dir, options.worker_id);
      stale.directories > 0) {
    std::cerr << "stoker-worker: removed " << stale.bytes / (1 << 20) << " MiB of data left in "
              << stale.directories << " attempt director" << (stale.directories == 1 ? "y" : "ies")
              << " of " << options.runner.work_dir << " by an earlier run of worker "
              << options.worker_id << " (logs kept)\n";
  }

  std::atomic<bool> stop{false};
  std::thread signal_thread([&] {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    std::cerr << "stoker-worker: " << strsignal(signal_number)
              << ", shutting down: running jobs checkpoint and go back to the queue (a second "
                 "signal stops at once)\n";
    stop.store(true);
    sigwait(&signals, &signal_number);
    // Trainers and loaders die with this process (PR_SET_PDEATHSIG); the server requeues the
    // jobs when the lease runs out.
    std::cerr << "stoker-worker: " << strsignal(signal_number) << " again, exiting now\n";
    std::_Exit(stoker::kExitFailure);
  });
  signal_thread.detach();

  // GPUs, found through NVML (loaded with dlopen; none without a driver).
  if (std::unique_ptr<stoker::Nvml> nvml = stoker::Nvml::Load(); nvml != nullptr) {
    for (const stoker::GpuReading& gpu : nvml->Read()) {
      stoker::v1::Device& device = options.gpus.emplace_back();
      device.set_kind("cuda");
      device.set_index(gpu.index);
      device.set_name(gpu.name);
      device.set_memory_bytes(static_cast<int64_t>(gpu.memory_total_bytes.value_or(0)));
      device.set_uuid(gpu.uuid);
    }
  }
  if (fake_gpus > 0) {
    absl::StatusOr<std::vector<stoker::v1::Device>> fake = stoker::FakeGpusForTests(
        fake_gpus, static_cast<int>(options.gpus.size()), options.server_address);
    if (!fake.ok()) {
      std::cerr << "stoker-worker: " << fake.status().message() << "\n";
      return stoker::kExitBadInput;
    }
    options.gpus = std::move(*fake);
    options.fake_gpus_for_tests = true;
    std::cerr << "stoker-worker: " << fake_gpus
              << " FAKE GPUs for tests: GPU jobs train on the cpu backend\n";
  }
  options.cpus = cpus;
  if (memory_mib > 0) {
    options.memory_bytes = memory_mib << 20;
  } else {
    absl::StatusOr<int64_t> available = stoker::AvailableSystemMemoryBytes();
    if (!available.ok()) {
      std::cerr << "stoker-worker: cannot tell the available memory ("
                << available.status().message() << "); pass --memory-mib\n";
      return stoker::kExitFailure;
    }
    options.memory_bytes = *available;
  }
  std::unique_ptr<stoker::WorkerMetrics> metrics;
  if (!metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<stoker::WorkerMetrics>> created = stoker::WorkerMetrics::Create(
        {.worker_id = options.worker_id, .listen_address = metrics_listen});
    if (!created.ok()) {
      std::cerr << "stoker-worker: metrics: " << created.status().message() << "\n";
      return stoker::kExitFailure;
    }
    metrics = std::move(*created);
    const std::string host = metrics_listen.substr(0, metrics_listen.rfind(':'));
    options.metrics_url = absl::StrCat("http://", host, ":", metrics->Port(), "/metrics");
    std::cerr << "stoker-worker: serving " << options.metrics_url << "; " << metrics->NvmlStatus()
              << "\n";
  }
  stoker::Agent agent(options, metrics.get());
  return agent.Run(stop) ? 0 : 1;
}
