// Data-parallel training throughput of the cpu backend (issue 16's benchmark, bench/run_ddp.sh):
// the MLP of examples/fashion-mnist-mlp.yaml trained by `--ranks` forked processes, each pinned to
// a core of its own with one OpenMP thread, joined by Gloo over TCP on 127.0.0.1 (ConnectGloo, the
// ranks meeting through a file-based KeyValueStore in a temporary directory), gradients summed by
// the BucketedReducer (25 MiB buckets, as PyTorch DDP) that the model calls during its TrainStep.
// Each rank trains on `--batch` synthetic uint8 samples per step (Fashion-MNIST's shape; the model
// normalises them itself), so the global batch is ranks x batch. `--ranks=1` trains the plain
// model (no reducer, no Gloo): the single-rank baseline. `--job FILE` trains that job file's
// network (the example CNN, ResNet-20) instead of the MLP, with its optimizer; `--threads_per_rank`
// gives each rank that many OpenMP threads and cores (1 rank x 2 threads: the baseline that 2 ranks
// x 1 thread are measured against).
//
// Timing as bench/ddp_pytorch.py: warm-up steps, the window's step count picked by rank 0 from
// the warm-up's second half and broadcast, a barrier, the window, a barrier. Prints one JSON line:
// samples_per_s is the global rate; allreduce_* are the reducer's counters over the window.
#include <fcntl.h>
#include <omp.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_main.h"
#include "comm/collective.h"
#include "engine/backend.h"
#include "engine/model_shapes.h"
#include "nlohmann/json.hpp"
#include "spec/job_file.h"
#include "spec/job_spec.h"
#include "spec/model_spec.h"

ABSL_FLAG(int, ranks, 2, "processes (1: the plain model, no reducer)");
ABSL_FLAG(int, batch, 128, "samples per rank per step");
ABSL_FLAG(double, seconds, 3.0, "timed window (about)");
ABSL_FLAG(int, warmup_steps, 40, "steps before the window");
ABSL_FLAG(std::string, hidden, "256,128", "hidden widths, comma-separated");
ABSL_FLAG(std::string, precision, "fp32", "fp32 or bf16");
ABSL_FLAG(double, lr, 0.05, "SGD learning rate");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum");
ABSL_FLAG(int64_t, bucket_bytes, 25ll << 20, "reducer bucket size (PyTorch DDP: 25 MiB)");
ABSL_FLAG(std::string, transport, "gloo",
          "how the ranks sum: gloo (TCP over loopback) or shm (shared memory, as the trainer "
          "does when every rank is on one machine)");
ABSL_FLAG(double, timeout_seconds, 120, "the whole run; ranks still running then are killed");
ABSL_FLAG(std::string, job, "",
          "train this job file's network (cnn or resnet, Fashion-MNIST's 28x28 shape) instead of "
          "the MLP; its optimizer, precision unless --precision is given");
ABSL_FLAG(int, threads_per_rank, 1,
          "OpenMP threads of each rank (each rank pinned to that many cores of its own)");

namespace stoker {
namespace {

constexpr int kFeatures = 784;
constexpr int kClasses = 10;
constexpr int kPoolBatches = 32;

struct Options {
  int ranks = 2;
  int batch = 128;
  double seconds = 3;
  int warmup_steps = 40;
  std::vector<int> hidden;
  Precision precision = Precision::kFp32;
  double lr = 0.05;
  double momentum = 0.9;
  int64_t bucket_bytes = 25ll << 20;
  std::string transport = "gloo";  // or "shm"
  std::string store_directory;
  int threads_per_rank = 1;
  std::optional<NetworkConfig> network;  // --job
  std::string model_name;
};

// The `index`-th CPU this process may run on (modulo their count); -1 when unknown.
int AllowedCpu(int index) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  return cpus.empty() ? -1 : cpus[index % cpus.size()];
}

int AllowedCpuCount() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return 1;
  return CPU_COUNT(&allowed);
}

