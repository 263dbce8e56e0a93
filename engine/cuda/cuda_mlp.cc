#include "engine/cuda/cuda_mlp.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend_helpers.h"
#include "engine/cuda/batch_staging.h"
#include "engine/cuda/compute_type.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/cuda_graph.h"
#include "engine/cuda/lt_gemm.h"
#include "engine/cuda/mlp_kernels.h"
#include "engine/cuda/model_counters.h"
#include "engine/cuda/network_kernels.h"
#include "engine/cuda/step_state.h"
#include "engine/cuda/tensor_transfer.h"
#include "engine/plan_cache.h"

namespace stoker {
namespace {

using cuda::DeviceBuffer;
using cuda::DeviceContext;
using cuda::DeviceTensorRef;
using cuda::DType;
using cuda::GemmEpilogue;
using cuda::GemmEpilogueArgs;
using cuda::GemmShape;
using cuda::LtGemm;

// Plans kept besides the full-batch one; a new batch size beyond this evicts the oldest.
constexpr size_t kMaxPartialPlans = 3;

struct Layer {
  int in = 0;
  int out = 0;
  bool relu = false;
  DeviceBuffer weight;  // [out, in] fp32 master
  DeviceBuffer bias;    // [out]
  DeviceBuffer weight_grad;
  DeviceBuffer bias_grad;
  DeviceBuffer weight_velocity;
  DeviceBuffer bias_velocity;
  DeviceBuffer weight_low;  // bf16/fp16 only: the copy the GEMMs read
  // bf16/fp16 hidden layers only, in the compute type as cuBLASLt wants them beside a
  // compute-type output (lt_gemm.h): the bias the fused forward epilogue adds (written by the
  // optimizer with the master), and the bias gradient of the fused DRELU_BGRAD epilogue (widened
  // into bias_grad).
  DeviceBuffer bias_low;
  DeviceBuffer bias_grad_low;
  // [max_batch, out]: ReLU output in the compute type for hidden layers, fp32 logits for the last.
  DeviceBuffer output;
  DeviceBuffer output_grad;  // [max_batch, out] compute type: dLoss/d(pre-activation) (scaled)
  DeviceBuffer relu_mask;    // hidden layers: 1 bit per output, ReluMaskLd(out) bits per sample
};

// The GEMMs of one layer for one batch size, and which epilogues they fused.
struct LayerGemms {
  std::unique_ptr<LtGemm> forward;
  std::unique_ptr<LtGemm> weight_grad;
  std::unique_ptr<LtGemm> input_grad;  // null for layer 0
  bool forward_fused = false;          // bias (+ ReLU) done by the epilogue
  bool bias_grad_fused = false;        // last layer: its bias gradient came from BGRADB
  bool input_grad_fused = false;       // the layer below's ReLU backward and bias grad fused
};

// GEMMs enqueued, by whether their epilogue was fused (CudaModelCounters).
struct GemmCounts {
  int64_t fused = 0;
  int64_t plain = 0;
};

struct Plan {
  int batch = 0;
  std::vector<LayerGemms> layers;
  // TrainStep's device work for this batch size, captured per staging buffer (the buffer's
  // address is baked into the graph) and per input kind (uint8 samples or float features).
  cuda::GraphExec step_graphs[2][2];  // [staging slot][features]
  GemmCounts graph_gemms[2][2];       // the GEMMs each graph replays
  // A step of this batch size and input kind ran kernel by kernel: the kernels it needs are
  // loaded (lazy module loading) and cuBLASLt has run each GEMM once, so neither happens inside
  // a capture. Captures start from the second step.
  bool warmed_up[2] = {false, false};  // [features]
  bool graph_failed = false;           // a capture failed once: run this plan kernel by kernel
};

class CudaMlp final : public cuda::CountingModel {
 public:
  CudaMlp(const MlpConfig& config, const CudaBackendOptions& options)
      : CountingModel(/*gradient_test_hook=*/true),
        config_(config),
        options_(options),
        type_(cuda::ComputeType(config.precision)),
        loss_scaling_(config.precision == Precision::kFp16) {}
  ~CudaMlp() override;

  absl::Status Init(int device);

  STOKER_MODEL_OVERRIDES;
  cudaStream_t compute_stream() const { return context_->compute_stream(); }
  void* device_stream() const override { return compute_stream(); }

