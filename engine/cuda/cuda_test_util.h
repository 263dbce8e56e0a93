// Shared by the cuda backend's tests (cuda_conformance_test, cuda_network_test,
// cuda_vision_layers_test, comm's NCCL tests): random batches, model creation on both backends,
// comparison of named tensors within a tolerance, a network trained on both backends side by side,
// checkpoints across backends and resumption. Test only.
#ifndef STOKER_ENGINE_CUDA_CUDA_TEST_UTIL_H_
#define STOKER_ENGINE_CUDA_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_helpers.h"
#include "engine/cuda/cuda_backend.h"
#include "gtest/gtest.h"

// Skips the test on a machine without a CUDA device, or fails it, with the CUDA error, when
// STOKER_REQUIRE_CUDA=1 (tests/gpu/check.sh sets it: on a GPU machine a device the runtime cannot
// see must not turn every test into a pass).
#define SKIP_WITHOUT_DEVICE()                                                      \
  do {                                                                             \
    const ::absl::Status stoker_device_status_ = ::stoker::CudaDeviceStatus();     \
    if (!stoker_device_status_.ok()) {                                             \
      if (::stoker::cuda_testing::CudaRequired()) {                                \
        FAIL() << "STOKER_REQUIRE_CUDA=1 but " << stoker_device_status_.message(); \
      }                                                                            \
      GTEST_SKIP() << stoker_device_status_.message();                             \
    }                                                                              \
  } while (0)

// Skips the test in a build without cuDNN, where the cuda backend builds no networks.
#ifdef STOKER_HAVE_CUDNN
#define SKIP_WITHOUT_CUDNN()
#else
#define SKIP_WITHOUT_CUDNN() GTEST_SKIP() << "built without cuDNN"
#endif

namespace stoker::cuda_testing {

// True when the environment variable STOKER_REQUIRE_CUDA is set to anything but "" or "0".
bool CudaRequired();

// Device 0's compute capability as 10 * major + minor (90 for sm_90), or 0 without a device.
int DeviceComputeCapability();

// The model's CudaModelCounters (a test failure, and empty counters, for a non-cuda model).
CudaModelCounters Counters(const Model& model);

// A batch that owns its data: uint8 samples or float features, and labels.
struct Batch {
  std::vector<uint8_t> samples;
  std::vector<float> features;
  std::vector<uint8_t> labels;
  int count = 0;
  BatchView View() const;
};

// How RandomBatch draws uint8 pixels.
enum class Pixels {
  kAnyByte,  // [0, 255]
  kNonZero,  // [1, 255]: never an all-zero input
};

// `count` samples of `features` values and labels < `classes`, from `seed`: uint8 pixels, or with
// `float_features` float features in [-2, 2).
Batch RandomBatch(int count, int64_t features, int classes, uint64_t seed,
                  bool float_features = false, Pixels pixels = Pixels::kAnyByte);

// `count` samples of `config`'s input: uint8 pixels in [1, 255] (never an all-zero input), or float
// features in [-2, 2); labels < config.classes.
Batch RandomBatch(const NetworkConfig& config, int count, uint64_t seed,
                  bool float_features = false);

// `pixels`'s uint8 samples as the model should see them, as float features (labels kept):
// pixel * scale[c] + shift[c] in fp32, a multiply then an add, c the value's channel.
Batch Normalized(const Batch& pixels, const ChannelNormalization& norm);

// The cpu backend's models (the reference), or nullptr after a test failure.
std::unique_ptr<Model> CpuMlp(const MlpConfig& config);
std::unique_ptr<Model> CpuNetwork(const NetworkConfig& config);

// The cuda backend on device 0, or nullptr after a test failure.
std::unique_ptr<Backend> CudaBackend(const CudaBackendOptions& options = {});
// Its models, or nullptr after a test failure.
std::unique_ptr<Model> CudaMlp(const MlpConfig& config, const CudaBackendOptions& options = {});
std::unique_ptr<Model> CudaNetwork(const NetworkConfig& config);

// ||a - b|| / ||b||, the L2 relative error (||b|| floored to avoid 0/0 for all-zero tensors).
double RelativeError(const std::vector<float>& a, const std::vector<float>& b);

// Same names and shapes, and values within `tolerance` (L2 relative, per tensor; 0: equal).
void ExpectTensorsNear(const std::vector<NamedTensor>& actual,
                       const std::vector<NamedTensor>& expected, double tolerance,
                       const std::string& what);

// Parameter updates (after - before): comparing them, not the weights, keeps the small step from
// hiding a wrong gradient under the weights' own size.
std::vector<NamedTensor> Delta(const std::vector<NamedTensor>& after,
                               const std::vector<NamedTensor>& before);

// How ExpectTrainingTracksCpu compares.
struct TrackingOptions {
  int steps = 4;
  double learning_rate = 0.05;
  double loss_tolerance = 1e-4;    // relative, on each loss (and Evaluate's loss sum)
  double update_tolerance = 1e-4;  // L2 relative per tensor, updates and optimizer state
  // false: the parameters themselves are compared instead of their updates (AdamW's first steps
  // move every weight by about +-lr whatever the gradient's size, so the sign of a near-zero
  // 16-bit gradient decides a whole update, and updates are no fair measure there).
  bool compare_updates = true;
  // Then Evaluate both on a held-out full batch (BatchNorm: on the running statistics).
  bool evaluate_held_out = false;
};

// A cpu network (the reference) and a cuda network from `config` start equal (parameters and
// optimizer state, bit for bit) and take `steps` steps on the same batches (every third a partial
// one, odd steps float features): each step's loss, skip and loss scale, then every tensor's
// update (or value) and the optimizer state, must agree.
void ExpectTrainingTracksCpu(const NetworkConfig& config, const TrackingOptions& options);

// How ExpectCheckpointsMoveBetweenBackends and ExpectResumeContinuesExactly train.
struct CheckpointOptions {
  double learning_rate = 0.05;       // the steps before the checkpoint
  double next_learning_rate = 0.01;  // the steps after it
  double loss_tolerance = 1e-4;      // cpu against cuda: relative, on the next step's loss
  double update_tolerance = 1e-4;    // cpu against cuda: L2 relative per tensor, after that step
  int batch_shrink = 1;              // resumed step s takes max_batch - s * batch_shrink samples
};

// A cpu network trained two steps: its parameters and optimizer state load into a fresh cuda
// network and read back unchanged, and from there into a fresh cpu network; the next step on the
// cpu and the cuda network then agrees.
void ExpectCheckpointsMoveBetweenBackends(const NetworkConfig& config,
                                          const CheckpointOptions& options);

// A cuda network trained three steps, its parameters and optimizer state loaded into a fresh cuda
// network: the next two steps (the second on a smaller batch) give both the same losses,
// parameters and optimizer state (within 1e-6: only atomic sums reorder).
void ExpectResumeContinuesExactly(const NetworkConfig& config, const CheckpointOptions& options);

// For INSTANTIATE_TEST_SUITE_P over the precisions: all three, and each one's name.
inline auto AllPrecisions() {
  return ::testing::Values(Precision::kFp32, Precision::kBf16, Precision::kFp16);
}
std::string PrecisionParamName(const ::testing::TestParamInfo<Precision>& info);

}  // namespace stoker::cuda_testing

#endif  // STOKER_ENGINE_CUDA_CUDA_TEST_UTIL_H_
