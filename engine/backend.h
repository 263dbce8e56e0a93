// The training engine's contract: a Backend builds Models; a Model trains on uint8 batches straight
// from the ring buffer and keeps fp32 master weights whatever its compute precision.
#ifndef STOKER_ENGINE_BACKEND_H_
#define STOKER_ENGINE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stoker {

// Compute precision of forward and backward passes. Master weights, optimizer state and gradient
// accumulation are fp32 in every case.
enum class Precision { kFp32, kBf16, kFp16 };

// "fp32", "bf16", "fp16".
const char* PrecisionName(Precision precision);

enum class OptimizerType {
  kSgd,    // torch.optim.SGD: momentum, nesterov, L2 weight decay added to the gradient
  kAdamW,  // torch.optim.AdamW: decoupled weight decay, bias-corrected moments
};

// "sgd", "adamw".
const char* OptimizerTypeName(OptimizerType type);

struct OptimizerConfig {
  double learning_rate = 0.05;
  // SGD momentum (PyTorch semantics: v = mu * v + g; w -= lr * v). 0 = plain SGD.
  double momentum = 0.9;
  // SGD: L2 decay added to the gradients of Conv2d and Linear weights; AdamW: decoupled decay of
  // those weights, w -= lr * weight_decay * w before the Adam update. Biases and BatchNorm
  // parameters are never decayed (the usual parameter groups).
  double weight_decay = 0.0;
  OptimizerType type = OptimizerType::kSgd;
  // SGD only (PyTorch semantics: w -= lr * (g + mu * v) after v = mu * v + g); needs momentum > 0.
  bool nesterov = false;
  // AdamW only (PyTorch defaults).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // Gradients are scaled by min(1, clip_grad_norm / (global L2 norm + 1e-6)) before the update,
  // as torch.nn.utils.clip_grad_norm_. 0 = off.
  double clip_grad_norm = 0.0;
};

// Dynamic loss scaling for fp16 (torch.cuda.amp.GradScaler semantics): the loss is multiplied by
// `scale` before backward; a step whose gradients hold inf/NaN is skipped and the scale multiplied
// by backoff_factor; after growth_interval consecutive applied steps it is multiplied by
// growth_factor. Unused by fp32 and bf16 (their scale is 1).
struct LossScaleConfig {
  float initial = 65536.0f;
  int growth_interval = 2000;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
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
  // Input normalisation, done by the model on its own side, per channel: a sample's values are
  // `input_channels` equal blocks (an image's [C, H, W] planes, flattened), and value i, in
  // channel c = i / (input_features / input_channels), becomes pixel * input_scale[c] +
  // input_shift[c]. input_scale and input_shift hold one value per channel, or one for all.
  // The defaults map [0, 255] to [-1, 1] (torchvision's Normalize(0.5, 0.5) after ToTensor).
  int input_channels = 1;
  std::vector<float> input_scale = {1.0f / 127.5f};
  std::vector<float> input_shift = {-1.0f};
  LossScaleConfig loss_scale;
  // As NetworkConfig::label_smoothing, in [0, 1). Not 0: the MLP trains as a network
  // (MlpNeedsNetwork), whose loss smooths; the fast paths do not.
  float label_smoothing = 0;
};

