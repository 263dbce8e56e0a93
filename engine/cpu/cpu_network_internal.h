// Private to the cpu network (cpu_network.h): the model class and the per-node and per-batch-size
// structures its four source files share.
//   cpu_network.cc         creation, the step (input, forward, backward, optimizer), Evaluate
//   cpu_network_plan.cc    activation layouts, each batch size's plan, weight layout changes
//   cpu_network_layers.cc  the primitives of each layer kind within a plan
//   cpu_network_state.cc   parameters and optimizer state to and from the host
#ifndef STOKER_ENGINE_CPU_CPU_NETWORK_INTERNAL_H_
#define STOKER_ENGINE_CPU_CPU_NETWORK_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend_helpers.h"
#include "engine/bf16.h"
#include "engine/cpu/aligned_array.h"
#include "engine/cpu/cpu_kernels.h"
#include "engine/cpu/cpu_train_kernels.h"
#include "engine/model.h"
#include "engine/model_base.h"
#include "engine/network_graph.h"
#include "engine/plan_cache.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace stoker::cpu_network_internal {

using dnnl::memory;
using DataType = memory::data_type;
using Tag = memory::format_tag;
using Kind = LayerConfig::Kind;
using Dims = memory::dims;

// Plans kept besides the full-batch one; a new batch size beyond this evicts the oldest.
inline constexpr size_t kMaxPartialPlans = 3;

// Weight tensors up to this many values change layout by a Gather (its index: 4 bytes a value);
// larger ones by oneDNN's parallel, vectorised reorder, whose cost their size then repays. (At
// 1 << 20 the example CNN's 802,816-value first linear layer was gathered value by value: 18.5 %
// of its bf16 step; every ResNet-20 tensor is below 1 << 16.)
inline constexpr int64_t kMaxGatherValues = int64_t{1} << 16;

// bf16 convolutions with at most this many output pixels (7x7) compute their weight gradient in
// f32 when oneDNN's bf16 kernel for it is the AMX one (Node::f32_weight_grad).
inline constexpr int64_t kMaxF32WeightGradPixels = 49;

// Values in a plain (non-padded) descriptor of f32 or bf16.
inline int64_t Elements(const memory::desc& md) {
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
inline void RunGather(const Gather& g, int64_t begin, int64_t end) {
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

using Activation = GraphActivation;

// A node of the network graph (network_graph.h) with what the cpu keeps for it.
struct Node : GraphNode {
  explicit Node(GraphNode node) : GraphNode(std::move(node)) {}
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
  AlignedArray<std::byte> workspace;    // MaxPool2d
  AlignedArray<uint8_t> keep;           // Dropout mask
  AlignedArray<float> mean, variance;   // BatchNorm: the last training batch's statistics
  // bf16 BatchNorm that oneDNN has no jit kernel for (channels not a multiple of 16): its
  // evaluation runs in f32 on copies of the input (`norm_src`) and output (`norm_dst`)
  // (PlanBatchNorm).
  AlignedArray<float> norm_src, norm_dst;
  // BatchNorm: training forward and backward by cpu::BatchNormForward/Backward (OwnBatchNorm)
  // with `norm_work` as their scratch; oneDNN's primitive for evaluation only.
  AlignedArray<double> norm_work;
  // A residual block's sum fused into the BatchNorm that makes one of its inputs (FuseNormAdds,
  // training only): the BatchNorm's `sum_node` is the kAdd node whose output (after its ReLU, if
  // any) it writes, adding the other input; that kAdd's `sum_in_norm` skips its own forward, and
  // with a ReLU its backward too (the BatchNorm's backward masks the gradient and hands it to
  // both inputs).
  // Evaluation runs them apart (oneDNN's BatchNorm, then the sum).
  int sum_node = -1;
  bool sum_in_norm = false;
  // A kAdd whose backward (its ReLU's and the copy to both inputs) the fused BatchNorm's
  // backward does: a fused sum with a ReLU. Without one the sum's backward is its own.
  bool BackwardInNorm() const {
    return sum_in_norm && config.activation == LayerConfig::Activation::kRelu;
  }
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
inline void* Bind(AlignedArray<std::byte>& buffer, void* fallback) {
  return buffer.size() > 0 ? static_cast<void*>(buffer.data()) : fallback;
}

// An NHWC activation of 16 channels described as nChw16c: the same bytes at the same offsets.
inline memory::desc SixteenChannelView(const memory::desc& nhwc) {
  return memory::desc(nhwc.dims(), nhwc.data_type(), Tag::aBcd16b);
}

// How a primitive sees an activation: `view` where one was chosen (not zero), else `md` itself.
inline const memory::desc& ViewOr(const memory::desc& view, const memory::desc& md) {
  return view.is_zero() ? md : view;
}

// The Model of cpu_network.h (see there for the layout and the step).
class CpuNetwork final : public ModelBase {
 public:
  CpuNetwork(const NetworkConfig& config, ParameterNaming naming);

  // Builds the full-batch plan and the weight reorders, and loads the initial weights.
  absl::Status Init();

  STOKER_MODEL_OVERRIDES;
  int MinTrainBatch() const override { return CheckBatchNormValues(1).ok() ? 1 : 2; }
  // cpu_network_timing.cc
  absl::StatusOr<std::vector<KernelTime>> TimeKernels(int batch, int runs) override;

 private:
  absl::StatusOr<StepResult> StepWithoutSamples(double learning_rate) override;
  bool bf16() const { return config_.precision == Precision::kBf16; }
  bool fp16() const { return config_.precision == Precision::kFp16; }
  DataType ComputeType() const { return bf16() ? DataType::bf16 : DataType::f32; }
  bool adamw() const { return config_.optimizer.type == OptimizerType::kAdamW; }

  // A buffer beyond the graph's (FuseRelus' masked gradients).
  int NewBuffer();
  // What the cpu keeps besides the graph's node: its own max pool, BatchNorm's batch statistics,
  // a Dropout's mask.
  Node CpuNode(GraphNode graph_node) const;
  // Folds each ReLU that directly follows a BatchNorm into it (oneDNN's fuse_norm_relu: one pass
  // less each way, the mask kept as a bit workspace), else each ReLU directly followed by a
  // MaxPool2d into the pool (relu(maxpool(x)) = maxpool(relu(x)) exactly, with the same argmax
  // wherever the gradient is not zero): the ReLU then runs on a quarter of the values, as a
  // post-op forward and on the pooled gradient backward. fp16 keeps BatchNorm's ReLU apart: the
  // mask must come from the output rounded to fp16, as PyTorch's would.
  void FuseRelus();

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
  // Marks the BatchNorm + residual sum pairs (Node::sum_node) after FuseRelus.
  void FuseNormAdds();
  // Training forward or backward of a BatchNorm, at the plan's batch size.
  void OwnBatchNorm(size_t index, const Plan& plan, bool forward);
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
};

}  // namespace stoker::cpu_network_internal

#endif  // STOKER_ENGINE_CPU_CPU_NETWORK_INTERNAL_H_
