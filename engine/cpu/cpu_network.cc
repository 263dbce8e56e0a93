#include "engine/cpu/cpu_network.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Values in a plain (non-padded) descriptor of f32 or bf16.
int64_t Elements(const memory::desc& md) {
  return static_cast<int64_t>(md.get_size()) / (md.data_type() == DataType::bf16 ? 2 : 4);
}

// A primitive with its arguments bound once.
struct Op {
  dnnl::primitive primitive;
  std::unordered_map<int, memory> args;
};

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  bool is_weight = false;  // weight decay applies to weights only
  AlignedArray<float> value;
  AlignedArray<float> grad;
  AlignedArray<float> state1;  // SGD momentum or AdamW exp_avg
  AlignedArray<float> state2;  // AdamW exp_avg_sq
};

// The memory of one activation and its gradient; Flatten's output shares its input's.
struct Storage {
  AlignedArray<std::byte> value;
  AlignedArray<std::byte> grad;
};

struct Layer {
  LayerConfig config;
  std::vector<int> in_shape;
  int in_storage = 0;
  int out_storage = 0;
  int stride = 1;
  int weight = -1;  // index in params_, Conv2d and Linear only
  int bias = -1;
  // A parameterised layer comes before this one: its input gradient is needed.
  bool needs_input_grad = false;
  // Conv2d / Linear: the layouts oneDNN chose at the full batch (partial plans reuse them).
  memory::desc weight_plain_md;  // f32, PyTorch's layout
  memory::desc weight_fwd_md;    // compute type
  memory::desc weight_bwd_md;    // compute type, for backward data
  memory::desc diff_weight_md;   // f32
  // The weight copies the primitives read (empty when they read the master directly).
  AlignedArray<std::byte> weight_fwd;
  AlignedArray<std::byte> weight_bwd;
  AlignedArray<std::byte> diff_weight;  // empty when backward writes the plain gradient directly
  AlignedArray<std::byte> workspace;    // MaxPool2d
  AlignedArray<uint8_t> keep;           // Dropout mask
};

struct Plan {
  int batch = 0;
  std::vector<memory::desc> value_md;  // per activation: 0 = input, i + 1 = layers[i]'s output
  std::vector<memory::desc> grad_md;
  std::vector<std::optional<Op>> forward;  // per layer; none for Flatten and Dropout
  std::vector<std::optional<Op>> backward_data;
  std::vector<std::optional<Op>> backward_weights;
  AlignedArray<std::byte> scratchpad;
};

// One layer's view of a plan being built: its activations' descriptors and buffers at the plan's
// batch size.
struct LayerIo {
  size_t index = 0;   // in NetworkConfig::layers
  bool full = false;  // the full-batch plan, which fixes the layouts later plans reuse
  memory::desc src, dst, diff_src, diff_dst;
  void* src_ptr = nullptr;
  void* dst_ptr = nullptr;
  void* diff_src_ptr = nullptr;  // null for the first layer: no input gradient
  void* diff_dst_ptr = nullptr;
};

// A primitive waiting for its arguments: bound once every layer is described, so one scratchpad
// sized for the largest can be shared (the primitives run in turn).
struct PendingOp {
  dnnl::primitive primitive;
  memory::desc scratchpad;
  std::unordered_map<int, std::pair<memory::desc, void*>> args;
  std::optional<Op>* slot;
};

// `buffer` when it holds a copy, else `fallback` (the primitive reads the master directly).
void* Bind(AlignedArray<std::byte>& buffer, void* fallback) {
  return buffer.size() > 0 ? static_cast<void*>(buffer.data()) : fallback;
}

class CpuNetwork final : public Model {
 public:
  CpuNetwork(const NetworkConfig& config, std::vector<std::vector<int>> shapes,
             ParameterNaming naming);

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

 private:
  bool bf16() const { return config_.precision == Precision::kBf16; }
  bool fp16() const { return config_.precision == Precision::kFp16; }
  DataType ComputeType() const { return bf16() ? DataType::bf16 : DataType::f32; }
  bool adamw() const { return config_.optimizer.type == OptimizerType::kAdamW; }

