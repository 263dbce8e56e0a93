#include "engine/cuda/cuda_network.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/cuda_network_internal.h"
#include "engine/cuda/cudnn_util.h"
#include "engine/cuda/dropout_hash.h"
#include "engine/cuda/lt_gemm.h"
#include "engine/cuda/mlp_kernels.h"
#include "engine/cuda/network_kernels.h"
#include "engine/cuda/vision_kernels.h"
#include "engine/layer_kinds.h"

namespace stoker {
namespace cuda::network_internal {
namespace {

cuda::SumActivation SumActivationOf(LayerConfig::Activation activation) {
  switch (activation) {
    case LayerConfig::Activation::kRelu:
      return cuda::SumActivation::kRelu;
    case LayerConfig::Activation::kGelu:
      return cuda::SumActivation::kGelu;
    case LayerConfig::Activation::kNone:
      break;
  }
  return cuda::SumActivation::kNone;
}

// BatchNorm's view of its [C, H, W] or [features] input: channels and values per channel.
struct NormShape {
  int channels;
  int64_t spatial;
};
NormShape NormShapeOf(const std::vector<int>& in) {
  return {in[0], in.size() == 3 ? static_cast<int64_t>(in[1]) * in[2] : 1};
}

}  // namespace

CudaNetwork::~CudaNetwork() {
  if (context_ == nullptr) return;
  cudaSetDevice(context_->device());
  cudaStreamSynchronize(context_->copy_stream());
  cudaStreamSynchronize(context_->compute_stream());
}

absl::Status CudaNetwork::Init(int device) {
  absl::StatusOr<std::unique_ptr<DeviceContext>> context =
      DeviceContext::Create(device, options_.gemm_workspace_bytes);
  if (!context.ok()) return context.status();
  context_ = *std::move(context);
  const bool needs_cudnn =
      std::any_of(graph_.nodes.begin(), graph_.nodes.end(), [](const Node& node) {
        return node.type == Node::Type::kLayer &&
               (node.config.kind == Kind::kConv2d || node.config.kind == Kind::kMaxPool2d);
      });
  if (needs_cudnn) {
    STOKER_RETURN_IF_ERROR(cudnn_.Create());
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnSetStream(cudnn_.get(), context_->compute_stream()));
  }
  STOKER_RETURN_IF_ERROR(BuildParameters());
  STOKER_RETURN_IF_ERROR(BuildNodes());
  STOKER_RETURN_IF_ERROR(AllocateStepBuffers());
  absl::StatusOr<std::unique_ptr<Plan>> plan = BuildPlan(config_.max_batch);
  if (!plan.ok()) return plan.status();
  full_plan_ = *std::move(plan);
  STOKER_RETURN_IF_ERROR(ProbePooling());
  return SetParameters(InitialNetworkParameters(config_, naming_));
}

absl::Status CudaNetwork::RunGemm(const LtGemm& gemm, const void* a, const void* b, void* d) {
  ++(gemm.epilogue() == GemmEpilogue::kNone ? counters_.plain_gemms : counters_.fused_gemms);
  return gemm.Run(context_->lt(), a, b, d, context_->workspace(), context_->workspace_bytes(),
                  context_->compute_stream());
}

cuda::PoolGeometry CudaNetwork::PoolGeometryOf(const Node& node, int rows) const {
  const std::vector<int>& in = graph_.activations[node.in].shape;
  const std::vector<int>& out = graph_.activations[node.out].shape;
  return {.planes = rows * in[0],
          .height = in[1],
          .width = in[2],
          .out_height = out[1],
          .out_width = out[2],
          .kernel = node.config.kernel,
          .stride = node.stride,
          .padding = node.config.padding};
}

absl::StatusOr<int> CudaNetwork::StageBatch(const BatchView& batch) {
  const cudaStream_t compute = context_->compute_stream();
  absl::StatusOr<int> slot = staging_.Stage(batch, context_->copy_stream(), compute);
  if (!slot.ok()) return slot.status();
  STOKER_RETURN_IF_ERROR(
      staging_.Normalize(*slot, batch.count, batch.features != nullptr, Value(0), compute));
  return slot;
}

absl::Status CudaNetwork::Forward(const Plan& plan, int rows, bool training) {
  const cudaStream_t stream = context_->compute_stream();
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    switch (node.type) {
      case Node::Type::kFork:
        break;  // its work is in backward
      case Node::Type::kAdd: {
        const int64_t n = static_cast<int64_t>(rows) * graph_.activations[node.out].per_sample();
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchAddActivationForward(
            SumActivationOf(node.config.activation), Value(node.in), Value(node.in2),
            Buffer(node.pre), Value(node.out), type_, n, stream));
        break;
      }
      case Node::Type::kLayer:
        STOKER_RETURN_IF_ERROR(ForwardLayer(i, plan.layers[i], rows, training));
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::ForwardLayer(size_t index, const LayerPlan& lp, int rows, bool training) {
  const cudaStream_t stream = context_->compute_stream();
  const float alpha = 1.0f, beta = 0.0f;
  const auto& [node, r, c, in_shape, out_shape] = LayerAt(index);
  const void* x = Value(node.in);
  void* y = Value(node.out);
  const int64_t out_elements = static_cast<int64_t>(rows) * Product(out_shape);
  switch (c.kind) {
    case Kind::kConv2d: {
      const cuda::ConvolutionPlan& conv = *lp.conv;
      STOKER_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(
          cudnn_.get(), &alpha, conv.x.get(), x, r.filter.get(), ComputeWeight(node),
          conv.forward.get(), conv.forward_algo, conv_workspace_.get(), conv_workspace_.bytes(),
          &beta, conv.y.get(), y));
      if (node.bias >= 0) {
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchAddChannelBias(
            y, type_, params_[node.bias].value.as<float>(), rows, out_shape[0],
            static_cast<int64_t>(out_shape[1]) * out_shape[2], stream));
      }
      break;
    }
    case Kind::kMaxPool2d:
      if (r.own_pooling) {
        STOKER_CUDA_RETURN_IF_ERROR(
            cuda::LaunchMaxPoolForward(x, y, type_, PoolGeometryOf(node, rows), stream));
      } else {
        STOKER_CUDNN_RETURN_IF_ERROR(cudnnPoolingForward(
            cudnn_.get(), r.pooling.get(), &alpha, lp.pool_x.get(), x, &beta, lp.pool_y.get(), y));
      }
      break;
    case Kind::kAvgPool2d:
      STOKER_CUDA_RETURN_IF_ERROR(
          cuda::LaunchAvgPoolForward(x, y, type_, PoolGeometryOf(node, rows), stream));
      break;
    case Kind::kGlobalAvgPool:
      STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchGlobalAvgPoolForward(
          x, y, type_, static_cast<int64_t>(rows) * in_shape[0],
          static_cast<int64_t>(in_shape[1]) * in_shape[2], stream));
      break;
    case Kind::kBatchNorm2d:
    case Kind::kBatchNorm1d: {
      const NormShape s = NormShapeOf(in_shape);
      const float* mean = params_[node.norm + 2].value.as<float>();  // running statistics
      const float* variance = params_[node.norm + 3].value.as<float>();
      if (training) {
        // The batch's statistics, kept for backward and for the running ones' update.
        STOKER_CUDA_RETURN_IF_ERROR(
            cuda::LaunchBatchNormStatistics(x, type_, rows, s.channels, s.spatial,
                                            r.mean.as<float>(), r.variance.as<float>(), stream));
        mean = r.mean.as<float>();
        variance = r.variance.as<float>();
      }
      STOKER_CUDA_RETURN_IF_ERROR(
          cuda::LaunchBatchNormApply(x, y, type_, rows, s.channels, s.spatial, mean, variance,
                                     params_[node.norm].value.as<float>(),
                                     params_[node.norm + 1].value.as<float>(), c.eps, stream));
      break;
    }
    case Kind::kLinear:
      STOKER_RETURN_IF_ERROR(RunGemm(*lp.forward, ComputeWeight(node), x, y));
      if (node.bias >= 0 && !lp.forward_fused) {
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchBiasActivation(
            y, graph_.activations[node.out].type, params_[node.bias].value.as<float>(), rows,
            c.units, /*relu=*/false, stream));
      }
      break;
    case Kind::kRelu:
    case Kind::kGelu:
      STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchActivationForward(
          c.kind == Kind::kRelu ? cuda::ActivationKind::kRelu : cuda::ActivationKind::kGelu, x, y,
          type_, out_elements, stream));
      break;
    case Kind::kDropout:
      if (training && c.rate > 0) {
        // The cpu's mask: it hashes the index in its own memory order (DropoutHashLayout).
        const uint64_t key =
            cuda::DropoutKey(config_.seed, cuda::DropoutStream(train_steps_, index));
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchDropoutForward(
            x, y, r.keep.as<uint8_t>(), type_, out_elements, node.dropout_layout.channels,
            node.dropout_layout.spatial, key, cuda::DropoutThreshold(c.rate),
            1.0f / (1.0f - c.rate), stream));
      } else {
        STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y, x, out_elements * cuda::DTypeBytes(type_),
                                                    cudaMemcpyDeviceToDevice, stream));
      }
      break;
    case Kind::kFlatten:
      break;  // an alias of its input
    case Kind::kResidual:
      return absl::InternalError("a residual block is not a graph step");
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> CudaNetwork::Logits(int rows) {
  const Activation& last = graph_.activations[graph_.output];
  if (last.type == DType::kF32) return static_cast<const float*>(Value(graph_.output));
  STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertToF32(
      Value(graph_.output), last.type, static_cast<int64_t>(rows) * config_.classes,
      logits_.as<float>(), context_->compute_stream()));
  return logits_.as<float>();
}

