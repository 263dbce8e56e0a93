#include "engine/cuda/cuda_test_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace stoker::cuda_testing {

bool CudaRequired() {
  const char* value = std::getenv("STOKER_REQUIRE_CUDA");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

int DeviceComputeCapability() {
  if (CudaDeviceCount() == 0) return 0;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return 10 * major + minor;
}

CudaModelCounters Counters(const Model& model) {
  absl::StatusOr<CudaModelCounters> counters = GetCudaModelCounters(model);
  EXPECT_TRUE(counters.ok()) << counters.status();
  return counters.ok() ? *std::move(counters) : CudaModelCounters{};
}

BatchView Batch::View() const {
  BatchView view{samples.empty() ? nullptr : samples.data(), labels.data(), count};
  if (!features.empty()) view.features = features.data();
  return view;
}

Batch RandomBatch(int count, int64_t features, int classes, uint64_t seed, bool float_features,
                  Pixels pixels) {
  std::mt19937_64 rng(seed);
  Batch batch;
  batch.count = count;
  const size_t n = static_cast<size_t>(count) * features;
  if (float_features) {
    batch.features.resize(n);
    for (float& f : batch.features) f = static_cast<float>((rng() >> 11) * 0x1.0p-53 * 4 - 2);
  } else if (pixels == Pixels::kNonZero) {
    batch.samples.resize(n);
    for (uint8_t& p : batch.samples) p = static_cast<uint8_t>(1 + (rng() >> 32) % 255);
  } else {
    batch.samples.resize(n);
    for (uint8_t& p : batch.samples) p = static_cast<uint8_t>(rng() >> 56);
  }
  batch.labels.resize(count);
  for (uint8_t& l : batch.labels) l = static_cast<uint8_t>(rng() % classes);
  return batch;
}

Batch RandomBatch(const NetworkConfig& config, int count, uint64_t seed, bool float_features) {
  int64_t features = 1;
  for (int d : config.input_shape) features *= d;
  return RandomBatch(count, features, config.classes, seed, float_features, Pixels::kNonZero);
}

Batch Normalized(const Batch& pixels, const ChannelNormalization& norm) {
  Batch out;
  out.count = pixels.count;
  out.labels = pixels.labels;
  out.features.reserve(pixels.samples.size());
  for (size_t i = 0; i < pixels.samples.size(); ++i) {
    const size_t c = (i / norm.plane) % norm.channels;
    volatile float product = static_cast<float>(pixels.samples[i]) * norm.scale[c];  // no FMA
    out.features.push_back(product + norm.shift[c]);
  }
  return out;
}

namespace {

std::unique_ptr<Backend> CpuBackend() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

std::unique_ptr<Model> ModelOrNull(absl::StatusOr<std::unique_ptr<Model>> model) {
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

}  // namespace

std::unique_ptr<Model> CpuMlp(const MlpConfig& config) {
  std::unique_ptr<Backend> backend = CpuBackend();
  return backend == nullptr ? nullptr : ModelOrNull(backend->CreateMlp(config));
}

std::unique_ptr<Model> CpuNetwork(const NetworkConfig& config) {
  std::unique_ptr<Backend> backend = CpuBackend();
  return backend == nullptr ? nullptr : ModelOrNull(backend->CreateNetwork(config));
}

std::unique_ptr<Backend> CudaBackend(const CudaBackendOptions& options) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(0, options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

std::unique_ptr<Model> CudaMlp(const MlpConfig& config, const CudaBackendOptions& options) {
  std::unique_ptr<Backend> backend = CudaBackend(options);
  if (backend == nullptr) return nullptr;
  EXPECT_EQ(backend->Name(), "cuda");
  return ModelOrNull(backend->CreateMlp(config));
}

std::unique_ptr<Model> CudaNetwork(const NetworkConfig& config) {
  std::unique_ptr<Backend> backend = CudaBackend();
  return backend == nullptr ? nullptr : ModelOrNull(backend->CreateNetwork(config));
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-12);
}

void ExpectTensorsNear(const std::vector<NamedTensor>& actual,
                       const std::vector<NamedTensor>& expected, double tolerance,
                       const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].name, expected[i].name) << what;
    EXPECT_EQ(actual[i].shape, expected[i].shape) << what << " " << expected[i].name;
    ASSERT_EQ(actual[i].values.size(), expected[i].values.size()) << what;
    if (tolerance == 0) {
      EXPECT_TRUE(actual[i].values == expected[i].values) << what << " " << expected[i].name;
    } else {
      EXPECT_LE(RelativeError(actual[i].values, expected[i].values), tolerance)
          << what << " " << expected[i].name;
    }
  }
}

std::vector<NamedTensor> Delta(const std::vector<NamedTensor>& after,
                               const std::vector<NamedTensor>& before) {
  std::vector<NamedTensor> delta = after;
  for (size_t i = 0; i < delta.size() && i < before.size(); ++i) {
    for (size_t j = 0; j < delta[i].values.size() && j < before[i].values.size(); ++j) {
      delta[i].values[j] -= before[i].values[j];
    }
  }
  return delta;
}

