#include "worker/engine/cuda/cuda_network.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/cuda_context.h"
#include "worker/engine/cuda/cudnn_util.h"
#include "worker/engine/cuda/dropout_hash.h"
#include "worker/engine/cuda/lt_gemm.h"
#include "worker/engine/cuda/mlp_kernels.h"
#include "worker/engine/cuda/network_kernels.h"
#include "worker/engine/plan_cache.h"
#include "worker/engine/tensor_match.h"

namespace stoker {
namespace {

using cuda::DeviceBuffer;
using cuda::DeviceContext;
using cuda::DType;
using cuda::GemmEpilogue;
using cuda::GemmEpilogueArgs;
using cuda::GemmShape;
using cuda::LtGemm;
using Kind = LayerConfig::Kind;

// Plans kept besides the full-batch one; a new batch size beyond this evicts the oldest.
constexpr size_t kMaxPartialPlans = 3;
// The most workspace one convolution algorithm may ask for.
constexpr size_t kMaxConvWorkspaceBytes = size_t{256} << 20;

#define STOKER_ASSIGN_BUFFER(target, bytes)                                      \
  do {                                                                           \
    absl::StatusOr<DeviceBuffer> stoker_buffer_ = DeviceBuffer::Allocate(bytes); \
    if (!stoker_buffer_.ok()) return stoker_buffer_.status();                    \
    (target) = *std::move(stoker_buffer_);                                       \
  } while (0)

DType ComputeType(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return DType::kF32;
    case Precision::kBf16:
      return DType::kBf16;
    case Precision::kFp16:
      return DType::kF16;
  }
  return DType::kF32;
}

int64_t Product(const std::vector<int>& shape) {
  int64_t product = 1;
  for (int d : shape) product *= d;
  return product;
}

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t size = 0;
  bool is_weight = false;  // weight decay applies to weights only
  DeviceBuffer value;      // fp32 master
  DeviceBuffer grad;       // fp32
  DeviceBuffer state1;     // SGD momentum or AdamW exp_avg
  DeviceBuffer state2;     // AdamW exp_avg_sq
  DeviceBuffer low;        // weights in bf16/fp16: the copy the layers read
};

// One activation and its gradient ([max_batch, per-sample shape]); Flatten's output is its
// input's storage.
struct Storage {
  DType type = DType::kF32;  // the value's; gradients are always in the compute type
  int64_t per_sample = 0;
  DeviceBuffer value;
  DeviceBuffer grad;
};

struct Layer {
  LayerConfig config;
  std::vector<int> in_shape;
  std::vector<int> out_shape;
  int in_storage = 0;
  int out_storage = 0;
  int stride = 1;
  int weight = -1;  // index in params_, Conv2d and Linear only
  int bias = -1;
  // A parameterised layer comes before this one: its input gradient is needed.
  bool needs_input_grad = false;
  DeviceBuffer keep;             // Dropout mask, uint8 per element
  DeviceBuffer weight_grad_low;  // Conv2d in bf16/fp16: cuDNN's weight gradient
  cuda::FilterDescriptor filter;
  cuda::PoolingDescriptor pooling;
  bool own_pooling = false;  // cuDNN refused this pooling: network_kernels' kernels run it
};

// What one layer runs at one batch size.
struct LayerPlan {
  std::optional<cuda::ConvolutionPlan> conv;
  cuda::TensorDescriptor pool_x;
  cuda::TensorDescriptor pool_y;
  std::unique_ptr<LtGemm> forward;
  std::unique_ptr<LtGemm> weight_grad;
  std::unique_ptr<LtGemm> input_grad;
  bool forward_fused = false;    // bias added by the epilogue
  bool bias_grad_fused = false;  // bias gradient from the BGRADB epilogue
};

struct Plan {
  int batch = 0;
  std::vector<LayerPlan> layers;
};

class CudaNetwork final : public Model {
 public:
  CudaNetwork(const NetworkConfig& config, std::vector<std::vector<int>> shapes, bool mlp_names,
              const CudaBackendOptions& options)
      : config_(config),
        shapes_(std::move(shapes)),
        mlp_names_(mlp_names),
        options_(options),
        type_(ComputeType(config.precision)),
        loss_scaling_(config.precision == Precision::kFp16) {}
  ~CudaNetwork() override;

