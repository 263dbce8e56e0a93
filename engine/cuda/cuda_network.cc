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
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/cuda_network_internal.h"
#include "engine/cuda/cudnn_util.h"
#include "engine/cuda/dropout_hash.h"
#include "engine/cuda/lt_gemm.h"
#include "engine/cuda/mlp_kernels.h"
#include "engine/cuda/network_kernels.h"
#include "engine/layer_kinds.h"

namespace stoker {
namespace cuda::network_internal {

using Kind = LayerConfig::Kind;

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
      std::any_of(config_.layers.begin(), config_.layers.end(), [](const LayerConfig& layer) {
        return LayerKindInfoOf(layer.kind).has_kernel;  // Conv2d, MaxPool2d
      });
  if (needs_cudnn) {
    STOKER_RETURN_IF_ERROR(cudnn_.Create());
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnSetStream(cudnn_.get(), context_->compute_stream()));
  }
  STOKER_RETURN_IF_ERROR(BuildLayers());
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

cuda::PoolGeometry CudaNetwork::PoolGeometryOf(const Layer& layer, int rows) const {
  return {.planes = rows * layer.in_shape[0],
          .height = layer.in_shape[1],
          .width = layer.in_shape[2],
          .out_height = layer.out_shape[1],
          .out_width = layer.out_shape[2],
          .kernel = layer.config.kernel,
          .stride = layer.stride,
          .padding = layer.config.padding};
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
  const float alpha = 1.0f, beta = 0.0f;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = layers_[i];
    const LayerPlan& lp = plan.layers[i];
    const LayerConfig& c = layer.config;
    const void* x = Value(layer.in_storage);
    void* y = Value(layer.out_storage);
    const int64_t out_elements = static_cast<int64_t>(rows) * Product(layer.out_shape);
    switch (c.kind) {
      case Kind::kConv2d: {
        const cuda::ConvolutionPlan& conv = *lp.conv;
        STOKER_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(
            cudnn_.get(), &alpha, conv.x.get(), x, layer.filter.get(), ComputeWeight(layer),
            conv.forward.get(), conv.forward_algo, conv_workspace_.get(), conv_workspace_.bytes(),
            &beta, conv.y.get(), y));
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchAddChannelBias(
            y, type_, params_[layer.bias].value.as<float>(), rows, layer.out_shape[0],
            static_cast<int64_t>(layer.out_shape[1]) * layer.out_shape[2], stream));
        break;
      }
      case Kind::kMaxPool2d:
        if (layer.own_pooling) {
          STOKER_CUDA_RETURN_IF_ERROR(
              cuda::LaunchMaxPoolForward(x, y, type_, PoolGeometryOf(layer, rows), stream));
        } else {
          STOKER_CUDNN_RETURN_IF_ERROR(cudnnPoolingForward(cudnn_.get(), layer.pooling.get(),
                                                           &alpha, lp.pool_x.get(), x, &beta,
                                                           lp.pool_y.get(), y));
        }
        break;
      case Kind::kLinear:
        STOKER_RETURN_IF_ERROR(RunGemm(*lp.forward, ComputeWeight(layer), x, y));
        if (!lp.forward_fused) {
          STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchBiasActivation(
              y, storage_[layer.out_storage].type, params_[layer.bias].value.as<float>(), rows,
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
          const uint64_t key = cuda::DropoutKey(config_.seed, cuda::DropoutStream(train_steps_, i));
          STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchDropoutForward(
              x, y, layer.keep.as<uint8_t>(), type_, out_elements, layer.dropout_layout.channels,
              layer.dropout_layout.spatial, key, cuda::DropoutThreshold(c.rate),
              1.0f / (1.0f - c.rate), stream));
        } else {
          STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y, x, out_elements * cuda::DTypeBytes(type_),
                                                      cudaMemcpyDeviceToDevice, stream));
        }
        break;
      case Kind::kFlatten:
        break;  // an alias of its input
      default:  // refused by CheckCudaSupports
        return absl::UnimplementedError(absl::StrCat("layers[", i, "]: not on cuda"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> CudaNetwork::Logits(int rows) {
  const Storage& last = storage_[LastStorage()];
  if (last.type == DType::kF32) return last.value.as<float>();
  STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertToF32(
      last.value.get(), last.type, static_cast<int64_t>(rows) * config_.classes,
      logits_.as<float>(), context_->compute_stream()));
  return logits_.as<float>();
}

absl::Status CudaNetwork::Backward(const Plan& plan, int rows) {
  const cudaStream_t stream = context_->compute_stream();
  const float alpha = 1.0f, beta = 0.0f;
  for (size_t i = layers_.size(); i-- > 0;) {
    const Layer& layer = layers_[i];
    const LayerPlan& lp = plan.layers[i];
    const LayerConfig& c = layer.config;
    const void* x = Value(layer.in_storage);
    const void* dy = Grad(layer.out_storage);
    void* dx = layer.needs_input_grad ? Grad(layer.in_storage) : nullptr;
    const int64_t in_elements = static_cast<int64_t>(rows) * Product(layer.in_shape);
    switch (c.kind) {
      case Kind::kConv2d: {
        const cuda::ConvolutionPlan& conv = *lp.conv;
        Param& weight = params_[layer.weight];
        void* dw = type_ == DType::kF32 ? weight.grad.get() : layer.weight_grad_low.get();
        // cuDNN writes a 16-bit dW in the compute type. With fp16 loss scaling a scaled dW
        // overflows 65504 as soon as |dW| > 65504 / scale (~1 at 65536), which the cpu, keeping
        // gradients in fp32, does not: so cuDNN computes the unscaled dW (alpha = 1 / scale;
        // the host copy of the scale is current, every step ends with its read-back), and the
        // widening multiplies the scale back in fp32, so that the optimizer's unscaling (all
        // gradients alike, gradients[i] / scale) applies once. The scale is a power of two:
        // both products are exact but for fp16's rounding of dW itself.
        const float filter_alpha = loss_scaling_ ? 1.0f / state_.host().loss_scale : 1.0f;
        STOKER_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(
            cudnn_.get(), &filter_alpha, conv.x.get(), x, conv.y.get(), dy,
            conv.backward_filter.get(), conv.backward_filter_algo, conv_workspace_.get(),
            conv_workspace_.bytes(), &beta, layer.filter.get(), dw));
        if (loss_scaling_) {
          STOKER_CUDA_RETURN_IF_ERROR(
              cuda::LaunchConvertToF32Scaled(dw, type_, weight.size, &state_.device()->loss_scale,
                                             weight.grad.as<float>(), stream));
        } else if (type_ != DType::kF32) {
          STOKER_CUDA_RETURN_IF_ERROR(
              cuda::LaunchConvertToF32(dw, type_, weight.size, weight.grad.as<float>(), stream));
        }
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchChannelBiasGrad(
            dy, type_, rows, layer.out_shape[0],
            static_cast<int64_t>(layer.out_shape[1]) * layer.out_shape[2],
            params_[layer.bias].grad.as<float>(), stream));
        if (dx != nullptr) {
          STOKER_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(
              cudnn_.get(), &alpha, layer.filter.get(), ComputeWeight(layer), conv.y.get(), dy,
              conv.backward_data.get(), conv.backward_data_algo, conv_workspace_.get(),
              conv_workspace_.bytes(), &beta, conv.x.get(), dx));
        }
        break;
      }
      case Kind::kMaxPool2d:
        if (dx == nullptr) break;
        if (layer.own_pooling) {
          STOKER_CUDA_RETURN_IF_ERROR(
              cuda::LaunchMaxPoolBackward(x, dy, dx, type_, PoolGeometryOf(layer, rows), stream));
        } else {
          STOKER_CUDNN_RETURN_IF_ERROR(cudnnPoolingBackward(
              cudnn_.get(), layer.pooling.get(), &alpha, lp.pool_y.get(), Value(layer.out_storage),
              lp.pool_y.get(), dy, lp.pool_x.get(), x, &beta, lp.pool_x.get(), dx));
        }
        break;
      case Kind::kLinear: {
        Param& weight = params_[layer.weight];
        Param& bias = params_[layer.bias];
        STOKER_RETURN_IF_ERROR(RunGemm(*lp.weight_grad, x, dy, weight.grad.get()));
        if (!lp.bias_grad_fused) {
          // Column sums of dY[B, units]; nothing is masked (no activation given).
          STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchReluBackwardBiasGrad(
              const_cast<void*>(dy), nullptr, type_, rows, c.units, bias.grad.as<float>(), stream));
        }
        if (dx != nullptr) {
          STOKER_RETURN_IF_ERROR(RunGemm(*lp.input_grad, ComputeWeight(layer), dy, dx));
        }
        break;
      }
      case Kind::kRelu:
      case Kind::kGelu:
        if (dx == nullptr) break;
        STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchActivationBackward(
            c.kind == Kind::kRelu ? cuda::ActivationKind::kRelu : cuda::ActivationKind::kGelu, x,
            dy, dx, type_, in_elements, stream));
        break;
      case Kind::kDropout:
        if (dx == nullptr) break;
        if (c.rate > 0) {
          STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchDropoutBackward(dy, layer.keep.as<uint8_t>(), dx,
                                                                  type_, in_elements,
                                                                  1.0f / (1.0f - c.rate), stream));
        } else {
          STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dx, dy, in_elements * cuda::DTypeBytes(type_),
                                                      cudaMemcpyDeviceToDevice, stream));
        }
        break;
      case Kind::kFlatten:
        break;  // shares its input's gradient
      default:  // refused by CheckCudaSupports
        return absl::UnimplementedError("layer not on cuda");
    }
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

