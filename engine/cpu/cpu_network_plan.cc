// The cpu network's plans: how each activation is laid out, the primitives of one batch size
// bound to the model's buffers, and the weight layout changes between PyTorch's and oneDNN's.
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
#include "engine/cpu/cpu_network_internal.h"
#include "engine/cpu/cpu_train_kernels.h"
#include "engine/layer_kinds.h"

namespace stoker::cpu_network_internal {

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

}  // namespace stoker::cpu_network_internal