void ExpectTrainingTracksCpu(const NetworkConfig& config, const TrackingOptions& options) {
  std::unique_ptr<Model> cpu = CpuNetwork(config);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(cpu && gpu);
  const std::vector<NamedTensor> initial = cpu->Parameters();
  ExpectTensorsNear(gpu->Parameters(), initial, 0.0, "initial parameters");
  ExpectTensorsNear(gpu->OptimizerState(), cpu->OptimizerState(), 0.0, "initial optimizer state");
  const std::string precision = PrecisionName(config.precision);
  for (int step = 0; step < options.steps; ++step) {
    const int count = step % 3 == 1 ? config.max_batch / 2 + 1 : config.max_batch;
    const Batch batch = RandomBatch(config, count, 100 + step, step % 2 == 1);
    absl::StatusOr<StepResult> expected = cpu->TrainStep(batch.View(), options.learning_rate);
    absl::StatusOr<StepResult> actual = gpu->TrainStep(batch.View(), options.learning_rate);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, options.loss_tolerance * expected->loss)
        << precision << " step " << step;
    EXPECT_EQ(actual->skipped, expected->skipped) << precision << " step " << step;
    EXPECT_EQ(actual->loss_scale, expected->loss_scale) << precision << " step " << step;
    const std::string what = precision + " after step " + std::to_string(step);
    if (options.compare_updates) {
      ExpectTensorsNear(Delta(gpu->Parameters(), initial), Delta(cpu->Parameters(), initial),
                        options.update_tolerance, what + " (updates)");
    } else {
      ExpectTensorsNear(gpu->Parameters(), cpu->Parameters(), options.update_tolerance,
                        what + " (parameters)");
    }
    ExpectTensorsNear(gpu->OptimizerState(), cpu->OptimizerState(), options.update_tolerance,
                      what + " (optimizer state)");
  }
  if (!options.evaluate_held_out) return;
  const Batch held_out = RandomBatch(config, config.max_batch, 999);
  absl::StatusOr<EvalResult> expected = cpu->Evaluate(held_out.View());
  absl::StatusOr<EvalResult> actual = gpu->Evaluate(held_out.View());
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_TRUE(actual.ok()) << actual.status();
  EXPECT_NEAR(actual->loss_sum, expected->loss_sum, options.loss_tolerance * expected->loss_sum)
      << precision << " evaluation of a held-out batch";
}

void ExpectCheckpointsMoveBetweenBackends(const NetworkConfig& config,
                                          const CheckpointOptions& options) {
  std::unique_ptr<Model> cpu = CpuNetwork(config);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(cpu && gpu);
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(cpu->TrainStep(RandomBatch(config, config.max_batch, 300 + step).View(),
                               options.learning_rate)
                    .ok());
  }
  const std::vector<NamedTensor> parameters = cpu->Parameters();
  const std::vector<NamedTensor> state = cpu->OptimizerState();
  ASSERT_TRUE(gpu->SetParameters(parameters).ok());
  absl::Status status = gpu->SetOptimizerState(state);
  ASSERT_TRUE(status.ok()) << status;
  ExpectTensorsNear(gpu->Parameters(), parameters, 0.0, "cpu checkpoint in cuda");
  ExpectTensorsNear(gpu->OptimizerState(), state, 0.0, "cpu optimizer state in cuda");

  std::unique_ptr<Model> back = CpuNetwork(config);
  ASSERT_TRUE(back);
  ASSERT_TRUE(back->SetParameters(gpu->Parameters()).ok());
  ASSERT_TRUE(back->SetOptimizerState(gpu->OptimizerState()).ok());
  ExpectTensorsNear(back->Parameters(), parameters, 0.0, "cuda checkpoint in cpu");

  const Batch next = RandomBatch(config, config.max_batch, 310);
  absl::StatusOr<StepResult> expected = cpu->TrainStep(next.View(), options.next_learning_rate);
  absl::StatusOr<StepResult> actual = gpu->TrainStep(next.View(), options.next_learning_rate);
  ASSERT_TRUE(expected.ok() && actual.ok()) << actual.status();
  EXPECT_NEAR(actual->loss, expected->loss, options.loss_tolerance * expected->loss);
  ExpectTensorsNear(gpu->Parameters(), cpu->Parameters(), options.update_tolerance,
                    "parameters after a step from the loaded checkpoint");
}

void ExpectResumeContinuesExactly(const NetworkConfig& config, const CheckpointOptions& options) {
  std::unique_ptr<Model> first = CudaNetwork(config);
  std::unique_ptr<Model> second = CudaNetwork(config);
  ASSERT_TRUE(first && second);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(first
                    ->TrainStep(RandomBatch(config, config.max_batch, 400 + step).View(),
                                options.learning_rate)
                    .ok());
  }
  ASSERT_TRUE(second->SetParameters(first->Parameters()).ok());
  ASSERT_TRUE(second->SetOptimizerState(first->OptimizerState()).ok());
  for (int step = 0; step < 2; ++step) {
    const Batch batch =
        RandomBatch(config, config.max_batch - options.batch_shrink * step, 410 + step);
    absl::StatusOr<StepResult> a = first->TrainStep(batch.View(), options.next_learning_rate);
    absl::StatusOr<StepResult> b = second->TrainStep(batch.View(), options.next_learning_rate);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status();
    // Same kernels on the same data; only atomic sums (the loss, the clipping norm) reorder.
    EXPECT_NEAR(a->loss, b->loss, 1e-6 * a->loss) << "step " << step;
  }
  ExpectTensorsNear(second->Parameters(), first->Parameters(), 1e-6, "resumed parameters");
  ExpectTensorsNear(second->OptimizerState(), first->OptimizerState(), 1e-6, "resumed state");
}

std::string PrecisionParamName(const ::testing::TestParamInfo<Precision>& info) {
  return std::string(PrecisionName(info.param));
}

}  // namespace stoker::cuda_testing
