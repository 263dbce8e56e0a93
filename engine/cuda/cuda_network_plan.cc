// The cuda network's graph, parameters and buffers (once, at creation) and the plan of each
// batch size: cuDNN descriptors and algorithms for Conv2d and MaxPool2d, cuBLASLt GEMMs for
// Linear.
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

// Every buffer as large as the largest use (aliases share), at max_batch.
void SizeBuffers(const NetworkConfig& config, DType type, Graph& graph) {
  const size_t batch = static_cast<size_t>(std::max(config.max_batch, 0));
  const size_t compute_bytes = cuda::DTypeBytes(type);
  auto need = [&](int buffer, int64_t per_sample, size_t element_bytes) {
    if (buffer < 0) return;
    size_t& bytes = graph.buffer_bytes[buffer];
    bytes = std::max(bytes, batch * static_cast<size_t>(per_sample) * element_bytes);
  };
  for (const Activation& a : graph.activations) {
    need(a.value, a.per_sample(), cuda::DTypeBytes(a.type));
    need(a.grad, a.per_sample(), compute_bytes);
  }
  for (const Node& node : graph.nodes) {
    const int64_t in = graph.activations[node.in].per_sample();
    if (node.type == Node::Type::kFork) {
      need(node.extra, in, compute_bytes);
    } else if (node.type == Node::Type::kAdd) {
      need(node.pre, graph.activations[node.out].per_sample(), compute_bytes);
    } else {
      need(node.diff_src, in, compute_bytes);
    }
  }
}

}  // namespace

Graph BuildGraph(const NetworkConfig& config, DType type) {
  NetworkGraph network = BuildNetworkGraph(config, {.input_gradient = false});
  Graph graph;
  graph.output = network.output;
  graph.buffer_bytes.assign(network.buffers, 0);
  for (size_t a = 0; a < network.activations.size(); ++a) {
    graph.activations.emplace_back(network.activations[a], type);
  }
  for (GraphNode& graph_node : network.nodes) {
    Node node(std::move(graph_node));
    if (node.type == Node::Type::kLayer && node.config.kind == Kind::kDropout) {
      node.dropout_layout = DropoutHashLayout(network, node.in);
    }
    graph.nodes.push_back(std::move(node));
  }
  const bool f32_logits = !graph.nodes.empty() && graph.nodes.back().type == Node::Type::kLayer &&
                          graph.nodes.back().config.kind == Kind::kLinear && type != DType::kF16;
  if (f32_logits) graph.activations[graph.output].type = DType::kF32;
  SizeBuffers(config, type, graph);
  return graph;
}