 private:
  absl::StatusOr<StepResult> StepWithoutSamples(double learning_rate) override;
  std::vector<DeviceTensorRef> Tensors(bool optimizer_state) const;

  absl::StatusOr<std::unique_ptr<Plan>> BuildPlan(int batch);
  absl::StatusOr<Plan*> PlanFor(int batch);
  // Enqueues the GEMM and counts it in pending_gemms_.
  absl::Status RunGemm(const LtGemm& gemm, const void* a, const void* b, void* d) const;
  // Adds `gemms` to the counters.
  void CountGemms(const GemmCounts& gemms) {
    counters_.fused_gemms += gemms.fused;
    counters_.plain_gemms += gemms.plain;
  }

  // Enqueues the normalisation of staging slot `slot` (rows samples) into input_.
  absl::Status NormalizeStaged(int slot, int rows, bool features) const;
  // Everything TrainStep does on the compute stream after BatchStaging::Stage: reset the step
  // state, load the learning rate (from host_rate_), normalise, forward, loss, backward, [fp16:
  // finite check], SGD, [fp16: loss-scale update], and the copy of the step state to the host.
  // Enqueues only, so it can be captured in a CUDA graph (never with a reducer).
  absl::Status EnqueueTrainStep(const Plan& plan, int rows, int slot, bool features) {
    STOKER_RETURN_IF_ERROR(EnqueueForwardBackward(plan, rows, slot, features, 1.0f));
    // Never captured with a pending injection: TrainStep runs such a step eagerly.
    STOKER_RETURN_IF_ERROR(EnqueueInjectedGradient());
    return EnqueueUpdate();
  }
  // Its two halves, split where a data-parallel step calls the reducer's Finish(). `share`
  // multiplies the loss gradient (GradientReducer::LocalShare; 1 alone).
  absl::Status EnqueueForwardBackward(const Plan& plan, int rows, int slot, bool features,
                                      float share);
  absl::Status EnqueueUpdate();
  // InjectGradientForTest's value added to the first weight gradient, if one is pending.
  absl::Status EnqueueInjectedGradient();
  // TrainStep with a reducer: forward and backward handing each gradient over, Finish(), then
  // the update; eager (the reducer's calls sit between the kernels, and its error must stop the
  // update on the host). An error from Finish() returns before anything is updated.
  absl::Status EnqueueDataParallelStep(const Plan& plan, int rows, int slot, bool features,
                                       float share);
  absl::Status Forward(const Plan& plan, int rows);
  // Hands each gradient to reducer_ (when set) as soon as the work finalising it is enqueued.
  absl::Status Backward(const Plan& plan, int rows);
  // reducer_->GradientReady(next_index++, ...) for `gradient`.
  void HandOver(const DeviceBuffer& gradient, int& next_index) {
    reducer_->GradientReady(next_index++, gradient.as<float>(),
                            static_cast<int64_t>(gradient.bytes() / sizeof(float)));
  }
  // Copies the step state to the host and waits for it: the step's one host synchronisation.
  absl::Status FinishStep();

  const void* GemmWeight(const Layer& layer) const {
    return type_ == DType::kF32 ? layer.weight.get() : layer.weight_low.get();
  }
  absl::Status RefreshLowWeights();