  memory::desc ActivationMd(size_t index, int batch, DataType type) const;
  // The primitives of every layer at `batch`, bound to this model's buffers. BuildPlan dispatches
  // on the layer kind; the Plan* functions below each add one kind's primitives to `pending`.
  absl::StatusOr<std::unique_ptr<Plan>> BuildPlan(int batch);
  // A Conv2d's or Linear's primitives (backward_data only when the layer needs its input
  // gradient), with their scratchpads.
  struct WeightedPrimitives {
    dnnl::primitive forward, backward_data, backward_weights;
    memory::desc forward_scratch, data_scratch, weights_scratch;
    memory::desc bias;
  };
  // The descriptors a Conv2d's or Linear's primitives are described with; the full-batch plan
  // also fixes layer.weight_plain_md.
  struct WeightDescs {
    memory::desc any_weights, any_diff_weights, bias;
  };
  WeightDescs DescribeWeights(Layer& layer, const LayerIo& io) const;
  WeightedPrimitives PlanConv2d(Layer& layer, const LayerIo& io, const dnnl::primitive_attr& attr);
  WeightedPrimitives PlanLinear(Layer& layer, const LayerIo& io, const dnnl::primitive_attr& attr);
  // Binds a Conv2d's or Linear's primitives to the input, output, weights and gradients.
  void PlanWeightedLayer(Layer& layer, const LayerIo& io, const WeightedPrimitives& primitives,
                         Plan& plan, std::vector<PendingOp>& pending);
  // ReLU and GELU.
  void PlanEltwise(const Layer& layer, const LayerIo& io, const dnnl::primitive_attr& attr,
                   Plan& plan, std::vector<PendingOp>& pending);
  // INTERNAL if a partial batch would need a larger workspace than the full batch allocated.
  absl::Status PlanMaxPool2d(Layer& layer, const LayerIo& io, const dnnl::primitive_attr& attr,
                             Plan& plan, std::vector<PendingOp>& pending);
  // Sizes the shared scratchpad and binds every pending primitive into its plan slot.
  void BindPlan(Plan& plan, std::vector<PendingOp>& pending);
  absl::StatusOr<Plan*> PlanFor(int batch);
  void BuildWeightReorders();
  void RefreshComputeWeights();
  void LoadInput(const BatchView& batch);
  // Forward through every layer; dropout only when training. Returns the f32 logits.
  const float* Forward(Plan& plan, bool training);
  void Backward(Plan& plan);
  void Execute(const Op& op) { op.primitive.execute(stream_, op.args); }
  // Gradient norm clipping, then the optimizer on every parameter.
  void ApplyOptimizer(float learning_rate);

  std::byte* Value(size_t tensor) { return storage_[storage_index_[tensor]].value.data(); }
  std::byte* Grad(size_t tensor) { return storage_[storage_index_[tensor]].grad.data(); }

  // Optimizer state that is not per parameter: counters (exact in float up to 2^24) and fp16's
  // loss scale.
  std::vector<std::pair<std::string, std::vector<float>>> ScalarState() const;

  const NetworkConfig config_;
  const ChannelNormalization normalization_;    // of uint8 samples, per channel
  const std::vector<std::vector<int>> shapes_;  // per activation, without the batch
  const ParameterNaming naming_;
  // NHWC: oneDNN 2.6 runs NCHW convolutions as im2col + GEMM here; with NHWC it picks its
  // direct/brgemm kernels, 2.3x faster for bf16 and 1.5x for fp32 on the Fashion-MNIST CNN.
  const Tag activation_tag_ = Tag::nhwc;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<Layer> layers_;
  std::vector<Param> params_;
  std::vector<Storage> storage_;
  std::vector<int> storage_index_;   // per activation
  AlignedArray<float> logits_;       // [max_batch, classes] when the last activation is not f32
  AlignedArray<float> loss_grad_;    // [max_batch, classes]
  std::vector<Op> weight_reorders_;  // master -> compute copies, after every update
  std::vector<Op> grad_reorders_;    // oneDNN's diff weights -> plain gradients, after backward
  std::unique_ptr<Plan> full_plan_;
  PartialPlanCache<Plan> partial_plans_{kMaxPartialPlans};