  absl::Status Init(int device);

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
  struct TensorRef {
    std::string name;
    std::vector<int64_t> shape;
    float* data;  // null for the scalar state, which lives on the host
    size_t size;
  };
  bool adamw() const { return config_.optimizer.type == OptimizerType::kAdamW; }
  bool clipping() const { return config_.optimizer.clip_grad_norm > 0; }

  absl::Status BuildLayers();
  absl::Status AllocateStepBuffers();
  absl::StatusOr<std::unique_ptr<Plan>> BuildPlan(int batch);
  absl::StatusOr<Plan*> PlanFor(int batch);
  absl::Status ProbePooling();

  absl::StatusOr<std::unique_ptr<LtGemm>> MakeGemmPreferFused(const GemmShape& shape,
                                                              const GemmEpilogueArgs& epilogue,
                                                              bool* fused) const;
  absl::Status RunGemm(const LtGemm& gemm, const void* a, const void* b, void* d) const;

  // Enqueues the batch copy and the input conversion; returns the staging slot.
  absl::StatusOr<int> StageBatch(const BatchView& batch);
  absl::Status Forward(const Plan& plan, int rows, bool training);
  // The fp32 logits of the last Forward.
  absl::StatusOr<const float*> Logits(int rows);
  absl::Status Backward(const Plan& plan, int rows);
  absl::Status ApplyOptimizer(float learning_rate);
  // Copies the step state to host_state_ and waits for it: the step's one host synchronisation.
  absl::Status FinishStep();

  // The storage of the logits (the input's when there are no layers).
  int LastStorage() const { return layers_.empty() ? 0 : layers_.back().out_storage; }
  void* Value(int storage) const { return storage_[storage].value.get(); }
  void* Grad(int storage) const { return storage_[storage].grad.get(); }
  // The weight as the layers read it (compute type).
  const void* ComputeWeight(const Layer& layer) const {
    const Param& w = params_[layer.weight];
    return type_ == DType::kF32 ? w.value.get() : w.low.get();
  }
  cuda::PoolGeometry PoolGeometryOf(const Layer& layer, int rows) const;
  absl::Status RefreshLowWeights();

  std::vector<TensorRef> ParameterRefs() const;
  std::vector<TensorRef> StateRefs() const;  // per-parameter state, then the scalars
  std::vector<std::pair<std::string, std::vector<float>>> ScalarState() const;
  absl::StatusOr<std::vector<NamedTensor>> Download(const std::vector<TensorRef>& refs) const;
  absl::Status Upload(const std::vector<TensorRef>& refs, const std::vector<NamedTensor>& values);

  const NetworkConfig config_;
  const std::vector<std::vector<int>> shapes_;  // per activation, without the batch
  const bool mlp_names_;
  const CudaBackendOptions options_;
  const DType type_;
  const bool loss_scaling_;
  // Declared first so that it is destroyed last, after every buffer, handle and event below.
  std::unique_ptr<DeviceContext> context_;
  cuda::CudnnHandle cudnn_;  // only when a Conv2d or MaxPool2d needs it
  std::vector<Param> params_;
  std::vector<Storage> storage_;
  std::vector<Layer> layers_;
  DeviceBuffer logits_;  // [max_batch, classes] fp32 when the last activation is not fp32
  DeviceBuffer conv_workspace_;
  DeviceBuffer staging_[2];
  DeviceBuffer staging_labels_[2];
  cudaEvent_t copy_done_[2] = {nullptr, nullptr};     // recorded on the copy stream
  cudaEvent_t staging_free_[2] = {nullptr, nullptr};  // recorded on the compute stream
  int next_slot_ = 0;
  DeviceBuffer state_;                     // cuda::StepState
  DeviceBuffer clip_;                      // cuda::ClipState, when clipping
  cuda::StepState* host_state_ = nullptr;  // pinned
  std::vector<cuda::OptimizerTensor> optimizer_tensors_;
  std::vector<cuda::SgdTensor> finite_check_tensors_;  // LaunchCheckFinite reads grad and size
  std::unique_ptr<Plan> full_plan_;
  PartialPlanCache<Plan> partial_plans_{kMaxPartialPlans};
  int64_t optimizer_steps_ = 0;  // applied updates (AdamW's bias-correction step)
  int64_t train_steps_ = 0;      // TrainStep calls that ran (dropout's mask stream)
  std::optional<float> injected_gradient_;
};