absl::Status CudaNetwork::Backward(const Plan& plan, int rows) {
  const cudaStream_t stream = context_->compute_stream();
  next_gradient_index_ = 0;
  for (size_t i = graph_.nodes.size(); i-- > 0;) {
    const Node& node = graph_.nodes[i];
    switch (node.type) {
      case Node::Type::kFork:
        // The block input's gradient: the main branch's (already in diff_src) plus the
        // shortcut's.
        if (node.needs_input_grad) {
          STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchAddInPlace(
              Buffer(node.diff_src), Buffer(node.extra), type_,
              static_cast<int64_t>(rows) * graph_.activations[node.in].per_sample(), stream));
        }
        break;
      case Node::Type::kAdd: {
        if (!node.needs_input_grad) break;
        // The sum's gradient goes to the main branch, and to a projection shortcut's own buffer.
        const bool copy = node.needs_input2_grad && node.diff_src2 != node.diff_src;
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchAddActivationBackward(
            SumActivationOf(node.config.activation), Buffer(node.pre), Value(node.out),
            Grad(node.out), Buffer(node.diff_src), copy ? Buffer(node.diff_src2) : nullptr, type_,
            static_cast<int64_t>(rows) * graph_.activations[node.out].per_sample(), stream));
        break;
      }
      case Node::Type::kLayer:
        STOKER_RETURN_IF_ERROR(BackwardLayer(i, plan.layers[i], rows));
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::BackwardLayer(size_t index, const LayerPlan& lp, int rows) {
  const cudaStream_t stream = context_->compute_stream();
  const float alpha = 1.0f, beta = 0.0f;
  const auto& [node, r, c, in_shape, out_shape] = LayerAt(index);
  const void* x = Value(node.in);
  const void* dy = Grad(node.out);
  void* dx = node.needs_input_grad ? Buffer(node.diff_src) : nullptr;
  const int64_t in_elements = static_cast<int64_t>(rows) * Product(in_shape);
  switch (c.kind) {
    case Kind::kConv2d: {
      const cuda::ConvolutionPlan& conv = *lp.conv;
      Param& weight = params_[node.weight];
      void* dw = type_ == DType::kF32 ? weight.grad.get() : r.weight_grad_low.get();
      // cuDNN writes a 16-bit dW in the compute type. With fp16 loss scaling a scaled dW
      // overflows 65504 as soon as |dW| > 65504 / scale (~1 at 65536), which the cpu, keeping
      // gradients in fp32, does not: so cuDNN computes the unscaled dW (alpha = 1 / scale;
      // the host copy of the scale is current, every step ends with its read-back), and the
      // widening multiplies the scale back in fp32, so that the optimizer's unscaling (all
      // gradients alike, gradients[i] / scale) applies once. The scale is a power of two:
      // both products are exact but for fp16's rounding of dW itself. (A data-parallel share
      // rides in dY, so it stays in dW.)
      const float filter_alpha = loss_scaling_ ? 1.0f / state_.host().loss_scale : 1.0f;
      STOKER_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(
          cudnn_.get(), &filter_alpha, conv.x.get(), x, conv.y.get(), dy,
          conv.backward_filter.get(), conv.backward_filter_algo, conv_workspace_.get(),
          conv_workspace_.bytes(), &beta, r.filter.get(), dw));
      if (loss_scaling_) {
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertToF32Scaled(
            dw, type_, weight.size, &state_.device()->loss_scale, weight.grad.as<float>(), stream));
      } else if (type_ != DType::kF32) {
        STOKER_CUDA_RETURN_IF_ERROR(
            cuda::LaunchConvertToF32(dw, type_, weight.size, weight.grad.as<float>(), stream));
      }
      if (node.bias >= 0) {
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchChannelBiasGrad(
            dy, type_, rows, out_shape[0], static_cast<int64_t>(out_shape[1]) * out_shape[2],
            params_[node.bias].grad.as<float>(), stream));
      }
      STOKER_RETURN_IF_ERROR(HandOverGradients(node));
      if (dx != nullptr) {
        STOKER_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(
            cudnn_.get(), &alpha, r.filter.get(), ComputeWeight(node), conv.y.get(), dy,
            conv.backward_data.get(), conv.backward_data_algo, conv_workspace_.get(),
            conv_workspace_.bytes(), &beta, conv.x.get(), dx));
      }
      break;
    }
    case Kind::kLinear: {
      Param& weight = params_[node.weight];
      STOKER_RETURN_IF_ERROR(RunGemm(*lp.weight_grad, x, dy, weight.grad.get()));
      if (node.bias >= 0 && !lp.bias_grad_fused) {
        // Column sums of dY[B, units]; nothing is masked (no activation given).
        STOKER_CUDA_RETURN_IF_ERROR(
            cuda::LaunchReluBackwardBiasGrad(const_cast<void*>(dy), nullptr, type_, rows, c.units,
                                             params_[node.bias].grad.as<float>(), stream));
      }
      STOKER_RETURN_IF_ERROR(HandOverGradients(node));
      if (dx != nullptr) {
        STOKER_RETURN_IF_ERROR(RunGemm(*lp.input_grad, ComputeWeight(node), dy, dx));
      }
      break;
    }
    case Kind::kBatchNorm2d:
    case Kind::kBatchNorm1d: {
      const NormShape s = NormShapeOf(in_shape);
      STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchBatchNormBackward(
          x, dy, dx, type_, rows, s.channels, s.spatial, r.mean.as<float>(), r.variance.as<float>(),
          params_[node.norm].value.as<float>(), c.eps, params_[node.norm].grad.as<float>(),
          params_[node.norm + 1].grad.as<float>(), stream));
      STOKER_RETURN_IF_ERROR(HandOverGradients(node));
      break;
    }
    case Kind::kMaxPool2d:
      if (dx == nullptr) break;
      if (r.own_pooling) {
        STOKER_CUDA_RETURN_IF_ERROR(
            cuda::LaunchMaxPoolBackward(x, dy, dx, type_, PoolGeometryOf(node, rows), stream));
      } else {
        STOKER_CUDNN_RETURN_IF_ERROR(cudnnPoolingBackward(
            cudnn_.get(), r.pooling.get(), &alpha, lp.pool_y.get(), Value(node.out),
            lp.pool_y.get(), dy, lp.pool_x.get(), x, &beta, lp.pool_x.get(), dx));
      }
      break;
    case Kind::kAvgPool2d:
      if (dx == nullptr) break;
      STOKER_CUDA_RETURN_IF_ERROR(
          cuda::LaunchAvgPoolBackward(dy, dx, type_, PoolGeometryOf(node, rows), stream));
      break;
    case Kind::kGlobalAvgPool:
      if (dx == nullptr) break;
      STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchGlobalAvgPoolBackward(
          dy, dx, type_, static_cast<int64_t>(rows) * in_shape[0],
          static_cast<int64_t>(in_shape[1]) * in_shape[2], stream));
      break;
    case Kind::kRelu:
    case Kind::kGelu:
      if (dx == nullptr) break;
      STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchActivationBackward(
          c.kind == Kind::kRelu ? cuda::ActivationKind::kRelu : cuda::ActivationKind::kGelu, x, dy,
          dx, type_, in_elements, stream));
      break;
    case Kind::kDropout:
      if (dx == nullptr) break;
      if (c.rate > 0) {
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchDropoutBackward(
            dy, r.keep.as<uint8_t>(), dx, type_, in_elements, 1.0f / (1.0f - c.rate), stream));
      } else {
        STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dx, dy, in_elements * cuda::DTypeBytes(type_),
                                                    cudaMemcpyDeviceToDevice, stream));
      }
      break;
    case Kind::kFlatten:
      break;  // its output's gradient buffer is its input's (diff_src)
    case Kind::kResidual:
      return absl::InternalError("a residual block is not a graph step");
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::ApplyInjectedGradient() {
  if (params_.empty()) return absl::OkStatus();
  const std::optional<float> value = TakeInjectedGradient();
  if (!value.has_value()) return absl::OkStatus();
  STOKER_CUDA_RETURN_IF_ERROR(
      cuda::LaunchAddToFirst(params_[0].grad.as<float>(), *value, context_->compute_stream()));
  return absl::OkStatus();
}