  int64_t optimizer_steps_ = 0;  // applied updates (AdamW's bias-correction step)
  int64_t train_steps_ = 0;      // TrainStep calls that ran (dropout's mask stream)
  float loss_scale_ = 1;
  int64_t growth_tracker_ = 0;  // consecutive finite steps since the last scale change
  std::optional<float> injected_gradient_;
};

CpuNetwork::CpuNetwork(const NetworkConfig& config, std::vector<std::vector<int>> shapes,
                       ParameterNaming naming)
    : config_(config),
      normalization_(InputNormalization(config)),
      shapes_(std::move(shapes)),
      naming_(naming),
      engine_(dnnl::engine::kind::cpu, 0),
      stream_(engine_),
      loss_scale_(config.precision == Precision::kFp16 ? config.loss_scale.initial : 1.0f) {
  const int64_t max_batch = config.max_batch;
  // Parameters, named as InitialNetworkParameters names them under `naming`.
  std::vector<NamedTensor> initial = InitialNetworkParameters(config, naming);
  for (size_t p = 0; p < initial.size(); ++p) {
    Param param;
    param.name = initial[p].name;
    param.shape = initial[p].shape;
    param.is_weight = p % 2 == 0;
    const size_t size = initial[p].values.size();
    param.value = AlignedArray<float>(size);
    param.grad = AlignedArray<float>(size);
    param.state1 = AlignedArray<float>(size);
    if (adamw()) param.state2 = AlignedArray<float>(size);
    params_.push_back(std::move(param));
  }
  bool seen_parameters = false;
  int next_param = 0;
  storage_index_.push_back(0);
  storage_.emplace_back();
  for (size_t i = 0; i < config.layers.size(); ++i) {
    Layer layer;
    layer.config = config.layers[i];
    layer.in_shape = shapes_[i];
    layer.in_storage = storage_index_.back();
    layer.needs_input_grad = seen_parameters;
    const Kind kind = layer.config.kind;
    layer.stride = EffectiveStride(layer.config);
    if (LayerHasParameters(kind)) {
      layer.weight = next_param++;
      layer.bias = next_param++;
      seen_parameters = true;
    }
    if (kind == Kind::kFlatten) {
      layer.out_storage = layer.in_storage;
    } else {
      layer.out_storage = static_cast<int>(storage_.size());
      storage_.emplace_back();
    }
    storage_index_.push_back(layer.out_storage);
    if (kind == Kind::kDropout) {
      int64_t size = max_batch;
      for (int d : layer.in_shape) size *= d;
      layer.keep = AlignedArray<uint8_t>(size);
    }
    layers_.push_back(std::move(layer));
  }
  const size_t logits = static_cast<size_t>(max_batch) * config.classes;
  loss_grad_ = AlignedArray<float>(logits);
  logits_ = AlignedArray<float>(logits);
}

memory::desc CpuNetwork::ActivationMd(size_t index, int batch, DataType type) const {
  // Laid out as its LayoutOrigin (oneDNN's elementwise primitives write in their source's layout,
  // and Flatten is an alias): NHWC for images a layer made, the caller's NCHW for the network
  // input. A Linear reads a [N, C, H, W] input with [out, C, H, W] weights, which is PyTorch's
  // flattened order.
  const size_t origin = LayoutOrigin(config_, index);
  const std::vector<int>& shape = shapes_[origin];
  if (shape.size() == 3) {
    // The input arrives as C, H, W per sample: NHWC only when that is the same memory (C = 1).
    const Tag tag = origin == 0 && shape[0] > 1 ? Tag::nchw : activation_tag_;
    return memory::desc({batch, shape[0], shape[1], shape[2]}, type, tag);
  }
  return memory::desc({batch, shape[0]}, type, Tag::nc);
}