absl::Status CudaNetwork::BuildParameters() {
  const size_t compute_bytes = cuda::DTypeBytes(type_);
  const cudaStream_t stream = context_->compute_stream();
  // Named and ordered as NetworkTensorSpecs lists them under naming_ (the cpu's order).
  const std::vector<NetworkTensorSpec> specs = NetworkTensorSpecs(config_, naming_);
  for (const NetworkTensorSpec& spec : specs) {
    Param param;
    param.name = spec.name;
    param.shape = spec.shape;
    param.size = 1;
    for (int64_t d : spec.shape) param.size *= d;
    param.trained = IsTrainedTensor(spec.kind);
    param.decayed = IsDecayedTensor(spec.kind);
    const size_t bytes = param.size * sizeof(float);
    STOKER_ASSIGN_BUFFER(param.value, bytes);
    if (param.trained) {
      STOKER_ASSIGN_BUFFER(param.grad, bytes);
      STOKER_ASSIGN_BUFFER(param.state1, bytes);
      // Optimizer state starts at zero, as in PyTorch.
      STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(param.state1.get(), 0, bytes, stream));
      if (adamw()) {
        STOKER_ASSIGN_BUFFER(param.state2, bytes);
        STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(param.state2.get(), 0, bytes, stream));
      }
    }
    // Conv2d/Linear weights, and their biases: a Linear's fused epilogue adds the bias in its
    // output's type (lt_gemm.h).
    const bool low =
        spec.kind == NetworkTensorKind::kWeight || spec.kind == NetworkTensorKind::kBias;
    if (type_ != DType::kF32 && low) STOKER_ASSIGN_BUFFER(param.low, param.size * compute_bytes);
    params_.push_back(std::move(param));
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::BuildNodes() {
  const size_t max_batch = config_.max_batch;
  const size_t compute_bytes = cuda::DTypeBytes(type_);
  const cudaStream_t stream = context_->compute_stream();
  for (const Activation& activation : graph_.activations) {
    if (activation.per_sample() * static_cast<int64_t>(max_batch) > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("an activation of ", activation.per_sample(),
                                                     " values per sample times max_batch ",
                                                     max_batch, " exceeds 2^31 values"));
    }
  }
  buffers_.resize(graph_.buffer_bytes.size());
  for (size_t b = 0; b < buffers_.size(); ++b) {
    if (graph_.buffer_bytes[b] == 0) continue;
    STOKER_ASSIGN_BUFFER(buffers_[b], graph_.buffer_bytes[b]);
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffers_[b].get(), 0, buffers_[b].bytes(), stream));
  }
  resources_.resize(graph_.nodes.size());
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    NodeResources& r = resources_[i];
    if (node.type != Node::Type::kLayer) continue;
    const LayerConfig& c = node.config;
    const std::vector<int>& in = graph_.activations[node.in].shape;
    switch (c.kind) {
      case Kind::kDropout:
        STOKER_ASSIGN_BUFFER(r.keep, max_batch * Product(in));
        break;
      case Kind::kConv2d:
        STOKER_RETURN_IF_ERROR(r.filter.Create());
        // PyTorch's [out_channels, in_channels, k, k] is cuDNN's NCHW filter layout (KCRS).
        STOKER_CUDNN_RETURN_IF_ERROR(
            cudnnSetFilter4dDescriptor(r.filter.get(), cuda::CudnnType(type_), CUDNN_TENSOR_NCHW,
                                       c.out_channels, in[0], c.kernel, c.kernel));
        if (type_ != DType::kF32) {
          STOKER_ASSIGN_BUFFER(r.weight_grad_low, params_[node.weight].size * compute_bytes);
        }
        break;
      case Kind::kMaxPool2d:
        STOKER_RETURN_IF_ERROR(r.pooling.Create());
        // Padded positions never win a max in cuDNN (as in PyTorch); NaN propagates so that an
        // fp16 overflow still reaches the finite check.
        STOKER_CUDNN_RETURN_IF_ERROR(cudnnSetPooling2dDescriptor(
            r.pooling.get(), CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_PROPAGATE_NAN, c.kernel,
            c.kernel, c.padding, c.padding, node.stride, node.stride));
        break;
      case Kind::kBatchNorm2d:
      case Kind::kBatchNorm1d:
        STOKER_ASSIGN_BUFFER(r.mean, in[0] * sizeof(float));
        STOKER_ASSIGN_BUFFER(r.variance, in[0] * sizeof(float));
        STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(r.mean.get(), 0, r.mean.bytes(), stream));
        STOKER_CUDA_RETURN_IF_ERROR(
            cudaMemsetAsync(r.variance.get(), 0, r.variance.bytes(), stream));
        break;
      default:
        break;
    }
  }
  if (graph_.activations[graph_.output].type != DType::kF32) {
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
    if (!param.trained) continue;  // BatchNorm's buffers
    // Conv2d and Linear weights only: never biases or BatchNorm's parameters.
    const float weight_decay =
        param.decayed ? static_cast<float>(config_.optimizer.weight_decay) : 0.0f;
    optimizer_tensors_.push_back({param.value.as<float>(), param.grad.as<float>(),
                                  param.state1.as<float>(), param.state2.as<float>(),
                                  param.low.get(), param.size, weight_decay});
    finite_check_tensors_.push_back(
        {nullptr, param.grad.as<float>(), nullptr, nullptr, param.size, 0.0f});
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::PlanLinear(const Node& node, int batch, LayerPlan& lp) {
  const int in_features = static_cast<int>(graph_.activations[node.in].per_sample());
  const int units = node.config.units;
  const DType out_type = graph_.activations[node.out].type;
  // The layout of the three GEMMs: cuda::LinearShapes (lt_gemm.h).
  const cuda::LinearGemmShapes shapes =
      cuda::LinearShapes(in_features, units, batch, type_, out_type);
  GemmEpilogueArgs forward_epilogue;
  GemmEpilogueArgs weight_grad_epilogue;
  if (node.bias >= 0) {
    const Param& bias = params_[node.bias];
    // The bias in the output's type (lt_gemm.h): the master, or its compute-type copy.
    forward_epilogue = {.kind = GemmEpilogue::kBias,
                        .bias = out_type == DType::kF32 ? bias.value.get() : bias.low.get()};
    // BGRADB: the bias gradient is the column sums of dY over the batch, fp32 as dW is.
    weight_grad_epilogue = {.kind = GemmEpilogue::kBGradB, .bias = bias.grad.get()};
  }
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = MakeGemmPreferFused(
      *context_, options_.fused_epilogues, shapes.forward, forward_epilogue, &lp.forward_fused);
  if (!gemm.ok()) return gemm.status();
  lp.forward = *std::move(gemm);
  gemm = MakeGemmPreferFused(*context_, options_.fused_epilogues, shapes.weight_grad,
                             weight_grad_epilogue, &lp.bias_grad_fused);
  if (!gemm.ok()) return gemm.status();
  lp.weight_grad = *std::move(gemm);
  if (node.needs_input_grad) {
    bool unused = false;
    gemm = MakeGemmPreferFused(*context_, options_.fused_epilogues, shapes.input_grad,
                               GemmEpilogueArgs{}, &unused);
    if (!gemm.ok()) return gemm.status();
    lp.input_grad = *std::move(gemm);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Plan>> CudaNetwork::BuildPlan(int batch) {
  auto plan = std::make_unique<Plan>();
  plan->batch = batch;
  plan->layers.resize(graph_.nodes.size());
  size_t conv_workspace_bytes = 0;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    if (node.type != Node::Type::kLayer) continue;  // kernels whatever the batch
    LayerPlan& lp = plan->layers[i];
    const LayerConfig& c = node.config;
    const std::vector<int>& in = graph_.activations[node.in].shape;
    const std::vector<int>& out = graph_.activations[node.out].shape;
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
                                           .stride = node.stride,
                                           .padding = c.padding,
                                           .type = type_,
                                           .needs_backward_data = node.needs_input_grad};
        absl::StatusOr<cuda::ConvolutionPlan> conv = cuda::PlanConvolution(
            cudnn_.get(), resources_[i].filter.get(), shape, kMaxConvWorkspaceBytes);
        if (!conv.ok()) {
          return absl::Status(conv.status().code(),
                              absl::StrCat("step ", i, " (", LayerKindName(c.kind),
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
            resources_[i].pooling.get(), lp.pool_x.get(), &n, &ch, &h, &w));
        if (n != batch || ch != out[0] || h != out[1] || w != out[2]) {
          return absl::InternalError(absl::StrCat("step ", i, " (", LayerKindName(c.kind),
                                                  "): cuDNN pools to ", h, "x", w, "; expected ",
                                                  out[1], "x", out[2]));
        }
        break;
      }
      case Kind::kLinear:
        STOKER_RETURN_IF_ERROR(PlanLinear(node, batch, lp));
        break;
      default:
        break;  // kernels (or nothing) whatever the batch
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

// cuDNN's pooling may refuse a data type (bf16 on some versions): try each max-pooling node once
// at the full batch (the buffers hold zeros) and use the own kernels where it answers
// NOT_SUPPORTED or BAD_PARAM (they compute the same thing).
absl::Status CudaNetwork::ProbePooling() {
  const float alpha = 1.0f, beta = 0.0f;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    if (node.type != Node::Type::kLayer || node.config.kind != Kind::kMaxPool2d) continue;
    NodeResources& r = resources_[i];
    const LayerPlan& lp = full_plan_->layers[i];
    cudnnStatus_t status =
        cudnnPoolingForward(cudnn_.get(), r.pooling.get(), &alpha, lp.pool_x.get(), Value(node.in),
                            &beta, lp.pool_y.get(), Value(node.out));
    if (status == CUDNN_STATUS_SUCCESS && node.needs_input_grad) {
      status =
          cudnnPoolingBackward(cudnn_.get(), r.pooling.get(), &alpha, lp.pool_y.get(),
                               Value(node.out), lp.pool_y.get(), Grad(node.out), lp.pool_x.get(),
                               Value(node.in), &beta, lp.pool_x.get(), Buffer(node.diff_src));
    }
    const int category = CUDNN_STATUS_CATEGORY(status);
    if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM) {
      r.own_pooling = true;
    } else if (status != CUDNN_STATUS_SUCCESS) {
      return cuda::CudnnError(status, "cudnnPoolingForward/Backward (probe)", __FILE__, __LINE__);
    }
  }
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(context_->compute_stream()));
  return absl::OkStatus();
}

}  // namespace stoker::cuda::network_internal
