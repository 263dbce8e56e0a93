// Measures TrainStep throughput of the cpu backend's MLP (fp32 and bf16) on synthetic uint8
// batches, and the raw oneDNN matmul throughput of the first layer's shape, in one process. Prints
// key=value lines for bench/run_train.sh. `--paths=mlp,network --rounds=N` measures the same MLP
// through the MLP fast path (CreateMlp) and through the general network
// (CreateNetwork(NetworkFromMlp)), alternating N times so that both see the same machine load
// (bench/run_model_path.sh).
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_main.h"
#include "engine/backend.h"
#include "engine/model_shapes.h"
#include "oneapi/dnnl/dnnl.hpp"

ABSL_FLAG(double, seconds, 3.0, "measuring time per configuration");
ABSL_FLAG(int, batch, 128, "samples per TrainStep");
ABSL_FLAG(std::string, hidden, "256,128", "hidden widths, comma-separated");
ABSL_FLAG(int, threads, 2, "OpenMP threads (oneDNN and the element-wise loops)");
ABSL_FLAG(std::string, precisions, "fp32,bf16", "precisions to measure");
ABSL_FLAG(std::string, paths, "mlp",
          "model paths to measure: mlp (CreateMlp), network (CreateNetwork(NetworkFromMlp))");
ABSL_FLAG(int, rounds, 1, "times each precision and path is measured, alternating paths");

namespace stoker {
namespace {

constexpr int kFeatures = 784;
constexpr int kClasses = 10;

// GFLOP/s of one oneDNN matmul M x K x N (src MxK, weights KxN read transposed as in the model).
double MatmulGflops(dnnl::memory::data_type type, int m, int k, int n, double seconds) {
  using dnnl::memory;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc src({m, k}, type, memory::format_tag::ab);
  const memory::desc weights({k, n}, type, memory::format_tag::ba);
  const memory::desc dst({m, n}, memory::data_type::f32, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, weights, dst), engine);
  const dnnl::matmul matmul(pd);
  memory src_memory(src, engine), weights_memory(weights, engine), dst_memory(dst, engine);
  // 16-bit words 0x3cXX: values near 0.008 in bf16, and near 0.016 when read in pairs as fp32;
  // no denormals, no zeros.
  std::mt19937 rng(1);
  for (auto* m : {&src_memory, &weights_memory}) {
    auto* words = static_cast<uint16_t*>(m->get_data_handle());
    for (size_t i = 0; i < m->get_desc().get_size() / 2; ++i) words[i] = 0x3c00 | (rng() & 0xff);
  }
  const std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, src_memory}, {DNNL_ARG_WEIGHTS, weights_memory}, {DNNL_ARG_DST, dst_memory}};
  for (int i = 0; i < 50; ++i) matmul.execute(stream, args);
  stream.wait();
  int64_t runs = 0;
  const absl::Time start = absl::Now();
  absl::Duration elapsed;
  do {
    for (int i = 0; i < 50; ++i) matmul.execute(stream, args);
    stream.wait();
    runs += 50;
    elapsed = absl::Now() - start;
  } while (absl::ToDoubleSeconds(elapsed) < seconds);
  return 2.0 * m * k * n * runs / absl::ToDoubleSeconds(elapsed) / 1e9;
}

struct Dataset {
  std::vector<uint8_t> samples;
  std::vector<uint8_t> labels;
};