// One layer of a NetworkConfig. Shapes follow PyTorch: activations [N, C, H, W] or [N, features].
struct LayerConfig {
  enum class Kind {
    kConv2d,  // out_channels, kernel (square), stride, padding; weight [out_c, in_c, k, k] + bias
    kMaxPool2d,  // kernel, stride (0 = kernel), padding (<= kernel / 2); PyTorch floor mode
    kLinear,     // units; weight [units, in_features] + bias; flattens a [C, H, W] input itself
    kRelu,
    kGelu,     // exact (erf) GELU, as torch.nn.GELU()
    kDropout,  // rate in [0, 1): inverted dropout in TrainStep only, identity in Evaluate
    kFlatten,  // [C, H, W] -> [C*H*W] in C, H, W order, as torch.nn.Flatten
    // torch.nn.BatchNorm2d on [C, H, W] (per channel) / BatchNorm1d on [features] (per feature):
    // TrainStep normalises by the batch's statistics (biased variance) and updates the running
    // ones (unbiased variance, `momentum`, `eps`); Evaluate uses the running ones. Parameters
    // "<prefix>.weight" (gamma, init 1) and "<prefix>.bias" (beta, init 0), [C]; buffers
    // "<prefix>.running_mean" (init 0), "<prefix>.running_var" (init 1), [C], and
    // "<prefix>.num_batches_tracked" [1]. Statistics and affine parameters stay fp32 in bf16/fp16.
    kBatchNorm2d,
    kBatchNorm1d,
    kAvgPool2d,      // kernel, stride (0 = kernel), padding (<= kernel / 2); as torch.nn.AvgPool2d
                     // (floor mode, count_include_pad=True)
    kGlobalAvgPool,  // [C, H, W] -> [C, 1, 1], as torch.nn.AdaptiveAvgPool2d(1)
    // activation(main(x) + shortcut(x)): `layers` is the main branch, `shortcut` the projection
    // (empty = identity); both must end in the same shape. Parameters of the branches are named
    // "<prefix>.layers.<j>.*" and "<prefix>.shortcut.<j>.*", as a torch module with two
    // nn.Sequential members `layers` and `shortcut` names them.
    kResidual,
  };
  // A residual block's activation after the sum.
  enum class Activation { kNone, kRelu, kGelu };
  Kind kind = Kind::kLinear;
  int out_channels = 0;
  int kernel = 0;
  int stride = 0;  // 0: 1 for Conv2d, kernel for MaxPool2d and AvgPool2d
  int padding = 0;
  int units = 0;
  float rate = 0;
  bool bias = true;                 // Conv2d, Linear: false = no bias parameter (torch bias=False)
  float momentum = 0.1f;            // BatchNorm: running-statistics momentum (PyTorch's default)
  float eps = 1e-5f;                // BatchNorm: added to the variance (PyTorch's default)
  std::vector<LayerConfig> layers;  // Residual: the main branch
  std::vector<LayerConfig> shortcut;          // Residual: the shortcut branch (empty = identity)
  Activation activation = Activation::kRelu;  // Residual
};

// "conv2d", "maxpool2d", "linear", "relu", "gelu", "dropout", "flatten": the names of the one
// layer table (engine/layer_kinds.h, which also parses them).
const char* LayerKindName(LayerConfig::Kind kind);

// A feed-forward network of `layers` ending in `classes` logits, trained with softmax
// cross-entropy. Parameters are named "layers.<i>.weight" / "layers.<i>.bias", i the index in
// `layers` (as torch.nn.Sequential names them). Optimizer state: "<param>.momentum" (SGD with
// momentum) or "<param>.exp_avg" and "<param>.exp_avg_sq" (AdamW), then "optimizer.step" [1]
// (optimizer steps applied), "train_step" [1] (TrainStep calls: seeds dropout) and, for fp16,
// "loss_scale" [2] (scale, consecutive finite steps).
struct NetworkConfig {
  // {C, H, W} for images, {features} for flat samples; product = values per sample.
  std::vector<int> input_shape = {1, 28, 28};
  std::vector<LayerConfig> layers;
  // The last layer's output must be flat with this many features.
  int classes = 10;
  int max_batch = 128;
  Precision precision = Precision::kFp32;
  // Seeds the initialisation (PyTorch's default for Conv2d and Linear: U(-1/sqrt(fan_in), +) for
  // weights and biases) and the dropout masks (with the step number).
  uint64_t seed = 1;
  OptimizerConfig optimizer;
  // Cross-entropy against (1 - label_smoothing) * one_hot + label_smoothing / classes, as
  // torch.nn.CrossEntropyLoss(label_smoothing=...); in [0, 1). Evaluate's loss uses the same.
  float label_smoothing = 0;
  // Input normalisation, per channel, as MlpConfig's. The channels are input_shape[0] for a
  // {C, H, W} input (input_channels is then 0 or C); a flat {features} input is input_channels
  // equal blocks (0 = 1), as an MLP's (NetworkFromMlp).
  int input_channels = 0;
  std::vector<float> input_scale = {1.0f / 127.5f};
  std::vector<float> input_shift = {-1.0f};
  LossScaleConfig loss_scale;
};

