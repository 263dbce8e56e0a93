// What a model is, as plain data: precision, optimizer, loss scaling, and the two model configs
// (an MLP; a network of layers, residual blocks included). The job spec translates a job file
// into these (spec/model_spec.h); every backend builds from them. No behaviour here: validation
// and shape inference are in model_shapes.h, the Model interface in model.h.
#ifndef STOKER_ENGINE_MODEL_CONFIG_H_
#define STOKER_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <vector>

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

// How a network names its parameters (and with them its optimizer state, "<parameter>.momentum").
enum class ParameterNaming {
  // "layers.<i>.weight" / "layers.<i>.bias", i the layer's index in NetworkConfig::layers, as
  // torch.nn.Sequential names them.
  kByLayer,
  // "layers.<j>.weight" / "layers.<j>.bias", j counting only the layers with parameters: an MLP's
  // names (j-th Linear), whichever path trains it, so its checkpoints do not depend on the path.
  kMlp,
};

}  // namespace stoker

#endif  // STOKER_ENGINE_MODEL_CONFIG_H_