absl::Status CpuNetwork::Init() {
  absl::StatusOr<std::unique_ptr<Plan>> plan = BuildPlan(config_.max_batch);
  if (!plan.ok()) return plan.status();
  full_plan_ = *std::move(plan);
  // Activation storage, sized by the full plan's descriptors.
  for (size_t t = 0; t < storage_index_.size(); ++t) {
    Storage& storage = storage_[storage_index_[t]];
    if (storage.value.size() == 0) {
      storage.value = AlignedArray<std::byte>(full_plan_->value_md[t].get_size());
    }
    if (t > 0 && storage.grad.size() == 0) {
      storage.grad = AlignedArray<std::byte>(full_plan_->grad_md[t].get_size());
    }
  }
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
  const size_t count = layers_.size();
  for (size_t t = 0; t <= count; ++t) {
    // Logits straight from a final Linear are f32; every other activation is in the compute type.
    const bool f32_logits = t == count && layers_.back().config.kind == Kind::kLinear;
    plan->value_md.push_back(ActivationMd(t, batch, f32_logits ? DataType::f32 : compute));
    plan->grad_md.push_back(ActivationMd(t, batch, compute));
  }
  plan->forward.resize(count);
  plan->backward_data.resize(count);
  plan->backward_weights.resize(count);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // Descriptors first, so one scratchpad sized for the largest can be shared (they run in turn).
  std::vector<PendingOp> pending;
  try {
    for (size_t i = 0; i < count; ++i) {
      Layer& layer = layers_[i];
      const LayerIo io = {
          .index = i,
          .full = full,
          .src = plan->value_md[i],
          .dst = plan->value_md[i + 1],
          .diff_src = plan->grad_md[i],
          .diff_dst = plan->grad_md[i + 1],
          .src_ptr = Value(i),
          .dst_ptr = Value(i + 1),
          .diff_src_ptr = i > 0 ? static_cast<void*>(Grad(i)) : nullptr,
          .diff_dst_ptr = Grad(i + 1),
      };
      switch (layer.config.kind) {
        case Kind::kConv2d:
          PlanWeightedLayer(layer, io, PlanConv2d(layer, io, attr), *plan, pending);
          break;
        case Kind::kLinear:
          PlanWeightedLayer(layer, io, PlanLinear(layer, io, attr), *plan, pending);
          break;
        case Kind::kRelu:
        case Kind::kGelu:
          PlanEltwise(layer, io, attr, *plan, pending);
          break;
        case Kind::kMaxPool2d:
          STOKER_RETURN_IF_ERROR(PlanMaxPool2d(layer, io, attr, *plan, pending));
          break;
        case Kind::kDropout:
        case Kind::kFlatten:
          break;  // no primitive: Dropout is a loop, Flatten an alias
      }
    }
    BindPlan(*plan, pending);
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN could not build the ", PrecisionName(config_.precision),
                     " network primitives for batch ", batch, ": ", e.what()));
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
  dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(
          dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, io.src,
          io.full ? w.any_weights : layer.weight_fwd_md, w.bias, io.dst, strides, padding, padding),
      attr, engine_);
  dnnl::convolution_backward_weights::primitive_desc bwd_w(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, io.src,
                                               io.full ? w.any_diff_weights : layer.diff_weight_md,
                                               w.bias, io.diff_dst, strides, padding, padding),
      attr, engine_, fwd);
  if (io.full) {
    layer.weight_fwd_md = fwd.weights_desc();
    layer.diff_weight_md = bwd_w.diff_weights_desc();
  }
  result.forward = dnnl::convolution_forward(fwd);
  result.forward_scratch = fwd.scratchpad_desc();
  result.backward_weights = dnnl::convolution_backward_weights(bwd_w);
  result.weights_scratch = bwd_w.scratchpad_desc();
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
          .bias = memory::desc({out}, DataType::f32, Tag::x)};
}