// The normalisation a model applies to uint8 samples, one value per channel: a sample is
// `channels` consecutive planes of `plane` values, and a value of plane c becomes
// pixel * scale[c] + shift[c] (computed in fp32, a multiply then an add, no FMA).
struct ChannelNormalization {
  int channels = 1;
  int64_t plane = 0;         // values per channel of one sample
  std::vector<float> scale;  // [channels]
  std::vector<float> shift;  // [channels]
};

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

// Data-parallel training: a model given a reducer (Model::SetGradientReducer) hands it its
// gradients between backward and the optimizer update, and updates with what comes back, so every
// rank takes the same step. Per step, the model
//   1. scales its batch-mean loss gradient by LocalShare() before backward (this rank's samples
//      over the global batch's: the ranks' gradients then sum to the global batch's mean),
//   2. calls GradientReady(i, ...) for each trained tensor once its gradient is final, in the
//      order backward finishes them (the same order, pointers and counts every step; i counts
//      0, 1, ... in that order), so a reducer may start summing early gradients while backward
//      still computes later ones,
//   3. calls Finish(): afterwards every buffer holds the sum over the ranks; the model then checks
//      finiteness (fp16), unscales, clips and updates as it would alone.
// Buffers are fp32 master gradients (fp16: still multiplied by the loss scale, which every rank
// keeps equal); a cuda model's are device pointers on its device whose final values the work it
// enqueued on its compute stream before the call writes: the reducer orders its reads after that
// stream, and when Finish returns its sums must be in place or ordered before that stream's later
// work (cuda_mlp.h and cuda_network.h expose the stream).
// From GradientReady until Finish returns the model neither reads nor writes a buffer it handed
// over. A step that fails before its first GradientReady (a bad batch, a
// LocalShare outside (0, 1]) leaves the reducer untouched; one that fails after it (a backend
// error) returns without calling Finish, leaving the reducer mid-step: the caller gives up the
// attempt, as after a collective's error. A reducer serves one model.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual float LocalShare() const = 0;
  virtual void GradientReady(int index, float* gradient, int64_t count) = 0;
  // An error (a peer gone, a timeout) fails the step: the model must not update.
  virtual absl::Status Finish() = 0;
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

  // Test hook: the next TrainStep adds `value` (e.g. +inf) to one element of the gradient after
  // the backward pass, as an overflow would. UNIMPLEMENTED where a model does not offer it.
  virtual absl::Status InjectGradientForTest(float value) {
    (void)value;
    return absl::UnimplementedError("this model has no gradient test hook");
  }
};

// How a network names its parameters (and with them its optimizer state, "<parameter>.momentum").
enum class ParameterNaming {
  // "layers.<i>.weight" / "layers.<i>.bias", i the layer's index in NetworkConfig::layers, as
  // torch.nn.Sequential names them.
  kByLayer,
  // "layers.<j>.weight" / "layers.<j>.bias", j counting only the layers with parameters: an MLP's
  // names (j-th Linear), whichever path trains it, so its checkpoints do not depend on the path.
  kMlp,
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "cuda".
  virtual std::string Name() const = 0;

  // An MLP model. The one place that picks an MLP's route: the backend's fast path
  // (CreateMlpFastPath), or, when MlpNeedsNetwork(config) and the backend builds networks
  // (BuildsNetworks), its general network for NetworkFromMlp(config) named ParameterNaming::kMlp.
  // INVALID_ARGUMENT for a bad config (ValidateMlpConfig); otherwise what the route returns
  // (UNIMPLEMENTED if the backend cannot run `config.precision`).
  absl::StatusOr<std::unique_ptr<Model>> CreateMlp(const MlpConfig& config);

  // A network of layers (NetworkConfig), its parameters named ParameterNaming::kByLayer.
  // INVALID_ARGUMENT naming the layer for a bad config ("layers[2] (conv2d): kernel 5 larger than
  // input 4x4"), UNIMPLEMENTED where the backend has no such path.
  absl::StatusOr<std::unique_ptr<Model>> CreateNetwork(const NetworkConfig& config) {
    return CreateNetworkModel(config, ParameterNaming::kByLayer);
  }

  // Memory a new model could still take, in bytes: the machine's available memory (within this
  // process's cgroup limit) for cpu, the device's free memory for cuda. UNIMPLEMENTED where the
  // backend cannot tell.
  virtual absl::StatusOr<int64_t> AvailableMemoryBytes() const {
    return absl::UnimplementedError(Name() + " backend cannot tell its free memory");
  }