  const MlpConfig config_;
  const CudaBackendOptions options_;
  const DType type_;
  const bool loss_scaling_;
  // Declared first so that it is destroyed last, after every buffer and event below.
  std::unique_ptr<DeviceContext> context_;
  DeviceBuffer input_;  // [max_batch, input_features], compute type
  std::vector<Layer> layers_;
  // Double-buffered staging: samples (uint8, or float features) and labels as they came.
  cuda::BatchStaging staging_;
  cuda::StepStateBuffer state_;
  float* host_rate_ = nullptr;  // pinned: the next step's learning rate
  // Pinned, data-parallel steps whose share is not 1: {loss scale x share, loss scale}, copied
  // into StepState::loss_scale around the softmax cross-entropy (which multiplies the loss
  // gradient by it) and back, so the gradient carries the share and the update the plain scale.
  float* host_share_scales_ = nullptr;
  GradientReducer* reducer_ = nullptr;  // data-parallel training: not owned; null when alone
  std::vector<cuda::SgdTensor> sgd_tensors_;
  std::unique_ptr<Plan> full_plan_;
  PartialPlanCache<Plan> partial_plans_{kMaxPartialPlans};
  // GEMMs enqueued since the last reset: counted when they run (eagerly), or per replay of the
  // graph they were captured into.
  mutable GemmCounts pending_gemms_;
};

CudaMlp::~CudaMlp() {
  if (context_ == nullptr) return;
  cudaSetDevice(context_->device());
  cudaStreamSynchronize(context_->copy_stream());
  cudaStreamSynchronize(context_->compute_stream());
  if (host_rate_ != nullptr) cudaFreeHost(host_rate_);
  if (host_share_scales_ != nullptr) cudaFreeHost(host_share_scales_);
}

absl::Status CudaMlp::Init(int device) {
  absl::StatusOr<std::unique_ptr<DeviceContext>> context =
      DeviceContext::Create(device, options_.gemm_workspace_bytes);
  if (!context.ok()) return context.status();
  context_ = *std::move(context);

  const size_t max_batch = config_.max_batch;
  const size_t compute_bytes = cuda::DTypeBytes(type_);
  STOKER_ASSIGN_BUFFER(input_, max_batch * config_.input_features * compute_bytes);
  STOKER_RETURN_IF_ERROR(
      staging_.Init(config_.max_batch, {.values_per_sample = config_.input_features,
                                        .normalization = InputNormalization(config_),
                                        .type = type_}));

  for (const MlpLayerShape& shape : MlpLayerShapes(config_)) {
    Layer layer;
    layer.in = shape.in;
    layer.out = shape.out;
    layer.relu = shape.relu;
    const size_t weight_bytes = static_cast<size_t>(layer.out) * layer.in * sizeof(float);
    const size_t bias_bytes = static_cast<size_t>(layer.out) * sizeof(float);
    STOKER_ASSIGN_BUFFER(layer.weight, weight_bytes);
    STOKER_ASSIGN_BUFFER(layer.bias, bias_bytes);
    STOKER_ASSIGN_BUFFER(layer.weight_grad, weight_bytes);
    STOKER_ASSIGN_BUFFER(layer.bias_grad, bias_bytes);
    STOKER_ASSIGN_BUFFER(layer.weight_velocity, weight_bytes);
    STOKER_ASSIGN_BUFFER(layer.bias_velocity, bias_bytes);
    if (type_ != DType::kF32) {
      STOKER_ASSIGN_BUFFER(layer.weight_low,
                           static_cast<size_t>(layer.out) * layer.in * compute_bytes);
      if (layer.relu) {
        STOKER_ASSIGN_BUFFER(layer.bias_low, static_cast<size_t>(layer.out) * compute_bytes);
        STOKER_ASSIGN_BUFFER(layer.bias_grad_low, static_cast<size_t>(layer.out) * compute_bytes);
      }
    }
    const size_t outputs = max_batch * layer.out;
    STOKER_ASSIGN_BUFFER(layer.output, outputs * (layer.relu ? compute_bytes : sizeof(float)));
    STOKER_ASSIGN_BUFFER(layer.output_grad, outputs * compute_bytes);
    if (layer.relu) {
      STOKER_ASSIGN_BUFFER(layer.relu_mask,
                           static_cast<size_t>(cuda::ReluMaskLd(layer.out)) / 8 * max_batch);
    }
    layers_.push_back(std::move(layer));
  }
  for (const Layer& layer : layers_) {
    const float weight_decay = static_cast<float>(config_.optimizer.weight_decay);
    sgd_tensors_.push_back({layer.weight.as<float>(), layer.weight_grad.as<float>(),
                            layer.weight_velocity.as<float>(), layer.weight_low.get(),
                            static_cast<int64_t>(layer.out) * layer.in, weight_decay});
    sgd_tensors_.push_back({layer.bias.as<float>(), layer.bias_grad.as<float>(),
                            layer.bias_velocity.as<float>(), layer.bias_low.get(), layer.out,
                            0.0f});
  }

  STOKER_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&host_rate_), sizeof(float)));
  *host_rate_ = 0.0f;
  STOKER_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&host_share_scales_), 2 * sizeof(float)));
  host_share_scales_[0] = host_share_scales_[1] = 1.0f;
  const cudaStream_t stream = context_->compute_stream();
  STOKER_RETURN_IF_ERROR(state_.Init(loss_scaling_, config_.loss_scale, stream));
  // Momentum starts at zero, as in PyTorch.
  for (const Layer& layer : layers_) {
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(layer.weight_velocity.get(), 0, layer.weight_velocity.bytes(), stream));
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(layer.bias_velocity.get(), 0, layer.bias_velocity.bytes(), stream));
  }

  STOKER_ASSIGN_OR_RETURN(full_plan_, BuildPlan(config_.max_batch));
  return SetParameters(InitialMlpParameters(config_));
}