CudaNetwork::~CudaNetwork() {
  if (context_ == nullptr) return;
  cudaSetDevice(context_->device());
  cudaStreamSynchronize(context_->copy_stream());
  cudaStreamSynchronize(context_->compute_stream());
  for (int slot = 0; slot < 2; ++slot) {
    if (copy_done_[slot] != nullptr) cudaEventDestroy(copy_done_[slot]);
    if (staging_free_[slot] != nullptr) cudaEventDestroy(staging_free_[slot]);
  }
  if (host_state_ != nullptr) cudaFreeHost(host_state_);
}

absl::Status CudaNetwork::Init(int device) {
  absl::StatusOr<std::unique_ptr<DeviceContext>> context =
      DeviceContext::Create(device, options_.gemm_workspace_bytes);
  if (!context.ok()) return context.status();
  context_ = *std::move(context);
  const bool needs_cudnn =
      std::any_of(config_.layers.begin(), config_.layers.end(), [](const LayerConfig& layer) {
        return layer.kind == Kind::kConv2d || layer.kind == Kind::kMaxPool2d;
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
  std::vector<NamedTensor> initial = InitialNetworkParameters(config_);
  for (size_t p = 0; p < initial.size(); ++p) initial[p].name = params_[p].name;
  return SetParameters(initial);
}

absl::Status CudaNetwork::BuildLayers() {
  const size_t max_batch = config_.max_batch;
  const size_t compute_bytes = cuda::DTypeBytes(type_);
  const cudaStream_t stream = context_->compute_stream();
  // Parameters, named as InitialNetworkParameters names them (or by Linear ordinal for the MLP).
  const std::vector<NamedTensor> initial = InitialNetworkParameters(config_);
  for (size_t p = 0; p < initial.size(); ++p) {
    Param param;
    param.name = mlp_names_ ? absl::StrCat("layers.", p / 2, p % 2 == 0 ? ".weight" : ".bias")
                            : initial[p].name;
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
    if (param.is_weight && type_ != DType::kF32) {
      STOKER_ASSIGN_BUFFER(param.low, param.size * compute_bytes);
    }
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
    layer.stride = layer.config.stride > 0 ? layer.config.stride
                                           : (kind == Kind::kMaxPool2d ? layer.config.kernel : 1);
    if (kind == Kind::kConv2d || kind == Kind::kLinear) {
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
  const size_t max_batch = config_.max_batch;
  const int64_t input_features = Product(config_.input_shape);
  for (int slot = 0; slot < 2; ++slot) {
    // Room for float features, the larger of the two input forms.
    STOKER_ASSIGN_BUFFER(staging_[slot], max_batch * input_features * sizeof(float));
    STOKER_ASSIGN_BUFFER(staging_labels_[slot], max_batch);
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&copy_done_[slot], cudaEventDisableTiming));
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&staging_free_[slot], cudaEventDisableTiming));
  }
  STOKER_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&host_state_), sizeof(cuda::StepState)));
  STOKER_ASSIGN_BUFFER(state_, sizeof(cuda::StepState));
  if (clipping()) STOKER_ASSIGN_BUFFER(clip_, sizeof(cuda::ClipState));
  *host_state_ = cuda::StepState{};
  host_state_->loss_scale = loss_scaling_ ? config_.loss_scale.initial : 1.0f;
  host_state_->growth_interval = std::max(1, config_.loss_scale.growth_interval);
  host_state_->growth_factor = config_.loss_scale.growth_factor;
  host_state_->backoff_factor = config_.loss_scale.backoff_factor;
  const cudaStream_t stream = context_->compute_stream();
  STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(state_.get(), host_state_, sizeof(cuda::StepState),
                                              cudaMemcpyHostToDevice, stream));
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