 protected:
  // The two constructors a backend implements; CreateMlp and CreateNetwork choose between them.

  // The MLP fast path, for a config ValidateMlpConfig accepts. It must handle at least every
  // config for which MlpNeedsNetwork is false (and, where BuildsNetworks is false, every config).
  virtual absl::StatusOr<std::unique_ptr<Model>> CreateMlpFastPath(const MlpConfig& config) = 0;

  // The general network, its parameters named by `naming`. UNIMPLEMENTED by default.
  virtual absl::StatusOr<std::unique_ptr<Model>> CreateNetworkModel(const NetworkConfig& config,
                                                                    ParameterNaming naming) {
    (void)config;
    (void)naming;
    return absl::UnimplementedError(Name() + " backend does not build networks");
  }

  // False where CreateNetworkModel is UNIMPLEMENTED (a cuda build without cuDNN): CreateMlp then
  // takes the fast path for every MLP.
  virtual bool BuildsNetworks() const { return true; }
};

// The oneDNN backend. Never fails on a machine oneDNN supports.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend();

// ---- Helpers shared by backends (mlp_common.cc) ----

// INVALID_ARGUMENT, naming the field, unless: input_features > 0, 1 <= classes <= 256 (labels are
// uint8), every hidden width > 0, max_batch > 0, input_channels >= 1 dividing input_features,
// input_scale and input_shift of 1 or input_channels values each (every scale finite and != 0,
// every shift finite), and the optimizer and loss scale pass ValidateTrainingOptions
// (learning_rate >= 0, 0 <= momentum <= 1, weight_decay >= 0, ...).
absl::Status ValidateMlpConfig(const MlpConfig& config);

// The per-channel normalisation of a config that ValidateMlpConfig (ValidateNetworkConfig)
// accepts: input_scale and input_shift expanded to one value per channel.
ChannelNormalization InputNormalization(const MlpConfig& config);
ChannelNormalization InputNormalization(const NetworkConfig& config);

// The checks of input_channels, input_scale and input_shift that ValidateMlpConfig and
// ValidateNetworkConfig share, for a sample of `features` values in `channels` channels;
// `channels_name` names where the channel count came from ("input_channels", "input_shape[0]").
absl::Status ValidateInputNormalization(int64_t features, int channels,
                                        const std::string& channels_name,
                                        const std::vector<float>& scale,
                                        const std::vector<float>& shift);

// `scale` and `shift` (1 or `channels` values each) expanded to one value per channel, for a
// sample of `features` values; arguments that ValidateInputNormalization accepts.
ChannelNormalization ExpandNormalization(int64_t features, int channels,
                                         const std::vector<float>& scale,
                                         const std::vector<float>& shift);

// INVALID_ARGUMENT unless samples/labels are set, 1 <= count <= config.max_batch and every label is
// < config.classes.
absl::Status ValidateBatch(const MlpConfig& config, const BatchView& batch);

// INVALID_ARGUMENT unless the learning rate TrainStep got is finite and >= 0.
absl::Status ValidateLearningRate(double learning_rate);

// What TrainStep scales its batch-mean loss gradient by: 1 without a reducer, else the
// reducer's LocalShare(), which must be in (0, 1] for a rank with samples (INVALID_ARGUMENT).
absl::StatusOr<float> LocalGradientShare(const GradientReducer* reducer);

// The initial fp32 parameters for `config`, identical on every backend and platform for a given
// seed: "layers.<i>.weight" [out, in] then "layers.<i>.bias" [out] for each Linear i = 0, 1, ...,
// each drawn U(-1/sqrt(in), 1/sqrt(in)) from one std::mt19937_64(config.seed) in that order.
std::vector<NamedTensor> InitialMlpParameters(const MlpConfig& config);

// Multiply-adds x 2 of one sample's forward pass (the Linear layers only).
int64_t MlpForwardFlopsPerSample(const MlpConfig& config);

// True when an MLP needs the general network path: fp16, AdamW, Nesterov or gradient clipping.
// Each backend's MLP fast path does SGD with momentum in fp32 or bf16 only. Asked in one place,
// Backend::CreateMlp, so both backends route alike and an MLP's checkpoint holds the same tensors
// on either.
bool MlpNeedsNetwork(const MlpConfig& config);