absl::StatusOr<std::unique_ptr<Plan>> CudaMlp::BuildPlan(int batch) {
  auto plan = std::make_unique<Plan>();
  plan->batch = batch;
  plan->layers.resize(layers_.size());
  const size_t last = layers_.size() - 1;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    LayerGemms& gemms = plan->layers[l];
    const DType output_type = layer.relu ? type_ : DType::kF32;
    const cuda::LinearGemmShapes shapes =
        cuda::LinearShapes(layer.in, layer.out, batch, type_, output_type);

    // The bias in the output's type (lt_gemm.h): the fp32 master for the fp32 logits.
    GemmEpilogueArgs forward_epilogue{
        .kind = layer.relu ? GemmEpilogue::kReluAuxBias : GemmEpilogue::kBias,
        .bias = output_type == DType::kF32 ? layer.bias.get() : layer.bias_low.get(),
        .aux = layer.relu ? layer.relu_mask.get() : nullptr,
        .aux_ld = layer.relu ? cuda::ReluMaskLd(layer.out) : 0};
    absl::StatusOr<std::unique_ptr<LtGemm>> gemm =
        MakeGemmPreferFused(*context_, options_.fused_epilogues, shapes.forward, forward_epilogue,
                            &gemms.forward_fused);
    if (!gemm.ok()) return gemm.status();
    gemms.forward = *std::move(gemm);

    GemmEpilogueArgs weight_grad_epilogue;
    if (l == last) {
      // dW is fp32, so is the bias gradient.
      weight_grad_epilogue = {.kind = GemmEpilogue::kBGradB, .bias = layer.bias_grad.get()};
    }
    gemm = MakeGemmPreferFused(*context_, options_.fused_epilogues, shapes.weight_grad,
                               weight_grad_epilogue, &gemms.bias_grad_fused);
    if (!gemm.ok()) return gemm.status();
    gemms.weight_grad = *std::move(gemm);

    // The input gradient is written as the layer below's output gradient.
    if (l == 0) continue;
    Layer& below = layers_[l - 1];
    GemmEpilogueArgs input_grad_epilogue;
    // The ReLU mask exists only if the layer below's forward GEMM fused its epilogue. The fused
    // bias gradient comes out in dX's type: fine in bf16 (fp32's range), but in fp16 the batch
    // sum of loss-scaled gradients can pass 65504, so fp16 sums them in fp32 with its own kernel.
    if (plan->layers[l - 1].forward_fused && type_ != DType::kF16) {
      input_grad_epilogue = {
          .kind = GemmEpilogue::kDReluBGrad,
          .bias = type_ == DType::kF32 ? below.bias_grad.get() : below.bias_grad_low.get(),
          .aux = below.relu_mask.get(),
          .aux_ld = cuda::ReluMaskLd(below.out)};
    }
    gemm = MakeGemmPreferFused(*context_, options_.fused_epilogues, shapes.input_grad,
                               input_grad_epilogue, &gemms.input_grad_fused);
    if (!gemm.ok()) return gemm.status();
    gemms.input_grad = *std::move(gemm);
  }
  return plan;
}

absl::StatusOr<Plan*> CudaMlp::PlanFor(int batch) {
  return partial_plans_.Get(full_plan_.get(), batch, [this](int size) { return BuildPlan(size); });
}

absl::Status CudaMlp::RunGemm(const LtGemm& gemm, const void* a, const void* b, void* d) const {
  ++(gemm.epilogue() == GemmEpilogue::kNone ? pending_gemms_.plain : pending_gemms_.fused);
  return gemm.Run(context_->lt(), a, b, d, context_->workspace(), context_->workspace_bytes(),
                  context_->compute_stream());
}

absl::Status CudaMlp::NormalizeStaged(int slot, int rows, bool features) const {
  return staging_.Normalize(slot, rows, features, input_.get(), context_->compute_stream());
}