absl::Status CudaNetwork::HandOverGradients(const Node& node) {
  if (reducer_ == nullptr) return absl::OkStatus();
  // Reverse Parameters() order within the node, as across nodes: the order is then exactly the
  // reverse of Parameters()' trained tensors (the cpu network's).
  const int order[] = {node.norm >= 0 ? node.norm + 1 : node.bias,
                       node.norm >= 0 ? node.norm : node.weight};
  if (order[1] == 0) STOKER_RETURN_IF_ERROR(ApplyInjectedGradient());
  // The work that finalises them is enqueued on the compute stream: the reducer orders its reads
  // after it (backend.h; Model::device_stream).
  for (const int p : order) {
    if (p < 0) continue;
    Param& param = params_[p];
    reducer_->GradientReady(next_gradient_index_++, param.grad.as<float>(), param.size);
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::CheckBatchNormValues(int batch) const {
  for (const Node& node : graph_.nodes) {
    if (node.norm < 0) continue;
    const std::vector<int>& shape = graph_.activations[node.in].shape;
    if (static_cast<int64_t>(batch) * NormShapeOf(shape).spatial > 1) continue;
    return OneValuePerChannelError(node.config.kind, params_[node.norm].name, batch, shape);
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::UpdateRunningStatistics(int rows) {
  const cudaStream_t stream = context_->compute_stream();
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    if (node.norm < 0) continue;
    // torch.nn.BatchNorm*d: the variance unbiased by m / (m - 1), m the values per channel (m > 1:
    // TrainStep refuses a batch with one, CheckBatchNormValues).
    const NormShape s = NormShapeOf(graph_.activations[node.in].shape);
    const int64_t m = static_cast<int64_t>(rows) * s.spatial;
    const double unbias = m > 1 ? static_cast<double>(m) / static_cast<double>(m - 1) : 1.0;
    STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchBatchNormUpdateRunning(
        resources_[i].mean.as<float>(), resources_[i].variance.as<float>(), s.channels,
        node.config.momentum, unbias, params_[node.norm + 2].value.as<float>(),
        params_[node.norm + 3].value.as<float>(), params_[node.norm + 4].value.as<float>(),
        stream));
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::ApplyOptimizer(float learning_rate) {
  const cudaStream_t stream = context_->compute_stream();
  const OptimizerConfig& opt = config_.optimizer;
  cuda::StepState* state = state_.device();
  const int count = static_cast<int>(optimizer_tensors_.size());
  const cuda::OptimizerTensor* tensors = optimizer_tensors_.data();
  if (count == 0) {
    // A network without parameters: only GradScaler's bookkeeping (every step is clean).
    if (loss_scaling_) STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchUpdateLossScale(state, stream));
    return absl::OkStatus();
  }
  if (loss_scaling_) {
    STOKER_CUDA_RETURN_IF_ERROR(
        cuda::LaunchCheckFinite(finite_check_tensors_.data(), count, state, stream));
  }
  cuda::ClipState* clip = nullptr;
  if (clipping()) {
    clip = clip_.as<cuda::ClipState>();
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(clip, 0, sizeof(cuda::ClipState), stream));
    STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchGradSumOfSquares(tensors, count, state, clip, stream));
    STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchClipCoefficient(clip, opt.clip_grad_norm, stream));
  }
  if (adamw()) {
    // As cpu::AdamWUpdate: float hyperparameters, bias corrections in double from them, at the
    // step this update would be (a skipped fp16 step does not count, and changes nothing).
    const int64_t step = optimizer_steps_ + 1;
    const float beta1 = static_cast<float>(opt.beta1);
    const float beta2 = static_cast<float>(opt.beta2);
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), step);
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), step);
    const cuda::AdamWConstants constants{
        .learning_rate = learning_rate,
        .beta1 = beta1,
        .beta2 = beta2,
        .eps = static_cast<float>(opt.eps),
        .step_size = static_cast<float>(learning_rate / bias_correction1),
        .inverse_sqrt_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2))};
    STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchAdamWStep(tensors, count, type_, constants, state, clip,
                                                      loss_scaling_, stream));
  } else {
    STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchSgdStep(tensors, count, type_, learning_rate,
                                                    static_cast<float>(opt.momentum), opt.nesterov,
                                                    state, clip, loss_scaling_, stream));
  }
  if (loss_scaling_) STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchUpdateLossScale(state, stream));
  return absl::OkStatus();
}

