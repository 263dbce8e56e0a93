// Private to the cuda network (cuda_network.h): the model class and the per-layer and
// per-batch-size structures that its three source files share.
//   cuda_network.cc        creation, the step (staging, forward, backward, optimizer), Evaluate
//   cuda_network_plan.cc   layers, buffers, and each batch size's descriptors, algorithms, GEMMs
//   cuda_network_state.cc  parameters and optimizer state to and from the host
// Only built with cuDNN (STOKER_HAVE_CUDNN).
#ifndef STOKER_ENGINE_CUDA_CUDA_NETWORK_INTERNAL_H_
#define STOKER_ENGINE_CUDA_CUDA_NETWORK_INTERNAL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/cuda/batch_staging.h"
#include "engine/cuda/compute_type.h"
#include "engine/cuda/cuda_backend_options.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/cudnn_util.h"
#include "engine/cuda/dtype.h"
#include "engine/cuda/lt_gemm.h"
#include "engine/cuda/mlp_kernels.h"
#include "engine/cuda/model_counters.h"
#include "engine/cuda/network_kernels.h"
#include "engine/cuda/step_state.h"
#include "engine/cuda/tensor_transfer.h"
#include "engine/plan_cache.h"

namespace stoker::cuda::network_internal {

// Plans kept besides the full-batch one; a new batch size beyond this evicts the oldest.
inline constexpr size_t kMaxPartialPlans = 3;

inline int64_t Product(const std::vector<int>& shape) {
  int64_t product = 1;
  for (int d : shape) product *= d;
  return product;
}

// The `channels` and `spatial` arguments of DropoutCpuIndex for a Dropout's activation.
struct DropoutLayout {
  int channels = 1;
  int64_t spatial = 1;
};

// The order in which the cpu network hashes the mask of Dropout layers[layer_index]
// (cpu_network.cc, CpuNetwork::ActivationMd): an image activation is NHWC there, and so is a flat
// one that Flatten made from an image (through any ReLU, GELU and Dropout layers after the
// Flatten); the network's input stays NCHW. NHWC gives {C, H * W}; otherwise the identity,
// {values per sample, 1}. `shapes` as NetworkShapes returns them.
DropoutLayout DropoutHashLayout(const NetworkConfig& config,
                                const std::vector<std::vector<int>>& shapes, size_t layer_index);

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t size = 0;
  bool is_weight = false;  // weight decay applies to weights only
  DeviceBuffer value;      // fp32 master
  DeviceBuffer grad;       // fp32
  DeviceBuffer state1;     // SGD momentum or AdamW exp_avg
  DeviceBuffer state2;     // AdamW exp_avg_sq
  // bf16/fp16: the compute-type copy the layers read (weights), or the bias a fused Linear
  // epilogue adds to a compute-type output (biases; lt_gemm.h). Written with the master.
  DeviceBuffer low;
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
  DropoutLayout dropout_layout;  // Dropout: the cpu's mask order (DropoutHashLayout)
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

// The Model of cuda_network.h (see there for the layout and the step).
class CudaNetwork final : public CountingModel {
 public:
  CudaNetwork(const NetworkConfig& config, std::vector<std::vector<int>> shapes,
              ParameterNaming naming, const CudaBackendOptions& options)
      : config_(config),
        shapes_(std::move(shapes)),
        naming_(naming),
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
  bool adamw() const { return config_.optimizer.type == OptimizerType::kAdamW; }
  bool clipping() const { return config_.optimizer.clip_grad_norm > 0; }

  absl::Status BuildLayers();
  absl::Status AllocateStepBuffers();
  absl::StatusOr<std::unique_ptr<Plan>> BuildPlan(int batch);
  absl::StatusOr<Plan*> PlanFor(int batch);
  absl::Status ProbePooling();

  // Enqueues and counts the GEMM (CudaModelCounters).
  absl::Status RunGemm(const LtGemm& gemm, const void* a, const void* b, void* d);

  // Enqueues the batch copy and the input conversion; returns the staging slot.
  absl::StatusOr<int> StageBatch(const BatchView& batch);
  absl::Status Forward(const Plan& plan, int rows, bool training);
  // The fp32 logits of the last Forward.
  absl::StatusOr<const float*> Logits(int rows);
  absl::Status Backward(const Plan& plan, int rows);
  absl::Status ApplyOptimizer(float learning_rate);
  // Copies the step state to the host and waits for it: the step's one host synchronisation.
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

  std::vector<DeviceTensorRef> ParameterRefs() const;
  // Per-parameter state, then the scalars (without data: they live on the host).
  std::vector<DeviceTensorRef> StateRefs() const;
  std::vector<std::pair<std::string, std::vector<float>>> ScalarState() const;

  const NetworkConfig config_;
  const std::vector<std::vector<int>> shapes_;  // per activation, without the batch
  const ParameterNaming naming_;
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
  BatchStaging staging_;
  StepStateBuffer state_;
  DeviceBuffer clip_;  // cuda::ClipState, when clipping
  std::vector<cuda::OptimizerTensor> optimizer_tensors_;
  std::vector<cuda::SgdTensor> finite_check_tensors_;  // LaunchCheckFinite reads grad and size
  std::unique_ptr<Plan> full_plan_;
  PartialPlanCache<Plan> partial_plans_{kMaxPartialPlans};
  int64_t optimizer_steps_ = 0;  // applied updates (AdamW's bias-correction step)
  int64_t train_steps_ = 0;      // TrainStep calls that ran (dropout's mask stream)
  std::optional<float> injected_gradient_;
};

}  // namespace stoker::cuda::network_internal

#endif  // STOKER_ENGINE_CUDA_CUDA_NETWORK_INTERNAL_H_
