// The Model interface every backend's models implement: a training step on uint8 batches straight
// from the ring buffer, evaluation, and the state a checkpoint holds (fp32 master weights and
// optimizer state, whatever the compute precision). Backends are in backend.h.
#ifndef STOKER_ENGINE_MODEL_H_
#define STOKER_ENGINE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gradient_reducer.h"

namespace stoker {

// A batch as it sits in a ring slot: `count` samples of `input_features` uint8 values each,
// row-major, and one uint8 class label per sample.
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

// One compute kernel of a training step, timed alone (Model::TimeKernels).
struct KernelTime {
  std::string name;  // e.g. "node 3 conv2d backward_weights 0", "optimizer"
  double median_ms = 0;
};

class Model {
 public:
  virtual ~Model() = default;

  // One optimizer step on `batch` (count <= max_batch) with the given learning rate.
  // Returns INVALID_ARGUMENT for a bad batch (count out of range, label >= classes).
  virtual absl::StatusOr<StepResult> TrainStep(const BatchView& batch, double learning_rate) = 0;

  // Forward pass only; no state changes.
  virtual absl::StatusOr<EvalResult> Evaluate(const BatchView& batch) = 0;

  // Copies of the fp32 master weights, in layer order, with a network's BatchNorm buffers
  // (running_mean, running_var, num_batches_tracked) where PyTorch's state_dict puts them: a
  // checkpoint holds them, the optimizer never touches them.
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

  // The fewest samples TrainStep accepts: 2 for a network where a batch of 1 would give a
  // BatchNorm one value per channel (TrainStep refuses it, as PyTorch does), else 1. The training
  // loop drops a last batch smaller than this instead of failing the job after hours.
  virtual int MinTrainBatch() const { return 1; }

  // Data-parallel training: TrainStep passes its gradients through `reducer` (see
  // GradientReducer) before the update; null turns it off. The reducer must outlive its use.
  // UNIMPLEMENTED where a model cannot (then the job cannot run data-parallel on it).
  virtual absl::Status SetGradientReducer(GradientReducer* reducer) {
    (void)reducer;
    return absl::UnimplementedError("this model cannot train data-parallel");
  }
  // A data-parallel step to which this rank brings no samples (its slice of the global batch is
  // empty: the epoch's last, short batch, or every image of it was bad): zero gradients go
  // through the reducer with the other ranks', then the same update as theirs. Its loss is 0.
  // FAILED_PRECONDITION without a reducer.
  virtual absl::StatusOr<StepResult> TrainStepWithoutSamples(double learning_rate) {
    (void)learning_rate;
    return absl::UnimplementedError("this model cannot train data-parallel");
  }

  // A device model's CUDA stream (a cudaStream_t), on which its gradients are final when it hands
  // them to a reducer: a reducer summing them on the device orders its work after that stream.
  // Null for a host model.
  virtual void* device_stream() const { return nullptr; }

  // Benchmarks only: every compute kernel a training step at `batch` runs (each oneDNN primitive,
  // the backend's own kernels, the optimizer), each run alone `runs` times on the buffers the
  // last TrainStep at that batch left, warm; the median of each. What a step takes beyond their
  // sum is the framework's own overhead. Disturbs the optimizer state: time a model that is then
  // thrown away. UNIMPLEMENTED where a model does not offer it.
  virtual absl::StatusOr<std::vector<KernelTime>> TimeKernels(int batch, int runs) {
    (void)batch;
    (void)runs;
    return absl::UnimplementedError("this model cannot time its kernels");
  }

  // Test hook: the next TrainStep adds `value` (e.g. +inf) to one element of the gradient after
  // the backward pass, as an overflow would. UNIMPLEMENTED where a model does not offer it.
  virtual absl::Status InjectGradientForTest(float value) {
    (void)value;
    return absl::UnimplementedError("this model has no gradient test hook");
  }
};

}  // namespace stoker

#endif  // STOKER_ENGINE_MODEL_H_
