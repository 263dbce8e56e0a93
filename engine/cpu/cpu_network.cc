#include "engine/cpu/cpu_network.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <numeric>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "engine/bf16.h"
#include "engine/cpu/aligned_array.h"
#include "engine/cpu/cpu_kernels.h"
#include "engine/cpu/cpu_train_kernels.h"
#include "engine/layer_kinds.h"
#include "engine/plan_cache.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace stoker {
namespace {

using dnnl::memory;
using DataType = memory::data_type;
using Tag = memory::format_tag;
using Kind = LayerConfig::Kind;
using Dims = memory::dims;

// Plans kept besides the full-batch one; a new batch size beyond this evicts the oldest.
constexpr size_t kMaxPartialPlans = 3;

// Weight tensors up to this many values change layout by a Gather (its index: 4 bytes a value);
// larger ones by oneDNN's parallel, vectorised reorder, whose cost their size then repays. (At
// 1 << 20 the example CNN's 802,816-value first linear layer was gathered value by value: 18.5 %
// of its bf16 step; every ResNet-20 tensor is below 1 << 16.)
constexpr int64_t kMaxGatherValues = int64_t{1} << 16;

// bf16 convolutions with at most this many output pixels (7x7) compute their weight gradient in
// f32 when oneDNN's bf16 kernel for it is the AMX one (Node::f32_weight_grad).
constexpr int64_t kMaxF32WeightGradPixels = 49;

// Values in a plain (non-padded) descriptor of f32 or bf16.
int64_t Elements(const memory::desc& md) {
  return static_cast<int64_t>(md.get_size()) / (md.data_type() == DataType::bf16 ? 2 : 4);
}

// A change of a weight tensor's layout (and type) as a gather: to[j] = from[index[j]], 0 where
// index[j] < 0 (a blocked layout's zero padding). oneDNN's reorders did this before; each was a
// parallel region of its own for a few thousand values, ~60 of them a step for ResNet-20, and a
// parallel region costs milliseconds when the machine's other work delays a thread
// (docs/profile-vision.md). The gathers run in one region (weights) or on the calling thread.
struct Gather {
  const float* from = nullptr;
  void* to = nullptr;
  bool to_bf16 = false;
  std::vector<int32_t> index;
};

// Runs gather `g` over [begin, end) of its destination.
void RunGather(const Gather& g, int64_t begin, int64_t end) {
  const int32_t* index = g.index.data();
  if (g.to_bf16) {
    bf16_t* to = static_cast<bf16_t*>(g.to);
    for (int64_t j = begin; j < end; ++j) {
      to[j] = index[j] < 0 ? bf16_t{0} : FloatToBf16(g.from[index[j]]);
    }
  } else {
    float* to = static_cast<float*>(g.to);
    for (int64_t j = begin; j < end; ++j) to[j] = index[j] < 0 ? 0.0f : g.from[index[j]];
  }
}

// A primitive with its arguments bound once.
struct Op {
  dnnl::primitive primitive;
  std::unordered_map<int, memory> args;
};

// A tensor of Parameters(): a trained parameter (with its gradient and optimizer state) or a
// BatchNorm buffer (value only).
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  bool trained = true;
  bool decayed = false;  // Conv2d and Linear weights only
  AlignedArray<float> value;
  AlignedArray<float> grad;
  AlignedArray<float> state1;  // SGD momentum or AdamW exp_avg
  AlignedArray<float> state2;  // AdamW exp_avg_sq
};

// One activation of the flattened graph: 0 = the network input.
struct Activation {
  std::vector<int> shape;
  int origin = 0;           // the activation whose layout this one shares (ActivationMd)
  int value = 0;            // index in buffers_
  int grad = 0;             // index in buffers_: its gradient as the layers after it produce it
  bool needs_grad = false;  // depends on a trained parameter
};

// A step of the flattened network. Residual blocks open up into a kFork (its backward adds the
// shortcut's input gradient to the block input's), the main branch's nodes, the shortcut's, and a
// kAdd (out = activation(main + shortcut)). A network without residual blocks has one kLayer node
// per layer, in order, so node index = layer index (dropout masks hash it).
struct Node {
  enum class Type { kLayer, kFork, kAdd };
  Type type = Type::kLayer;
  LayerConfig config;  // kLayer: the layer; kAdd: the block (its activation); branches cleared
  int in = 0;          // kLayer: input; kAdd: the main branch's output; kFork: the block input
  int in2 = -1;        // kAdd: the shortcut's output (the block input for an identity shortcut)
  int out = -1;        // kLayer, kAdd
  int diff_src = -1;   // buffer backward writes the input gradient to (kFork: adds into)
  int diff_src2 = -1;  // kAdd: the shortcut output's gradient buffer (-1: identity)
  int extra = -1;      // kFork: the buffer added into diff_src (the shortcut's input gradient)
  int pre = -1;        // kAdd with GELU: the sum before the activation
  bool needs_input_grad = false;
  bool needs_input2_grad = false;  // kAdd
  // ReLU fused into a neighbour (FuseRelus): a BatchNorm before it applies it (`fuse_relu`, and
  // the BatchNorm's `out` is the ReLU's), or a MaxPool2d after it applies it to the pooled values
  // (`relu_after`: max and ReLU commute; its `in` and `diff_src` are the ReLU's). The ReLU node
  // itself (`fused_away`) then has no primitives.
  bool fused_away = false;
  bool fuse_relu = false;
  bool relu_after = false;
  int masked = -1;  // MaxPool2d with relu_after: the output gradient times ReLU'
  // MaxPool2d on NHWC with window = stride and no padding (every example CNN's): run by
  // cpu::MaxPoolForward/Backward, with the argmax positions in `workspace` (OwnMaxPool).
  bool own_pool = false;
  int stride = 1;
  int weight = -1;  // index in params_, Conv2d and Linear only
  int bias = -1;    // -1 also for bias: false
  int norm = -1;    // BatchNorm: index of its weight; bias, running_mean, running_var and
                    // num_batches_tracked follow
  // Conv2d / Linear: the layouts oneDNN chose at the full batch (partial plans reuse them).
  memory::desc weight_plain_md;  // f32, PyTorch's layout
  memory::desc weight_fwd_md;    // compute type
  memory::desc weight_bwd_md;    // compute type, for backward data
  memory::desc diff_weight_md;   // f32
  // Where backward's blocked weight gradient becomes the plain one (grad_gathers_ or, for a large
  // tensor, grad_reorders_); both -1 when backward writes the plain one.
  int grad_gather = -1;
  int grad_reorder = -1;
  // bf16 Conv2d: its weight gradient from f32 copies of the input and the output gradient, with
  // oneDNN's f32 kernel. On AMX, oneDNN 2.6's bf16 weight-gradient kernel is slower than the f32
  // one for small images (ResNet-20's 7x7 stage: 3.7-3.9 against 2.3-2.6 ms a call); chosen at the
  // full batch (PlanConv2d) for outputs of at most kMaxF32WeightGradPixels.
  bool f32_weight_grad = false;
  AlignedArray<std::byte> f32_src, f32_diff_dst;
  AlignedArray<std::byte> weight_fwd;
  AlignedArray<std::byte> weight_bwd;
  AlignedArray<std::byte> diff_weight;  // empty when backward writes the plain gradient directly
  AlignedArray<std::byte> workspace;    // MaxPool2d; BatchNorm with fuse_relu (ReLU's mask)
  AlignedArray<uint8_t> keep;           // Dropout mask
  AlignedArray<float> mean, variance;   // BatchNorm: the last training batch's statistics
  // bf16 BatchNorm that oneDNN has no jit kernel for (channels not a multiple of 16): it runs in
  // f32 on copies (PlanBatchNorm). `norm_src` keeps the forward input for backward; `norm_dst`
  // holds the forward output, then the output gradient; `norm_diff_src` the input gradient.
  AlignedArray<float> norm_src, norm_dst, norm_diff_src;
};

struct NodeOps {
  std::vector<Op> forward;           // training (and evaluation when `eval` is empty)
  std::vector<Op> eval;              // BatchNorm: normalise by the running statistics
  std::vector<Op> backward_weights;  // always run (BatchNorm's also gives the input gradient)
  std::vector<Op> backward_data;     // run when the input gradient is needed
};

struct Plan {
  int batch = 0;
  std::vector<memory::desc> value_md;  // per activation
  std::vector<memory::desc> grad_md;
  std::vector<NodeOps> ops;  // per node
  std::vector<Op> input;     // a multi-channel image input: its NCHW batch into NHWC
  AlignedArray<std::byte> scratchpad;
};

// One node's view of a plan being built: its activations' descriptors and buffers at the plan's
// batch size.
struct LayerIo {
  size_t index = 0;   // node index
  bool full = false;  // the full-batch plan, which fixes the layouts later plans reuse
  memory::desc src, dst, diff_src, diff_dst;
  void* src_ptr = nullptr;
  void* dst_ptr = nullptr;
  void* diff_src_ptr = nullptr;
  void* diff_dst_ptr = nullptr;
};

// A primitive waiting for its arguments: bound once every node is described, so one scratchpad
// sized for the largest can be shared (the primitives run in turn).
struct PendingOp {
  dnnl::primitive primitive;
  memory::desc scratchpad;
  std::unordered_map<int, std::pair<memory::desc, void*>> args;
  std::vector<Op>* slot;
};

// `buffer` when it holds a copy, else `fallback` (the primitive reads the master directly).
void* Bind(AlignedArray<std::byte>& buffer, void* fallback) {
  return buffer.size() > 0 ? static_cast<void*>(buffer.data()) : fallback;
}

bool IsBatchNorm(Kind kind) { return kind == Kind::kBatchNorm2d || kind == Kind::kBatchNorm1d; }

// An NHWC activation of 16 channels described as nChw16c: the same bytes at the same offsets.
memory::desc SixteenChannelView(const memory::desc& nhwc) {
  return memory::desc(nhwc.dims(), nhwc.data_type(), Tag::aBcd16b);
}

// How a primitive sees an activation: `view` where one was chosen (not zero), else `md` itself.
const memory::desc& ViewOr(const memory::desc& view, const memory::desc& md) {
  return view.is_zero() ? md : view;
}

// Layers whose output keeps their input's memory layout.
bool KeepsLayout(Kind kind) {
  return kind == Kind::kFlatten || kind == Kind::kRelu || kind == Kind::kGelu ||
         kind == Kind::kDropout || IsBatchNorm(kind);
}

class CpuNetwork final : public Model {
 public:
  CpuNetwork(const NetworkConfig& config, ParameterNaming naming);

  // Builds the full-batch plan and the weight reorders, and loads the initial weights.
  absl::Status Init();

  absl::StatusOr<StepResult> TrainStep(const BatchView& batch, double learning_rate) override;
  absl::StatusOr<EvalResult> Evaluate(const BatchView& batch) override;
  std::vector<NamedTensor> Parameters() const override;
  absl::Status SetParameters(const std::vector<NamedTensor>& parameters) override;
  std::vector<NamedTensor> OptimizerState() const override;
  absl::Status SetOptimizerState(const std::vector<NamedTensor>& state) override;
  absl::Status InjectGradientForTest(float value) override {
    injected_gradient_ = value;
    return absl::OkStatus();
  }
  absl::Status SetGradientReducer(GradientReducer* reducer) override {
    reducer_ = reducer;
    return absl::OkStatus();
  }
  absl::StatusOr<StepResult> TrainStepWithoutSamples(double learning_rate) override;
  int MinTrainBatch() const override { return CheckBatchNormValues(1).ok() ? 1 : 2; }