void CpuNetwork::PlanWeightedLayer(Layer& layer, const LayerIo& io,
                                   const WeightedPrimitives& primitives, Plan& plan,
                                   std::vector<PendingOp>& pending) {
  Param& weight = params_[layer.weight];
  Param& bias = params_[layer.bias];
  const memory::desc& bias_md = primitives.bias;
  void* master = weight.value.data();
  void* fwd_weights = Bind(layer.weight_fwd, master);
  void* bwd_weights =
      layer.weight_bwd_md == layer.weight_fwd_md ? fwd_weights : Bind(layer.weight_bwd, master);
  pending.push_back({primitives.forward,
                     primitives.forward_scratch,
                     {{DNNL_ARG_SRC, {io.src, io.src_ptr}},
                      {DNNL_ARG_WEIGHTS, {layer.weight_fwd_md, fwd_weights}},
                      {DNNL_ARG_BIAS, {bias_md, bias.value.data()}},
                      {DNNL_ARG_DST, {io.dst, io.dst_ptr}}},
                     &plan.forward[io.index]});
  pending.push_back({primitives.backward_weights,
                     primitives.weights_scratch,
                     {{DNNL_ARG_SRC, {io.src, io.src_ptr}},
                      {DNNL_ARG_DIFF_DST, {io.diff_dst, io.diff_dst_ptr}},
                      {DNNL_ARG_DIFF_WEIGHTS,
                       {layer.diff_weight_md, Bind(layer.diff_weight, weight.grad.data())}},
                      {DNNL_ARG_DIFF_BIAS, {bias_md, bias.grad.data()}}},
                     &plan.backward_weights[io.index]});
  if (layer.needs_input_grad) {
    pending.push_back({primitives.backward_data,
                       primitives.data_scratch,
                       {{DNNL_ARG_DIFF_DST, {io.diff_dst, io.diff_dst_ptr}},
                        {DNNL_ARG_WEIGHTS, {layer.weight_bwd_md, bwd_weights}},
                        {DNNL_ARG_DIFF_SRC, {io.diff_src, io.diff_src_ptr}}},
                       &plan.backward_data[io.index]});
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
                     &plan.forward[io.index]});
  if (layer.needs_input_grad) {
    dnnl::eltwise_backward::primitive_desc bwd(
        dnnl::eltwise_backward::desc(algorithm, io.diff_dst, io.src, 0.f, 0.f), attr, engine_, fwd);
    pending.push_back({dnnl::eltwise_backward(bwd),
                       bwd.scratchpad_desc(),
                       {{DNNL_ARG_SRC, {io.src, io.src_ptr}},
                        {DNNL_ARG_DIFF_DST, {io.diff_dst, io.diff_dst_ptr}},
                        {DNNL_ARG_DIFF_SRC, {io.diff_src, io.diff_src_ptr}}},
                       &plan.backward_data[io.index]});
  }
}

absl::Status CpuNetwork::PlanMaxPool2d(Layer& layer, const LayerIo& io,
                                       const dnnl::primitive_attr& attr, Plan& plan,
                                       std::vector<PendingOp>& pending) {
  const LayerConfig& c = layer.config;
  const Dims strides = {layer.stride, layer.stride};
  const Dims kernel = {c.kernel, c.kernel};
  const Dims padding = {c.padding, c.padding};
  dnnl::pooling_forward::primitive_desc fwd(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max,
                                  io.src, io.dst, strides, kernel, padding, padding),
      attr, engine_);
  if (io.full) layer.workspace = AlignedArray<std::byte>(fwd.workspace_desc().get_size());
  const memory::desc workspace = fwd.workspace_desc();
  if (workspace.get_size() > layer.workspace.size()) {
    return absl::InternalError("pooling workspace larger than at the full batch");
  }
  pending.push_back({dnnl::pooling_forward(fwd),
                     fwd.scratchpad_desc(),
                     {{DNNL_ARG_SRC, {io.src, io.src_ptr}},
                      {DNNL_ARG_DST, {io.dst, io.dst_ptr}},
                      {DNNL_ARG_WORKSPACE, {workspace, layer.workspace.data()}}},
                     &plan.forward[io.index]});
  if (layer.needs_input_grad) {
    dnnl::pooling_backward::primitive_desc bwd(
        dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, io.diff_src, io.diff_dst,
                                     strides, kernel, padding, padding),
        attr, engine_, fwd);
    pending.push_back({dnnl::pooling_backward(bwd),
                       bwd.scratchpad_desc(),
                       {{DNNL_ARG_DIFF_DST, {io.diff_dst, io.diff_dst_ptr}},
                        {DNNL_ARG_DIFF_SRC, {io.diff_src, io.diff_src_ptr}},
                        {DNNL_ARG_WORKSPACE, {workspace, layer.workspace.data()}}},
                       &plan.backward_data[io.index]});
  }
  return absl::OkStatus();
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
    *p.slot = std::move(op);
  }
}

