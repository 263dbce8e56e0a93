// Private to the cuda network (cuda_network.h): the model class, its flattened graph and the
// per-node and per-batch-size structures that its three source files share.
//   cuda_network.cc        creation, the step (staging, forward, backward, optimizer), Evaluate
//   cuda_network_plan.cc   the graph, parameters, buffers, and each batch size's descriptors,
//                          algorithms and GEMMs
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
#include "engine/cuda/vision_kernels.h"
#include "engine/model.h"
#include "engine/model_shapes.h"
#include "engine/network_graph.h"
#include "engine/plan_cache.h"

namespace stoker::cuda::network_internal {

// Plans kept besides the full-batch one; a new batch size beyond this evicts the oldest.
inline constexpr size_t kMaxPartialPlans = 3;

inline int64_t Product(const std::vector<int>& shape) {
  int64_t product = 1;
  for (int d : shape) product *= d;
  return product;
}

// One activation of the network graph (network_graph.h) with the type the cuda network keeps its
// value in (gradients are always in the compute type).
struct Activation : GraphActivation {
  Activation() = default;
  Activation(GraphActivation activation, DType value_type)
      : GraphActivation(std::move(activation)), type(value_type) {}
  DType type = DType::kF32;
};

// A node of the network graph with the order its Dropout hashes the mask in (the cpu's:
// DropoutHashLayout, the `channels` and `spatial` arguments of DropoutCpuIndex).
struct Node : GraphNode {
  Node() = default;
  explicit Node(GraphNode node) : GraphNode(std::move(node)) {}
  DropoutLayout dropout_layout;
};

// The network graph as the cuda network runs it (host only: no device memory): no gradient for
// the network input, and each buffer's size at max_batch.
struct Graph {
  std::vector<Node> nodes;
  std::vector<Activation> activations;
  std::vector<size_t> buffer_bytes;  // per buffer, at max_batch
  int output = 0;                    // the logits' activation
};

// The graph of a config ValidateNetworkConfig accepts, with `type` the compute type (the logits
// straight from a final Linear are fp32 unless fp16, as on the cpu).
Graph BuildGraph(const NetworkConfig& config, DType type);

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t size = 0;
  bool trained = true;   // false: a BatchNorm buffer (value only)
  bool decayed = false;  // weight decay applies to Conv2d and Linear weights only
  DeviceBuffer value;    // fp32 master
  DeviceBuffer grad;     // fp32
  DeviceBuffer state1;   // SGD momentum or AdamW exp_avg
  DeviceBuffer state2;   // AdamW exp_avg_sq
  // bf16/fp16: the compute-type copy the layers read (Conv2d/Linear weights), or the bias a fused
  // Linear epilogue adds to a compute-type output (their biases; lt_gemm.h). Written with the
  // master.
  DeviceBuffer low;
};

// What one node owns on the device besides its activations.
struct NodeResources {
  DeviceBuffer keep;             // Dropout mask, uint8 per element
  DeviceBuffer weight_grad_low;  // Conv2d in bf16/fp16: cuDNN's weight gradient
  DeviceBuffer mean, variance;   // BatchNorm: the last training batch's statistics (fp32)
  cuda::FilterDescriptor filter;
  cuda::PoolingDescriptor pooling;
  bool own_pooling = false;  // cuDNN refused this max pooling: network_kernels' kernels run it
};

// What one node runs at one batch size.
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
  std::vector<LayerPlan> layers;  // per node
};

// The Model of cuda_network.h (see there for the layout and the step).
class CudaNetwork final : public CountingModel {
 public:
  CudaNetwork(const NetworkConfig& config, ParameterNaming naming,
              const CudaBackendOptions& options)
      : CountingModel(/*gradient_test_hook=*/true),
        config_(config),
        naming_(naming),
        options_(options),
        type_(ComputeType(config.precision)),
        loss_scaling_(config.precision == Precision::kFp16),
        graph_(BuildGraph(config, type_)) {}
  ~CudaNetwork() override;

  absl::Status Init(int device);

  STOKER_MODEL_OVERRIDES;
  int MinTrainBatch() const override { return CheckBatchNormValues(1).ok() ? 1 : 2; }
  cudaStream_t compute_stream() const { return context_->compute_stream(); }
  void* device_stream() const override { return compute_stream(); }

 private:
  absl::StatusOr<StepResult> StepWithoutSamples(double learning_rate) override;
  using Kind = LayerConfig::Kind;
  bool adamw() const { return config_.optimizer.type == OptimizerType::kAdamW; }
  bool clipping() const { return config_.optimizer.clip_grad_norm > 0; }