// ---- Networks (network_common.cc) ----

// The activation shape after each layer: shapes[0] = input_shape, shapes[i + 1] = the output of
// layers[i] ({C, H, W} or {features}). INVALID_ARGUMENT naming the layer for a bad config (see
// ValidateNetworkConfig).
absl::StatusOr<std::vector<std::vector<int>>> NetworkShapes(const NetworkConfig& config);

// The output shape of one layer (a residual block: its sum) on input shape `in`; INVALID_ARGUMENT
// as NetworkShapes, the layer named "layer".
absl::StatusOr<std::vector<int>> LayerOutputShape(const LayerConfig& layer,
                                                  const std::vector<int>& in);

// Layers inside residual blocks are checked as top-level ones and named by their path:
// "layers[3].layers[1] (conv2d): kernel 5 larger than input 4x4"; a block needs a non-empty main
// branch whose output shape equals the shortcut's (the input's for an identity shortcut), and
// blocks nest at most 16 deep. BatchNorm2d needs [C, H, W], BatchNorm1d [features], momentum in
// [0, 1] and eps > 0; label_smoothing must be in [0, 1).
// INVALID_ARGUMENT, naming the layer or field, unless every layer fits its input (kernel no larger
// than the padded input, positive sizes, 0 <= rate < 1, Conv2d/MaxPool2d on [C, H, W] only), the
// output is flat with `classes` features, input_channels is 0 or input_shape[0] for a {C, H, W}
// input (0 or a divisor of the features for a flat one), input_scale and input_shift hold 1 or
// C values, and the rest is as ValidateMlpConfig asks, plus: AdamW
// betas in [0, 1), eps > 0, nesterov only with SGD momentum > 0, clip_grad_norm >= 0, and a sane
// LossScaleConfig (initial > 0, growth_interval >= 1, growth_factor > 1, 0 < backoff_factor < 1).
absl::Status ValidateNetworkConfig(const NetworkConfig& config);

// The optimizer and loss-scale checks of ValidateNetworkConfig (ValidateMlpConfig runs them too).
absl::Status ValidateTrainingOptions(const OptimizerConfig& optimizer,
                                     const LossScaleConfig& loss_scale);

// A Conv2d's, MaxPool2d's or AvgPool2d's stride: LayerConfig::stride, or its default when 0 (1
// for Conv2d, the kernel size for the pools, as in PyTorch).
int EffectiveStride(const LayerConfig& layer);

// The network optimizer state's scalar entries, as a checkpoint brings them back: "loss_scale"
// must hold {finite scale > 0, whole count >= 0}; a counter ("optimizer.step", "train_step") a
// whole, finite value >= 0. INVALID_ARGUMENT naming the entry otherwise.
absl::Status ValidateScalarState(const NamedTensor& entry);

// ValidateBatch for a network (count, pointers, labels < classes).
absl::Status ValidateBatch(const NetworkConfig& config, const BatchView& batch);

// The error both networks' TrainStep return for a training batch of `batch` samples that gives a
// BatchNorm (`kind`, its weight tensor named `weight_name`, input `shape` without the batch) one
// value per channel, as PyTorch refuses it: INVALID_ARGUMENT naming the module and the remedy.
absl::Status OneValuePerChannelError(LayerConfig::Kind kind, absl::string_view weight_name,
                                     int batch, const std::vector<int>& shape);

// The name every path gives a parameter: "layers.<index>.weight" or "layers.<index>.bias", the
// index as ParameterNaming says (MlpParameterIndex / the layer index). The MLP fast paths, both
// networks and the initial parameters all name through it.
std::string ParameterName(size_t index, bool weight);

// The index that names the parameters of layers[layer] under `naming`: `layer` itself
// (kByLayer), or the number of layers with parameters (Conv2d, Linear, BatchNorm) before it (kMlp:
// the MLP's Linear ordinal). Nested layers are named by their path (NetworkTensorSpecs).
size_t ParameterIndex(const NetworkConfig& config, size_t layer, ParameterNaming naming);