 private:
  bool bf16() const { return config_.precision == Precision::kBf16; }
  bool fp16() const { return config_.precision == Precision::kFp16; }
  DataType ComputeType() const { return bf16() ? DataType::bf16 : DataType::f32; }
  bool adamw() const { return config_.optimizer.type == OptimizerType::kAdamW; }

  // Graph construction (constructor): a new activation with its own buffers, a branch of layers
  // and one layer (`diff_src`: where its input gradient goes), in NetworkTensorSpecs' order.
  int NewBuffer();
  int NewActivation(std::vector<int> shape, int origin);
  int AddBranch(const std::vector<LayerConfig>& layers, int in, int first_diff_src);
  int AddLayer(const LayerConfig& config, int in, int diff_src);
  // Folds each ReLU that directly follows a BatchNorm into it (oneDNN's fuse_norm_relu: one pass
  // less each way, the mask kept as a bit workspace), else each ReLU directly followed by a
  // MaxPool2d into the pool (relu(maxpool(x)) = maxpool(relu(x)) exactly, with the same argmax
  // wherever the gradient is not zero): the ReLU then runs on a quarter of the values, as a
  // post-op forward and on the pooled gradient backward. fp16 keeps BatchNorm's ReLU apart: the
  // mask must come from the output rounded to fp16, as PyTorch's would.
  void FuseRelus();
  // Whether oneDNN has a jit kernel for BatchNorm `node` with a fused ReLU in training. It has
  // none for channels that are not a multiple of 16 (its generic loop instead, many times slower
  // than BatchNorm and ReLU apart).
  bool FusedNormReluIsJit(const Node& node) const;

  memory::desc ActivationMd(size_t index, int batch, DataType type) const;
  // The primitives of every node at `batch`, bound to this model's buffers. BuildPlan dispatches
  // on the layer kind; the Plan* functions below each add one kind's primitives to `pending`.
  absl::StatusOr<std::unique_ptr<Plan>> BuildPlan(int batch);
  struct WeightedPrimitives {
    dnnl::primitive forward, backward_data, backward_weights;
    memory::desc forward_scratch, data_scratch, weights_scratch;
    memory::desc bias;
    // bf16 Conv2d whose weight gradient runs in f32 (Node::f32_weight_grad): the f32 copies of
    // its input and output gradient that backward_weights reads.
    memory::desc f32_src, f32_diff_dst;
    // Where not zero: how the forward (src, dst) and the weight gradient (src, diff_dst) see their
    // NHWC activations instead (SixteenChannelView).
    memory::desc forward_src, forward_dst, weights_src, weights_diff_dst;
  };
  struct WeightDescs {
    memory::desc any_weights, any_diff_weights, bias;
  };
  using Layer = Node;
  WeightDescs DescribeWeights(Layer& layer, const LayerIo& io) const;
  WeightedPrimitives PlanConv2d(Layer& layer, const LayerIo& io, const dnnl::primitive_attr& attr);
  WeightedPrimitives PlanLinear(Layer& layer, const LayerIo& io, const dnnl::primitive_attr& attr);
  void PlanWeightedLayer(Layer& layer, const LayerIo& io, const WeightedPrimitives& primitives,
                         Plan& plan, std::vector<PendingOp>& pending);
  // ReLU and GELU.
  void PlanEltwise(const Layer& layer, const LayerIo& io, const dnnl::primitive_attr& attr,
                   Plan& plan, std::vector<PendingOp>& pending);
  // MaxPool2d, AvgPool2d and GlobalAvgPool. INTERNAL if a partial batch would need a larger
  // workspace than the full batch allocated.
  absl::Status PlanPool(Layer& layer, const LayerIo& io, const dnnl::primitive_attr& attr,
                        Plan& plan, std::vector<PendingOp>& pending);
  void PlanBatchNorm(Layer& layer, const LayerIo& io, int batch, const dnnl::primitive_attr& attr,
                     Plan& plan, std::vector<PendingOp>& pending);
  void PlanAdd(const Node& node, int batch, const dnnl::primitive_attr& attr, Plan& plan,
               std::vector<PendingOp>& pending);
  void PlanFork(const Node& node, size_t index, const dnnl::primitive_attr& attr, Plan& plan,
                std::vector<PendingOp>& pending);
  void BindPlan(Plan& plan, std::vector<PendingOp>& pending);
  absl::StatusOr<Plan*> PlanFor(int batch);
  void BuildWeightReorders();
  // For each value of the `blocked` layout (in memory order), the index in the `plain` layout
  // (same dimensions) of the value it holds; -1 for padding.
  std::vector<int32_t> BlockedIndex(const memory::desc& plain, const memory::desc& blocked);
  void RefreshComputeWeights();
  // The batch into the input activation (normalised, in the compute type), through
  // input_planar_ and the plan's reorder when InputIsPlanar().
  void LoadInput(const Plan& plan, const BatchView& batch);
  // A multi-channel image input: its samples are C, H, W planes, the activation is NHWC.
  bool InputIsPlanar() const {
    return config_.input_shape.size() == 3 && config_.input_shape[0] > 1;
  }
  // INVALID_ARGUMENT naming the first BatchNorm that would see one value per channel in a
  // training batch of `batch` samples (PyTorch refuses it; the variance would be 0/0 unbiased).
  absl::Status CheckBatchNormValues(int batch) const;
  // Forward through every node; dropout and batch statistics only when training. Returns the f32
  // logits.
  const float* Forward(Plan& plan, bool training);
  // BatchNorm's running statistics from the batch statistics Forward(training) kept: once the
  // step cannot fail any more.
  void UpdateRunningStatistics(int batch);
  void UpdateRunningStatistics(const Node& node, int batch);
  // Backward through every node; with a reducer, each node's trained gradients go to it as soon as
  // they are final (HandOverGradients).
  void Backward(Plan& plan);
  // Forward or backward of a MaxPool2d with own_pool, at the plan's batch size.
  void OwnMaxPool(size_t index, const Plan& plan, bool forward);
  // Passes the trained gradients of `node` (one with parameters) to the reducer, in reverse
  // Parameters() order (bias before weight), as GradientReady(next_index++, ...); the test hook's
  // value is added to params_[0] before it goes.
  void HandOverGradients(const Node& node, int& next_index);
  // params_[0].grad[0] += the injected value, once.
  void ApplyInjectedGradient();
  // After the gradients are final (and summed over the ranks): the step is counted, then the fp16
  // finiteness check and unscale, clipping and the optimizer, and the loss-scale growth.
  StepResult FinishStep(double learning_rate, StepResult result);
  void Execute(const Op& op) { op.primitive.execute(stream_, op.args); }
  void ExecuteAll(const std::vector<Op>& ops) {
    for (const Op& op : ops) Execute(op);
  }
  void RoundFp16(int buffer, const memory::desc& md) {
    if (fp16()) cpu::RoundToFp16InPlace(reinterpret_cast<float*>(Buffer(buffer)), Elements(md));
  }
  // Gradient norm clipping, then the optimizer on every trained parameter.
  void ApplyOptimizer(float learning_rate);
  // Softmax cross-entropy with label smoothing; `grad` as cpu::SoftmaxCrossEntropy's.
  double Loss(const float* logits, const uint8_t* labels, int rows, float* grad,
              int64_t* correct) const;

  std::byte* Buffer(int index) { return buffers_[index].data(); }
  std::byte* Value(int activation) { return Buffer(activations_[activation].value); }
  std::byte* Grad(int activation) { return Buffer(activations_[activation].grad); }

  std::vector<std::pair<std::string, std::vector<float>>> ScalarState() const;

  const NetworkConfig config_;
  const ChannelNormalization normalization_;  // of uint8 samples, per channel
  const ParameterNaming naming_;
  // NHWC: oneDNN 2.6 runs NCHW convolutions as im2col + GEMM here; with NHWC it picks its
  // direct/brgemm kernels, 2.3x faster for bf16 and 1.5x for fp32 on the Fashion-MNIST CNN.
  const Tag activation_tag_ = Tag::nhwc;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<Node> nodes_;
  std::vector<Activation> activations_;
  int output_ = 0;  // the logits' activation
  std::vector<AlignedArray<std::byte>> buffers_;
  std::vector<Param> params_;
  size_t next_param_ = 0;          // construction: the next NetworkTensorSpecs entry
  AlignedArray<float> logits_;     // [max_batch, classes] when the last activation is not f32
  AlignedArray<float> loss_grad_;  // [max_batch, classes]
  AlignedArray<std::byte> input_planar_;  // InputIsPlanar(): the batch as NCHW
  // Master -> compute copies, after every update; oneDNN's diff weights -> plain gradients, in
  // backward. Gathers for tensors of at most kMaxGatherValues, reorders for larger ones.
  std::vector<Gather> weight_gathers_;
  std::vector<Op> weight_reorders_;
  std::vector<Gather> grad_gathers_;
  std::vector<Op> grad_reorders_;
  std::unique_ptr<Plan> full_plan_;
  PartialPlanCache<Plan> partial_plans_{kMaxPartialPlans};

  int64_t optimizer_steps_ = 0;  // applied updates (AdamW's bias-correction step)
  int64_t train_steps_ = 0;      // TrainStep calls that ran (dropout's mask stream)
  float loss_scale_ = 1;
  int64_t growth_tracker_ = 0;  // consecutive finite steps since the last scale change
  std::optional<float> injected_gradient_;
  GradientReducer* reducer_ = nullptr;  // data-parallel training: not owned; null when alone
};

CpuNetwork::CpuNetwork(const NetworkConfig& config, ParameterNaming naming)
    : config_(config),
      normalization_(InputNormalization(config)),
      naming_(naming),
      engine_(dnnl::engine::kind::cpu, 0),
      stream_(engine_),
      loss_scale_(config.precision == Precision::kFp16 ? config.loss_scale.initial : 1.0f) {
  // Parameters and buffers, named and ordered as NetworkTensorSpecs lists them.
  for (const NetworkTensorSpec& spec : NetworkTensorSpecs(config, naming)) {
    Param param;
    param.name = spec.name;
    param.shape = spec.shape;
    param.trained = IsTrainedTensor(spec.kind);
    param.decayed = IsDecayedTensor(spec.kind);
    int64_t size = 1;
    for (int64_t d : spec.shape) size *= d;
    param.value = AlignedArray<float>(size);
    if (param.trained) {
      param.grad = AlignedArray<float>(size);
      param.state1 = AlignedArray<float>(size);
      if (adamw()) param.state2 = AlignedArray<float>(size);
    }
    params_.push_back(std::move(param));
  }
  const int input = NewActivation(config.input_shape, 0);
  output_ = AddBranch(config.layers, input, activations_[input].grad);
  FuseRelus();
  const size_t logits = static_cast<size_t>(config.max_batch) * config.classes;
  loss_grad_ = AlignedArray<float>(logits);
  logits_ = AlignedArray<float>(logits);
}

void CpuNetwork::FuseRelus() {
  for (size_t i = 0; i + 1 < nodes_.size(); ++i) {
    Node& node = nodes_[i];
    Node& next = nodes_[i + 1];
    if (node.type != Node::Type::kLayer || next.type != Node::Type::kLayer || node.fused_away ||
        next.in != node.out) {
      continue;
    }
    if (IsBatchNorm(node.config.kind) && next.config.kind == Kind::kRelu && !fp16() &&
        FusedNormReluIsJit(node)) {
      node.fuse_relu = true;
      node.out = next.out;
      next.fused_away = true;
    } else if (node.config.kind == Kind::kRelu && next.config.kind == Kind::kMaxPool2d) {
      node.fused_away = true;
      next.relu_after = true;
      next.in = node.in;
      next.diff_src = node.diff_src;
      // oneDNN's pooling backward reads the masked gradient from a buffer; the own pool masks
      // on the fly.
      if (!next.own_pool) next.masked = NewBuffer();
    }
  }
}