  absl::Status BuildParameters();
  absl::Status BuildNodes();
  absl::Status AllocateStepBuffers();
  absl::StatusOr<std::unique_ptr<Plan>> BuildPlan(int batch);
  absl::Status PlanLinear(const Node& node, int batch, LayerPlan& lp);
  absl::StatusOr<Plan*> PlanFor(int batch);
  absl::Status ProbePooling();

  // Enqueues and counts the GEMM (CudaModelCounters).
  absl::Status RunGemm(const LtGemm& gemm, const void* a, const void* b, void* d);

  // Enqueues the batch copy and the input conversion; returns the staging slot.
  absl::StatusOr<int> StageBatch(const BatchView& batch);
  absl::Status Forward(const Plan& plan, int rows, bool training);
  // Layer node `index` as ForwardLayer and BackwardLayer read it: the node, its resources, its
  // config, and its input and output shapes (per sample).
  struct LayerRefs {
    const Node& node;
    const NodeResources& r;
    const LayerConfig& c;
    const std::vector<int>& in_shape;
    const std::vector<int>& out_shape;
  };
  LayerRefs LayerAt(size_t index) const {
    const Node& node = graph_.nodes[index];
    return {node, resources_[index], node.config, graph_.activations[node.in].shape,
            graph_.activations[node.out].shape};
  }
  absl::Status ForwardLayer(size_t index, const LayerPlan& lp, int rows, bool training);
  // The fp32 logits of the last Forward.
  absl::StatusOr<const float*> Logits(int rows);
  absl::Status Backward(const Plan& plan, int rows);
  absl::Status BackwardLayer(size_t index, const LayerPlan& lp, int rows);
  // With a reducer: hands the node's trained gradients over (their work enqueued) in reverse
  // Parameters() order (bias before weight, BatchNorm beta before gamma); the test hook's value
  // goes into params_[0]'s gradient before it is handed over.
  absl::Status HandOverGradients(const Node& node);
  absl::Status ApplyInjectedGradient();
  // INVALID_ARGUMENT naming the first BatchNorm that a training batch of `batch` samples would
  // give one value per channel (PyTorch refuses it; so does the cpu network).
  absl::Status CheckBatchNormValues(int batch) const;
  // BatchNorm's running statistics from the batch statistics Forward(training) kept: once the
  // step can no longer fail.
  absl::Status UpdateRunningStatistics(int rows);
  absl::Status ApplyOptimizer(float learning_rate);
  // After the gradients are final (and summed over the ranks): the optimizer, the step state's
  // read-back (the step's one host synchronisation) and the counters.
  absl::StatusOr<StepResult> FinishStep(double learning_rate, int rows);

  void* Buffer(int index) const { return index < 0 ? nullptr : buffers_[index].get(); }
  void* Value(int activation) const { return Buffer(graph_.activations[activation].value); }
  void* Grad(int activation) const { return Buffer(graph_.activations[activation].grad); }
  // The weight as the layers read it (compute type).
  const void* ComputeWeight(const Node& node) const {
    const Param& w = params_[node.weight];
    return type_ == DType::kF32 ? w.value.get() : w.low.get();
  }
  cuda::PoolGeometry PoolGeometryOf(const Node& node, int rows) const;
  absl::Status RefreshLowWeights();

  std::vector<DeviceTensorRef> ParameterRefs() const;
  // Per-parameter state, then the scalars (without data: they live on the host).
  std::vector<DeviceTensorRef> StateRefs() const;
  std::vector<std::pair<std::string, std::vector<float>>> ScalarState() const;

  const NetworkConfig config_;
  const ParameterNaming naming_;
  const CudaBackendOptions options_;
  const DType type_;
  const bool loss_scaling_;
  const Graph graph_;
  // Declared first so that it is destroyed last, after every buffer, handle and event below.
  std::unique_ptr<DeviceContext> context_;
  cuda::CudnnHandle cudnn_;  // only when a Conv2d or MaxPool2d needs it
  std::vector<Param> params_;
  std::vector<DeviceBuffer> buffers_;     // graph_.buffer_bytes
  std::vector<NodeResources> resources_;  // per node
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
  int next_gradient_index_ = 0;  // GradientReady's index within the step
};

}  // namespace stoker::cuda::network_internal

#endif  // STOKER_ENGINE_CUDA_CUDA_NETWORK_INTERNAL_H_
