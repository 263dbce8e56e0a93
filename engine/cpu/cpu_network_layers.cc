// The primitives of each layer kind within a cpu network plan (CpuNetwork::BuildPlan dispatches
// here): Conv2d and Linear, ReLU and GELU, the pools, BatchNorm, a residual block's add and fork.
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
#include "engine/cpu/cpu_kernels.h"
#include "engine/cpu/cpu_network_internal.h"
#include "engine/cpu/cpu_train_kernels.h"
#include "engine/layer_kinds.h"

namespace stoker::cpu_network_internal {

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
  if (c.kind == Kind::kBatchNorm1d) {
    data = memory::desc({batch, io.src.dims()[1], 1, 1}, io.src.data_type(), Tag::nhwc);
  }
  // Training runs Stoker's own kernels (OwnBatchNorm), with this scratch; only evaluation, which
  // normalises by the running statistics, is oneDNN's primitive.
  if (io.full) {
    const Dims dims = data.dims();
    layer.norm_work = AlignedArray<double>(cpu::NormWorkDoubles(
        {.rows = dims[0] * dims[2] * dims[3], .channels = static_cast<int>(dims[1])}));
  }
  const memory::desc channel_md({static_cast<memory::dim>(layer.mean.size())}, DataType::f32,
                                Tag::x);
  auto param = [&](int offset) {
    return std::make_pair(channel_md,
                          static_cast<void*>(params_[layer.norm + offset].value.data()));
  };
  auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift |
               dnnl::normalization_flags::use_global_stats;
  if (layer.fuse_relu) flags = flags | dnnl::normalization_flags::fuse_norm_relu;
  auto eval_desc = [&](const memory::desc& md) {
    return dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_inference, md, c.eps,
                                                flags),
        attr, engine_);
  };
  dnnl::batch_normalization_forward::primitive_desc eval = eval_desc(data);
  // oneDNN 2.6's bf16 batch normalisation has jit kernels only for channels in multiples of 16;
  // otherwise it picks a generic loop (nspc_bnorm:any) that converts every value on its own, ~50x
  // slower than the f32 jit kernel (docs/profile-vision.md). Such a layer converts to f32, runs
  // the f32 kernel and converts back: the same f32 arithmetic, rounded to bf16 where the bf16
  // primitive rounds.
  const bool via_f32 = data.data_type() == DataType::bf16 &&
                       std::string(eval.impl_info_str()).find("jit") == std::string::npos;
  void* src_ptr = io.src_ptr;
  void* dst_ptr = io.dst_ptr;
  const memory::desc bf16_data = data;
  // A conversion between the bf16 activation and its f32 copy, added to evaluation's ops.
  std::vector<Op>* slot = &plan.ops[io.index].eval;
  auto convert = [&](const memory::desc& from, void* from_ptr, const memory::desc& to,
                     void* to_ptr) {
    dnnl::reorder::primitive_desc copy(engine_, from, engine_, to, attr);
    pending.push_back({dnnl::reorder(copy),
                       copy.scratchpad_desc(),
                       {{DNNL_ARG_FROM, {from, from_ptr}}, {DNNL_ARG_TO, {to, to_ptr}}},
                       slot});
  };
  if (via_f32) {
    data = memory::desc(data.dims(), DataType::f32, Tag::nhwc);
    if (io.full) {
      const size_t values = static_cast<size_t>(Elements(data));
      layer.norm_src = AlignedArray<float>(values);
      layer.norm_dst = AlignedArray<float>(values);
    }
    src_ptr = layer.norm_src.data();
    dst_ptr = layer.norm_dst.data();
    eval = eval_desc(data);
    convert(bf16_data, io.src_ptr, data, src_ptr);
  }
  pending.push_back({dnnl::batch_normalization_forward(eval),
                     eval.scratchpad_desc(),
                     {{DNNL_ARG_SRC, {data, src_ptr}},
                      {DNNL_ARG_DST, {data, dst_ptr}},
                      {DNNL_ARG_SCALE, param(0)},
                      {DNNL_ARG_SHIFT, param(1)},
                      {DNNL_ARG_MEAN, param(2)},
                      {DNNL_ARG_VARIANCE, param(3)}},
                     slot});
  if (via_f32) convert(data, dst_ptr, bf16_data, io.dst_ptr);
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

}  // namespace stoker::cpu_network_internal