bool CpuNetwork::FusedNormReluIsJit(const Node& node) const {
  const std::vector<int>& shape = activations_[node.in].shape;
  const memory::dim channels = shape[0];
  const memory::dim height = shape.size() == 3 ? shape[1] : 1;
  const memory::dim width = shape.size() == 3 ? shape[2] : 1;
  const memory::desc data({config_.max_batch, channels, height, width}, ComputeType(), Tag::nhwc);
  try {
    dnnl::batch_normalization_forward::primitive_desc fwd(
        dnnl::batch_normalization_forward::desc(
            dnnl::prop_kind::forward_training, data, node.config.eps,
            dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift |
                dnnl::normalization_flags::fuse_norm_relu),
        engine_);
    return std::string(fwd.impl_info_str()).find("jit") != std::string::npos;
  } catch (const dnnl::error&) {
    return false;
  }
}

int CpuNetwork::NewBuffer() {
  buffers_.emplace_back();
  return static_cast<int>(buffers_.size()) - 1;
}

int CpuNetwork::NewActivation(std::vector<int> shape, int origin) {
  Activation activation;
  activation.shape = std::move(shape);
  activation.origin = origin < 0 ? static_cast<int>(activations_.size()) : origin;
  activation.value = NewBuffer();
  activation.grad = NewBuffer();
  activations_.push_back(std::move(activation));
  return static_cast<int>(activations_.size()) - 1;
}

int CpuNetwork::AddBranch(const std::vector<LayerConfig>& layers, int in, int first_diff_src) {
  for (size_t j = 0; j < layers.size(); ++j) {
    in = AddLayer(layers[j], in, j == 0 ? first_diff_src : activations_[in].grad);
  }
  return in;
}

int CpuNetwork::AddLayer(const LayerConfig& config, int in, int diff_src) {
  const bool in_needs_grad = activations_[in].needs_grad;
  if (config.kind == Kind::kResidual) {
    Node fork;
    fork.type = Node::Type::kFork;
    fork.in = in;
    fork.diff_src = diff_src;
    fork.needs_input_grad = in_needs_grad;
    const size_t fork_index = nodes_.size();
    nodes_.push_back(std::move(fork));
    const int main = AddBranch(config.layers, in, diff_src);
    int shortcut = in;
    int extra = activations_[main].grad;  // identity: the sum's gradient itself
    if (!config.shortcut.empty()) {
      extra = NewBuffer();
      shortcut = AddBranch(config.shortcut, in, extra);
    }
    nodes_[fork_index].extra = extra;
    Node add;
    add.type = Node::Type::kAdd;
    add.config = config;
    add.config.layers.clear();
    add.config.shortcut.clear();
    add.in = main;
    add.in2 = shortcut;
    add.diff_src = activations_[main].grad;
    add.needs_input_grad = activations_[main].needs_grad || activations_[shortcut].needs_grad;
    if (!config.shortcut.empty()) {
      add.diff_src2 = activations_[shortcut].grad;
      add.needs_input2_grad = activations_[shortcut].needs_grad;
    }
    if (config.activation == LayerConfig::Activation::kGelu) add.pre = NewBuffer();
    add.out = NewActivation(activations_[main].shape, activations_[main].origin);
    activations_[add.out].needs_grad = add.needs_input_grad;
    const int out = add.out;
    nodes_.push_back(std::move(add));
    return out;
  }
  Node node;
  node.config = config;
  node.in = in;
  node.diff_src = diff_src;
  node.needs_input_grad = in_needs_grad;
  node.stride = EffectiveStride(config);
  // oneDNN 2.6's pooling ran at 6.5 GB/s here, forward and backward, where a plain loop over the
  // channels streams at 2-3x that (docs/decisions.md): the common max pool (on NHWC, as every
  // image activation is) is Stoker's own.
  node.own_pool = config.kind == Kind::kMaxPool2d && config.kernel == node.stride &&
                  config.padding == 0 && config.kernel <= 15;
  bool has_parameters = false;
  if (config.kind == Kind::kConv2d || config.kind == Kind::kLinear) {
    node.weight = static_cast<int>(next_param_++);
    if (config.bias) node.bias = static_cast<int>(next_param_++);
    has_parameters = true;
  } else if (IsBatchNorm(config.kind)) {
    node.norm = static_cast<int>(next_param_);
    next_param_ += 5;
    has_parameters = true;
    const int channels = activations_[in].shape[0];
    node.mean = AlignedArray<float>(channels);
    node.variance = AlignedArray<float>(channels);
  }
  std::vector<int> shape = *LayerOutputShape(config, activations_[in].shape);
  if (config.kind == Kind::kFlatten) {
    Activation alias;
    alias.shape = std::move(shape);
    alias.origin = activations_[in].origin;
    alias.value = activations_[in].value;
    alias.grad = diff_src;
    activations_.push_back(std::move(alias));
    node.out = static_cast<int>(activations_.size()) - 1;
  } else {
    node.out =
        NewActivation(std::move(shape), KeepsLayout(config.kind) ? activations_[in].origin : -1);
  }
  activations_[node.out].needs_grad = in_needs_grad || has_parameters;
  if (config.kind == Kind::kDropout) {
    int64_t size = config_.max_batch;
    for (int d : activations_[in].shape) size *= d;
    node.keep = AlignedArray<uint8_t>(size);
  }
  const int out = node.out;
  nodes_.push_back(std::move(node));
  return out;
}

memory::desc CpuNetwork::ActivationMd(size_t index, int batch, DataType type) const {
  // Laid out as its origin (oneDNN's elementwise and normalisation primitives write in their
  // source's layout, and Flatten is an alias): NHWC for images a layer made, the caller's NCHW for
  // the network input. A Linear reads a [N, C, H, W] input with [out, C, H, W] weights, which is
  // PyTorch's flattened order.
  const int origin = activations_[index].origin;
  const std::vector<int>& shape = activations_[origin].shape;
  if (shape.size() == 3) {
    // The input too: it arrives as C, H, W per sample, and a multi-channel one is reordered
    // (InputIsPlanar). Read as NCHW, a 3-channel input made oneDNN 2.6 pick its reference
    // convolution for the first layer: ResNet-20 on 3x32x32 bf16 took 2.4 s a step, 77 % of it in
    // that one convolution.
    return memory::desc({batch, shape[0], shape[1], shape[2]}, type, activation_tag_);
  }
  return memory::desc({batch, shape[0]}, type, Tag::nc);
}

absl::Status CpuNetwork::Init() {
  absl::StatusOr<std::unique_ptr<Plan>> plan = BuildPlan(config_.max_batch);
  if (!plan.ok()) return plan.status();
  full_plan_ = *std::move(plan);
  // Buffers, sized by the full plan's descriptors (aliases take the largest).
  std::vector<size_t> bytes(buffers_.size(), 0);
  auto need = [&](int buffer, size_t size) {
    if (buffer >= 0) bytes[buffer] = std::max(bytes[buffer], size);
  };
  for (size_t t = 0; t < activations_.size(); ++t) {
    need(activations_[t].value, full_plan_->value_md[t].get_size());
    need(activations_[t].grad, full_plan_->grad_md[t].get_size());
  }
  for (const Node& node : nodes_) {
    if (node.type == Node::Type::kFork) {
      need(node.extra, full_plan_->grad_md[node.in].get_size());
    } else if (node.type == Node::Type::kAdd) {
      need(node.pre, full_plan_->value_md[node.out].get_size());
    } else {
      need(node.diff_src, full_plan_->grad_md[node.in].get_size());
      need(node.masked, full_plan_->grad_md[node.out].get_size());
    }
  }
  for (size_t b = 0; b < buffers_.size(); ++b) buffers_[b] = AlignedArray<std::byte>(bytes[b]);
  if (InputIsPlanar()) input_planar_ = AlignedArray<std::byte>(bytes[activations_[0].value]);
  try {
    BuildWeightReorders();
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN could not build the weight reorders: ", e.what()));
  }
  // Plans bind pointers: rebuild the full plan now that every buffer exists.
  plan = BuildPlan(config_.max_batch);
  if (!plan.ok()) return plan.status();
  full_plan_ = *std::move(plan);
  return SetParameters(InitialNetworkParameters(config_, naming_));
}

absl::StatusOr<std::unique_ptr<Plan>> CpuNetwork::BuildPlan(int batch) {
  auto plan = std::make_unique<Plan>();
  plan->batch = batch;
  const bool full = batch == config_.max_batch && full_plan_ == nullptr;
  const DataType compute = ComputeType();
  // Logits straight from a final Linear are f32; every other activation is in the compute type.
  const bool f32_logits =
      nodes_.back().type == Node::Type::kLayer && nodes_.back().config.kind == Kind::kLinear;
  for (size_t t = 0; t < activations_.size(); ++t) {
    const bool f32 = f32_logits && static_cast<int>(t) == output_;
    plan->value_md.push_back(ActivationMd(t, batch, f32 ? DataType::f32 : compute));
    plan->grad_md.push_back(ActivationMd(t, batch, compute));
  }
  plan->ops.resize(nodes_.size());
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // Descriptors first, so one scratchpad sized for the largest can be shared (they run in turn).
  std::vector<PendingOp> pending;
  if (InputIsPlanar()) {
    const memory::desc& input = plan->value_md[0];
    const memory::desc planar(input.dims(), input.data_type(), Tag::nchw);
    dnnl::reorder::primitive_desc transpose(engine_, planar, engine_, input, attr);
    pending.push_back(
        {dnnl::reorder(transpose),
         transpose.scratchpad_desc(),
         {{DNNL_ARG_FROM, {planar, input_planar_.data()}}, {DNNL_ARG_TO, {input, Value(0)}}},
         &plan->input});
  }
  size_t i = 0;  // the node being described, for the error
  try {
    for (i = 0; i < nodes_.size(); ++i) {
      Node& node = nodes_[i];
      if (node.type == Node::Type::kFork) {
        PlanFork(node, i, attr, *plan, pending);
        continue;
      }
      if (node.type == Node::Type::kAdd) {
        PlanAdd(node, batch, attr, *plan, pending);
        continue;
      }
      if (node.fused_away) continue;  // a ReLU its neighbour applies (FuseRelus)
      const LayerIo io = {
          .index = i,
          .full = full,
          .src = plan->value_md[node.in],
          .dst = plan->value_md[node.out],
          .diff_src = plan->grad_md[node.in],
          .diff_dst = plan->grad_md[node.out],
          .src_ptr = Value(node.in),
          .dst_ptr = Value(node.out),
          .diff_src_ptr = Buffer(node.diff_src),
          .diff_dst_ptr = Grad(node.out),
      };
      switch (node.config.kind) {
        case Kind::kConv2d:
          PlanWeightedLayer(node, io, PlanConv2d(node, io, attr), *plan, pending);
          break;
        case Kind::kLinear:
          PlanWeightedLayer(node, io, PlanLinear(node, io, attr), *plan, pending);
          break;
        case Kind::kRelu:
        case Kind::kGelu:
          PlanEltwise(node, io, attr, *plan, pending);
          break;
        case Kind::kMaxPool2d:
        case Kind::kAvgPool2d:
        case Kind::kGlobalAvgPool:
          STOKER_RETURN_IF_ERROR(PlanPool(node, io, attr, *plan, pending));
          break;
        case Kind::kBatchNorm2d:
        case Kind::kBatchNorm1d:
          PlanBatchNorm(node, io, batch, attr, *plan, pending);
          break;
        case Kind::kDropout:
        case Kind::kFlatten:
        case Kind::kResidual:
          break;  // no primitive: Dropout is a loop, Flatten an alias (residual: opened up)
      }
    }
    BindPlan(*plan, pending);
  } catch (const dnnl::error& e) {
    std::string what = "binding";
    if (i < nodes_.size()) {
      const Node& node = nodes_[i];
      what = node.type == Node::Type::kFork  ? "a residual block's input gradient sum"
             : node.type == Node::Type::kAdd ? "a residual block's sum"
                                             : LayerKindName(node.config.kind);
    }
    return absl::InternalError(absl::StrCat(
        "oneDNN could not build the ", PrecisionName(config_.precision),
        " network primitives for batch ", batch, " (", what, ", step ", i, "): ", e.what()));
  }
  return plan;
}