// One rank's whole run; rank 0 returns the JSON line to print.
absl::StatusOr<std::string> RunRank(int rank, const Options& options) {
  cpu_set_t set;
  CPU_ZERO(&set);
  bool pinned = false;
  for (int t = 0; t < options.threads_per_rank; ++t) {
    const int cpu = AllowedCpu(rank * options.threads_per_rank + t);
    if (cpu >= 0) {
      CPU_SET(cpu, &set);
      pinned = true;
    }
  }
  if (pinned && sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(absl::StrCat("rank ", rank, ": pinning: ", std::strerror(errno)));
  }
  omp_set_num_threads(options.threads_per_rank);

  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  if (!backend.ok()) return backend.status();
  absl::StatusOr<std::unique_ptr<Model>> model;
  if (options.network) {
    NetworkConfig config = *options.network;
    config.max_batch = options.batch;
    config.precision = options.precision;
    config.seed = 1;  // the same initial weights on every rank
    model = (*backend)->CreateNetwork(config);
  } else {
    MlpConfig config;
    config.hidden = options.hidden;
    config.max_batch = options.batch;
    config.precision = options.precision;
    config.seed = 1;  // the same initial weights on every rank
    config.optimizer.learning_rate = options.lr;
    config.optimizer.momentum = options.momentum;
    model = (*backend)->CreateMlp(config);
  }
  if (!model.ok()) return model.status();

  std::unique_ptr<KeyValueStore> store;
  std::unique_ptr<Collective> collective;
  std::unique_ptr<BucketedReducer> reducer;
  if (options.ranks > 1) {
    store = CreateDirectoryStore(options.store_directory);
    GlooOptions gloo;
    gloo.rank = rank;
    gloo.size = options.ranks;
    gloo.host = "127.0.0.1";
    gloo.store_prefix = "ddp_bench/";
    absl::StatusOr<std::unique_ptr<Collective>> connected =
        options.transport == "shm"
            ? ConnectSharedMemory(
                  {.rank = rank, .size = options.ranks, .store_prefix = "ddp_bench/"}, *store)
            : ConnectGloo(gloo, *store);
    if (!connected.ok()) return connected.status();
    collective = std::move(*connected);
    BucketOptions bucket;
    bucket.bucket_bytes = options.bucket_bytes;
    bucket.global_batch = static_cast<int64_t>(options.ranks) * options.batch;
    reducer = CreateBucketedReducer(*collective, bucket);
    if (absl::Status status = (*model)->SetGradientReducer(reducer.get()); !status.ok()) {
      return status;
    }
  }

  // A pool of random batches per rank (a disjoint stream per rank), cycled.
  std::mt19937_64 rng(2024 + rank);
  std::vector<uint8_t> samples(static_cast<size_t>(kPoolBatches) * options.batch * kFeatures);
  std::vector<uint8_t> labels(static_cast<size_t>(kPoolBatches) * options.batch);
  for (uint8_t& p : samples) p = static_cast<uint8_t>(rng() >> 56);
  for (uint8_t& l : labels) l = static_cast<uint8_t>(rng() % kClasses);

  float loss = 0;
  auto step = [&](int64_t i) -> absl::Status {
    const int64_t b = i % kPoolBatches;
    const BatchView view{samples.data() + b * options.batch * kFeatures,
                         labels.data() + b * options.batch, options.batch};
    if (reducer != nullptr) reducer->SetLocalSamples(options.batch);
    absl::StatusOr<StepResult> result = (*model)->TrainStep(view, options.lr);
    if (!result.ok()) {
      return absl::Status(result.status().code(), absl::StrCat("rank ", rank, " step ", i, ": ",
                                                               result.status().message()));
    }
    loss = result->loss;
    return absl::OkStatus();
  };

  // The window's length comes from the warm-up's second half (the first steps allocate).
  const int half = options.warmup_steps / 2;
  for (int i = 0; i < half; ++i) {
    if (absl::Status status = step(i); !status.ok()) return status;
  }
  absl::Time start = absl::Now();
  for (int i = half; i < options.warmup_steps; ++i) {
    if (absl::Status status = step(i); !status.ok()) return status;
  }
  const double warm_step_seconds =
      absl::ToDoubleSeconds(absl::Now() - start) / std::max(1, options.warmup_steps - half);
  float steps_value = static_cast<float>(
      std::max<int64_t>(10, std::llround(options.seconds / std::max(warm_step_seconds, 1e-6))));
  ReducerCounters before;
  if (collective != nullptr) {
    if (absl::Status status = collective->Broadcast(&steps_value, 1, 0); !status.ok()) {
      return status;
    }
    if (absl::Status status = collective->Barrier(); !status.ok()) return status;
    before = reducer->counters();
  }
  const int64_t steps = static_cast<int64_t>(steps_value);
  start = absl::Now();
  for (int64_t i = 0; i < steps; ++i) {
    if (absl::Status status = step(options.warmup_steps + i); !status.ok()) return status;
  }
  ReducerCounters after;
  if (collective != nullptr) {
    after = reducer->counters();
    if (absl::Status status = collective->Barrier(); !status.ok()) return status;
  }
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  if (rank != 0) return std::string();

  const int64_t global_batch = static_cast<int64_t>(options.ranks) * options.batch;
  nlohmann::ordered_json json = {
      {"impl", "stoker"},
      {"mode", options.ranks > 1 ? "ddp-" + options.transport : std::string("single")},
      {"ranks", options.ranks},
      {"batch_per_rank", options.batch},
      {"global_batch", global_batch},
      {"precision", PrecisionName(options.precision)},
      {"input", "uint8, normalised by the model"},
      {"model", options.model_name},
      {"steps", steps},
      {"seconds", elapsed},
      {"step_ms", 1e3 * elapsed / steps},
      {"samples_per_s", global_batch * steps / elapsed},
      {"last_loss", loss},
      {"omp_threads", omp_get_max_threads()},
  };
  if (reducer != nullptr) {
    const double window_steps = static_cast<double>(steps);
    json["bucket_bytes"] = options.bucket_bytes;
    json["transport"] = options.transport;
    json["allreduce_seconds"] = after.allreduce_seconds - before.allreduce_seconds;
    json["exposed_seconds"] = after.exposed_seconds - before.exposed_seconds;
    json["allreduce_bytes"] = after.allreduce_bytes - before.allreduce_bytes;
    json["allreduce_calls"] = after.allreduce_calls - before.allreduce_calls;
    json["allreduce_ms_per_step"] =
        1e3 * (after.allreduce_seconds - before.allreduce_seconds) / window_steps;
    json["exposed_ms_per_step"] =
        1e3 * (after.exposed_seconds - before.exposed_seconds) / window_steps;
    json["allreduce_gb_per_s"] =
        after.allreduce_seconds > before.allreduce_seconds
            ? static_cast<double>(after.allreduce_bytes - before.allreduce_bytes) /
                  (after.allreduce_seconds - before.allreduce_seconds) / 1e9
            : 0.0;
  }
  return json.dump();
}

