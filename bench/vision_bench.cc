// Training speed of the cpu network on a job file's model (issue 15's vision benchmark): the job's
// model section (a cnn's layers or the resnet preset, expanded by spec/ exactly as the trainer
// expands it), its optimizer, label smoothing and batch size, on synthetic uint8 samples of the
// given shape; fp32 or bf16. Prints one key=value line per measurement for bench/run_vision.sh.
// --write_network writes what bench/vision_pytorch.py needs to train the same network in PyTorch
// (the checkpoint's architecture JSON, the optimizer, the batch) and exits.
//
//   vision_bench --job examples/fashion-mnist-resnet.yaml --precision bf16 [--seconds 3]
//   vision_bench --job examples/fashion-mnist-cnn.yaml --write_network cnn.json
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/backend.h"
#include "engine/model_shapes.h"
#include "nlohmann/json.hpp"
#include "spec/job_file.h"
#include "spec/job_spec.h"
#include "spec/model_spec.h"

ABSL_FLAG(std::string, job, "", "job file whose model, optimizer and batch size are timed");
ABSL_FLAG(std::string, precision, "", "fp32 or bf16 (default: the job's train.precision)");
ABSL_FLAG(int, batch, 0, "samples per step (0: the job's train.batch_size)");
ABSL_FLAG(std::string, sample_shape, "28,28", "one sample's shape: H,W or C,H,W");
ABSL_FLAG(int, classes, 0, "classes (0: the job's dataset.classes, else 10)");
ABSL_FLAG(double, seconds, 3.0, "timed window (after the warm-up steps)");
ABSL_FLAG(int, warmup, 3, "untimed steps before the window");
ABSL_FLAG(int, threads, 2, "OpenMP threads (oneDNN and the element-wise loops)");
ABSL_FLAG(int, kernel_runs, 0,
          "after the window, time each kernel of the step alone this many times (the median "
          "of each, Model::TimeKernels) and print them with their sum beside the median step "
          "time; 0: not");
ABSL_FLAG(std::string, write_network, "",
          "write the network as JSON for vision_pytorch.py to this file and exit");

namespace stoker {
namespace {

struct Bench {
  v1::JobSpec spec;
  NetworkConfig config;
  std::vector<int> sample_shape;
};

absl::StatusOr<Bench> Load() {
  Bench bench;
  absl::StatusOr<JobFile> file = ReadJobFile(absl::GetFlag(FLAGS_job));
  if (!file.ok()) return file.status();
  if (absl::Status s = ValidateJobSpec(file->spec); !s.ok()) return WithFileLocation(*file, s);
  bench.spec = file->spec;
  if (bench.spec.model().type() == "mlp") {
    return absl::InvalidArgumentError("the vision benchmark times cnn and resnet models");
  }
  if (absl::GetFlag(FLAGS_batch) > 0) {
    bench.spec.mutable_train()->set_batch_size(absl::GetFlag(FLAGS_batch));
  }
  const std::string precision = absl::GetFlag(FLAGS_precision);
  if (precision == "fp32") bench.spec.mutable_train()->set_precision(v1::PRECISION_FP32);
  if (precision == "bf16") bench.spec.mutable_train()->set_precision(v1::PRECISION_BF16);
  if (!precision.empty() && precision != "fp32" && precision != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--precision: fp32 or bf16, not ", precision));
  }
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_sample_shape), ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(d, &value) || value < 1 || value > 4096) {
      return absl::InvalidArgumentError("--sample_shape: H,W or C,H,W of positive sizes");
    }
    bench.sample_shape.push_back(value);
  }
  int classes = absl::GetFlag(FLAGS_classes);
  if (classes == 0)
    classes = bench.spec.dataset().classes() > 0 ? bench.spec.dataset().classes() : 10;
  if (absl::Status s = ValidateModelForData(bench.spec, bench.sample_shape, classes); !s.ok()) {
    return WithFileLocation(*file, s);
  }
  absl::StatusOr<NetworkConfig> config =
      NetworkConfigFromSpec(bench.spec, bench.sample_shape, classes);
  if (!config.ok()) return config.status();
  bench.config = *config;
  return bench;
}