void CpuNetwork::BuildWeightReorders() {
  for (Layer& layer : layers_) {
    if (layer.weight < 0) continue;
    Param& weight = params_[layer.weight];
    memory master(layer.weight_plain_md, engine_, weight.value.data());
    // A copy is needed unless the primitive reads the f32 master as it is (fp16 rounds its copy).
    auto add_copy = [&](const memory::desc& md, AlignedArray<std::byte>& buffer) {
      if (md == layer.weight_plain_md && !fp16()) return;
      buffer = AlignedArray<std::byte>(md.get_size());
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
      memory diff(layer.diff_weight_md, engine_, layer.diff_weight.data());
      memory plain(layer.weight_plain_md, engine_, weight.grad.data());
      grad_reorders_.push_back(
          {dnnl::reorder(diff, plain), {{DNNL_ARG_FROM, diff}, {DNNL_ARG_TO, plain}}});
    }
  }
}

void CpuNetwork::RefreshComputeWeights() {
  for (const Op& op : weight_reorders_) {
    Execute(op);
    if (fp16()) {
      const memory& copy = op.args.at(DNNL_ARG_TO);
      cpu::RoundToFp16InPlace(static_cast<float*>(copy.get_data_handle()),
                              copy.get_desc().get_size() / sizeof(float));
    }
  }
  stream_.wait();
}

absl::StatusOr<Plan*> CpuNetwork::PlanFor(int batch) {
  return partial_plans_.Get(full_plan_.get(), batch, [this](int size) { return BuildPlan(size); });
}

void CpuNetwork::LoadInput(const BatchView& batch) {
  int64_t n = batch.count;
  for (int d : config_.input_shape) n *= d;
  std::byte* input = Value(0);
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
}

const float* CpuNetwork::Forward(Plan& plan, bool training) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    const int64_t elements = Elements(plan.value_md[i + 1]);
    if (plan.forward[i]) {
      Execute(*plan.forward[i]);
    } else if (layer.config.kind == Kind::kDropout) {
      if (training && layer.config.rate > 0) {
        const uint64_t stream = static_cast<uint64_t>(train_steps_) * 4096 + i;
        if (bf16()) {
          cpu::DropoutForward(reinterpret_cast<const bf16_t*>(Value(i)), elements,
                              layer.config.rate, config_.seed, stream, layer.keep.data(),
                              reinterpret_cast<bf16_t*>(Value(i + 1)));
        } else {
          cpu::DropoutForward(reinterpret_cast<const float*>(Value(i)), elements, layer.config.rate,
                              config_.seed, stream, layer.keep.data(),
                              reinterpret_cast<float*>(Value(i + 1)));
        }
      } else {
        std::memcpy(Value(i + 1), Value(i), plan.value_md[i + 1].get_size());
      }
    } else {
      continue;  // Flatten
    }
    if (fp16()) cpu::RoundToFp16InPlace(reinterpret_cast<float*>(Value(i + 1)), elements);
  }
  stream_.wait();
  const size_t last = layers_.size();
  if (plan.value_md[last].data_type() == DataType::f32) {
    return reinterpret_cast<const float*>(Value(last));
  }
  cpu::ConvertBf16ToF32(reinterpret_cast<const bf16_t*>(Value(last)),
                        static_cast<int64_t>(plan.batch) * config_.classes, logits_.data());
  return logits_.data();
}