// What a tensor of a network's state is. BatchNorm's running statistics are buffers: they
// travel with the parameters (Model::Parameters() and SetParameters() list them, so a checkpoint
// saves and restores them and PyTorch's load_state_dict(strict=True) takes the same names), but
// they have no gradient, no optimizer state, no weight decay and no part in gradient clipping.
enum class NetworkTensorKind {
  kWeight,          // Conv2d / Linear weight: trained, weight-decayed
  kBias,            // Conv2d / Linear bias: trained, never decayed
  kNormWeight,      // BatchNorm gamma [C]: trained, never decayed
  kNormBias,        // BatchNorm beta [C]: trained, never decayed
  kRunningMean,     // BatchNorm buffer [C]
  kRunningVar,      // BatchNorm buffer [C]
  kBatchesTracked,  // BatchNorm buffer [1]: TrainStep calls that updated the statistics (a float)
};
bool IsTrainedTensor(NetworkTensorKind kind);  // weights, biases, BatchNorm gamma and beta
bool IsDecayedTensor(NetworkTensorKind kind);  // Conv2d and Linear weights only

struct NetworkTensorSpec {
  std::string name;  // "layers.3.layers.1.weight", "layers.4.running_mean", ...
  std::vector<int64_t> shape;
  NetworkTensorKind kind;
  int64_t fan_in = 0;  // Conv2d / Linear weight and bias: in_channels * k * k or in_features
};

// Every tensor Model::Parameters() lists, in that order: PyTorch's state_dict order for a module
// tree where top-level layer i is "layers.<ParameterIndex(i)>" and a residual block's branches
// are "<block>.layers.<j>" and "<block>.shortcut.<j>" (nested blocks recurse; a block's main
// branch comes before its shortcut). A Conv2d/Linear gives ".weight" then ".bias" (none when
// bias is false); a BatchNorm ".weight", ".bias", ".running_mean", ".running_var",
// ".num_batches_tracked". Empty for a config NetworkShapes refuses.
std::vector<NetworkTensorSpec> NetworkTensorSpecs(
    const NetworkConfig& config, ParameterNaming naming = ParameterNaming::kByLayer);

// The initial fp32 values of NetworkTensorSpecs(config, naming), in that order: each Conv2d or
// Linear weight then its bias drawn U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from one
// std::mt19937_64(config.seed), in that order (a bias-free layer draws no bias); BatchNorm
// weight 1, bias 0, running_mean 0, running_var 1, num_batches_tracked 0. Configs without the
// new layer kinds get the values they always had.
std::vector<NamedTensor> InitialNetworkParameters(
    const NetworkConfig& config, ParameterNaming naming = ParameterNaming::kByLayer);

// The MLP as a network: Linear(+ReLU) per hidden width, then Linear to the classes; same seed,
// optimizer, precision and input normalisation (a flat input of input_channels blocks). Its initial
// parameters equal InitialMlpParameters(mlp) value for value, and name for name under
// ParameterNaming::kMlp (by layer index, layers.0, layers.2, ..., under kByLayer).
NetworkConfig NetworkFromMlp(const MlpConfig& mlp);

// Multiply-adds x 2 of one sample's forward pass (Conv2d and Linear layers only, those inside
// residual blocks included); 0 for a bad config.
int64_t NetworkForwardFlopsPerSample(const NetworkConfig& config);

// A training run's memory, roughly as either backend allocates it: fp32 master weights, their
// gradients and optimizer state (1 slot for SGD with momentum, 2 for AdamW), a low-precision
// weight copy for bf16/fp16, and max_batch samples of every activation with its gradient and a
// low-precision copy. An estimate for refusing a model that cannot fit, not an exact figure.
struct TrainingFootprint {
  int64_t parameters = 0;
  int64_t activations_per_sample = 0;  // values of every layer's output, input included
  int64_t bytes = 0;
};

// The footprint of `config`; INVALID_ARGUMENT as NetworkShapes for a bad config.
absl::StatusOr<TrainingFootprint> EstimateTrainingFootprint(const NetworkConfig& config);

// OK when `footprint` fits in `available_bytes` (less a tenth kept for everything else);
// RESOURCE_EXHAUSTED naming both sizes, the parameter count and the batch size otherwise.
absl::Status CheckTrainingFits(const TrainingFootprint& footprint, int64_t available_bytes,
                               const std::string& where, int max_batch);

}  // namespace stoker

#endif  // STOKER_ENGINE_BACKEND_H_
