// Training-step throughput of the cuda backend on a large MLP, bf16 and fp32 (fp16 too), and the
// cuBLASLt GEMM ceiling for the model's dominant shape measured in the same run; the small-MLP
// step with and without its CUDA graph; and the example CNN (cuDNN) in fp32, bf16 and fp16.
// Prints key=value lines; tests/gpu/check.sh turns them into a table. Exits 1 when anything
// failed (no device, a model that cannot be built, a failed step or GEMM, a graph that did not
// replay), after printing what it measured.
//
//   gpu_bench [--width 4096] [--hidden_layers 3] [--batch 4096] [--steps 30] [--warmup 5]
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/lt_gemm.h"
#include "engine/model_shapes.h"
#include "engine/test_layers.h"

namespace stoker {
namespace {

struct Flags {
  int width = 4096;
  int hidden_layers = 3;
  int batch = 4096;
  int classes = 256;
  int steps = 30;
  int warmup = 5;
};

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int value = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--width")) flags.width = value;
    if (!std::strcmp(argv[i], "--hidden_layers")) flags.hidden_layers = value;
    if (!std::strcmp(argv[i], "--batch")) flags.batch = value;
    if (!std::strcmp(argv[i], "--steps")) flags.steps = value;
    if (!std::strcmp(argv[i], "--warmup")) flags.warmup = value;
  }
  return flags;
}

// FLOPs of one training step: forward, weight gradients, and input gradients of every layer but
// the first (the first layer's input needs no gradient).
double StepFlops(const MlpConfig& config, int batch) {
  const double forward = static_cast<double>(MlpForwardFlopsPerSample(config)) * batch;
  const double first_layer = 2.0 * config.input_features *
                             (config.hidden.empty() ? config.classes : config.hidden[0]) * batch;
  return 3 * forward - first_layer;
}