absl::StatusOr<std::unique_ptr<LtGemm>> CudaNetwork::MakeGemmPreferFused(
    const GemmShape& shape, const GemmEpilogueArgs& epilogue, bool* fused) const {
  *fused = false;
  if (options_.fused_epilogues && epilogue.kind != GemmEpilogue::kNone) {
    absl::StatusOr<std::unique_ptr<LtGemm>> gemm =
        LtGemm::Create(context_->lt(), shape, epilogue, context_->workspace_bytes());
    if (gemm.ok()) {
      *fused = true;
      return gemm;
    }
    if (!absl::IsUnimplemented(gemm.status())) return gemm.status();
  }
  return LtGemm::Create(context_->lt(), shape, GemmEpilogueArgs{}, context_->workspace_bytes());
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
                              absl::StrCat("layers[", i, "] (conv2d): ", conv.status().message()));
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
          return absl::InternalError(absl::StrCat("layers[", i, "] (maxpool2d): cuDNN pools to ", h,
                                                  "x", w, "; expected ", out[1], "x", out[2]));
        }
        break;
      }
      case Kind::kLinear: {
        const Param& bias = params_[layer.bias];
        const int in_features = static_cast<int>(Product(in));
        const int units = c.units;
        const DType out_type = storage_[layer.out_storage].type;
        // Row-major [rows, cols] buffers are column-major [cols, rows] to cuBLASLt (lt_gemm.h).
        // Y^T[units, B] = W[units, in] X^T[in, B]: W is column-major [in, units], transposed.
        const GemmShape forward{.m = units,
                                .n = batch,
                                .k = in_features,
                                .transpose_a = true,
                                .transpose_b = false,
                                .a_type = type_,
                                .b_type = type_,
                                .d_type = out_type};
        absl::StatusOr<std::unique_ptr<LtGemm>> gemm = MakeGemmPreferFused(
            forward, {.kind = GemmEpilogue::kBias, .bias = bias.value.as<float>()},
            &lp.forward_fused);
        if (!gemm.ok()) return gemm.status();
        lp.forward = *std::move(gemm);
        // dW^T[in, units] = X^T[in, B] dY[B, units] (fp32): dY is column-major [units, B],
        // transposed. BGRADB: the bias gradient is the column sums of dY over the batch.
        const GemmShape weight_grad{.m = in_features,
                                    .n = units,
                                    .k = batch,
                                    .transpose_a = false,
                                    .transpose_b = true,
                                    .a_type = type_,
                                    .b_type = type_,
                                    .d_type = DType::kF32};
        gemm = MakeGemmPreferFused(weight_grad,
                                   {.kind = GemmEpilogue::kBGradB, .bias = bias.grad.as<float>()},
                                   &lp.bias_grad_fused);
        if (!gemm.ok()) return gemm.status();
        lp.weight_grad = *std::move(gemm);
        if (layer.needs_input_grad) {
          // dX^T[in, B] = W^T[in, units] dY^T[units, B]: W is column-major [in, units] as is.
          const GemmShape input_grad{.m = in_features,
                                     .n = batch,
                                     .k = units,
                                     .transpose_a = false,
                                     .transpose_b = false,
                                     .a_type = type_,
                                     .b_type = type_,
                                     .d_type = type_};
          bool unused = false;
          gemm = MakeGemmPreferFused(input_grad, GemmEpilogueArgs{}, &unused);
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

absl::Status CudaNetwork::RunGemm(const LtGemm& gemm, const void* a, const void* b, void* d) const {
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
  const int slot = next_slot_;
  next_slot_ ^= 1;
  const cudaStream_t copy = context_->copy_stream();
  const cudaStream_t compute = context_->compute_stream();
  const int64_t n = static_cast<int64_t>(batch.count) * Product(config_.input_shape);
  const bool features = batch.features != nullptr;
  const void* source = features ? static_cast<const void*>(batch.features) : batch.samples;
  const size_t bytes = n * (features ? sizeof(float) : sizeof(uint8_t));

  // The compute stream must be done reading this slot (two steps ago) before it is overwritten.
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, staging_free_[slot], 0));
  STOKER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(staging_[slot].get(), source, bytes, cudaMemcpyHostToDevice, copy));
  STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_labels_[slot].get(), batch.labels,
                                              batch.count, cudaMemcpyHostToDevice, copy));
  STOKER_CUDA_RETURN_IF_ERROR(cudaEventRecord(copy_done_[slot], copy));

  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, copy_done_[slot], 0));
  if (features) {
    STOKER_CUDA_RETURN_IF_ERROR(
        cuda::LaunchConvertFloat(staging_[slot].as<float>(), n, type_, Value(0), compute));
  } else {
    STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchNormalizeInput(staging_[slot].as<uint8_t>(), n,
                                                           config_.input_scale, config_.input_shift,
                                                           type_, Value(0), compute));
  }
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
          // The cpu's mask: images are NHWC there, so the hash index is the NHWC one.
          const bool image = layer.in_shape.size() == 3;
          const int channels = layer.in_shape[0];
          const int64_t spatial =
              image ? static_cast<int64_t>(layer.in_shape[1]) * layer.in_shape[2] : 1;
          const uint64_t key = cuda::DropoutKey(config_.seed, cuda::DropoutStream(train_steps_, i));
          STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchDropoutForward(
              x, y, layer.keep.as<uint8_t>(), type_, out_elements, channels, spatial, key,
              cuda::DropoutThreshold(c.rate), 1.0f / (1.0f - c.rate), stream));
        } else {
          STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y, x, out_elements * cuda::DTypeBytes(type_),
                                                      cudaMemcpyDeviceToDevice, stream));
        }
        break;
      case Kind::kFlatten:
        break;  // an alias of its input
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
        STOKER_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(
            cudnn_.get(), &alpha, conv.x.get(), x, conv.y.get(), dy, conv.backward_filter.get(),
            conv.backward_filter_algo, conv_workspace_.get(), conv_workspace_.bytes(), &beta,
            layer.filter.get(), dw));
        if (type_ != DType::kF32) {
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
    }
  }
  return absl::OkStatus();
}

