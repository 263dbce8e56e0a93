#include "engine/cuda/cuda_test_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

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

}  // namespace stoker::cuda_testing