absl::Status CudaMlp::Forward(const Plan& plan, int rows) {
  const cudaStream_t stream = context_->compute_stream();
  const void* input = input_.get();
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    const LayerGemms& gemms = plan.layers[l];
    STOKER_RETURN_IF_ERROR(RunGemm(*gemms.forward, GemmWeight(layer), input, layer.output.get()));
    if (!gemms.forward_fused) {
      STOKER_CUDA_RETURN_IF_ERROR(
          cuda::LaunchBiasActivation(layer.output.get(), layer.relu ? type_ : DType::kF32,
                                     layer.bias.as<float>(), rows, layer.out, layer.relu, stream));
    }
    input = layer.output.get();
  }
  return absl::OkStatus();
}

absl::Status CudaMlp::Backward(const Plan& plan, int rows) {
  const cudaStream_t stream = context_->compute_stream();
  const size_t last = layers_.size() - 1;
  int next_index = 0;  // GradientReady's
  for (size_t l = layers_.size(); l-- > 0;) {
    Layer& layer = layers_[l];
    const LayerGemms& gemms = plan.layers[l];
    const void* input = l == 0 ? input_.get() : layers_[l - 1].output.get();
    if (l == last && !gemms.bias_grad_fused) {
      STOKER_CUDA_RETURN_IF_ERROR(
          cuda::LaunchReluBackwardBiasGrad(layer.output_grad.get(), nullptr, type_, rows, layer.out,
                                           layer.bias_grad.as<float>(), stream));
    }
    STOKER_RETURN_IF_ERROR(
        RunGemm(*gemms.weight_grad, input, layer.output_grad.get(), layer.weight_grad.get()));
    // The cpu MLP's order: layers last to first, each layer's bias then its weight. The last
    // layer's bias may come from the weight GEMM's epilogue (BGRADB), so both go after it; a
    // lower layer's bias was finished by the input-gradient step of the layer above.
    if (reducer_ != nullptr) {
      if (l == last) HandOver(layer.bias_grad, next_index);
      HandOver(layer.weight_grad, next_index);
    }
    if (l == 0) continue;
    Layer& below = layers_[l - 1];
    STOKER_RETURN_IF_ERROR(RunGemm(*gemms.input_grad, GemmWeight(layer), layer.output_grad.get(),
                                   below.output_grad.get()));
    if (!gemms.input_grad_fused) {
      STOKER_CUDA_RETURN_IF_ERROR(
          cuda::LaunchReluBackwardBiasGrad(below.output_grad.get(), below.output.get(), type_, rows,
                                           below.out, below.bias_grad.as<float>(), stream));
    } else if (type_ != DType::kF32) {
      // The epilogue wrote the bias gradient in the compute type; the optimizer reads fp32.
      STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertToF32(
          below.bias_grad_low.get(), type_, below.out, below.bias_grad.as<float>(), stream));
    }
    if (reducer_ != nullptr) HandOver(below.bias_grad, next_index);
  }
  return absl::OkStatus();
}

absl::Status CudaMlp::FinishStep() { return state_.ReadBack(context_->compute_stream()); }

absl::Status CudaMlp::EnqueueForwardBackward(const Plan& plan, int rows, int slot, bool features,
                                             float share) {
  const cudaStream_t stream = context_->compute_stream();
  cuda::StepState* state = state_.device();
  STOKER_RETURN_IF_ERROR(state_.EnqueueReset(stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&state->learning_rate, host_rate_, sizeof(float),
                                              cudaMemcpyHostToDevice, stream));
  STOKER_RETURN_IF_ERROR(NormalizeStaged(slot, rows, features));
  STOKER_RETURN_IF_ERROR(Forward(plan, rows));
  Layer& last = layers_.back();
  // This rank's part of the global batch's mean: the cross-entropy multiplies its gradient by
  // StepState::loss_scale, so the share rides on it for that one kernel (the fast path has no
  // kernel of its own to scale the logits' gradient). Never in a captured graph: a step with a
  // reducer runs eagerly, and the host copies are current (every step ends synchronised).
  if (share != 1.0f) {
    host_share_scales_[1] = state_.host().loss_scale;
    host_share_scales_[0] = host_share_scales_[1] * share;
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&state->loss_scale, &host_share_scales_[0],
                                                sizeof(float), cudaMemcpyHostToDevice, stream));
  }
  STOKER_CUDA_RETURN_IF_ERROR(
      cuda::LaunchSoftmaxCrossEntropy(last.output.as<float>(), staging_.labels(slot), rows,
                                      last.out, type_, last.output_grad.get(), state, stream));
  if (share != 1.0f) {
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&state->loss_scale, &host_share_scales_[1],
                                                sizeof(float), cudaMemcpyHostToDevice, stream));
  }
  return Backward(plan, rows);
}