absl::Status CudaNetwork::ApplyOptimizer(float learning_rate) {
  const cudaStream_t stream = context_->compute_stream();
  const OptimizerConfig& opt = config_.optimizer;
  auto* state = state_.as<cuda::StepState>();
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

absl::Status CudaNetwork::FinishStep() {
  const cudaStream_t stream = context_->compute_stream();
  STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_state_, state_.get(), sizeof(cuda::StepState),
                                              cudaMemcpyDeviceToHost, stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<StepResult> CudaNetwork::TrainStep(const BatchView& batch, double learning_rate) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  if (absl::Status status = ValidateLearningRate(learning_rate); !status.ok()) return status;
  STOKER_RETURN_IF_ERROR(context_->Activate());
  absl::StatusOr<Plan*> plan = PlanFor(batch.count);
  if (!plan.ok()) return plan.status();
  const int rows = batch.count;
  const cudaStream_t stream = context_->compute_stream();
  auto* state = state_.as<cuda::StepState>();

  STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(state, 0, cuda::kStepStateResetBytes, stream));
  absl::StatusOr<int> slot = StageBatch(batch);
  if (!slot.ok()) return slot.status();
  STOKER_RETURN_IF_ERROR(Forward(**plan, rows, /*training=*/true));
  absl::StatusOr<const float*> logits = Logits(rows);
  if (!logits.ok()) return logits.status();
  // The loss gradient enters backward in the compute type, times the loss scale.
  // (No gradient buffer when there are no layers: then nothing trains.)
  STOKER_CUDA_RETURN_IF_ERROR(
      cuda::LaunchSoftmaxCrossEntropy(*logits, staging_labels_[*slot].as<uint8_t>(), rows,
                                      config_.classes, type_, Grad(LastStorage()), state, stream));
  // Nothing reads the staging slot after the loss; the copy stream may refill it.
  STOKER_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_free_[*slot], stream));
  STOKER_RETURN_IF_ERROR(Backward(**plan, rows));
  ++train_steps_;
  if (injected_gradient_.has_value() && !params_.empty()) {
    STOKER_CUDA_RETURN_IF_ERROR(
        cuda::LaunchAddToFirst(params_[0].grad.as<float>(), *injected_gradient_, stream));
    injected_gradient_.reset();
  }
  STOKER_RETURN_IF_ERROR(ApplyOptimizer(static_cast<float>(learning_rate)));
  STOKER_RETURN_IF_ERROR(FinishStep());

  StepResult result;
  result.loss = static_cast<float>(host_state_->loss_sum / rows);
  result.skipped = loss_scaling_ && host_state_->found_inf != 0;
  result.loss_scale = host_state_->loss_scale;
  if (!result.skipped) ++optimizer_steps_;
  return result;
}