CpuNetwork::WeightedPrimitives CpuNetwork::PlanConv2d(Layer& layer, const LayerIo& io,
                                                      const dnnl::primitive_attr& attr) {
  const LayerConfig& c = layer.config;
  const WeightDescs w = DescribeWeights(layer, io);
  const Dims strides = {layer.stride, layer.stride};
  const Dims padding = {c.padding, c.padding};
  WeightedPrimitives result;
  result.bias = w.bias;
  auto forward_desc = [&](const memory::desc& src, const memory::desc& dst) {
    return dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(
            dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src,
            io.full ? w.any_weights : layer.weight_fwd_md, w.bias, dst, strides, padding, padding),
        attr, engine_);
  };
  dnnl::convolution_forward::primitive_desc fwd = forward_desc(io.src, io.dst);
  // A convolution from 16 channels to 16 sees its NHWC activations as oneDNN's 16-channel-blocked
  // nChw16c, the very same bytes (one block spans all the channels), wherever oneDNN's kernels
  // for that layout were measured faster: without AMX, its direct forward convolution beats the
  // NHWC brgconv by 30-40% (f32 and bf16), and its bf16 weight gradient by ~10% (an AMD EPYC Zen
  // 5, docs/profile-vision.md). The input gradient stays NHWC (equal or faster). With AMX the
  // NHWC kernels are the AMX ones: nothing changes.
  const bool sixteen = io.src.dims()[1] == 16 && io.dst.dims()[1] == 16;
  const bool amx = std::string(fwd.impl_info_str()).find("amx") != std::string::npos;
  if (sixteen && !amx) {
    result.forward_src = SixteenChannelView(io.src);
    result.forward_dst = SixteenChannelView(io.dst);
    fwd = forward_desc(result.forward_src, result.forward_dst);
    if (bf16()) {
      result.weights_src = result.forward_src;
      result.weights_diff_dst = SixteenChannelView(io.diff_dst);
    }
  }
  if (io.full) layer.weight_fwd_md = fwd.weights_desc();
  result.forward = dnnl::convolution_forward(fwd);
  result.forward_scratch = fwd.scratchpad_desc();
  const Dims dst_dims = io.dst.dims();
  // The compute-type weight gradient: always at the full batch (which decides f32_weight_grad),
  // later only where it is the one used.
  if (io.full || !layer.f32_weight_grad) {
    dnnl::convolution_backward_weights::primitive_desc bwd_w(
        dnnl::convolution_backward_weights::desc(
            dnnl::algorithm::convolution_direct, ViewOr(result.weights_src, io.src),
            io.full ? w.any_diff_weights : layer.diff_weight_md, w.bias,
            ViewOr(result.weights_diff_dst, io.diff_dst), strides, padding, padding),
        attr, engine_, fwd);
    result.backward_weights = dnnl::convolution_backward_weights(bwd_w);
    result.weights_scratch = bwd_w.scratchpad_desc();
    if (io.full) {
      layer.diff_weight_md = bwd_w.diff_weights_desc();
      // Image activations are all NHWC (ActivationMd), as the f32 copies are.
      layer.f32_weight_grad = bf16() && dst_dims[2] * dst_dims[3] <= kMaxF32WeightGradPixels &&
                              std::string(bwd_w.impl_info_str()).find("amx") != std::string::npos;
    }
  }
  if (layer.f32_weight_grad) {
    result.f32_src = memory::desc(io.src.dims(), DataType::f32, Tag::nhwc);
    result.f32_diff_dst = memory::desc(dst_dims, DataType::f32, Tag::nhwc);
    const memory::desc any_f32_weights(w.any_weights.dims(), DataType::f32, Tag::any);
    dnnl::convolution_forward::primitive_desc f32_fwd(
        dnnl::convolution_forward::desc(
            dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, result.f32_src,
            any_f32_weights, w.bias, result.f32_diff_dst, strides, padding, padding),
        attr, engine_);
    dnnl::convolution_backward_weights::primitive_desc f32_bwd_w(
        dnnl::convolution_backward_weights::desc(
            dnnl::algorithm::convolution_direct, result.f32_src,
            io.full ? w.any_diff_weights : layer.diff_weight_md, w.bias, result.f32_diff_dst,
            strides, padding, padding),
        attr, engine_, f32_fwd);
    if (io.full) {
      layer.diff_weight_md = f32_bwd_w.diff_weights_desc();
      layer.f32_src = AlignedArray<std::byte>(result.f32_src.get_size());
      layer.f32_diff_dst = AlignedArray<std::byte>(result.f32_diff_dst.get_size());
    }
    result.backward_weights = dnnl::convolution_backward_weights(f32_bwd_w);
    result.weights_scratch = f32_bwd_w.scratchpad_desc();
  }
  if (layer.needs_input_grad) {
    dnnl::convolution_backward_data::primitive_desc bwd_d(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, io.diff_src,
                                              io.full ? w.any_weights : layer.weight_bwd_md,
                                              io.diff_dst, strides, padding, padding),
        attr, engine_, fwd);
    if (io.full) layer.weight_bwd_md = bwd_d.weights_desc();
    result.backward_data = dnnl::convolution_backward_data(bwd_d);
    result.data_scratch = bwd_d.scratchpad_desc();
  }
  return result;
}

CpuNetwork::WeightedPrimitives CpuNetwork::PlanLinear(Layer& layer, const LayerIo& io,
                                                      const dnnl::primitive_attr& attr) {
  const WeightDescs w = DescribeWeights(layer, io);
  WeightedPrimitives result;
  result.bias = w.bias;
  dnnl::inner_product_forward::primitive_desc fwd(
      dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, io.src,
                                        io.full ? w.any_weights : layer.weight_fwd_md, w.bias,
                                        io.dst),
      attr, engine_);
  dnnl::inner_product_backward_weights::primitive_desc bwd_w(
      dnnl::inner_product_backward_weights::desc(
          io.src, io.full ? w.any_diff_weights : layer.diff_weight_md, w.bias, io.diff_dst),
      attr, engine_, fwd);
  if (io.full) {
    layer.weight_fwd_md = fwd.weights_desc();
    layer.diff_weight_md = bwd_w.diff_weights_desc();
  }
  result.forward = dnnl::inner_product_forward(fwd);
  result.forward_scratch = fwd.scratchpad_desc();
  result.backward_weights = dnnl::inner_product_backward_weights(bwd_w);
  result.weights_scratch = bwd_w.scratchpad_desc();
  if (layer.needs_input_grad) {
    dnnl::inner_product_backward_data::primitive_desc bwd_d(
        dnnl::inner_product_backward_data::desc(
            io.diff_src, io.full ? w.any_weights : layer.weight_bwd_md, io.diff_dst),
        attr, engine_, fwd);
    if (io.full) layer.weight_bwd_md = bwd_d.weights_desc();
    result.backward_data = dnnl::inner_product_backward_data(bwd_d);
    result.data_scratch = bwd_d.scratchpad_desc();
  }
  return result;
}

CpuNetwork::WeightDescs CpuNetwork::DescribeWeights(Layer& layer, const LayerIo& io) const {
  const LayerConfig& c = layer.config;
  const memory::dim out = params_[layer.weight].shape[0];
  Dims weight_dims = {out};
  const Dims src_dims = io.src.dims();
  weight_dims.insert(weight_dims.end(), src_dims.begin() + 1, src_dims.end());
  if (c.kind == Kind::kConv2d) weight_dims = {out, src_dims[1], c.kernel, c.kernel};
  if (io.full) {
    layer.weight_plain_md =
        memory::desc(weight_dims, DataType::f32, weight_dims.size() == 4 ? Tag::oihw : Tag::oi);
  }
  return {.any_weights = memory::desc(weight_dims, ComputeType(), Tag::any),
          .any_diff_weights = memory::desc(weight_dims, DataType::f32, Tag::any),
          .bias = layer.bias >= 0 ? memory::desc({out}, DataType::f32, Tag::x) : memory::desc()};
}

void CpuNetwork::PlanWeightedLayer(Layer& layer, const LayerIo& io,
                                   const WeightedPrimitives& primitives, Plan& plan,
                                   std::vector<PendingOp>& pending) {
  Param& weight = params_[layer.weight];
  const memory::desc& bias_md = primitives.bias;
  void* master = weight.value.data();
  void* fwd_weights = Bind(layer.weight_fwd, master);
  void* bwd_weights =
      layer.weight_bwd_md == layer.weight_fwd_md ? fwd_weights : Bind(layer.weight_bwd, master);
  PendingOp forward{primitives.forward,
                    primitives.forward_scratch,
                    {{DNNL_ARG_SRC, {ViewOr(primitives.forward_src, io.src), io.src_ptr}},
                     {DNNL_ARG_WEIGHTS, {layer.weight_fwd_md, fwd_weights}},
                     {DNNL_ARG_DST, {ViewOr(primitives.forward_dst, io.dst), io.dst_ptr}}},
                    &plan.ops[io.index].forward};
  memory::desc grad_src = ViewOr(primitives.weights_src, io.src);
  memory::desc grad_diff_dst = ViewOr(primitives.weights_diff_dst, io.diff_dst);
  void* grad_src_ptr = io.src_ptr;
  void* grad_diff_dst_ptr = io.diff_dst_ptr;
  if (layer.f32_weight_grad) {
    // The weight gradient's f32 inputs, converted right before it.
    grad_src = primitives.f32_src;
    grad_diff_dst = primitives.f32_diff_dst;
    grad_src_ptr = layer.f32_src.data();
    grad_diff_dst_ptr = layer.f32_diff_dst.data();
    const std::pair<memory::desc, void*> copies[][2] = {
        {{io.src, io.src_ptr}, {grad_src, grad_src_ptr}},
        {{io.diff_dst, io.diff_dst_ptr}, {grad_diff_dst, grad_diff_dst_ptr}}};
    for (const auto& [from, to] : copies) {
      dnnl::reorder::primitive_desc copy(engine_, from.first, engine_, to.first);
      pending.push_back({dnnl::reorder(copy),
                         copy.scratchpad_desc(),
                         {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}},
                         &plan.ops[io.index].backward_weights});
    }
  }
  PendingOp backward_weights{
      primitives.backward_weights,
      primitives.weights_scratch,
      {{DNNL_ARG_SRC, {grad_src, grad_src_ptr}},
       {DNNL_ARG_DIFF_DST, {grad_diff_dst, grad_diff_dst_ptr}},
       {DNNL_ARG_DIFF_WEIGHTS,
        {layer.diff_weight_md, Bind(layer.diff_weight, weight.grad.data())}}},
      &plan.ops[io.index].backward_weights};
  if (layer.bias >= 0) {
    Param& bias = params_[layer.bias];
    forward.args.emplace(DNNL_ARG_BIAS,
                         std::make_pair(bias_md, static_cast<void*>(bias.value.data())));
    backward_weights.args.emplace(DNNL_ARG_DIFF_BIAS,
                                  std::make_pair(bias_md, static_cast<void*>(bias.grad.data())));
  }
  pending.push_back(std::move(forward));
  pending.push_back(std::move(backward_weights));
  if (layer.needs_input_grad) {
    pending.push_back({primitives.backward_data,
                       primitives.data_scratch,
                       {{DNNL_ARG_DIFF_DST, {io.diff_dst, io.diff_dst_ptr}},
                        {DNNL_ARG_WEIGHTS, {layer.weight_bwd_md, bwd_weights}},
                        {DNNL_ARG_DIFF_SRC, {io.diff_src, io.diff_src_ptr}}},
                       &plan.ops[io.index].backward_data});
  }
}