absl::StatusOr<Options> ParseOptions() {
  Options options;
  options.ranks = absl::GetFlag(FLAGS_ranks);
  options.batch = absl::GetFlag(FLAGS_batch);
  options.seconds = absl::GetFlag(FLAGS_seconds);
  options.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  options.lr = absl::GetFlag(FLAGS_lr);
  options.momentum = absl::GetFlag(FLAGS_momentum);
  options.bucket_bytes = absl::GetFlag(FLAGS_bucket_bytes);
  options.transport = absl::GetFlag(FLAGS_transport);
  if (options.transport != "gloo" && options.transport != "shm") {
    return absl::InvalidArgumentError("--transport must be gloo or shm");
  }
  if (options.ranks < 1 || options.ranks > 64) {
    return absl::InvalidArgumentError("--ranks must be in [1, 64]");
  }
  if (options.batch < 1) return absl::InvalidArgumentError("--batch must be at least 1");
  if (options.warmup_steps < 2) {
    return absl::InvalidArgumentError("--warmup_steps must be at least 2");
  }
  if (!(options.seconds > 0)) return absl::InvalidArgumentError("--seconds must be positive");
  if (options.bucket_bytes < 4) return absl::InvalidArgumentError("--bucket_bytes too small");
  for (absl::string_view width : absl::StrSplit(absl::GetFlag(FLAGS_hidden), ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(width, &value) || value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hidden: '", width, "' is not a positive width"));
    }
    options.hidden.push_back(value);
  }
  options.threads_per_rank = absl::GetFlag(FLAGS_threads_per_rank);
  if (options.threads_per_rank < 1 || options.threads_per_rank > 256) {
    return absl::InvalidArgumentError("--threads_per_rank must be in [1, 256]");
  }
  options.model_name = absl::StrCat("784-", absl::StrJoin(options.hidden, "-"), "-10");
  if (const std::string job = absl::GetFlag(FLAGS_job); !job.empty()) {
    absl::StatusOr<JobFile> file = ReadJobFile(job);
    if (!file.ok()) return file.status();
    if (absl::Status s = ValidateJobSpec(file->spec); !s.ok()) return WithFileLocation(*file, s);
    if (file->spec.model().type() == "mlp") {
      return absl::InvalidArgumentError("--job: a cnn or resnet job (the MLP is the default)");
    }
    const std::vector<int> shape = {28, 28};
    if (absl::Status s = ValidateModelForData(file->spec, shape, kClasses); !s.ok()) {
      return WithFileLocation(*file, s);
    }
    absl::StatusOr<NetworkConfig> network = NetworkConfigFromSpec(file->spec, shape, kClasses);
    if (!network.ok()) return network.status();
    options.network = *network;
    options.lr = network->optimizer.learning_rate;
    options.model_name = file->spec.name();
  }
  const std::string precision = absl::GetFlag(FLAGS_precision);
  if (precision == "fp32") {
    options.precision = Precision::kFp32;
  } else if (precision == "bf16") {
    options.precision = Precision::kBf16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--precision: '", precision, "' (fp32 or bf16)"));
  }
  return options;
}

}  // namespace