absl::Status CudaMlp::EnqueueInjectedGradient() {
  const std::optional<float> value = TakeInjectedGradient();
  if (!value.has_value()) return absl::OkStatus();
  STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchAddToFirst(layers_[0].weight_grad.as<float>(), *value,
                                                     context_->compute_stream()));
  return absl::OkStatus();
}

absl::Status CudaMlp::EnqueueUpdate() {
  const cudaStream_t stream = context_->compute_stream();
  cuda::StepState* state = state_.device();
  const int tensor_count = static_cast<int>(sgd_tensors_.size());
  if (loss_scaling_) {
    STOKER_CUDA_RETURN_IF_ERROR(
        cuda::LaunchCheckFinite(sgd_tensors_.data(), tensor_count, state, stream));
  }
  STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchSgdMomentumRateFromState(
      sgd_tensors_.data(), tensor_count, type_, static_cast<float>(config_.optimizer.momentum),
      config_.optimizer.nesterov, state, loss_scaling_, stream));
  if (loss_scaling_) STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchUpdateLossScale(state, stream));
  return state_.EnqueueReadBack(stream);
}

absl::StatusOr<StepResult> CudaMlp::TrainStep(const BatchView& batch, double learning_rate) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  if (absl::Status status = ValidateLearningRate(learning_rate); !status.ok()) return status;
  // This rank's part of the global batch's mean (1 alone).
  STOKER_ASSIGN_OR_RETURN(const float share, LocalGradientShare(reducer_));
  STOKER_RETURN_IF_ERROR(context_->Activate());
  STOKER_ASSIGN_OR_RETURN(Plan* const plan, PlanFor(batch.count));
  const int rows = batch.count;
  const bool features = batch.features != nullptr;
  const cudaStream_t stream = context_->compute_stream();

  absl::StatusOr<int> slot =
      staging_.Stage(batch, context_->copy_stream(), context_->compute_stream());
  if (!slot.ok()) return slot.status();
  // The previous step has finished (its end synchronised), so nothing reads host_rate_ now.
  *host_rate_ = static_cast<float>(learning_rate);
  if (reducer_ != nullptr && options_.cuda_graphs) {
    NoteFallback(
        "data-parallel training steps run kernel by kernel, not as a CUDA graph: the gradient "
        "reducer's calls sit between backward's kernels, and its result decides the update");
  }
  const bool graph = options_.cuda_graphs && !plan->graph_failed && !has_injected_gradient() &&
                     reducer_ == nullptr;
  const int kind = features ? 1 : 0;
  bool enqueued = false;
  if (graph) {
    cuda::GraphExec& exec = plan->step_graphs[*slot][kind];
    GemmCounts& exec_gemms = plan->graph_gemms[*slot][kind];
    // The first step of each batch size and input kind runs kernel by kernel (the warm-up).
    if (!exec && plan->warmed_up[kind]) {
      pending_gemms_ = {};
      absl::StatusOr<cuda::GraphExec> captured = cuda::GraphExec::Capture(
          stream, [&] { return EnqueueTrainStep(*plan, rows, *slot, features); });
      if (captured.ok()) {
        exec = *std::move(captured);
        exec_gemms = pending_gemms_;
        ++counters_.graph_captures;
      } else {
        // Kernel by kernel from now on for this batch size; the step itself still runs below.
        plan->graph_failed = true;
        NoteFallback(absl::StrCat("CUDA graph capture of the ", rows,
                                  "-sample training step failed, that batch size runs kernel by "
                                  "kernel: ",
                                  captured.status().message()));
      }
      pending_gemms_ = {};
    }
    if (exec) {
      STOKER_RETURN_IF_ERROR(exec.Launch(stream));
      enqueued = true;
      ++counters_.graph_replays;
      CountGemms(exec_gemms);
    }
  }
  if (!enqueued) {
    pending_gemms_ = {};
    const absl::Status step = reducer_ != nullptr
                                  ? EnqueueDataParallelStep(*plan, rows, *slot, features, share)
                                  : EnqueueTrainStep(*plan, rows, *slot, features);
    if (!step.ok()) {
      // The staging slot goes back to the copy stream whatever happened; nothing was updated.
      (void)staging_.Release(*slot, stream);
      pending_gemms_ = {};
      (void)TakeInjectedGradient();
      return step;
    }
    CountGemms(pending_gemms_);
    pending_gemms_ = {};
    ++counters_.eager_steps;
    plan->warmed_up[kind] = true;
  }
  (void)TakeInjectedGradient();
  // Nothing reads the staging slot after this step; the copy stream may refill it.
  STOKER_RETURN_IF_ERROR(staging_.Release(*slot, stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));

  // found_inf is only ever set by the fp16 finite check.
  return state_.TrainResult(rows, loss_scaling_);
}