void CpuNetwork::PlanEltwise(const Layer& layer, const LayerIo& io,
                             const dnnl::primitive_attr& attr, Plan& plan,
                             std::vector<PendingOp>& pending) {
  const dnnl::algorithm algorithm = layer.config.kind == Kind::kRelu
                                        ? dnnl::algorithm::eltwise_relu
                                        : dnnl::algorithm::eltwise_gelu_erf;
  dnnl::eltwise_forward::primitive_desc fwd(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, algorithm, io.src, 0.f, 0.f),
      attr, engine_);
  pending.push_back({dnnl::eltwise_forward(fwd),
                     fwd.scratchpad_desc(),
                     {{DNNL_ARG_SRC, {io.src, io.src_ptr}}, {DNNL_ARG_DST, {io.dst, io.dst_ptr}}},
                     &plan.ops[io.index].forward});
  if (layer.needs_input_grad) {
    dnnl::eltwise_backward::primitive_desc bwd(
        dnnl::eltwise_backward::desc(algorithm, io.diff_dst, io.src, 0.f, 0.f), attr, engine_, fwd);
    pending.push_back({dnnl::eltwise_backward(bwd),
                       bwd.scratchpad_desc(),
                       {{DNNL_ARG_SRC, {io.src, io.src_ptr}},
                        {DNNL_ARG_DIFF_DST, {io.diff_dst, io.diff_dst_ptr}},
                        {DNNL_ARG_DIFF_SRC, {io.diff_src, io.diff_src_ptr}}},
                       &plan.ops[io.index].backward_data});
  }
}

absl::Status CpuNetwork::PlanPool(Layer& layer, const LayerIo& io, const dnnl::primitive_attr& attr,
                                  Plan& plan, std::vector<PendingOp>& pending) {
  const LayerConfig& c = layer.config;
  const bool max = c.kind == Kind::kMaxPool2d;
  const bool global = c.kind == Kind::kGlobalAvgPool;
  if (layer.own_pool) {
    if (io.full) layer.workspace = AlignedArray<std::byte>(Elements(io.dst));
    return absl::OkStatus();
  }
  const Dims src_dims = io.src.dims();
  const Dims strides = global ? Dims{1, 1} : Dims{layer.stride, layer.stride};
  const Dims kernel = global ? Dims{src_dims[2], src_dims[3]} : Dims{c.kernel, c.kernel};
  const Dims padding = global ? Dims{0, 0} : Dims{c.padding, c.padding};
  // AvgPool2d's default count_include_pad=True divides by the whole window, padding included.
  const dnnl::algorithm algorithm =
      max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_include_padding;
  // The ReLU before a MaxPool2d runs after it, as a post-op (FuseRelus). A new attribute: copies
  // of a primitive_attr share one handle.
  dnnl::primitive_attr fwd_attr;
  fwd_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (layer.relu_after) {
    dnnl::post_ops post;
    post.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    fwd_attr.set_post_ops(post);
  }
  dnnl::pooling_forward::primitive_desc fwd(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, algorithm, io.src, io.dst,
                                  strides, kernel, padding, padding),
      layer.relu_after ? fwd_attr : attr, engine_);
  const memory::desc workspace = fwd.workspace_desc();
  if (io.full && workspace.get_size() > 0) {
    layer.workspace = AlignedArray<std::byte>(workspace.get_size());
  }
  if (workspace.get_size() > layer.workspace.size()) {
    return absl::InternalError("pooling workspace larger than at the full batch");
  }
  PendingOp forward{dnnl::pooling_forward(fwd),
                    fwd.scratchpad_desc(),
                    {{DNNL_ARG_SRC, {io.src, io.src_ptr}}, {DNNL_ARG_DST, {io.dst, io.dst_ptr}}},
                    &plan.ops[io.index].forward};
  if (workspace.get_size() > 0) {
    forward.args.emplace(DNNL_ARG_WORKSPACE,
                         std::make_pair(workspace, static_cast<void*>(layer.workspace.data())));
  }
  pending.push_back(std::move(forward));
  if (layer.needs_input_grad) {
    void* diff_dst_ptr = io.diff_dst_ptr;
    if (layer.relu_after) {
      // ReLU' from the pooled output (positive exactly where the window's maximum is), into
      // `masked`, which the pool's backward then reads.
      diff_dst_ptr = Buffer(layer.masked);
      dnnl::eltwise_forward::primitive_desc relu_fwd(
          dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training,
                                      dnnl::algorithm::eltwise_relu_use_dst_for_bwd, io.dst, 0.f,
                                      0.f),
          attr, engine_);
      dnnl::eltwise_backward::primitive_desc relu_bwd(
          dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, io.diff_dst,
                                       io.dst, 0.f, 0.f),
          attr, engine_, relu_fwd);
      pending.push_back({dnnl::eltwise_backward(relu_bwd),
                         relu_bwd.scratchpad_desc(),
                         {{DNNL_ARG_DST, {io.dst, io.dst_ptr}},
                          {DNNL_ARG_DIFF_DST, {io.diff_dst, io.diff_dst_ptr}},
                          {DNNL_ARG_DIFF_SRC, {io.diff_dst, diff_dst_ptr}}},
                         &plan.ops[io.index].backward_data});
    }
    dnnl::pooling_backward::primitive_desc bwd(
        dnnl::pooling_backward::desc(algorithm, io.diff_src, io.diff_dst, strides, kernel, padding,
                                     padding),
        attr, engine_, fwd);
    PendingOp backward{dnnl::pooling_backward(bwd),
                       bwd.scratchpad_desc(),
                       {{DNNL_ARG_DIFF_DST, {io.diff_dst, diff_dst_ptr}},
                        {DNNL_ARG_DIFF_SRC, {io.diff_src, io.diff_src_ptr}}},
                       &plan.ops[io.index].backward_data};
    if (workspace.get_size() > 0) {
      backward.args.emplace(DNNL_ARG_WORKSPACE,
                            std::make_pair(workspace, static_cast<void*>(layer.workspace.data())));
    }
    pending.push_back(std::move(backward));
  }
  return absl::OkStatus();
}

void CpuNetwork::PlanBatchNorm(Layer& layer, const LayerIo& io, int batch,
                               const dnnl::primitive_attr& attr, Plan& plan,
                               std::vector<PendingOp>& pending) {
  const LayerConfig& c = layer.config;
  // BatchNorm1d's [N, C] runs as [N, C, 1, 1] NHWC: the same memory.
  memory::desc data = io.src;
  memory::desc diff = io.diff_dst;
  if (c.kind == Kind::kBatchNorm1d) {
    const memory::dim channels = io.src.dims()[1];
    data = memory::desc({batch, channels, 1, 1}, io.src.data_type(), Tag::nhwc);
    diff = memory::desc({batch, channels, 1, 1}, io.diff_dst.data_type(), Tag::nhwc);
  }
  const memory::desc channel_md({static_cast<memory::dim>(layer.mean.size())}, DataType::f32,
                                Tag::x);
  auto param = [&](int offset) {
    return std::make_pair(channel_md,
                          static_cast<void*>(params_[layer.norm + offset].value.data()));
  };
  auto param_grad = [&](int offset) {
    return std::make_pair(channel_md, static_cast<void*>(params_[layer.norm + offset].grad.data()));
  };
  const std::pair<memory::desc, void*> batch_mean = {channel_md, layer.mean.data()};
  const std::pair<memory::desc, void*> batch_variance = {channel_md, layer.variance.data()};
  // With fuse_relu (FuseRelus) the output is ReLU'd and the ReLU's mask kept as a workspace,
  // which backward applies to the output gradient first.
  auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  if (layer.fuse_relu) flags = flags | dnnl::normalization_flags::fuse_norm_relu;
  dnnl::batch_normalization_forward::primitive_desc fwd(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, data, c.eps,
                                              flags),
      attr, engine_);
  // oneDNN 2.6's bf16 batch normalisation has jit kernels only for channels in multiples of 16;
  // otherwise it picks a generic loop (nspc_bnorm:any) that converts every value on its own, ~50x
  // slower than the f32 jit kernel (docs/profile-vision.md). Such a layer converts to f32, runs
  // the f32 kernel and converts back: the same f32 arithmetic, rounded to bf16 where the bf16
  // primitive rounds.
  const bool via_f32 = data.data_type() == DataType::bf16 &&
                       std::string(fwd.impl_info_str()).find("jit") == std::string::npos;
  void* src_ptr = io.src_ptr;
  void* dst_ptr = io.dst_ptr;
  void* diff_dst_ptr = io.diff_dst_ptr;
  void* diff_src_ptr = io.diff_src_ptr;
  const memory::desc bf16_data = data;
  const memory::desc bf16_diff = diff;
  if (via_f32) {
    data = memory::desc(data.dims(), DataType::f32, Tag::nhwc);
    diff = data;
    if (io.full) {
      const size_t values = static_cast<size_t>(Elements(data));
      layer.norm_src = AlignedArray<float>(values);
      layer.norm_dst = AlignedArray<float>(values);
      layer.norm_diff_src = AlignedArray<float>(values);
    }
    src_ptr = layer.norm_src.data();
    dst_ptr = layer.norm_dst.data();
    diff_dst_ptr = layer.norm_dst.data();
    diff_src_ptr = layer.norm_diff_src.data();
    fwd = dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, data, c.eps,
                                                flags),
        attr, engine_);
  }
  // A conversion between the bf16 activation and its f32 copy, added to `slot`.
  auto convert = [&](const memory::desc& from, void* from_ptr, const memory::desc& to, void* to_ptr,
                     std::vector<Op>* slot) {
    dnnl::reorder::primitive_desc copy(engine_, from, engine_, to, attr);
    pending.push_back({dnnl::reorder(copy),
                       copy.scratchpad_desc(),
                       {{DNNL_ARG_FROM, {from, from_ptr}}, {DNNL_ARG_TO, {to, to_ptr}}},
                       slot});
  };
  NodeOps& ops = plan.ops[io.index];
  if (via_f32) {
    convert(bf16_data, io.src_ptr, data, src_ptr, &ops.forward);
    convert(bf16_data, io.src_ptr, data, src_ptr, &ops.eval);
  }
  const memory::desc workspace = fwd.workspace_desc();
  if (io.full) layer.workspace = AlignedArray<std::byte>(workspace.get_size());
  // A partial batch's workspace is smaller; the full batch's buffer holds it.
  const std::pair<memory::desc, void*> workspace_arg = {workspace, layer.workspace.data()};
  PendingOp forward{dnnl::batch_normalization_forward(fwd),
                    fwd.scratchpad_desc(),
                    {{DNNL_ARG_SRC, {data, src_ptr}},
                     {DNNL_ARG_DST, {data, dst_ptr}},
                     {DNNL_ARG_SCALE, param(0)},
                     {DNNL_ARG_SHIFT, param(1)},
                     {DNNL_ARG_MEAN, batch_mean},
                     {DNNL_ARG_VARIANCE, batch_variance}},
                    &ops.forward};
  if (workspace.get_size() > 0) forward.args.emplace(DNNL_ARG_WORKSPACE, workspace_arg);
  pending.push_back(std::move(forward));
  if (via_f32) convert(data, dst_ptr, bf16_data, io.dst_ptr, &ops.forward);
  dnnl::batch_normalization_forward::primitive_desc eval(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_inference, data, c.eps,
                                              flags | dnnl::normalization_flags::use_global_stats),
      attr, engine_);
  pending.push_back({dnnl::batch_normalization_forward(eval),
                     eval.scratchpad_desc(),
                     {{DNNL_ARG_SRC, {data, src_ptr}},
                      {DNNL_ARG_DST, {data, dst_ptr}},
                      {DNNL_ARG_SCALE, param(0)},
                      {DNNL_ARG_SHIFT, param(1)},
                      {DNNL_ARG_MEAN, param(2)},
                      {DNNL_ARG_VARIANCE, param(3)}},
                     &ops.eval});
  if (via_f32) {
    convert(data, dst_ptr, bf16_data, io.dst_ptr, &ops.eval);
    convert(bf16_diff, io.diff_dst_ptr, diff, diff_dst_ptr, &ops.backward_weights);
  }
  // Backward always gives the input gradient; with no use for it, it lands in the input's
  // gradient buffer unread.
  dnnl::batch_normalization_backward::primitive_desc bwd(
      dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, diff, data, c.eps, flags),
      attr, engine_, fwd);
  PendingOp backward{dnnl::batch_normalization_backward(bwd),
                     bwd.scratchpad_desc(),
                     {{DNNL_ARG_SRC, {data, src_ptr}},
                      {DNNL_ARG_MEAN, batch_mean},
                      {DNNL_ARG_VARIANCE, batch_variance},
                      {DNNL_ARG_SCALE, param(0)},
                      {DNNL_ARG_SHIFT, param(1)},
                      {DNNL_ARG_DIFF_DST, {diff, diff_dst_ptr}},
                      {DNNL_ARG_DIFF_SRC, {diff, diff_src_ptr}},
                      {DNNL_ARG_DIFF_SCALE, param_grad(0)},
                      {DNNL_ARG_DIFF_SHIFT, param_grad(1)}},
                     &ops.backward_weights};
  if (workspace.get_size() > 0) backward.args.emplace(DNNL_ARG_WORKSPACE, workspace_arg);
  pending.push_back(std::move(backward));
  if (via_f32) convert(diff, diff_src_ptr, bf16_diff, io.diff_src_ptr, &ops.backward_weights);
}