absl::StatusOr<StepResult> CudaNetwork::FinishStep(double learning_rate, int rows) {
  // Counted also by a step without samples: every rank's dropout stream stays at the same step.
  ++train_steps_;
  STOKER_RETURN_IF_ERROR(ApplyInjectedGradient());  // alone (a reducer's step applied it already)
  STOKER_RETURN_IF_ERROR(ApplyOptimizer(static_cast<float>(learning_rate)));
  // The step's one host synchronisation: the step state to pinned memory.
  STOKER_RETURN_IF_ERROR(state_.ReadBack(context_->compute_stream()));
  ++counters_.eager_steps;  // the network captures no CUDA graphs
  StepResult result = state_.TrainResult(std::max(rows, 1), loss_scaling_);
  if (rows == 0) result.loss = 0;
  if (!result.skipped) ++optimizer_steps_;
  return result;
}

absl::StatusOr<StepResult> CudaNetwork::TrainStep(const BatchView& batch, double learning_rate) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  if (absl::Status status = ValidateLearningRate(learning_rate); !status.ok()) return status;
  STOKER_RETURN_IF_ERROR(CheckBatchNormValues(batch.count));
  // This rank's part of the global batch's mean: folded into the loss gradient's scale.
  absl::StatusOr<float> share = LocalGradientShare(reducer_);
  if (!share.ok()) return share.status();
  STOKER_RETURN_IF_ERROR(context_->Activate());
  absl::StatusOr<Plan*> plan = PlanFor(batch.count);
  if (!plan.ok()) return plan.status();
  const int rows = batch.count;
  const cudaStream_t stream = context_->compute_stream();

  STOKER_RETURN_IF_ERROR(state_.EnqueueReset(stream));
  absl::StatusOr<int> slot = StageBatch(batch);
  if (!slot.ok()) return slot.status();
  STOKER_RETURN_IF_ERROR(Forward(**plan, rows, /*training=*/true));
  absl::StatusOr<const float*> logits = Logits(rows);
  if (!logits.ok()) return logits.status();
  // The loss gradient enters backward in the compute type, times the loss scale and the share.
  // (No gradient buffer when there are no layers: then nothing trains.)
  STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchSmoothedCrossEntropy(
      *logits, staging_.labels(*slot), rows, config_.classes, config_.label_smoothing, *share,
      type_, Grad(graph_.output), state_.device(), stream));
  // Nothing reads the staging slot after the loss; the copy stream may refill it.
  STOKER_RETURN_IF_ERROR(staging_.Release(*slot, stream));
  STOKER_RETURN_IF_ERROR(Backward(**plan, rows));
  // Summed over the ranks, or the step fails with nothing updated (running statistics included).
  if (reducer_ != nullptr) STOKER_RETURN_IF_ERROR(reducer_->Finish());
  STOKER_RETURN_IF_ERROR(UpdateRunningStatistics(rows));
  return FinishStep(learning_rate, rows);
}