absl::Status CudaNetwork::FinishStep() { return state_.ReadBack(context_->compute_stream()); }

absl::StatusOr<StepResult> CudaNetwork::TrainStep(const BatchView& batch, double learning_rate) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  if (absl::Status status = ValidateLearningRate(learning_rate); !status.ok()) return status;
  STOKER_RETURN_IF_ERROR(context_->Activate());
  absl::StatusOr<Plan*> plan = PlanFor(batch.count);
  if (!plan.ok()) return plan.status();
  const int rows = batch.count;
  const cudaStream_t stream = context_->compute_stream();
  cuda::StepState* state = state_.device();

  STOKER_RETURN_IF_ERROR(state_.EnqueueReset(stream));
  absl::StatusOr<int> slot = StageBatch(batch);
  if (!slot.ok()) return slot.status();
  STOKER_RETURN_IF_ERROR(Forward(**plan, rows, /*training=*/true));
  absl::StatusOr<const float*> logits = Logits(rows);
  if (!logits.ok()) return logits.status();
  // The loss gradient enters backward in the compute type, times the loss scale.
  // (No gradient buffer when there are no layers: then nothing trains.)
  STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchSoftmaxCrossEntropy(*logits, staging_.labels(*slot), rows,
                                                              config_.classes, type_,
                                                              Grad(LastStorage()), state, stream));
  // Nothing reads the staging slot after the loss; the copy stream may refill it.
  STOKER_RETURN_IF_ERROR(staging_.Release(*slot, stream));
  STOKER_RETURN_IF_ERROR(Backward(**plan, rows));
  ++train_steps_;
  if (injected_gradient_.has_value() && !params_.empty()) {
    STOKER_CUDA_RETURN_IF_ERROR(
        cuda::LaunchAddToFirst(params_[0].grad.as<float>(), *injected_gradient_, stream));
    injected_gradient_.reset();
  }
  STOKER_RETURN_IF_ERROR(ApplyOptimizer(static_cast<float>(learning_rate)));
  STOKER_RETURN_IF_ERROR(FinishStep());
  ++counters_.eager_steps;  // the network captures no CUDA graphs

  const StepResult result = state_.TrainResult(rows, loss_scaling_);
  if (!result.skipped) ++optimizer_steps_;
  return result;
}