void CpuNetwork::PlanAdd(const Node& node, int batch, const dnnl::primitive_attr& attr, Plan& plan,
                         std::vector<PendingOp>& pending) {
  (void)batch;
  NodeOps& ops = plan.ops[&node - nodes_.data()];
  const memory::desc& main_md = plan.value_md[node.in];
  const memory::desc& shortcut_md = plan.value_md[node.in2];
  const memory::desc& out_md = plan.value_md[node.out];
  const memory::desc& out_grad_md = plan.grad_md[node.out];
  const LayerConfig::Activation activation = node.config.activation;
  // Forward: the sum, with ReLU fused as a post-op; GELU runs after on the kept sum.
  // A new attribute: copying a primitive_attr shares its handle, and the post-op would reach
  // every later primitive.
  dnnl::primitive_attr add_attr;
  add_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (activation == LayerConfig::Activation::kRelu) {
    dnnl::post_ops post;
    post.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    add_attr.set_post_ops(post);
  }
  void* sum_ptr = node.pre >= 0 ? static_cast<void*>(Buffer(node.pre)) : Value(node.out);
  dnnl::binary::primitive_desc add(
      dnnl::binary::desc(dnnl::algorithm::binary_add, main_md, shortcut_md, out_md), add_attr,
      engine_);
  pending.push_back({dnnl::binary(add),
                     add.scratchpad_desc(),
                     {{DNNL_ARG_SRC_0, {main_md, Value(node.in)}},
                      {DNNL_ARG_SRC_1, {shortcut_md, Value(node.in2)}},
                      {DNNL_ARG_DST, {out_md, sum_ptr}}},
                     &ops.forward});
  std::optional<dnnl::eltwise_forward::primitive_desc> gelu;
  if (activation != LayerConfig::Activation::kNone) {
    const bool relu = activation == LayerConfig::Activation::kRelu;
    const dnnl::algorithm algorithm =
        relu ? dnnl::algorithm::eltwise_relu : dnnl::algorithm::eltwise_gelu_erf;
    dnnl::eltwise_forward::primitive_desc fwd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, algorithm, out_md, 0.f, 0.f),
        attr, engine_);
    if (!relu) {
      pending.push_back(
          {dnnl::eltwise_forward(fwd),
           fwd.scratchpad_desc(),
           {{DNNL_ARG_SRC, {out_md, sum_ptr}}, {DNNL_ARG_DST, {out_md, Value(node.out)}}},
           &ops.forward});
    }
    if (node.needs_input_grad) {
      // ReLU's derivative from its output (positive exactly where the sum is), GELU's from the sum.
      dnnl::eltwise_backward::primitive_desc bwd(
          dnnl::eltwise_backward::desc(algorithm, out_grad_md, out_md, 0.f, 0.f), attr, engine_,
          fwd);
      pending.push_back({dnnl::eltwise_backward(bwd),
                         bwd.scratchpad_desc(),
                         {{DNNL_ARG_SRC, {out_md, relu ? Value(node.out) : sum_ptr}},
                          {DNNL_ARG_DIFF_DST, {out_grad_md, Grad(node.out)}},
                          {DNNL_ARG_DIFF_SRC, {out_grad_md, Buffer(node.diff_src)}}},
                         &ops.backward_data});
    }
  } else if (node.needs_input_grad) {
    dnnl::reorder::primitive_desc copy(engine_, out_grad_md, engine_, plan.grad_md[node.in]);
    pending.push_back({dnnl::reorder(copy),
                       copy.scratchpad_desc(),
                       {{DNNL_ARG_FROM, {out_grad_md, Grad(node.out)}},
                        {DNNL_ARG_TO, {plan.grad_md[node.in], Buffer(node.diff_src)}}},
                       &ops.backward_data});
  }
  // The shortcut's gradient is the main branch's: a copy, unless the buffers are one.
  if (node.needs_input2_grad && node.diff_src2 != node.diff_src) {
    const memory::desc& from = plan.grad_md[node.in];
    const memory::desc& to = plan.grad_md[node.in2];
    dnnl::reorder::primitive_desc copy(engine_, from, engine_, to);
    pending.push_back({dnnl::reorder(copy),
                       copy.scratchpad_desc(),
                       {{DNNL_ARG_FROM, {from, Buffer(node.diff_src)}},
                        {DNNL_ARG_TO, {to, Buffer(node.diff_src2)}}},
                       &ops.backward_data});
  }
}

void CpuNetwork::PlanFork(const Node& node, size_t index, const dnnl::primitive_attr& attr,
                          Plan& plan, std::vector<PendingOp>& pending) {
  if (!node.needs_input_grad) return;
  // The block input's gradient: the main branch's (already in diff_src) plus the shortcut's.
  const memory::desc& md = plan.grad_md[node.in];
  dnnl::binary::primitive_desc sum(dnnl::binary::desc(dnnl::algorithm::binary_add, md, md, md),
                                   attr, engine_);
  pending.push_back({dnnl::binary(sum),
                     sum.scratchpad_desc(),
                     {{DNNL_ARG_SRC_0, {md, Buffer(node.diff_src)}},
                      {DNNL_ARG_SRC_1, {md, Buffer(node.extra)}},
                      {DNNL_ARG_DST, {md, Buffer(node.diff_src)}}},
                     &plan.ops[index].backward_data});
}

void CpuNetwork::BindPlan(Plan& plan, std::vector<PendingOp>& pending) {
  size_t scratchpad_bytes = 0;
  for (const PendingOp& p : pending) {
    scratchpad_bytes = std::max(scratchpad_bytes, p.scratchpad.get_size());
  }
  plan.scratchpad = AlignedArray<std::byte>(scratchpad_bytes);
  for (PendingOp& p : pending) {
    Op op;
    op.primitive = p.primitive;
    for (const auto& [arg, bound] : p.args) {
      op.args.emplace(arg, memory(bound.first, engine_, bound.second));
    }
    op.args.emplace(DNNL_ARG_SCRATCHPAD, memory(p.scratchpad, engine_, plan.scratchpad.data()));
    p.slot->push_back(std::move(op));
  }
}

std::vector<int32_t> CpuNetwork::BlockedIndex(const memory::desc& plain,
                                              const memory::desc& blocked) {
  // The indices themselves, 1-based, through an s32 reorder between the same layouts: padding
  // stays 0, i.e. -1 after the shift.
  dnnl_memory_desc_t plain_s32 = plain.data;
  plain_s32.data_type = dnnl_s32;
  dnnl_memory_desc_t blocked_s32 = blocked.data;
  blocked_s32.data_type = dnnl_s32;
  const memory::desc from_md(plain_s32), to_md(blocked_s32);
  std::vector<int32_t> from(from_md.get_size() / sizeof(int32_t));
  std::iota(from.begin(), from.end(), 1);
  std::vector<int32_t> to(to_md.get_size() / sizeof(int32_t), 0);
  memory from_memory(from_md, engine_, from.data());
  memory to_memory(to_md, engine_, to.data());
  dnnl::reorder(from_memory, to_memory).execute(stream_, from_memory, to_memory);
  stream_.wait();
  for (int32_t& v : to) v -= 1;
  return to;
}

void CpuNetwork::BuildWeightReorders() {
  for (Node& layer : nodes_) {
    if (layer.weight < 0) continue;
    Param& weight = params_[layer.weight];
    const bool gather = static_cast<int64_t>(weight.value.size()) <= kMaxGatherValues;
    memory master(layer.weight_plain_md, engine_, weight.value.data());
    // A copy is needed unless the primitive reads the f32 master as it is (fp16 rounds its copy).
    auto add_copy = [&](const memory::desc& md, AlignedArray<std::byte>& buffer) {
      if (md == layer.weight_plain_md && !fp16()) return;
      buffer = AlignedArray<std::byte>(md.get_size());
      if (gather) {
        weight_gathers_.push_back({.from = weight.value.data(),
                                   .to = buffer.data(),
                                   .to_bf16 = md.data_type() == DataType::bf16,
                                   .index = BlockedIndex(layer.weight_plain_md, md)});
        return;
      }
      memory copy(md, engine_, buffer.data());
      weight_reorders_.push_back(
          {dnnl::reorder(master, copy), {{DNNL_ARG_FROM, master}, {DNNL_ARG_TO, copy}}});
    };
    add_copy(layer.weight_fwd_md, layer.weight_fwd);
    if (layer.needs_input_grad && !(layer.weight_bwd_md == layer.weight_fwd_md)) {
      add_copy(layer.weight_bwd_md, layer.weight_bwd);
    }
    if (!(layer.diff_weight_md == layer.weight_plain_md)) {
      layer.diff_weight = AlignedArray<std::byte>(layer.diff_weight_md.get_size());
      if (gather) {
        // The inverse map: plain value i comes from blocked position j.
        const std::vector<int32_t> blocked =
            BlockedIndex(layer.weight_plain_md, layer.diff_weight_md);
        Gather g{.from = reinterpret_cast<const float*>(layer.diff_weight.data()),
                 .to = weight.grad.data(),
                 .to_bf16 = false,
                 .index = std::vector<int32_t>(weight.grad.size(), -1)};
        for (size_t j = 0; j < blocked.size(); ++j) {
          if (blocked[j] >= 0) g.index[blocked[j]] = static_cast<int32_t>(j);
        }
        layer.grad_gather = static_cast<int>(grad_gathers_.size());
        grad_gathers_.push_back(std::move(g));
        continue;
      }
      memory diff(layer.diff_weight_md, engine_, layer.diff_weight.data());
      memory plain(layer.weight_plain_md, engine_, weight.grad.data());
      layer.grad_reorder = static_cast<int>(grad_reorders_.size());
      grad_reorders_.push_back(
          {dnnl::reorder(diff, plain), {{DNNL_ARG_FROM, diff}, {DNNL_ARG_TO, plain}}});
    }
  }
}

