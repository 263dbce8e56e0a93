// The training engine's contract: a Backend builds Models; a Model trains on uint8 batches straight
// from the ring buffer and keeps fp32 master weights whatever its compute precision.
#ifndef STOKER_WORKER_ENGINE_BACKEND_H_
#define STOKER_WORKER_ENGINE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stoker {

// Compute precision of forward and backward passes. Master weights, optimizer state and gradient
// accumulation are fp32 in every case.
enum class Precision { kFp32, kBf16, kFp16 };

// "fp32", "bf16", "fp16".
const char* PrecisionName(Precision precision);

struct OptimizerConfig {
  double learning_rate = 0.05;
  // SGD momentum (PyTorch semantics: v = mu * v + g; w -= lr * v). 0 = plain SGD.
  double momentum = 0.9;
  // L2 decay added to weight gradients (not biases).
  double weight_decay = 0.0;
};

// A multi-layer perceptron: Linear(+ReLU) for each hidden width, then Linear to `classes` logits,
// trained with softmax cross-entropy.
struct MlpConfig {
  int input_features = 784;
  std::vector<int> hidden = {256, 128};
  int classes = 10;
  // Largest batch TrainStep/Evaluate will see; buffers are sized for it once.
  int max_batch = 128;
  Precision precision = Precision::kFp32;
  // Seeds the weight initialisation (PyTorch's nn.Linear default: U(-1/sqrt(fan_in), +)).
  uint64_t seed = 1;
  OptimizerConfig optimizer;
  // Input normalisation, done by the model on its own side: x = pixel * input_scale + input_shift.
  float input_scale = 1.0f / 127.5f;
  float input_shift = -1.0f;
};

// A batch as it sits in a ring slot: `count` samples of `input_features` uint8 values each, row-major,
// and one uint8 class label per sample.
struct BatchView {
  const uint8_t* samples = nullptr;
  const uint8_t* labels = nullptr;
  int count = 0;
  // Float32 features (NPY/CSV data), used instead of `samples` when set: taken as they are,
  // without the uint8 normalisation.
  const float* features = nullptr;
};

struct StepResult {
  // Mean cross-entropy over the batch (unscaled).
  float loss = 0;
  // True when the step was skipped because a gradient overflowed (fp16 loss scaling).
  bool skipped = false;
  // Loss scale in force after the step (1 when no loss scaling is used).
  float loss_scale = 1;
};

struct EvalResult {
  double loss_sum = 0;  // summed cross-entropy over the batch
  int64_t correct = 0;  // argmax(logits) == label
  int64_t count = 0;
};

// A named fp32 tensor, for checkpoints and tests.
struct NamedTensor {
  std::string name;  // e.g. "layers.0.weight" (shape [out, in]), "layers.0.bias" (shape [out])
  std::vector<int64_t> shape;
  std::vector<float> values;
};

class Model {
 public:
  virtual ~Model() = default;

  // One optimizer step on `batch` (count <= max_batch) with the given learning rate.
  // Returns INVALID_ARGUMENT for a bad batch (count out of range, label >= classes).
  virtual absl::StatusOr<StepResult> TrainStep(const BatchView& batch, double learning_rate) = 0;

  // Forward pass only; no state changes.
  virtual absl::StatusOr<EvalResult> Evaluate(const BatchView& batch) = 0;

  // Copies of the fp32 master weights, in layer order.
  virtual std::vector<NamedTensor> Parameters() const = 0;
  // Replaces the master weights; names and shapes must match Parameters().
  virtual absl::Status SetParameters(const std::vector<NamedTensor>& parameters) = 0;

  // Optimizer state (e.g. SGD momentum buffers, named "<parameter>.momentum"), for checkpoints:
  // together with Parameters() it makes a resumed run continue exactly.
  virtual std::vector<NamedTensor> OptimizerState() const { return {}; }
  // Replaces the optimizer state; names and shapes must match OptimizerState().
  virtual absl::Status SetOptimizerState(const std::vector<NamedTensor>& state) {
    return state.empty() ? absl::OkStatus()
                         : absl::UnimplementedError("this model keeps no optimizer state");
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "cuda".
  virtual std::string Name() const = 0;
  // UNIMPLEMENTED if the backend cannot run `config.precision`.
  virtual absl::StatusOr<std::unique_ptr<Model>> CreateMlp(const MlpConfig& config) = 0;
};

// The oneDNN backend. Never fails on a machine oneDNN supports.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend();

// ---- Helpers shared by backends (mlp_common.cc) ----

// INVALID_ARGUMENT, naming the field, unless: input_features > 0, 1 <= classes <= 256 (labels are
// uint8), every hidden width > 0, max_batch > 0, finite input_scale and input_shift,
// learning_rate >= 0, 0 <= momentum <= 1, weight_decay >= 0.
absl::Status ValidateMlpConfig(const MlpConfig& config);

// INVALID_ARGUMENT unless samples/labels are set, 1 <= count <= config.max_batch and every label is
// < config.classes.
absl::Status ValidateBatch(const MlpConfig& config, const BatchView& batch);

// The initial fp32 parameters for `config`, identical on every backend and platform for a given
// seed: "layers.<i>.weight" [out, in] then "layers.<i>.bias" [out] for each Linear i = 0, 1, ...,
// each drawn U(-1/sqrt(in), 1/sqrt(in)) from one std::mt19937_64(config.seed) in that order.
std::vector<NamedTensor> InitialMlpParameters(const MlpConfig& config);

// Multiply-adds x 2 of one sample's forward pass (the Linear layers only).
int64_t MlpForwardFlopsPerSample(const MlpConfig& config);

}  // namespace stoker

#endif  // STOKER_WORKER_ENGINE_BACKEND_H_
