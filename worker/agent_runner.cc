#include "worker/agent_runner.h"

#include <limits.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/exit_codes.h"
#include "common/system_memory.h"
#include "grpcpp/grpcpp.h"
#include "stoker.grpc.pb.h"
#include "worker/metrics/nvml.h"
#include "worker/metrics/worker_metrics.h"

namespace stoker {
namespace {

// Directory of this executable, where stoker-trainer and stoker-loader are installed beside it.
std::string SelfDirectory() {
  char path[PATH_MAX] = {0};
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return ".";
  return std::filesystem::path(std::string(path, n)).parent_path().string();
}

// The flags' timeouts, the collective host, the token and the channel's credentials.
// INVALID_ARGUMENT (bad input) for a token file or CA that cannot be used.
absl::Status ApplyFlags(const WorkerFlags& flags, AgentOptions& options) {
  options.runner.collective_host =
      !flags.collective_host.empty()
          ? flags.collective_host
          : (IsLoopbackAddress(options.server_address) ? "127.0.0.1" : flags.hostname);
  options.runner.collective_timeout = absl::Seconds(flags.collective_timeout_seconds);
  options.runner.collective_transport = flags.collective_transport;
  options.runner.collective_machine_for_tests = flags.collective_machine_for_tests;
  options.runner.drain_timeout = absl::Seconds(flags.drain_seconds);
  options.runner.trainer_stall_timeout =
      flags.stall_seconds > 0 ? absl::Seconds(flags.stall_seconds) : absl::InfiniteDuration();
  absl::StatusOr<ClientCredentials> credentials =
      LoadClientCredentials(flags.token_file, flags.tls_ca);
  if (!credentials.ok()) return credentials.status();
  options.token = credentials->token;
  options.credentials = credentials->channel;
  // Data-parallel trainers read the token and the CA from the files themselves.
  if (!flags.token_file.empty()) {
    options.runner.token_file = std::filesystem::absolute(flags.token_file).string();
  }
  if (!flags.tls_ca.empty())
    options.runner.tls_ca = std::filesystem::absolute(flags.tls_ca).string();
  options.runner.jpeg_cache_bytes = flags.jpeg_cache_mib << 20;
  if (!options.runner.jpeg_cache_dir.empty()) {
    // Created here, so that a path that cannot be used is said at start (the loaders would only
    // log it and read the originals).
    std::error_code error;
    std::filesystem::create_directories(options.runner.jpeg_cache_dir, error);
    if (error) {
      return absl::InvalidArgumentError(absl::StrCat("--jpeg-cache-dir ",
                                                     options.runner.jpeg_cache_dir,
                                                     ": cannot create it: ", error.message()));
    }
    options.runner.jpeg_cache_dir =
        std::filesystem::absolute(options.runner.jpeg_cache_dir).string();
    std::cerr << "stoker-worker: image folders' JPEGs are cached restart-indexed in "
              << options.runner.jpeg_cache_dir << " (up to " << flags.jpeg_cache_mib << " MiB)\n";
  }
  return absl::OkStatus();
}

// The programs beside the agent, the work directory created and claimed for this worker id (one
// live process per id and directory), and what a killed earlier process under this id left there
// removed (its attempts are requeued by the server).
// The worker's credential. A worker token kept in the work directory (worker.token, 0600) is
// used when there is one; else --join-token-file is exchanged for one once (JoinWorker) and kept
// there; else --token-file (the legacy shared token) or none. Trainers read the same file.
absl::Status ResolveWorkerToken(const WorkerFlags& flags, AgentOptions& options) {
  const std::string path = options.runner.work_dir + "/worker.token";
  std::error_code error;
  if (std::filesystem::exists(path, error)) {
    absl::StatusOr<std::string> token = ReadTokenFile(path);
    if (!token.ok()) return token.status();
    std::filesystem::permissions(
        path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write, error);
    options.token = *token;
    options.runner.token_file = path;
    std::cerr << "stoker-worker: using the worker token in " << path << "\n";
    return absl::OkStatus();
  }
  if (flags.join_token_file.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> join = ReadTokenFile(flags.join_token_file);
  if (!join.ok()) return join.status();
  auto stub =
      v1::WorkerService::NewStub(grpc::CreateChannel(options.server_address, options.credentials));
  v1::JoinWorkerRequest request;
  request.set_worker_id(options.worker_id);
  v1::JoinWorkerResponse response;
  const absl::Time give_up = absl::Now() + absl::Minutes(5);
  for (int tries = 0;; ++tries) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    AddToken(context, *join);
    const grpc::Status status = stub->JoinWorker(&context, request, &response);
    if (status.ok()) break;
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::InvalidArgumentError(absl::StrCat(
          "joining ", options.server_address, " as ", options.worker_id, " with the join token in ",
          flags.join_token_file, " was refused: ", status.error_message()));
    }
    if (absl::Now() > give_up) {
      return absl::UnavailableError(absl::StrCat("cannot reach ", options.server_address,
                                                 " to join: ", status.error_message()));
    }
    if (tries % 10 == 0) {
      std::cerr << "stoker-worker: waiting for " << options.server_address << " to join ("
                << status.error_message() << ")\n";
    }
    absl::SleepFor(absl::Seconds(1));
  }
  if (absl::Status s = WriteSecretFile(path, response.worker_token(), SecretFileMode::kReplace);
      !s.ok()) {
    return s;
  }
  options.token = response.worker_token();
  options.runner.token_file = path;
  std::cerr << "stoker-worker: joined as " << options.worker_id << "; worker token "
            << response.token_id() << " (worker ids '" << response.worker_ids() << "') kept in "
            << path << "\n";
  return absl::OkStatus();
}

absl::Status PrepareWorkDirectory(AgentOptions& options) {
  for (const std::string& path : {options.runner.trainer_path, options.runner.loader_path}) {
    if (access(path.c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot execute ", path, " (use --trainer / --loader)"));
    }
  }
  std::error_code error;
  std::filesystem::create_directories(options.runner.work_dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create work directory ", options.runner.work_dir, ": ", error.message()));
  }
  options.runner.work_dir = std::filesystem::absolute(options.runner.work_dir).string();
  absl::StatusOr<WorkerInstance> claim =
      ClaimWorkerInstance(options.runner.work_dir, options.worker_id);
  if (!claim.ok()) return absl::FailedPreconditionError(claim.status().message());
  options.instance = claim->instance;
  options.previous_instance = claim->previous_instance;
  if (const StaleAttemptData stale =
          RemoveStaleAttemptData(options.runner.work_dir, options.worker_id);
      stale.directories > 0) {
    std::cerr << "stoker-worker: removed " << stale.bytes / (1 << 20) << " MiB of data left in "
              << stale.directories << " attempt director" << (stale.directories == 1 ? "y" : "ies")
              << " of " << options.runner.work_dir << " by an earlier run of worker "
              << options.worker_id << " (logs kept)\n";
  }
  return absl::OkStatus();
}

// What the worker offers: its GPUs (NVML, loaded with dlopen; none without a driver) or, in
// tests, fake ones; its cores; its memory (--memory-mib, else what is available now).
absl::Status DescribeResources(const WorkerFlags& flags, AgentOptions& options) {
  if (std::unique_ptr<Nvml> nvml = Nvml::Load(); nvml != nullptr) {
    for (const GpuReading& gpu : nvml->Read()) {
      v1::Device& device = options.gpus.emplace_back();
      device.set_kind("cuda");
      device.set_index(gpu.index);
      device.set_name(gpu.name);
      device.set_memory_bytes(static_cast<int64_t>(gpu.memory_total_bytes.value_or(0)));
      device.set_uuid(gpu.uuid);
    }
  }
  if (flags.fake_gpus > 0) {
    absl::StatusOr<std::vector<v1::Device>> fake = FakeGpusForTests(
        flags.fake_gpus, static_cast<int>(options.gpus.size()), options.server_address);
    if (!fake.ok()) return fake.status();  // INVALID_ARGUMENT: bad input
    options.gpus = std::move(*fake);
    options.fake_gpus_for_tests = true;
    std::cerr << "stoker-worker: " << flags.fake_gpus
              << " FAKE GPUs for tests: GPU jobs train on the cpu backend\n";
  }
  options.cpus = flags.cpus;
  if (flags.memory_mib > 0) {
    options.memory_bytes = flags.memory_mib << 20;
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> available = AvailableSystemMemoryBytes();
  if (!available.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot tell the available memory (",
                                                      available.status().message(),
                                                      "); pass --memory-mib"));
  }
  options.memory_bytes = *available;
  return absl::OkStatus();
}

// The /metrics endpoint, when --metrics-listen asks for one (null otherwise).
absl::StatusOr<std::unique_ptr<WorkerMetrics>> StartMetrics(const WorkerFlags& flags,
                                                            AgentOptions& options) {
  if (flags.metrics_listen.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> metrics = WorkerMetrics::Create(
      {.worker_id = options.worker_id, .listen_address = flags.metrics_listen});
  if (!metrics.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("metrics: ", metrics.status().message()));
  }
  const std::string host = flags.metrics_listen.substr(0, flags.metrics_listen.rfind(':'));
  options.metrics_url = absl::StrCat("http://", host, ":", (*metrics)->Port(), "/metrics");
  std::cerr << "stoker-worker: serving " << options.metrics_url << "; " << (*metrics)->NvmlStatus()
            << "\n";
  return metrics;
}

// The first SIGINT or SIGTERM sets `stop` (the agent drains); a second exits at once (trainers
// and loaders die with this process through PR_SET_PDEATHSIG, and the server requeues the jobs
// when the lease runs out).
void WatchShutdownSignals(const sigset_t& signals, std::atomic<bool>& stop) {
  std::thread([signals, &stop] {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    std::cerr << "stoker-worker: " << strsignal(signal_number)
              << ", shutting down: running jobs checkpoint and go back to the queue (a second "
                 "signal stops at once)\n";
    stop.store(true);
    sigwait(&signals, &signal_number);
    std::cerr << "stoker-worker: " << strsignal(signal_number) << " again, exiting now\n";
    std::_Exit(kExitFailure);
  }).detach();
}

int Exit(const absl::Status& status) {
  std::cerr << "stoker-worker: " << status.message() << "\n";
  return absl::IsInvalidArgument(status) ? kExitBadInput : kExitFailure;
}

}  // namespace

WorkerFlags DefaultWorkerFlags() {
  WorkerFlags flags;
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  flags.hostname = hostname;
  AgentOptions& options = flags.agent;
  // Stable across restarts, so that a restarted worker re-attaches and a join token's pattern
  // can name it; a second worker on one host needs its own --worker-id.
  options.worker_id =
      hostname[0] != '\0' ? std::string(hostname) : absl::StrCat("worker-", getpid());
  options.runner.work_dir = ".stoker/worker";
  options.runner.data_root = "/usr/share/datasets";
  const std::string self_dir = SelfDirectory();
  options.runner.trainer_path = self_dir + "/stoker-trainer";
  options.runner.loader_path = self_dir + "/stoker-loader";
  options.runner.cpu_count = static_cast<int>(std::thread::hardware_concurrency());
  flags.cpus = options.runner.cpu_count;
  flags.drain_seconds = absl::ToDoubleSeconds(options.runner.drain_timeout);
  flags.stall_seconds = absl::ToDoubleSeconds(options.runner.trainer_stall_timeout);
  flags.collective_timeout_seconds = absl::ToDoubleSeconds(options.runner.collective_timeout);
  return flags;
}

int RunWorker(WorkerFlags flags, const sigset_t& signals) {
  AgentOptions& options = flags.agent;
  if (absl::Status s = ApplyFlags(flags, options); !s.ok()) return Exit(s);
  if (absl::Status s = PrepareWorkDirectory(options); !s.ok()) return Exit(s);
  if (absl::Status s = ResolveWorkerToken(flags, options); !s.ok()) return Exit(s);
  // Static: the signal thread outlives this call.
  static std::atomic<bool> stop{false};
  WatchShutdownSignals(signals, stop);
  if (absl::Status s = DescribeResources(flags, options); !s.ok()) return Exit(s);
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> metrics = StartMetrics(flags, options);
  if (!metrics.ok()) return Exit(metrics.status());
  Agent agent(options, metrics->get());
  return agent.Run(stop) ? kExitSuccess : kExitFailure;
}

}  // namespace stoker