void CpuNetwork::RefreshComputeWeights() {
  // Every small tensor in one parallel region, split evenly between the threads without a
  // barrier between tensors.
  const std::vector<Gather>& gathers = weight_gathers_;
#pragma omp parallel
  {
    const int threads = omp_get_num_threads();
    const int thread = omp_get_thread_num();
    for (const Gather& g : gathers) {
      const int64_t size = static_cast<int64_t>(g.index.size());
      RunGather(g, size * thread / threads, size * (thread + 1) / threads);
    }
  }
  for (const Op& op : weight_reorders_) Execute(op);
  stream_.wait();
  if (fp16()) {
    for (const Gather& g : weight_gathers_) {
      cpu::RoundToFp16InPlace(static_cast<float*>(g.to), g.index.size());
    }
    for (const Op& op : weight_reorders_) {
      const memory& copy = op.args.at(DNNL_ARG_TO);
      cpu::RoundToFp16InPlace(static_cast<float*>(copy.get_data_handle()),
                              copy.get_desc().get_size() / sizeof(float));
    }
  }
}

absl::StatusOr<Plan*> CpuNetwork::PlanFor(int batch) {
  return partial_plans_.Get(full_plan_.get(), batch, [this](int size) { return BuildPlan(size); });
}

void CpuNetwork::LoadInput(const Plan& plan, const BatchView& batch) {
  int64_t n = batch.count;
  for (int d : config_.input_shape) n *= d;
  std::byte* input = InputIsPlanar() ? input_planar_.data() : Value(0);
  if (batch.features != nullptr) {
    if (bf16()) {
      cpu::ConvertToBf16(batch.features, n, reinterpret_cast<bf16_t*>(input));
    } else {
      std::memcpy(input, batch.features, n * sizeof(float));
    }
  } else {
    const cpu::ChannelAffine affine{normalization_.channels, normalization_.plane,
                                    normalization_.scale.data(), normalization_.shift.data()};
    if (bf16()) {
      cpu::NormalizeToBf16(batch.samples, n, affine, reinterpret_cast<bf16_t*>(input));
    } else {
      cpu::NormalizeToF32(batch.samples, n, affine, reinterpret_cast<float*>(input));
    }
  }
  if (fp16()) cpu::RoundToFp16InPlace(reinterpret_cast<float*>(input), n);
  ExecuteAll(plan.input);
}

absl::Status CpuNetwork::CheckBatchNormValues(int batch) const {
  for (const Node& node : nodes_) {
    if (node.type != Node::Type::kLayer || !IsBatchNorm(node.config.kind)) continue;
    const std::vector<int>& shape = activations_[node.in].shape;
    int64_t per_channel = batch;
    for (size_t d = 1; d < shape.size(); ++d) per_channel *= shape[d];
    if (per_channel > 1) continue;
    return OneValuePerChannelError(node.config.kind, params_[node.norm].name, batch, shape);
  }
  return absl::OkStatus();
}

void CpuNetwork::UpdateRunningStatistics(int batch) {
  for (const Node& node : nodes_) {
    if (node.type == Node::Type::kLayer && IsBatchNorm(node.config.kind)) {
      UpdateRunningStatistics(node, batch);
    }
  }
}

void CpuNetwork::UpdateRunningStatistics(const Node& node, int batch) {
  // torch.nn.BatchNorm*d in training: running = (1 - momentum) * running + momentum * batch
  // statistic, the variance unbiased (n / (n - 1)); n > 1 (CheckBatchNormValues).
  int64_t n = batch;
  for (size_t d = 1; d < activations_[node.in].shape.size(); ++d) {
    n *= activations_[node.in].shape[d];
  }
  const double unbias = static_cast<double>(n) / static_cast<double>(n - 1);
  const float momentum = node.config.momentum;
  float* running_mean = params_[node.norm + 2].value.data();
  float* running_var = params_[node.norm + 3].value.data();
  for (size_t c = 0; c < node.mean.size(); ++c) {
    running_mean[c] = momentum * node.mean[c] + (1 - momentum) * running_mean[c];
    const float unbiased = static_cast<float>(node.variance[c] * unbias);
    running_var[c] = momentum * unbiased + (1 - momentum) * running_var[c];
  }
  params_[node.norm + 4].value[0] += 1;
}

const float* CpuNetwork::Forward(Plan& plan, bool training) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node& node = nodes_[i];
    const NodeOps& ops = plan.ops[i];
    if (node.type == Node::Type::kFork) continue;
    if (node.type == Node::Type::kAdd) {
      ExecuteAll(ops.forward);
      if (node.pre >= 0) RoundFp16(node.pre, plan.value_md[node.out]);
      RoundFp16(activations_[node.out].value, plan.value_md[node.out]);
      continue;
    }
    const int64_t elements = Elements(plan.value_md[node.out]);
    if (!ops.forward.empty()) {
      // BatchNorm in training keeps the batch's statistics in node.mean and node.variance; the
      // running ones follow once the step has succeeded (TrainStep).
      ExecuteAll(!training && !ops.eval.empty() ? ops.eval : ops.forward);
    } else if (node.config.kind == Kind::kDropout) {
      if (training && node.config.rate > 0) {
        const uint64_t stream = static_cast<uint64_t>(train_steps_) * 4096 + i;
        if (bf16()) {
          cpu::DropoutForward(reinterpret_cast<const bf16_t*>(Value(node.in)), elements,
                              node.config.rate, config_.seed, stream, node.keep.data(),
                              reinterpret_cast<bf16_t*>(Value(node.out)));
        } else {
          cpu::DropoutForward(reinterpret_cast<const float*>(Value(node.in)), elements,
                              node.config.rate, config_.seed, stream, node.keep.data(),
                              reinterpret_cast<float*>(Value(node.out)));
        }
      } else {
        std::memcpy(Value(node.out), Value(node.in), plan.value_md[node.out].get_size());
      }
    } else if (node.own_pool) {
      OwnMaxPool(i, plan, /*forward=*/true);
    } else {
      continue;  // Flatten
    }
    RoundFp16(activations_[node.out].value, plan.value_md[node.out]);
  }
  stream_.wait();
  if (plan.value_md[output_].data_type() == DataType::f32) {
    return reinterpret_cast<const float*>(Value(output_));
  }
  cpu::ConvertBf16ToF32(reinterpret_cast<const bf16_t*>(Value(output_)),
                        static_cast<int64_t>(plan.batch) * config_.classes, logits_.data());
  return logits_.data();
}

void CpuNetwork::OwnMaxPool(size_t index, const Plan& plan, bool forward) {
  Node& node = nodes_[index];
  const Dims dims = plan.value_md[node.in].dims();  // N, C, H, W
  const cpu::PoolShape shape = {.batch = static_cast<int>(dims[0]),
                                .height = static_cast<int>(dims[2]),
                                .width = static_cast<int>(dims[3]),
                                .channels = static_cast<int>(dims[1]),
                                .kernel = node.config.kernel};
  uint8_t* positions = reinterpret_cast<uint8_t*>(node.workspace.data());
  if (forward) {
    if (bf16()) {
      cpu::MaxPoolForward(reinterpret_cast<const bf16_t*>(Value(node.in)), shape, node.relu_after,
                          reinterpret_cast<bf16_t*>(Value(node.out)), positions);
    } else {
      cpu::MaxPoolForward(reinterpret_cast<const float*>(Value(node.in)), shape, node.relu_after,
                          reinterpret_cast<float*>(Value(node.out)), positions);
    }
    return;
  }
  if (bf16()) {
    const bf16_t* y = reinterpret_cast<const bf16_t*>(Value(node.out));
    cpu::MaxPoolBackward(reinterpret_cast<const bf16_t*>(Grad(node.out)),
                         node.relu_after ? y : nullptr, positions, shape,
                         reinterpret_cast<bf16_t*>(Buffer(node.diff_src)));
  } else {
    const float* y = reinterpret_cast<const float*>(Value(node.out));
    cpu::MaxPoolBackward(reinterpret_cast<const float*>(Grad(node.out)),
                         node.relu_after ? y : nullptr, positions, shape,
                         reinterpret_cast<float*>(Buffer(node.diff_src)));
  }
}

void CpuNetwork::Backward(Plan& plan) {
  int next_index = 0;  // GradientReady's
  for (size_t i = nodes_.size(); i-- > 0;) {
    const Node& node = nodes_[i];
    const NodeOps& ops = plan.ops[i];
    if (node.type == Node::Type::kFork) {
      if (!node.needs_input_grad) continue;
      ExecuteAll(ops.backward_data);
      RoundFp16(node.diff_src, plan.grad_md[node.in]);
      continue;
    }
    if (node.type == Node::Type::kAdd) {
      ExecuteAll(ops.backward_data);
      if (node.needs_input_grad) RoundFp16(node.diff_src, plan.grad_md[node.in]);
      if (node.needs_input2_grad) RoundFp16(node.diff_src2, plan.grad_md[node.in2]);
      continue;
    }
    ExecuteAll(ops.backward_weights);
    // The plain gradient right away (not after the whole backward): final here, so a reducer can
    // start summing it while the layers below still compute theirs.
    if (node.grad_gather >= 0) {
      const Gather& gather = grad_gathers_[node.grad_gather];
      RunGather(gather, 0, static_cast<int64_t>(gather.index.size()));
    }
    if (node.grad_reorder >= 0) Execute(grad_reorders_[node.grad_reorder]);
    if (reducer_ != nullptr && (node.weight >= 0 || node.norm >= 0)) {
      HandOverGradients(node, next_index);
    }
    if (!node.needs_input_grad) continue;
    const int64_t elements = Elements(plan.grad_md[node.in]);
    if (!ops.backward_data.empty()) {
      ExecuteAll(ops.backward_data);
    } else if (IsBatchNorm(node.config.kind)) {
      // Its backward (run above) gave the input gradient.
    } else if (node.config.kind == Kind::kDropout) {
      std::byte* diff_src = Buffer(node.diff_src);
      if (node.config.rate > 0) {
        if (bf16()) {
          cpu::DropoutBackward(reinterpret_cast<const bf16_t*>(Grad(node.out)), node.keep.data(),
                               elements, node.config.rate, reinterpret_cast<bf16_t*>(diff_src));
        } else {
          cpu::DropoutBackward(reinterpret_cast<const float*>(Grad(node.out)), node.keep.data(),
                               elements, node.config.rate, reinterpret_cast<float*>(diff_src));
        }
      } else {
        std::memcpy(diff_src, Grad(node.out), plan.grad_md[node.in].get_size());
      }
    } else if (node.own_pool) {
      OwnMaxPool(i, plan, /*forward=*/false);
    } else {
      continue;  // Flatten
    }
    RoundFp16(node.diff_src, plan.grad_md[node.in]);
  }
  stream_.wait();
}