// Returns 1 on failure (after printing why).
int BenchTraining(Precision precision, absl::string_view path, const std::vector<int>& hidden,
                  int batch, double seconds, const Dataset& data, int batches_in_pool) {
  MlpConfig config;
  config.hidden = hidden;
  config.max_batch = batch;
  config.precision = precision;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  if (!backend.ok()) {
    std::fprintf(stderr, "cpu backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Model>> model =
      path == "network" ? (*backend)->CreateNetwork(NetworkFromMlp(config))
                        : (*backend)->CreateMlp(config);
  if (!model.ok()) {
    std::fprintf(stderr, "%s model (%s): %s\n", std::string(path).c_str(), PrecisionName(precision),
                 model.status().ToString().c_str());
    return 1;
  }
  int64_t next = 0;
  float loss = 0;
  auto step = [&]() -> bool {
    const int b = static_cast<int>(next++ % batches_in_pool);
    const BatchView view{data.samples.data() + static_cast<int64_t>(b) * batch * kFeatures,
                         data.labels.data() + static_cast<int64_t>(b) * batch, batch};
    absl::StatusOr<StepResult> result = (*model)->TrainStep(view, 0.01);
    if (!result.ok()) {
      std::fprintf(stderr, "TrainStep: %s\n", result.status().ToString().c_str());
      return false;
    }
    loss = result->loss;
    return true;
  };
  for (int i = 0; i < 30; ++i) {
    if (!step()) return 1;
  }
  int64_t steps = 0;
  const absl::Time start = absl::Now();
  absl::Duration elapsed;
  do {
    for (int i = 0; i < 20; ++i) {
      if (!step()) return 1;
    }
    steps += 20;
    elapsed = absl::Now() - start;
  } while (absl::ToDoubleSeconds(elapsed) < seconds);
  const double step_seconds = absl::ToDoubleSeconds(elapsed) / steps;
  const double samples_per_second = batch / step_seconds;
  const double gflops = 3.0 * MlpForwardFlopsPerSample(config) * samples_per_second / 1e9;
  std::printf(
      "stoker precision=%s path=%s threads=%d batch=%d steps=%lld step_us=%.1f "
      "samples_per_s=%.0f train_gflops=%.1f last_loss=%.4f\n",
      PrecisionName(precision), std::string(path).c_str(), omp_get_max_threads(), batch,
      static_cast<long long>(steps), step_seconds * 1e6, samples_per_second, gflops, loss);
  return 0;
}

}  // namespace

int BenchMain() {
  omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  const int batch = absl::GetFlag(FLAGS_batch);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::vector<int> hidden;
  for (absl::string_view width : absl::StrSplit(absl::GetFlag(FLAGS_hidden), ',')) {
    hidden.push_back(std::stoi(std::string(width)));
  }
  std::printf("config model=784-%s-10 batch=%d threads=%d\n", absl::StrJoin(hidden, "-").c_str(),
              batch, absl::GetFlag(FLAGS_threads));

  for (auto [name, type] : {std::pair{"fp32", dnnl::memory::data_type::f32},
                            std::pair{"bf16", dnnl::memory::data_type::bf16}}) {
    std::printf("matmul precision=%s threads=%d shape=128x784x256 gflops=%.1f\n", name,
                omp_get_max_threads(), MatmulGflops(type, 128, 784, 256, seconds / 3));
  }

  // A pool of random batches, cycled, so that reading samples is part of each step as in training.
  constexpr int kPoolBatches = 32;
  Dataset data;
  std::mt19937_64 rng(2024);
  data.samples.resize(static_cast<size_t>(kPoolBatches) * batch * kFeatures);
  data.labels.resize(static_cast<size_t>(kPoolBatches) * batch);
  for (uint8_t& p : data.samples) p = static_cast<uint8_t>(rng() >> 56);
  for (uint8_t& l : data.labels) l = static_cast<uint8_t>(rng() % kClasses);

  const std::vector<std::string> paths = absl::StrSplit(absl::GetFlag(FLAGS_paths), ',');
  for (const std::string& path : paths) {
    if (path != "mlp" && path != "network") {
      std::fprintf(stderr, "--paths: unknown path '%s' (mlp or network)\n", path.c_str());
      return 1;
    }
  }
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_precisions), ',')) {
    const Precision precision = name == "bf16"   ? Precision::kBf16
                                : name == "fp16" ? Precision::kFp16
                                                 : Precision::kFp32;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      for (const std::string& path : paths) {
        if (BenchTraining(precision, path, hidden, batch, seconds, data, kPoolBatches) != 0) {
          return 1;
        }
      }
    }
  }
  return 0;
}

}  // namespace stoker