absl::StatusOr<EvalResult> CudaNetwork::Evaluate(const BatchView& batch) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  STOKER_RETURN_IF_ERROR(context_->Activate());
  absl::StatusOr<Plan*> plan = PlanFor(batch.count);
  if (!plan.ok()) return plan.status();
  const cudaStream_t stream = context_->compute_stream();
  cuda::StepState* state = state_.device();
  STOKER_RETURN_IF_ERROR(state_.EnqueueReset(stream));
  absl::StatusOr<int> slot = StageBatch(batch);
  if (!slot.ok()) return slot.status();
  STOKER_RETURN_IF_ERROR(Forward(**plan, batch.count, /*training=*/false));
  absl::StatusOr<const float*> logits = Logits(batch.count);
  if (!logits.ok()) return logits.status();
  STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchSoftmaxCrossEntropy(*logits, staging_.labels(*slot),
                                                              batch.count, config_.classes, type_,
                                                              nullptr, state, stream));
  STOKER_RETURN_IF_ERROR(staging_.Release(*slot, stream));
  STOKER_RETURN_IF_ERROR(FinishStep());
  return state_.EvaluateResult(batch.count);
}

}  // namespace cuda::network_internal

namespace {

using cuda::network_internal::CudaNetwork;

// The layers and options the cuda network does not build yet (batch normalisation, average
// pooling, residual blocks, bias-free layers, label smoothing): UNIMPLEMENTED naming the first.
absl::Status CheckCudaSupports(const NetworkConfig& config) {
  using Kind = LayerConfig::Kind;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const LayerConfig& layer = config.layers[i];
    const bool supported = layer.kind == Kind::kConv2d || layer.kind == Kind::kMaxPool2d ||
                           layer.kind == Kind::kLinear || layer.kind == Kind::kRelu ||
                           layer.kind == Kind::kGelu || layer.kind == Kind::kDropout ||
                           layer.kind == Kind::kFlatten;
    if (!supported || !layer.bias) {
      return absl::UnimplementedError(absl::StrCat(
          "layers[", i, "] (", LayerKindName(layer.kind), ")", layer.bias ? "" : " without bias",
          " is not available on the cuda backend yet; train it on the cpu backend (resources.gpus: "
          "0)"));
    }
  }
  if (config.label_smoothing != 0) {
    return absl::UnimplementedError(
        "label_smoothing is not available on the cuda backend yet; train it on the cpu backend "
        "(resources.gpus: 0)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateCudaNetwork(const NetworkConfig& config, int device,
                                                         const CudaBackendOptions& options,
                                                         ParameterNaming naming) {
  STOKER_RETURN_IF_ERROR(CheckCudaSupports(config));
  STOKER_RETURN_IF_ERROR(ValidateNetworkConfig(config));
  STOKER_ASSIGN_OR_RETURN(std::vector<std::vector<int>> shapes, NetworkShapes(config));
  auto model = std::make_unique<CudaNetwork>(config, std::move(shapes), naming, options);
  STOKER_RETURN_IF_ERROR(model->Init(device));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace stoker