absl::Status CudaMlp::EnqueueDataParallelStep(const Plan& plan, int rows, int slot, bool features,
                                              float share) {
  STOKER_RETURN_IF_ERROR(EnqueueForwardBackward(plan, rows, slot, features, share));
  STOKER_RETURN_IF_ERROR(reducer_->Finish());
  // Into the summed gradient, as an overflow of the sum would be.
  STOKER_RETURN_IF_ERROR(EnqueueInjectedGradient());
  return EnqueueUpdate();
}

absl::StatusOr<StepResult> CudaMlp::StepWithoutSamples(double learning_rate) {
  STOKER_RETURN_IF_ERROR(context_->Activate());
  const cudaStream_t stream = context_->compute_stream();
  *host_rate_ = static_cast<float>(learning_rate);
  STOKER_RETURN_IF_ERROR(state_.EnqueueReset(stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&state_.device()->learning_rate, host_rate_,
                                              sizeof(float), cudaMemcpyHostToDevice, stream));
  // Zero gradients in TrainStep's order (layers last to first, bias then weight), so the sums
  // over the ranks are the other ranks' gradients.
  int next_index = 0;
  for (size_t l = layers_.size(); l-- > 0;) {
    const Layer& layer = layers_[l];
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(layer.bias_grad.get(), 0, layer.bias_grad.bytes(), stream));
    HandOver(layer.bias_grad, next_index);
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(layer.weight_grad.get(), 0, layer.weight_grad.bytes(), stream));
    HandOver(layer.weight_grad, next_index);
  }
  STOKER_RETURN_IF_ERROR(reducer_->Finish());
  STOKER_RETURN_IF_ERROR(EnqueueUpdate());
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  ++counters_.eager_steps;
  // No samples: loss 0; the fp16 overflow flag and scale as the step left them.
  StepResult result = state_.TrainResult(1, loss_scaling_);
  result.loss = 0;
  return result;
}

absl::StatusOr<EvalResult> CudaMlp::Evaluate(const BatchView& batch) {
  STOKER_RETURN_IF_ERROR(ValidateBatch(config_, batch));
  STOKER_RETURN_IF_ERROR(context_->Activate());
  STOKER_ASSIGN_OR_RETURN(Plan * plan, PlanFor(batch.count));
  const cudaStream_t stream = context_->compute_stream();
  STOKER_RETURN_IF_ERROR(state_.EnqueueReset(stream));
  absl::StatusOr<int> slot =
      staging_.Stage(batch, context_->copy_stream(), context_->compute_stream());
  if (!slot.ok()) return slot.status();
  STOKER_RETURN_IF_ERROR(NormalizeStaged(*slot, batch.count, batch.features != nullptr));
  pending_gemms_ = {};
  STOKER_RETURN_IF_ERROR(Forward(*plan, batch.count));
  CountGemms(pending_gemms_);
  pending_gemms_ = {};
  const Layer& last = layers_.back();
  STOKER_CUDA_RETURN_IF_ERROR(
      cuda::LaunchSoftmaxCrossEntropy(last.output.as<float>(), staging_.labels(*slot), batch.count,
                                      last.out, type_, nullptr, state_.device(), stream));
  STOKER_RETURN_IF_ERROR(staging_.Release(*slot, stream));
  STOKER_RETURN_IF_ERROR(FinishStep());
  return state_.EvaluateResult(batch.count);
}