absl::StatusOr<EvalResult> CudaNetwork::Evaluate(const BatchView& batch) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  STOKER_RETURN_IF_ERROR(context_->Activate());
  absl::StatusOr<Plan*> plan = PlanFor(batch.count);
  if (!plan.ok()) return plan.status();
  const cudaStream_t stream = context_->compute_stream();
  auto* state = state_.as<cuda::StepState>();
  STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(state, 0, cuda::kStepStateResetBytes, stream));
  absl::StatusOr<int> slot = StageBatch(batch);
  if (!slot.ok()) return slot.status();
  STOKER_RETURN_IF_ERROR(Forward(**plan, batch.count, /*training=*/false));
  absl::StatusOr<const float*> logits = Logits(batch.count);
  if (!logits.ok()) return logits.status();
  STOKER_CUDA_RETURN_IF_ERROR(
      cuda::LaunchSoftmaxCrossEntropy(*logits, staging_labels_[*slot].as<uint8_t>(), batch.count,
                                      config_.classes, type_, nullptr, state, stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_free_[*slot], stream));
  STOKER_RETURN_IF_ERROR(FinishStep());
  EvalResult result;
  result.loss_sum = host_state_->loss_sum;
  result.correct = static_cast<int64_t>(host_state_->correct);
  result.count = batch.count;
  return result;
}

std::vector<CudaNetwork::TensorRef> CudaNetwork::ParameterRefs() const {
  std::vector<TensorRef> refs;
  for (const Param& param : params_) {
    refs.push_back(
        {param.name, param.shape, param.value.as<float>(), static_cast<size_t>(param.size)});
  }
  return refs;
}

std::vector<std::pair<std::string, std::vector<float>>> CudaNetwork::ScalarState() const {
  // Counters are exact in float up to 2^24, as on the cpu.
  std::vector<std::pair<std::string, std::vector<float>>> scalars = {
      {"optimizer.step", {static_cast<float>(optimizer_steps_)}},
      {"train_step", {static_cast<float>(train_steps_)}}};
  if (loss_scaling_) {
    scalars.push_back(
        {"loss_scale", {host_state_->loss_scale, static_cast<float>(host_state_->growth_tracker)}});
  }
  return scalars;
}

std::vector<CudaNetwork::TensorRef> CudaNetwork::StateRefs() const {
  std::vector<TensorRef> refs;
  for (const Param& param : params_) {
    const size_t size = static_cast<size_t>(param.size);
    if (adamw()) {
      refs.push_back({param.name + ".exp_avg", param.shape, param.state1.as<float>(), size});
      refs.push_back({param.name + ".exp_avg_sq", param.shape, param.state2.as<float>(), size});
    } else {
      refs.push_back({param.name + ".momentum", param.shape, param.state1.as<float>(), size});
    }
  }
  for (const auto& [name, values] : ScalarState()) {
    refs.push_back({name, {static_cast<int64_t>(values.size())}, nullptr, values.size()});
  }
  return refs;
}

absl::StatusOr<std::vector<NamedTensor>> CudaNetwork::Download(
    const std::vector<TensorRef>& refs) const {
  STOKER_RETURN_IF_ERROR(context_->Activate());
  const cudaStream_t stream = context_->compute_stream();
  std::vector<NamedTensor> copies;
  copies.reserve(refs.size());
  for (const TensorRef& ref : refs) {
    copies.push_back({ref.name, ref.shape, std::vector<float>(ref.size)});
    if (ref.data == nullptr) continue;
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copies.back().values.data(), ref.data,
                                                ref.size * sizeof(float), cudaMemcpyDeviceToHost,
                                                stream));
  }
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return copies;
}

absl::Status CudaNetwork::Upload(const std::vector<TensorRef>& refs,
                                 const std::vector<NamedTensor>& values) {
  STOKER_RETURN_IF_ERROR(context_->Activate());
  const cudaStream_t stream = context_->compute_stream();
  for (size_t i = 0; i < refs.size(); ++i) {
    if (refs[i].data == nullptr) continue;
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(refs[i].data, values[i].values.data(),
                                                refs[i].size * sizeof(float),
                                                cudaMemcpyHostToDevice, stream));
  }
  // The host vectors must outlive the copies (pageable copies may return before the DMA ends).
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