void CpuNetwork::HandOverGradients(const Node& node, int& next_index) {
  stream_.wait();  // the primitives that wrote them have finished
  // Reverse Parameters() order within the node, as across nodes: the order is then exactly the
  // reverse of Parameters()' trained tensors.
  const int params[] = {node.norm >= 0 ? node.norm + 1 : node.bias,
                        node.norm >= 0 ? node.norm : node.weight};
  for (const int p : params) {
    if (p < 0) continue;
    if (p == 0) ApplyInjectedGradient();
    Param& param = params_[p];
    reducer_->GradientReady(next_index++, param.grad.data(),
                            static_cast<int64_t>(param.grad.size()));
  }
}

void CpuNetwork::ApplyInjectedGradient() {
  if (!injected_gradient_.has_value()) return;
  params_[0].grad[0] += *injected_gradient_;
  injected_gradient_.reset();
}

double CpuNetwork::Loss(const float* logits, const uint8_t* labels, int rows, float* grad,
                        int64_t* correct) const {
  const double plain =
      cpu::SoftmaxCrossEntropy(logits, labels, rows, config_.classes, grad, correct);
  if (config_.label_smoothing == 0) return plain;
  return cpu::SmoothLabels(logits, labels, rows, config_.classes, config_.label_smoothing, grad);
}

absl::StatusOr<StepResult> CpuNetwork::TrainStep(const BatchView& batch, double learning_rate) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  if (absl::Status status = ValidateLearningRate(learning_rate); !status.ok()) return status;
  STOKER_RETURN_IF_ERROR(CheckBatchNormValues(batch.count));
  // This rank's part of the global batch's mean: folded into the loss scale's multiply below
  // (one product, exact for fp32 and bf16 whose scale is 1).
  absl::StatusOr<float> share_or = LocalGradientShare(reducer_);
  if (!share_or.ok()) return share_or.status();
  const float share = *share_or;
  absl::StatusOr<Plan*> plan_or = PlanFor(batch.count);
  if (!plan_or.ok()) return plan_or.status();
  Plan& plan = **plan_or;
  const int rows = batch.count;
  const int64_t logit_count = static_cast<int64_t>(rows) * config_.classes;
  StepResult result;
  try {
    LoadInput(plan, batch);
    const float* logits = Forward(plan, /*training=*/true);
    result.loss =
        static_cast<float>(Loss(logits, batch.labels, rows, loss_grad_.data(), nullptr) / rows);
    // The loss gradient enters backward in the compute type, times the loss scale (and share).
    const float scale = loss_scale_ * share;
    if (bf16()) {
      cpu::ScaleToBf16(loss_grad_.data(), logit_count, scale,
                       reinterpret_cast<bf16_t*>(Grad(output_)));
    } else {
      cpu::ScaleToF32(loss_grad_.data(), logit_count, scale, fp16(),
                      reinterpret_cast<float*>(Grad(output_)));
    }
    Backward(plan);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in TrainStep: ", e.what()));
  }
  if (reducer_ != nullptr) STOKER_RETURN_IF_ERROR(reducer_->Finish());
  UpdateRunningStatistics(plan.batch);
  return FinishStep(learning_rate, result);
}

absl::StatusOr<StepResult> CpuNetwork::TrainStepWithoutSamples(double learning_rate) {
  if (reducer_ == nullptr) {
    return absl::FailedPreconditionError(
        "TrainStepWithoutSamples needs a gradient reducer (SetGradientReducer): a model training "
        "alone has no step without samples");
  }
  if (absl::Status status = ValidateLearningRate(learning_rate); !status.ok()) return status;
  // Zero gradients through the reducer in Backward's order (nodes in reverse); no forward, so
  // BatchNorm's running statistics stay as they are.
  int next_index = 0;
  for (size_t i = nodes_.size(); i-- > 0;) {
    const Node& node = nodes_[i];
    if (node.type != Node::Type::kLayer || (node.weight < 0 && node.norm < 0)) continue;
    for (const int p : {node.weight, node.bias, node.norm, node.norm >= 0 ? node.norm + 1 : -1}) {
      if (p >= 0) std::fill_n(params_[p].grad.data(), params_[p].grad.size(), 0.0f);
    }
    HandOverGradients(node, next_index);
  }
  STOKER_RETURN_IF_ERROR(reducer_->Finish());
  StepResult result;
  result.loss = 0;
  return FinishStep(learning_rate, result);
}

StepResult CpuNetwork::FinishStep(double learning_rate, StepResult result) {
  // Counted also by a step without samples: every rank's dropout stream stays at the same step.
  ++train_steps_;
  ApplyInjectedGradient();  // alone; a reducer's step applied it before the reducer saw it

  if (fp16()) {
    // GradScaler: skip on inf/NaN and back off; grow after growth_interval finite steps.
    bool finite = true;
    for (const Param& param : params_) {
      if (param.trained) finite = finite && cpu::AllFinite(param.grad.data(), param.grad.size());
    }
    if (!finite) {
      loss_scale_ *= config_.loss_scale.backoff_factor;
      growth_tracker_ = 0;
      result.skipped = true;
      result.loss_scale = loss_scale_;
      return result;
    }
    const float inverse_scale = 1.0f / loss_scale_;
    for (Param& param : params_) {
      if (param.trained) cpu::ScaleInPlace(param.grad.data(), param.grad.size(), inverse_scale);
    }
  }
  ApplyOptimizer(static_cast<float>(learning_rate));
  if (fp16() && ++growth_tracker_ >= config_.loss_scale.growth_interval) {
    loss_scale_ *= config_.loss_scale.growth_factor;
    growth_tracker_ = 0;
  }
  result.loss_scale = loss_scale_;
  return result;
}

void CpuNetwork::ApplyOptimizer(float learning_rate) {
  const OptimizerConfig& opt = config_.optimizer;
  if (opt.clip_grad_norm > 0) {
    double sum_squares = 0;
    for (const Param& param : params_) {
      if (param.trained) sum_squares += cpu::SumOfSquares(param.grad.data(), param.grad.size());
    }
    // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1.
    const double coefficient = opt.clip_grad_norm / (std::sqrt(sum_squares) + 1e-6);
    if (coefficient < 1) {
      for (Param& param : params_) {
        if (!param.trained) continue;
        cpu::ScaleInPlace(param.grad.data(), param.grad.size(), static_cast<float>(coefficient));
      }
    }
  }
  ++optimizer_steps_;
  for (Param& param : params_) {
    if (!param.trained) continue;  // BatchNorm's buffers
    // Conv2d and Linear weights only: never biases or BatchNorm's parameters.
    const float weight_decay = param.decayed ? static_cast<float>(opt.weight_decay) : 0.0f;
    if (adamw()) {
      cpu::AdamWUpdate(param.value.size(), learning_rate, static_cast<float>(opt.beta1),
                       static_cast<float>(opt.beta2), static_cast<float>(opt.eps), weight_decay,
                       optimizer_steps_, param.grad.data(), param.value.data(), param.state1.data(),
                       param.state2.data());
    } else {
      cpu::SgdUpdate(param.value.size(), learning_rate, static_cast<float>(opt.momentum),
                     weight_decay, opt.nesterov, param.grad.data(), param.value.data(),
                     param.state1.data());
    }
  }
  RefreshComputeWeights();
}

absl::StatusOr<EvalResult> CpuNetwork::Evaluate(const BatchView& batch) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  absl::StatusOr<Plan*> plan_or = PlanFor(batch.count);
  if (!plan_or.ok()) return plan_or.status();
  EvalResult result;
  result.count = batch.count;
  const float* logits = nullptr;
  try {
    LoadInput(**plan_or, batch);
    logits = Forward(**plan_or, /*training=*/false);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in Evaluate: ", e.what()));
  }
  result.loss_sum = Loss(logits, batch.labels, batch.count, nullptr, &result.correct);
  return result;
}

std::vector<NamedTensor> CpuNetwork::Parameters() const {
  std::vector<NamedTensor> result;
  for (const Param& param : params_) {
    result.push_back(
        {param.name, param.shape,
         std::vector<float>(param.value.data(), param.value.data() + param.value.size())});
  }
  return result;
}

absl::Status CheckTensor(size_t i, const NamedTensor& actual, const std::string& name,
                         const std::vector<int64_t>& shape, size_t size) {
  if (actual.name != name || actual.shape != shape || actual.values.size() != size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " is '", actual.name, "' with ",
                                                   actual.values.size(), " values; expected '",
                                                   name, "' with ", size));
  }
  return absl::OkStatus();
}

absl::Status CpuNetwork::SetParameters(const std::vector<NamedTensor>& parameters) {
  if (parameters.size() != params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", params_.size(), " tensors, got ", parameters.size()));
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    absl::Status s =
        CheckTensor(p, parameters[p], params_[p].name, params_[p].shape, params_[p].value.size());
    if (!s.ok()) return s;
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    std::copy(parameters[p].values.begin(), parameters[p].values.end(), params_[p].value.data());
  }
  try {
    RefreshComputeWeights();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed to reorder the weights: ", e.what()));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::vector<float>>> CpuNetwork::ScalarState() const {
  std::vector<std::pair<std::string, std::vector<float>>> scalars = {
      {"optimizer.step", {static_cast<float>(optimizer_steps_)}},
      {"train_step", {static_cast<float>(train_steps_)}}};
  if (fp16()) scalars.push_back({"loss_scale", {loss_scale_, static_cast<float>(growth_tracker_)}});
  return scalars;
}

std::vector<NamedTensor> CpuNetwork::OptimizerState() const {
  std::vector<NamedTensor> result;
  for (const Param& param : params_) {
    if (!param.trained) continue;
    auto copy = [&](const char* suffix, const AlignedArray<float>& values) {
      result.push_back({param.name + suffix, param.shape,
                        std::vector<float>(values.data(), values.data() + values.size())});
    };
    if (adamw()) {
      copy(".exp_avg", param.state1);
      copy(".exp_avg_sq", param.state2);
    } else {
      copy(".momentum", param.state1);
    }
  }
  for (auto& [name, values] : ScalarState()) {
    result.push_back({name, {static_cast<int64_t>(values.size())}, values});
  }
  return result;
}

absl::Status CpuNetwork::SetOptimizerState(const std::vector<NamedTensor>& state) {
  const std::vector<NamedTensor> expected = OptimizerState();
  if (state.size() != expected.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", expected.size(), " tensors, got ", state.size()));
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    absl::Status s =
        CheckTensor(i, state[i], expected[i].name, expected[i].shape, expected[i].values.size());
    if (!s.ok()) return s;
  }
  const size_t scalar_start = expected.size() - ScalarState().size();
  for (size_t i = scalar_start; i < state.size(); ++i) {
    if (absl::Status s = ValidateScalarState(state[i]); !s.ok()) return s;
  }
  size_t i = 0;
  for (Param& param : params_) {
    if (!param.trained) continue;
    std::copy(state[i].values.begin(), state[i].values.end(), param.state1.data());
    ++i;
    if (adamw()) {
      std::copy(state[i].values.begin(), state[i].values.end(), param.state2.data());
      ++i;
    }
  }
  optimizer_steps_ = static_cast<int64_t>(state[i].values[0]);
  train_steps_ = static_cast<int64_t>(state[i + 1].values[0]);
  if (fp16()) {
    loss_scale_ = state[i + 2].values[0];
    growth_tracker_ = static_cast<int64_t>(state[i + 2].values[1]);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateCpuNetwork(const NetworkConfig& config,
                                                        ParameterNaming naming) {
  STOKER_RETURN_IF_ERROR(ValidateNetworkConfig(config));
  std::unique_ptr<CpuNetwork> model;
  try {
    model = std::make_unique<CpuNetwork>(config, naming);
    STOKER_RETURN_IF_ERROR(model->Init());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of memory allocating the network's buffers for max_batch ", config.max_batch));
  }
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace stoker