std::vector<DeviceTensorRef> CudaMlp::Tensors(bool optimizer_state) const {
  std::vector<DeviceTensorRef> tensors;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const std::string suffix = optimizer_state ? ".momentum" : "";
    const DeviceBuffer& weight = optimizer_state ? layer.weight_velocity : layer.weight;
    const DeviceBuffer& bias = optimizer_state ? layer.bias_velocity : layer.bias;
    tensors.push_back({ParameterName(l, /*weight=*/true) + suffix,
                       {layer.out, layer.in},
                       weight.as<float>(),
                       static_cast<size_t>(layer.out) * layer.in});
    tensors.push_back({ParameterName(l, /*weight=*/false) + suffix,
                       {layer.out},
                       bias.as<float>(),
                       static_cast<size_t>(layer.out)});
  }
  return tensors;
}

std::vector<NamedTensor> CudaMlp::Parameters() const {
  absl::StatusOr<std::vector<NamedTensor>> copies =
      cuda::DownloadTensors(*context_, Tensors(false));
  return copies.ok() ? *std::move(copies) : std::vector<NamedTensor>{};
}

absl::Status CudaMlp::SetParameters(const std::vector<NamedTensor>& parameters) {
  STOKER_RETURN_IF_ERROR(cuda::UploadTensors(*context_, Tensors(false), parameters));
  return RefreshLowWeights();
}

// fp16 adds "loss_scale" [2] = {scale, consecutive clean steps}, as NetworkConfig's contract
// names it, so that a resumed run continues exactly.
std::vector<NamedTensor> CudaMlp::OptimizerState() const {
  absl::StatusOr<std::vector<NamedTensor>> copies = cuda::DownloadTensors(*context_, Tensors(true));
  if (!copies.ok()) return {};
  if (loss_scaling_) {
    // The host copy is current: every step and SetOptimizerState end synchronised.
    const cuda::StepState& state = state_.host();
    copies->push_back(
        {"loss_scale", {2}, {state.loss_scale, static_cast<float>(state.growth_tracker)}});
  }
  return *std::move(copies);
}

absl::Status CudaMlp::SetOptimizerState(const std::vector<NamedTensor>& state) {
  if (!loss_scaling_) return cuda::UploadTensors(*context_, Tensors(true), state);
  if (state.empty() || state.back().name != "loss_scale" || state.back().values.size() != 2 ||
      !(state.back().values[0] > 0) || !(state.back().values[1] >= 0)) {
    return absl::InvalidArgumentError(
        "fp16 optimizer state must end with 'loss_scale' [2] = {scale > 0, clean steps >= 0}");
  }
  const std::vector<NamedTensor> momentum(state.begin(), state.end() - 1);
  STOKER_RETURN_IF_ERROR(cuda::UploadTensors(*context_, Tensors(true), momentum));
  return state_.SetLossScale(state.back().values[0], static_cast<int>(state.back().values[1]),
                             context_->compute_stream());
}

absl::Status CudaMlp::RefreshLowWeights() {
  if (type_ == DType::kF32) return absl::OkStatus();
  const cudaStream_t stream = context_->compute_stream();
  for (const Layer& layer : layers_) {
    STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertFromF32(
        layer.weight.as<float>(), static_cast<int64_t>(layer.out) * layer.in, type_,
        layer.weight_low.get(), stream));
    if (layer.bias_low.get() != nullptr) {
      STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertFromF32(layer.bias.as<float>(), layer.out,
                                                             type_, layer.bias_low.get(), stream));
    }
  }
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateCudaMlp(const MlpConfig& config, int device,
                                                     const CudaBackendOptions& options) {
  if (absl::Status status = ValidateMlpConfig(config); !status.ok()) return status;
  if (config.optimizer.type != OptimizerType::kSgd) {
    return absl::UnimplementedError("the cuda MLP implements SGD (with momentum, nesterov) only");
  }
  if (config.optimizer.clip_grad_norm > 0) {
    return absl::UnimplementedError("the cuda MLP does not implement clip_grad_norm");
  }
  auto model = std::make_unique<CudaMlp>(config, options);
  if (absl::Status status = model->Init(device); !status.ok()) return status;
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace stoker