std::vector<NamedTensor> CudaNetwork::Parameters() const {
  absl::StatusOr<std::vector<NamedTensor>> copies = Download(ParameterRefs());
  return copies.ok() ? *std::move(copies) : std::vector<NamedTensor>{};
}

absl::Status CudaNetwork::SetParameters(const std::vector<NamedTensor>& parameters) {
  const std::vector<TensorRef> refs = ParameterRefs();
  if (absl::Status s = CheckTensorsMatch(refs, parameters); !s.ok()) return s;
  STOKER_RETURN_IF_ERROR(Upload(refs, parameters));
  return RefreshLowWeights();
}

absl::Status CudaNetwork::RefreshLowWeights() {
  if (type_ == DType::kF32) return absl::OkStatus();
  const cudaStream_t stream = context_->compute_stream();
  for (const Param& param : params_) {
    if (param.low.get() == nullptr) continue;
    STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertFromF32(param.value.as<float>(), param.size,
                                                           type_, param.low.get(), stream));
  }
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

std::vector<NamedTensor> CudaNetwork::OptimizerState() const {
  const std::vector<TensorRef> refs = StateRefs();
  absl::StatusOr<std::vector<NamedTensor>> copies = Download(refs);
  if (!copies.ok()) return {};
  const auto scalars = ScalarState();
  const size_t first_scalar = refs.size() - scalars.size();
  for (size_t i = 0; i < scalars.size(); ++i)
    (*copies)[first_scalar + i].values = scalars[i].second;
  return *std::move(copies);
}

absl::Status CudaNetwork::SetOptimizerState(const std::vector<NamedTensor>& state) {
  const std::vector<TensorRef> refs = StateRefs();
  if (absl::Status s = CheckTensorsMatch(refs, state); !s.ok()) return s;
  const size_t first_scalar = refs.size() - ScalarState().size();
  for (size_t i = first_scalar; i < state.size(); ++i) {
    const std::vector<float>& v = state[i].values;
    const bool is_scale = state[i].name == "loss_scale";
    const bool ok = is_scale
                        ? std::isfinite(v[0]) && v[0] > 0 && v[1] >= 0 && v[1] == std::floor(v[1])
                        : std::isfinite(v[0]) && v[0] >= 0 && v[0] == std::floor(v[0]);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state '", state[i].name, "' holds ", v[0],
          is_scale ? "; expected a finite scale > 0 and a count" : "; expected a count"));
    }
  }
  STOKER_RETURN_IF_ERROR(Upload(refs, state));
  optimizer_steps_ = static_cast<int64_t>(state[first_scalar].values[0]);
  train_steps_ = static_cast<int64_t>(state[first_scalar + 1].values[0]);
  if (loss_scaling_) {
    host_state_->loss_scale = state[first_scalar + 2].values[0];
    host_state_->growth_tracker = static_cast<int>(state[first_scalar + 2].values[1]);
    // Only the persistent fields; the per-step ones are reset by every step anyway.
    const size_t offset = offsetof(cuda::StepState, loss_scale);
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        state_.as<char>() + offset, reinterpret_cast<const char*>(host_state_) + offset,
        sizeof(cuda::StepState) - offset, cudaMemcpyHostToDevice, context_->compute_stream()));
    STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(context_->compute_stream()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Create(const NetworkConfig& config, bool mlp_names,
                                              int device, const CudaBackendOptions& options) {
  if (absl::Status status = ValidateNetworkConfig(config); !status.ok()) return status;
  absl::StatusOr<std::vector<std::vector<int>>> shapes = NetworkShapes(config);
  if (!shapes.ok()) return shapes.status();
  auto model = std::make_unique<CudaNetwork>(config, *std::move(shapes), mlp_names, options);
  if (absl::Status status = model->Init(device); !status.ok()) return status;
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateCudaNetwork(const NetworkConfig& config, int device,
                                                         const CudaBackendOptions& options) {
  return Create(config, /*mlp_names=*/false, device, options);
}

absl::StatusOr<std::unique_ptr<Model>> CreateCudaNetworkForMlp(const MlpConfig& config, int device,
                                                               const CudaBackendOptions& options) {
  if (absl::Status status = ValidateMlpConfig(config); !status.ok()) return status;
  return Create(NetworkFromMlp(config), /*mlp_names=*/true, device, options);
}

}  // namespace stoker