// Mean seconds per TrainStep (each ends with its host synchronisation), or < 0 on error (printed).
// `counters` (optional) receives the model's CudaModelCounters.
double TimeSteps(const Flags& flags, Precision precision, const std::vector<uint8_t>& samples,
                 const std::vector<uint8_t>& labels, double* flops, std::string* last_loss,
                 const CudaBackendOptions& options = {}, CudaModelCounters* counters = nullptr) {
  MlpConfig config;
  config.input_features = flags.width;
  config.hidden.assign(flags.hidden_layers, flags.width);
  config.classes = flags.classes;
  config.max_batch = flags.batch;
  config.precision = precision;
  config.optimizer.learning_rate = 1e-4;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(0, options);
  if (!backend.ok()) {
    std::fprintf(stderr, "CreateCudaBackend: %s\n", backend.status().ToString().c_str());
    return -1;
  }
  absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateMlp(config);
  if (!model.ok()) {
    std::fprintf(stderr, "CreateMlp(%s): %s\n", PrecisionName(precision),
                 model.status().ToString().c_str());
    return -1;
  }
  BatchView batch{samples.data(), labels.data(), flags.batch};
  for (int i = 0; i < flags.warmup; ++i) {
    absl::StatusOr<StepResult> result = (*model)->TrainStep(batch, 1e-4);
    if (!result.ok()) {
      std::fprintf(stderr, "TrainStep(%s): %s\n", PrecisionName(precision),
                   result.status().ToString().c_str());
      return -1;
    }
  }
  // Each step ends with its host synchronisation, so wall time per step is device time plus the
  // launch overhead a trainer pays too.
  const auto start = std::chrono::steady_clock::now();
  float loss = 0;
  for (int i = 0; i < flags.steps; ++i) {
    absl::StatusOr<StepResult> result = (*model)->TrainStep(batch, 1e-4);
    if (!result.ok()) {
      std::fprintf(stderr, "TrainStep(%s): %s\n", PrecisionName(precision),
                   result.status().ToString().c_str());
      return -1;
    }
    loss = result->loss;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / flags.steps;
  *flops = StepFlops(config, flags.batch);
  *last_loss = std::to_string(loss);
  if (counters != nullptr) {
    absl::StatusOr<CudaModelCounters> model_counters = GetCudaModelCounters(**model);
    if (model_counters.ok()) *counters = *std::move(model_counters);
  }
  return seconds;
}

// Mean seconds per TrainStep of examples/fashion-mnist-cnn.yaml's network (2 conv + pool, cuDNN)
// on 28x28 images at `batch`, or < 0 on error (printed).
double TimeCnnSteps(Precision precision, int batch, int steps) {
  NetworkConfig config;
  config.input_shape = {1, 28, 28};
  using Kind = LayerConfig::Kind;
  config.layers = {
      test_layers::Conv(32, 3, 0, 1),  test_layers::Of(Kind::kRelu), test_layers::Pool(2),
      test_layers::Conv(64, 3, 0, 1),  test_layers::Of(Kind::kRelu), test_layers::Pool(2),
      test_layers::Of(Kind::kFlatten), test_layers::Linear(256),     test_layers::Of(Kind::kRelu),
      test_layers::Dropout(0.3f),      test_layers::Linear(10),
  };
  config.classes = 10;
  config.max_batch = batch;
  config.precision = precision;
  config.optimizer.nesterov = true;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(0);
  if (!backend.ok()) {
    std::fprintf(stderr, "CreateCudaBackend: %s\n", backend.status().ToString().c_str());
    return -1;
  }
  absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateNetwork(config);
  if (!model.ok()) {
    std::fprintf(stderr, "CreateNetwork(%s): %s\n", PrecisionName(precision),
                 model.status().ToString().c_str());
    return -1;
  }
  std::vector<uint8_t> samples(static_cast<size_t>(batch) * 28 * 28);
  std::vector<uint8_t> labels(batch);
  std::mt19937_64 rng(9);
  for (uint8_t& p : samples) p = static_cast<uint8_t>(rng() >> 56);
  for (uint8_t& l : labels) l = static_cast<uint8_t>(rng() % 10);
  const BatchView view{samples.data(), labels.data(), batch};
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<StepResult> result = (*model)->TrainStep(view, 0.01);
    if (!result.ok()) {
      std::fprintf(stderr, "cnn TrainStep(%s): %s\n", PrecisionName(precision),
                   result.status().ToString().c_str());
      return -1;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    absl::StatusOr<StepResult> result = (*model)->TrainStep(view, 0.01);
    if (!result.ok()) {
      std::fprintf(stderr, "cnn TrainStep(%s): %s\n", PrecisionName(precision),
                   result.status().ToString().c_str());
      return -1;
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
}

// Mean seconds of one bf16 GEMM D[m, n] = A^T B with fp32 accumulation, timed with events.
double TimeGemm(int m, int n, int k, int iterations) {
  absl::StatusOr<std::unique_ptr<cuda::DeviceContext>> context =
      cuda::DeviceContext::Create(0, size_t{32} << 20);
  if (!context.ok()) {
    std::fprintf(stderr, "DeviceContext: %s\n", context.status().ToString().c_str());
    return -1;
  }
  cuda::GemmShape shape{.m = m,
                        .n = n,
                        .k = k,
                        .transpose_a = true,
                        .transpose_b = false,
                        .a_type = cuda::DType::kBf16,
                        .b_type = cuda::DType::kBf16,
                        .d_type = cuda::DType::kBf16};
  absl::StatusOr<std::unique_ptr<cuda::LtGemm>> gemm =
      cuda::LtGemm::Create((*context)->lt(), shape, {}, (*context)->workspace_bytes());
  if (!gemm.ok()) {
    std::fprintf(stderr, "LtGemm: %s\n", gemm.status().ToString().c_str());
    return -1;
  }
  absl::StatusOr<cuda::DeviceBuffer> a = cuda::DeviceBuffer::Allocate(size_t{2} * m * k);
  absl::StatusOr<cuda::DeviceBuffer> b = cuda::DeviceBuffer::Allocate(size_t{2} * k * n);
  absl::StatusOr<cuda::DeviceBuffer> d = cuda::DeviceBuffer::Allocate(size_t{2} * m * n);
  if (!a.ok() || !b.ok() || !d.ok()) {
    std::fprintf(stderr, "GEMM buffers: out of device memory\n");
    return -1;
  }
  const cudaStream_t stream = (*context)->compute_stream();
  // Small random-looking bf16 values (0x3c00..0x3cff is ~0.0078..0.0156): zeros would flatter the
  // tensor cores' power draw.
  std::vector<uint16_t> host(std::max(size_t{1} * m * k, size_t{1} * k * n));
  std::mt19937 rng(1);
  for (uint16_t& v : host) v = static_cast<uint16_t>(0x3c00 | (rng() & 0xff) | ((rng() & 1) << 15));
  if (cudaMemcpy(a->get(), host.data(), a->bytes(), cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(b->get(), host.data(), b->bytes(), cudaMemcpyHostToDevice) != cudaSuccess) {
    std::fprintf(stderr, "GEMM inputs: %s\n", cudaGetErrorString(cudaGetLastError()));
    return -1;
  }
  auto run = [&]() {
    return (*gemm)->Run((*context)->lt(), a->get(), b->get(), d->get(), (*context)->workspace(),
                        (*context)->workspace_bytes(), stream);
  };
  for (int i = 0; i < 5; ++i) {
    if (absl::Status status = run(); !status.ok()) {
      std::fprintf(stderr, "GEMM: %s\n", status.ToString().c_str());
      return -1;
    }
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess ||
      cudaEventRecord(start, stream) != cudaSuccess) {
    std::fprintf(stderr, "GEMM events: %s\n", cudaGetErrorString(cudaGetLastError()));
    return -1;
  }
  for (int i = 0; i < iterations; ++i) {
    if (absl::Status status = run(); !status.ok()) {
      std::fprintf(stderr, "GEMM: %s\n", status.ToString().c_str());
      return -1;
    }
  }
  float ms = 0;
  if (cudaEventRecord(stop, stream) != cudaSuccess || cudaEventSynchronize(stop) != cudaSuccess ||
      cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
    std::fprintf(stderr, "GEMM timing: %s\n", cudaGetErrorString(cudaGetLastError()));
    return -1;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3 / iterations;
}

int Main(int argc, char** argv) {
  if (absl::Status device = CudaDeviceStatus(); !device.ok()) {
    std::printf("error=%s\n", std::string(device.message()).c_str());
    return 1;
  }
  int errors = 0;
  const Flags flags = ParseFlags(argc, argv);
  cudaDeviceProp props{};
  if (const cudaError_t error = cudaGetDeviceProperties(&props, 0); error != cudaSuccess) {
    std::printf("error=cudaGetDeviceProperties: %s\n", cudaGetErrorString(error));
    return 1;
  }
  std::printf("device name=\"%s\" sms=%d cc=%d.%d\n", props.name, props.multiProcessorCount,
              props.major, props.minor);
  std::printf("config width=%d hidden_layers=%d batch=%d classes=%d steps=%d\n", flags.width,
              flags.hidden_layers, flags.batch, flags.classes, flags.steps);

  std::vector<uint8_t> samples(static_cast<size_t>(flags.batch) * flags.width);
  std::vector<uint8_t> labels(flags.batch);
  std::mt19937_64 rng(7);
  for (uint8_t& p : samples) p = static_cast<uint8_t>(rng() >> 56);
  for (uint8_t& l : labels) l = static_cast<uint8_t>(rng() % flags.classes);
  // Pinned, as the trainer pins its ring: the copy is then a true asynchronous DMA.
  PinnedHostRegion pinned_samples;
  const bool pinned = pinned_samples.Register(samples.data(), samples.size()).ok();

  double seconds[3] = {-1, -1, -1};
  const Precision precisions[3] = {Precision::kFp32, Precision::kBf16, Precision::kFp16};
  for (int p = 0; p < 3; ++p) {
    double flops = 0;
    std::string loss;
    CudaModelCounters counters;
    seconds[p] = TimeSteps(flags, precisions[p], samples, labels, &flops, &loss, {}, &counters);
    if (seconds[p] < 0) {
      std::printf("step precision=%s error=1\n", PrecisionName(precisions[p]));
      ++errors;
      continue;
    }
    std::printf(
        "step precision=%s ms=%.3f samples_per_s=%.0f tflops=%.1f last_loss=%s pinned=%d "
        "fused_gemms=%lld plain_gemms=%lld graph_replays=%lld eager_steps=%lld\n",
        PrecisionName(precisions[p]), seconds[p] * 1e3, flags.batch / seconds[p],
        flops / seconds[p] / 1e12, loss.c_str(), pinned ? 1 : 0,
        static_cast<long long>(counters.fused_gemms), static_cast<long long>(counters.plain_gemms),
        static_cast<long long>(counters.graph_replays),
        static_cast<long long>(counters.eager_steps));
    for (const std::string& reason : counters.fallbacks) {
      std::printf("fallback precision=%s reason=\"%s\"\n", PrecisionName(precisions[p]),
                  reason.c_str());
    }
  }
  if (absl::Status status = pinned_samples.Release(); !status.ok()) {
    std::printf("error=%s\n", status.ToString().c_str());
    ++errors;
  }

  // The dominant GEMM: a hidden layer's forward, [width x width] weights times a batch.
  const double gemm_seconds = TimeGemm(flags.width, flags.batch, flags.width, 50);
  if (gemm_seconds > 0) {
    const double gemm_tflops = 2.0 * flags.width * flags.batch * flags.width / gemm_seconds / 1e12;
    std::printf("gemm precision=bf16 shape=%dx%dx%d ms=%.3f tflops=%.1f\n", flags.width,
                flags.batch, flags.width, gemm_seconds * 1e3, gemm_tflops);
    if (seconds[1] > 0) {
      MlpConfig config;
      config.input_features = flags.width;
      config.hidden.assign(flags.hidden_layers, flags.width);
      config.classes = flags.classes;
      const double step_tflops = StepFlops(config, flags.batch) / seconds[1] / 1e12;
      std::printf("ratio bf16_step_vs_gemm=%.2f\n", step_tflops / gemm_tflops);
    }
  } else {
    std::printf("gemm precision=bf16 error=1\n");
    ++errors;
  }
  if (seconds[0] > 0 && seconds[1] > 0) {
    std::printf("speedup bf16_vs_fp32=%.2f\n", seconds[0] / seconds[1]);
  }
  if (seconds[0] > 0 && seconds[2] > 0) {
    std::printf("speedup fp16_vs_fp32=%.2f\n", seconds[0] / seconds[2]);
  }

  // CUDA graphs where launches dominate: a small MLP (784-784-10, batch 128, bf16, about the size
  // of the Fashion-MNIST example) with the step captured and replayed, against the same step
  // kernel by kernel.
  Flags small = flags;
  small.width = 784;
  small.batch = 128;
  small.classes = 10;
  small.steps = 500;
  small.warmup = 20;
  std::vector<uint8_t> small_labels(labels.begin(), labels.begin() + small.batch);
  for (uint8_t& l : small_labels) l %= 10;
  double small_seconds[2] = {-1, -1};
  for (int graphs = 1; graphs >= 0; --graphs) {
    CudaBackendOptions options;
    options.cuda_graphs = graphs == 1;
    small.hidden_layers = 1;
    double flops = 0;
    std::string loss;
    CudaModelCounters counters;
    small_seconds[graphs] = TimeSteps(small, Precision::kBf16, samples, small_labels, &flops, &loss,
                                      options, &counters);
    if (small_seconds[graphs] > 0) {
      std::printf(
          "small precision=bf16 graphs=%d width=784 batch=128 ms=%.4f graph_replays=%lld "
          "eager_steps=%lld\n",
          graphs, small_seconds[graphs] * 1e3, static_cast<long long>(counters.graph_replays),
          static_cast<long long>(counters.eager_steps));
      // A graph run that replayed nothing measured kernel-by-kernel launches twice.
      if (graphs == 1 && counters.graph_replays == 0) {
        std::printf("small precision=bf16 graphs=1 error=no graph was replayed\n");
        for (const std::string& reason : counters.fallbacks) {
          std::printf("fallback reason=\"%s\"\n", reason.c_str());
        }
        ++errors;
      }
    } else {
      std::printf("small precision=bf16 graphs=%d error=1\n", graphs);
      ++errors;
    }
  }
  if (small_seconds[0] > 0 && small_seconds[1] > 0) {
    std::printf("speedup graphs_vs_eager_small=%.2f\n", small_seconds[0] / small_seconds[1]);
  }

  // The example CNN through the general network (cuDNN convolutions and pooling), batch 512.
  constexpr int kCnnBatch = 512;
  double cnn_seconds[3] = {-1, -1, -1};
  for (int p = 0; p < 3; ++p) {
    cnn_seconds[p] = TimeCnnSteps(precisions[p], kCnnBatch, 30);
    if (cnn_seconds[p] > 0) {
      std::printf("cnn precision=%s batch=%d ms=%.3f samples_per_s=%.0f\n",
                  PrecisionName(precisions[p]), kCnnBatch, cnn_seconds[p] * 1e3,
                  kCnnBatch / cnn_seconds[p]);
    } else {
      std::printf("cnn precision=%s error=1\n", PrecisionName(precisions[p]));
      ++errors;
    }
  }
  if (cnn_seconds[0] > 0 && cnn_seconds[1] > 0) {
    std::printf("speedup cnn_bf16_vs_fp32=%.2f\n", cnn_seconds[0] / cnn_seconds[1]);
  }
  if (errors > 0) std::printf("errors=%d\n", errors);
  return errors > 0 ? 1 : 0;
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) { return stoker::Main(argc, argv); }
