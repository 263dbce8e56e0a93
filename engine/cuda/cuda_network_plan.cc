// The cuda network's layers and buffers (once, at creation) and the plan of each batch size:
// cuDNN descriptors and algorithms for Conv2d and MaxPool2d, cuBLASLt GEMMs for Linear.
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_network_internal.h"
#include "engine/layer_kinds.h"

namespace stoker::cuda::network_internal {
namespace {

using Kind = LayerConfig::Kind;

// The most workspace one convolution algorithm may ask for.
constexpr size_t kMaxConvWorkspaceBytes = size_t{256} << 20;

}  // namespace

DropoutLayout DropoutHashLayout(const NetworkConfig& config,
                                const std::vector<std::vector<int>>& shapes, size_t layer_index) {
  // The cpu hashes the mask over its memory order, which is that of the Dropout input's
  // LayoutOrigin (CpuNetwork::ActivationMd).
  const size_t source = LayoutOrigin(config, layer_index);
  const std::vector<int>& shape = shapes[source];
  // The input arrives as C, H, W per sample and stays so on the cpu (NHWC only when C = 1, the
  // same memory): the identity.
  if (source > 0 && shape.size() == 3) {
    return {.channels = shape[0], .spatial = static_cast<int64_t>(shape[1]) * shape[2]};
  }
  return {.channels = static_cast<int>(Product(shapes[layer_index])), .spatial = 1};
}

absl::Status CudaNetwork::BuildLayers() {
  const size_t max_batch = config_.max_batch;
  const size_t compute_bytes = cuda::DTypeBytes(type_);
  const cudaStream_t stream = context_->compute_stream();
  // Parameters, named as InitialNetworkParameters names them under naming_.
  const std::vector<NamedTensor> initial = InitialNetworkParameters(config_, naming_);
  for (size_t p = 0; p < initial.size(); ++p) {
    Param param;
    param.name = initial[p].name;
    param.shape = initial[p].shape;
    param.size = static_cast<int64_t>(initial[p].values.size());
    param.is_weight = p % 2 == 0;
    const size_t bytes = param.size * sizeof(float);
    STOKER_ASSIGN_BUFFER(param.value, bytes);
    STOKER_ASSIGN_BUFFER(param.grad, bytes);
    STOKER_ASSIGN_BUFFER(param.state1, bytes);
    // Optimizer state starts at zero, as in PyTorch.
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(param.state1.get(), 0, bytes, stream));
    if (adamw()) {
      STOKER_ASSIGN_BUFFER(param.state2, bytes);
      STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(param.state2.get(), 0, bytes, stream));
    }
    // Biases too: a Linear's fused epilogue adds the bias in its output's type (lt_gemm.h).
    if (type_ != DType::kF32) STOKER_ASSIGN_BUFFER(param.low, param.size * compute_bytes);
    params_.push_back(std::move(param));
  }

  // Activations. Every value is in the compute type except the logits straight out of a final
  // Linear, which are fp32 (the cpu's f32 logits), unless fp16 stores them in fp16 (as the cpu's
  // emulation rounds them).
  auto add_storage = [&](DType type, int64_t per_sample, bool with_grad) -> absl::Status {
    if (per_sample * static_cast<int64_t>(max_batch) > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("an activation of ", per_sample,
                                                     " values per sample times max_batch ",
                                                     max_batch, " exceeds 2^31 values"));
    }
    Storage storage;
    storage.type = type;
    storage.per_sample = per_sample;
    STOKER_ASSIGN_BUFFER(storage.value, max_batch * per_sample * cuda::DTypeBytes(type));
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(storage.value.get(), 0, storage.value.bytes(), stream));
    if (with_grad) {
      STOKER_ASSIGN_BUFFER(storage.grad, max_batch * per_sample * compute_bytes);
      STOKER_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(storage.grad.get(), 0, storage.grad.bytes(), stream));
    }
    storage_.push_back(std::move(storage));
    return absl::OkStatus();
  };
  STOKER_RETURN_IF_ERROR(add_storage(type_, Product(shapes_[0]), /*with_grad=*/false));
  bool seen_parameters = false;
  int next_param = 0;
  int current_storage = 0;
  const size_t count = config_.layers.size();
  for (size_t i = 0; i < count; ++i) {
    Layer layer;
    layer.config = config_.layers[i];
    layer.in_shape = shapes_[i];
    layer.out_shape = shapes_[i + 1];
    layer.in_storage = current_storage;
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
      const bool f32_logits = i + 1 == count && kind == Kind::kLinear && type_ != DType::kF16;
      layer.out_storage = static_cast<int>(storage_.size());
      STOKER_RETURN_IF_ERROR(add_storage(f32_logits ? DType::kF32 : type_, Product(layer.out_shape),
                                         /*with_grad=*/true));
    }
    current_storage = layer.out_storage;
    if (kind == Kind::kDropout) {
      STOKER_ASSIGN_BUFFER(layer.keep, max_batch * Product(layer.in_shape));
      layer.dropout_layout = DropoutHashLayout(config_, shapes_, i);
    }
    if (kind == Kind::kConv2d) {
      const LayerConfig& c = layer.config;
      STOKER_RETURN_IF_ERROR(layer.filter.Create());
      // PyTorch's [out_channels, in_channels, k, k] is cuDNN's NCHW filter layout (KCRS).
      STOKER_CUDNN_RETURN_IF_ERROR(
          cudnnSetFilter4dDescriptor(layer.filter.get(), cuda::CudnnType(type_), CUDNN_TENSOR_NCHW,
                                     c.out_channels, layer.in_shape[0], c.kernel, c.kernel));
      if (type_ != DType::kF32) {
        STOKER_ASSIGN_BUFFER(layer.weight_grad_low, params_[layer.weight].size * compute_bytes);
      }
    }
    if (kind == Kind::kMaxPool2d) {
      const LayerConfig& c = layer.config;
      STOKER_RETURN_IF_ERROR(layer.pooling.Create());
      // Padded positions never win a max in cuDNN (as in PyTorch); NaN propagates so that an
      // fp16 overflow still reaches the finite check.
      STOKER_CUDNN_RETURN_IF_ERROR(cudnnSetPooling2dDescriptor(
          layer.pooling.get(), CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_PROPAGATE_NAN, c.kernel,
          c.kernel, c.padding, c.padding, layer.stride, layer.stride));
    }
    layers_.push_back(std::move(layer));
  }
  if (storage_[LastStorage()].type != DType::kF32) {
    STOKER_ASSIGN_BUFFER(logits_, max_batch * config_.classes * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::AllocateStepBuffers() {
  STOKER_RETURN_IF_ERROR(
      staging_.Init(config_.max_batch, {.values_per_sample = Product(config_.input_shape),
                                        .normalization = InputNormalization(config_),
                                        .type = type_}));
  if (clipping()) STOKER_ASSIGN_BUFFER(clip_, sizeof(cuda::ClipState));
  const cudaStream_t stream = context_->compute_stream();
  STOKER_RETURN_IF_ERROR(state_.Init(loss_scaling_, config_.loss_scale, stream));
  for (Param& param : params_) {
    const float weight_decay =
        param.is_weight ? static_cast<float>(config_.optimizer.weight_decay) : 0.0f;
    optimizer_tensors_.push_back({param.value.as<float>(), param.grad.as<float>(),
                                  param.state1.as<float>(), param.state2.as<float>(),
                                  param.low.get(), param.size, weight_decay});
    finite_check_tensors_.push_back(
        {nullptr, param.grad.as<float>(), nullptr, nullptr, param.size, 0.0f});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Plan>> CudaNetwork::BuildPlan(int batch) {
  auto plan = std::make_unique<Plan>();
  plan->batch = batch;
  plan->layers.resize(layers_.size());
  size_t conv_workspace_bytes = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    LayerPlan& lp = plan->layers[i];
    const LayerConfig& c = layer.config;
    const std::vector<int>& in = layer.in_shape;
    const std::vector<int>& out = layer.out_shape;
    switch (c.kind) {
      case Kind::kConv2d: {
        const cuda::ConvolutionShape shape{.batch = batch,
                                           .in_channels = in[0],
                                           .height = in[1],
                                           .width = in[2],
                                           .out_channels = out[0],
                                           .out_height = out[1],
                                           .out_width = out[2],
                                           .kernel = c.kernel,
                                           .stride = layer.stride,
                                           .padding = c.padding,
                                           .type = type_,
                                           .needs_backward_data = layer.needs_input_grad};
        absl::StatusOr<cuda::ConvolutionPlan> conv =
            cuda::PlanConvolution(cudnn_.get(), layer.filter.get(), shape, kMaxConvWorkspaceBytes);
        if (!conv.ok()) {
          return absl::Status(conv.status().code(),
                              absl::StrCat("layers[", i, "] (", LayerKindName(c.kind),
                                           "): ", conv.status().message()));
        }
        conv_workspace_bytes = std::max(conv_workspace_bytes, conv->workspace_bytes);
        lp.conv = *std::move(conv);
        break;
      }
      case Kind::kMaxPool2d: {
        absl::StatusOr<cuda::TensorDescriptor> x =
            cuda::MakeTensorDescriptor(type_, batch, in[0], in[1], in[2]);
        if (!x.ok()) return x.status();
        absl::StatusOr<cuda::TensorDescriptor> y =
            cuda::MakeTensorDescriptor(type_, batch, out[0], out[1], out[2]);
        if (!y.ok()) return y.status();
        lp.pool_x = *std::move(x);
        lp.pool_y = *std::move(y);
        int n = 0, ch = 0, h = 0, w = 0;
        STOKER_CUDNN_RETURN_IF_ERROR(cudnnGetPooling2dForwardOutputDim(
            layer.pooling.get(), lp.pool_x.get(), &n, &ch, &h, &w));
        if (n != batch || ch != out[0] || h != out[1] || w != out[2]) {
          return absl::InternalError(absl::StrCat("layers[", i, "] (", LayerKindName(c.kind),
                                                  "): cuDNN pools to ", h, "x", w, "; expected ",
                                                  out[1], "x", out[2]));
        }
        break;
      }
      case Kind::kLinear: {
        const Param& bias = params_[layer.bias];
        const int in_features = static_cast<int>(Product(in));
        const int units = c.units;
        const DType out_type = storage_[layer.out_storage].type;
        // The layout of the three GEMMs: cuda::LinearShapes (lt_gemm.h).
        const cuda::LinearGemmShapes shapes =
            cuda::LinearShapes(in_features, units, batch, type_, out_type);
        // The bias in the output's type (lt_gemm.h): the master, or its compute-type copy.
        absl::StatusOr<std::unique_ptr<LtGemm>> gemm = MakeGemmPreferFused(
            *context_, options_.fused_epilogues, shapes.forward,
            {.kind = GemmEpilogue::kBias,
             .bias = out_type == DType::kF32 ? bias.value.get() : bias.low.get()},
            &lp.forward_fused);
        if (!gemm.ok()) return gemm.status();
        lp.forward = *std::move(gemm);
        // BGRADB: the bias gradient is the column sums of dY over the batch, fp32 as dW is.
        gemm = MakeGemmPreferFused(*context_, options_.fused_epilogues, shapes.weight_grad,
                                   {.kind = GemmEpilogue::kBGradB, .bias = bias.grad.get()},
                                   &lp.bias_grad_fused);
        if (!gemm.ok()) return gemm.status();
        lp.weight_grad = *std::move(gemm);
        if (layer.needs_input_grad) {
          bool unused = false;
          gemm = MakeGemmPreferFused(*context_, options_.fused_epilogues, shapes.input_grad,
                                     GemmEpilogueArgs{}, &unused);
          if (!gemm.ok()) return gemm.status();
          lp.input_grad = *std::move(gemm);
        }
        break;
      }
      case Kind::kRelu:
      case Kind::kGelu:
      case Kind::kDropout:
      case Kind::kFlatten:
        break;  // kernels (or nothing) whatever the batch
      default:
        break;  // refused by CheckCudaSupports before any plan is built
    }
  }
  if (conv_workspace_bytes > conv_workspace_.bytes()) {
    // Plans are built between steps; earlier work may still read the old workspace.
    STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(context_->compute_stream()));
    conv_workspace_ = DeviceBuffer();
    STOKER_ASSIGN_BUFFER(conv_workspace_, conv_workspace_bytes);
  }
  return plan;
}

absl::StatusOr<Plan*> CudaNetwork::PlanFor(int batch) {
  return partial_plans_.Get(full_plan_.get(), batch, [this](int size) { return BuildPlan(size); });
}

// cuDNN's pooling may refuse a data type (bf16 on some versions): try each pooling layer once at
// the full batch (the buffers hold zeros) and use the own kernels where it answers NOT_SUPPORTED
// or BAD_PARAM (they compute the same thing).
absl::Status CudaNetwork::ProbePooling() {
  const float alpha = 1.0f, beta = 0.0f;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    if (layer.config.kind != Kind::kMaxPool2d) continue;
    const LayerPlan& lp = full_plan_->layers[i];
    cudnnStatus_t status = cudnnPoolingForward(cudnn_.get(), layer.pooling.get(), &alpha,
                                               lp.pool_x.get(), Value(layer.in_storage), &beta,
                                               lp.pool_y.get(), Value(layer.out_storage));
    if (status == CUDNN_STATUS_SUCCESS && layer.needs_input_grad) {
      status = cudnnPoolingBackward(
          cudnn_.get(), layer.pooling.get(), &alpha, lp.pool_y.get(), Value(layer.out_storage),
          lp.pool_y.get(), Grad(layer.out_storage), lp.pool_x.get(), Value(layer.in_storage), &beta,
          lp.pool_x.get(), Grad(layer.in_storage));
    }
    const int category = CUDNN_STATUS_CATEGORY(status);
    if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM) {
      layer.own_pooling = true;
    } else if (status != CUDNN_STATUS_SUCCESS) {
      return cuda::CudnnError(status, "cudnnPoolingForward/Backward (probe)", __FILE__, __LINE__);
    }
  }
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(context_->compute_stream()));
  return absl::OkStatus();
}

}  // namespace stoker::cuda::network_internal