int BenchMain() {
  absl::StatusOr<Options> parsed = ParseOptions();
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
    return 2;
  }
  Options options = *parsed;
  if (options.ranks > AllowedCpuCount()) {
    std::fprintf(stderr, "warning: %d ranks on %d cores share cores\n", options.ranks,
                 AllowedCpuCount());
  }
  char directory[] = "/tmp/ddp_bench.XXXXXX";
  if (mkdtemp(directory) == nullptr) {
    std::fprintf(stderr, "mkdtemp: %s\n", std::strerror(errno));
    return 1;
  }
  options.store_directory = directory;
  int result_pipe[2];
  if (pipe(result_pipe) != 0) {
    std::fprintf(stderr, "pipe: %s\n", std::strerror(errno));
    return 1;
  }

  // Forked before this process starts any thread (no OpenMP, oneDNN or Gloo yet).
  std::vector<pid_t> children;
  for (int rank = 0; rank < options.ranks; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "fork: %s\n", std::strerror(errno));
      for (pid_t child : children) kill(child, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      close(result_pipe[0]);
      absl::StatusOr<std::string> line = RunRank(rank, options);
      if (!line.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, line.status().ToString().c_str());
        std::fflush(stderr);
        _exit(1);
      }
      if (rank == 0) {
        const std::string text = *line + "\n";
        if (write(result_pipe[1], text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
          _exit(1);
        }
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  close(result_pipe[1]);

  // Wait for every rank; the first failure (or the deadline) kills the rest.
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds));
  std::vector<bool> done(children.size(), false);
  size_t remaining = children.size();
  bool failed = false;
  while (remaining > 0) {
    bool reaped = false;
    for (size_t r = 0; r < children.size(); ++r) {
      if (done[r]) continue;
      int status = 0;
      const pid_t pid = waitpid(children[r], &status, WNOHANG);
      if (pid != children[r]) continue;
      done[r] = true;
      --remaining;
      reaped = true;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (!failed) {
          std::fprintf(stderr, "rank %zu failed (%s %d): stopping the others\n", r,
                       WIFEXITED(status) ? "exit" : "signal",
                       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        }
        failed = true;
      }
    }
    if (!failed && absl::Now() > deadline) {
      std::fprintf(stderr, "ranks still running after --timeout_seconds: killing them\n");
      failed = true;
    }
    if (failed) {
      for (size_t r = 0; r < children.size(); ++r) {
        if (!done[r]) kill(children[r], SIGKILL);
      }
    }
    if (!reaped && remaining > 0) absl::SleepFor(absl::Milliseconds(5));
  }
  std::error_code ignored;
  std::filesystem::remove_all(directory, ignored);

  std::string output;
  char buffer[4096];
  ssize_t n;
  while ((n = read(result_pipe[0], buffer, sizeof(buffer))) > 0) output.append(buffer, n);
  close(result_pipe[0]);
  if (failed || output.empty()) {
    if (!failed) std::fprintf(stderr, "rank 0 wrote no result\n");
    return 1;
  }
  std::fputs(output.c_str(), stdout);
  return 0;
}

}  // namespace stoker