absl::StatusOr<StepResult> CudaNetwork::StepWithoutSamples(double learning_rate) {
  STOKER_RETURN_IF_ERROR(context_->Activate());
  const cudaStream_t stream = context_->compute_stream();
  STOKER_RETURN_IF_ERROR(state_.EnqueueReset(stream));
  // Zero gradients through the reducer in Backward's order (nodes in reverse); no forward, so
  // BatchNorm's running statistics stay as they are.
  next_gradient_index_ = 0;
  for (size_t i = graph_.nodes.size(); i-- > 0;) {
    const Node& node = graph_.nodes[i];
    if (node.type != Node::Type::kLayer || (node.weight < 0 && node.norm < 0)) continue;
    for (const int p : {node.weight, node.bias, node.norm, node.norm >= 0 ? node.norm + 1 : -1}) {
      if (p < 0) continue;
      STOKER_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(params_[p].grad.get(), 0, params_[p].grad.bytes(), stream));
    }
    STOKER_RETURN_IF_ERROR(HandOverGradients(node));
  }
  STOKER_RETURN_IF_ERROR(reducer_->Finish());
  return FinishStep(learning_rate, 0);
}

absl::StatusOr<EvalResult> CudaNetwork::Evaluate(const BatchView& batch) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  STOKER_RETURN_IF_ERROR(context_->Activate());
  absl::StatusOr<Plan*> plan = PlanFor(batch.count);
  if (!plan.ok()) return plan.status();
  const cudaStream_t stream = context_->compute_stream();
  STOKER_RETURN_IF_ERROR(state_.EnqueueReset(stream));
  absl::StatusOr<int> slot = StageBatch(batch);
  if (!slot.ok()) return slot.status();
  STOKER_RETURN_IF_ERROR(Forward(**plan, batch.count, /*training=*/false));
  absl::StatusOr<const float*> logits = Logits(batch.count);
  if (!logits.ok()) return logits.status();
  STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchSmoothedCrossEntropy(
      *logits, staging_.labels(*slot), batch.count, config_.classes, config_.label_smoothing, 1.0f,
      type_, nullptr, state_.device(), stream));
  STOKER_RETURN_IF_ERROR(staging_.Release(*slot, stream));
  STOKER_RETURN_IF_ERROR(state_.ReadBack(stream));
  return state_.EvaluateResult(batch.count);
}

}  // namespace cuda::network_internal

absl::StatusOr<std::unique_ptr<Model>> CreateCudaNetwork(const NetworkConfig& config, int device,
                                                         const CudaBackendOptions& options,
                                                         ParameterNaming naming) {
  STOKER_RETURN_IF_ERROR(ValidateNetworkConfig(config));
  auto model = std::make_unique<cuda::network_internal::CudaNetwork>(config, naming, options);
  STOKER_RETURN_IF_ERROR(model->Init(device));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace stoker