void CpuNetwork::Backward(Plan& plan) {
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& layer = layers_[i];
    if (plan.backward_weights[i]) Execute(*plan.backward_weights[i]);
    if (!layer.needs_input_grad) continue;
    const int64_t elements = Elements(plan.grad_md[i]);
    if (plan.backward_data[i]) {
      Execute(*plan.backward_data[i]);
    } else if (layer.config.kind == Kind::kDropout) {
      if (layer.config.rate > 0) {
        if (bf16()) {
          cpu::DropoutBackward(reinterpret_cast<const bf16_t*>(Grad(i + 1)), layer.keep.data(),
                               elements, layer.config.rate, reinterpret_cast<bf16_t*>(Grad(i)));
        } else {
          cpu::DropoutBackward(reinterpret_cast<const float*>(Grad(i + 1)), layer.keep.data(),
                               elements, layer.config.rate, reinterpret_cast<float*>(Grad(i)));
        }
      } else {
        std::memcpy(Grad(i), Grad(i + 1), plan.grad_md[i].get_size());
      }
    } else {
      continue;  // Flatten
    }
    if (fp16()) cpu::RoundToFp16InPlace(reinterpret_cast<float*>(Grad(i)), elements);
  }
  for (const Op& op : grad_reorders_) Execute(op);
  stream_.wait();
}

absl::StatusOr<StepResult> CpuNetwork::TrainStep(const BatchView& batch, double learning_rate) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  if (absl::Status status = ValidateLearningRate(learning_rate); !status.ok()) return status;
  absl::StatusOr<Plan*> plan_or = PlanFor(batch.count);
  if (!plan_or.ok()) return plan_or.status();
  Plan& plan = **plan_or;
  const int rows = batch.count;
  const int64_t logit_count = static_cast<int64_t>(rows) * config_.classes;
  StepResult result;
  try {
    LoadInput(batch);
    const float* logits = Forward(plan, /*training=*/true);
    result.loss =
        static_cast<float>(cpu::SoftmaxCrossEntropy(logits, batch.labels, rows, config_.classes,
                                                    loss_grad_.data(), nullptr) /
                           rows);
    // The loss gradient enters backward in the compute type, times the loss scale.
    const size_t last = layers_.size();
    if (bf16()) {
      cpu::ScaleToBf16(loss_grad_.data(), logit_count, loss_scale_,
                       reinterpret_cast<bf16_t*>(Grad(last)));
    } else {
      cpu::ScaleToF32(loss_grad_.data(), logit_count, loss_scale_, fp16(),
                      reinterpret_cast<float*>(Grad(last)));
    }
    Backward(plan);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in TrainStep: ", e.what()));
  }
  ++train_steps_;
  if (injected_gradient_.has_value()) {
    params_[0].grad[0] += *injected_gradient_;
    injected_gradient_.reset();
  }

  if (fp16()) {
    // GradScaler: skip on inf/NaN and back off; grow after growth_interval finite steps.
    bool finite = true;
    for (const Param& param : params_) {
      finite = finite && cpu::AllFinite(param.grad.data(), param.grad.size());
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
      cpu::ScaleInPlace(param.grad.data(), param.grad.size(), inverse_scale);
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
      sum_squares += cpu::SumOfSquares(param.grad.data(), param.grad.size());
    }
    // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1.
    const double coefficient = opt.clip_grad_norm / (std::sqrt(sum_squares) + 1e-6);
    if (coefficient < 1) {
      for (Param& param : params_) {
        cpu::ScaleInPlace(param.grad.data(), param.grad.size(), static_cast<float>(coefficient));
      }
    }
  }
  ++optimizer_steps_;
  for (Param& param : params_) {
    const float weight_decay = param.is_weight ? static_cast<float>(opt.weight_decay) : 0.0f;
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
    LoadInput(batch);
    logits = Forward(**plan_or, /*training=*/false);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in Evaluate: ", e.what()));
  }
  result.loss_sum = cpu::SoftmaxCrossEntropy(logits, batch.labels, batch.count, config_.classes,
                                             nullptr, &result.correct);
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
  STOKER_ASSIGN_OR_RETURN(std::vector<std::vector<int>> shapes, NetworkShapes(config));
  std::unique_ptr<CpuNetwork> model;
  try {
    model = std::make_unique<CpuNetwork>(config, std::move(shapes), naming);
    STOKER_RETURN_IF_ERROR(model->Init());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of memory allocating the network's buffers for max_batch ", config.max_batch));
  }
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace stoker