absl::Status WriteNetwork(const Bench& bench, const std::string& path) {
  const OptimizerConfig& o = bench.config.optimizer;
  const nlohmann::json network = {
      {"name", bench.spec.name()},
      {"architecture", nlohmann::json::parse(ArchitectureJson(bench.config))},
      {"batch", bench.config.max_batch},
      {"classes", bench.config.classes},
      {"sample_shape", bench.sample_shape},
      {"description", NetworkDescription(bench.spec.model(), bench.config)},
      {"mflop_per_sample", NetworkForwardFlopsPerSample(bench.config) / 1e6},
      {"optimizer",
       {{"type", o.type == OptimizerType::kAdamW ? "adamw" : "sgd"},
        {"lr", o.learning_rate},
        {"momentum", o.momentum},
        {"nesterov", o.nesterov},
        {"beta1", o.beta1},
        {"beta2", o.beta2},
        {"eps", o.eps},
        {"weight_decay", o.weight_decay},
        {"clip_grad_norm", o.clip_grad_norm}}}};
  std::ofstream out(path);
  out << network.dump(1) << "\n";
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status Run(const Bench& bench) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  if (!backend.ok()) return backend.status();
  absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateNetwork(bench.config);
  if (!model.ok()) return model.status();
  const int batch = bench.config.max_batch;
  int64_t sample_values = 1;
  for (int d : bench.sample_shape) sample_values *= d;
  // Four different batches in turn (as PyTorch's side), uint8 normalised inside the step.
  constexpr int kPool = 4;
  std::mt19937 rng(1);
  std::vector<std::vector<uint8_t>> samples(kPool), labels(kPool);
  for (int b = 0; b < kPool; ++b) {
    samples[b].resize(batch * sample_values);
    labels[b].resize(batch);
    for (uint8_t& v : samples[b]) v = static_cast<uint8_t>(rng() & 255);
    for (uint8_t& v : labels[b]) v = static_cast<uint8_t>(rng() % bench.config.classes);
  }
  const double lr = bench.config.optimizer.learning_rate;
  auto step = [&](int64_t i) -> absl::StatusOr<float> {
    BatchView view;
    view.samples = samples[i % kPool].data();
    view.labels = labels[i % kPool].data();
    view.count = batch;
    absl::StatusOr<StepResult> result = (*model)->TrainStep(view, lr);
    if (!result.ok()) return result.status();
    return result->loss;
  };
  float loss = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) {
    absl::StatusOr<float> l = step(i);
    if (!l.ok()) return l.status();
  }
  const absl::Time start = absl::Now();
  const absl::Duration window = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  int64_t steps = 0;
  absl::Duration elapsed;
  std::vector<double> step_ms;
  do {
    const absl::Time step_start = absl::Now();
    absl::StatusOr<float> l = step(steps);
    if (!l.ok()) return l.status();
    step_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - step_start));
    loss = *l;
    ++steps;
    elapsed = absl::Now() - start;
  } while (elapsed < window || steps < 3);
  std::nth_element(step_ms.begin(), step_ms.begin() + step_ms.size() / 2, step_ms.end());
  const double median_step_ms = step_ms[step_ms.size() / 2];
  const double seconds = absl::ToDoubleSeconds(elapsed);
  std::printf(
      "stoker network=%s precision=%s threads=%d batch=%d steps=%lld step_ms=%.2f "
      "step_median_ms=%.2f samples_per_s=%.1f last_loss=%.4f mflop_per_sample=%.1f\n",
      bench.spec.name().c_str(), PrecisionName(bench.config.precision), omp_get_max_threads(),
      batch, static_cast<long long>(steps), 1000 * seconds / steps, median_step_ms,
      steps * batch / seconds, loss, NetworkForwardFlopsPerSample(bench.config) / 1e6);
  std::fflush(stdout);
  if (const int runs = absl::GetFlag(FLAGS_kernel_runs); runs > 0) {
    absl::StatusOr<std::vector<KernelTime>> kernels = (*model)->TimeKernels(batch, runs);
    if (!kernels.ok()) return kernels.status();
    double sum = 0;
    for (const KernelTime& k : *kernels) {
      std::printf("kernel network=%s precision=%s ms=%.4f name=\"%s\"\n", bench.spec.name().c_str(),
                  PrecisionName(bench.config.precision), k.median_ms, k.name.c_str());
      sum += k.median_ms;
    }
    // overhead: how much longer the median step is than its kernels run alone.
    std::printf(
        "kernels network=%s precision=%s threads=%d batch=%d kernels=%zu runs=%d "
        "kernel_sum_ms=%.3f step_median_ms=%.3f overhead=%.3f\n",
        bench.spec.name().c_str(), PrecisionName(bench.config.precision), omp_get_max_threads(),
        batch, kernels->size(), runs, sum, median_step_ms, median_step_ms / sum - 1);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_job).empty()) {
    std::fprintf(stderr, "vision_bench: --job FILE is required\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  absl::StatusOr<stoker::Bench> bench = stoker::Load();
  if (!bench.ok()) {
    std::fprintf(stderr, "vision_bench: %s\n", bench.status().ToString().c_str());
    return 2;
  }
  const std::string network = absl::GetFlag(FLAGS_write_network);
  const absl::Status status =
      network.empty() ? stoker::Run(*bench) : stoker::WriteNetwork(*bench, network);
  if (!status.ok()) {
    std::fprintf(stderr, "vision_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
