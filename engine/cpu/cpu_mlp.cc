#include "engine/cpu/cpu_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_helpers.h"
#include "engine/bf16.h"
#include "engine/cpu/aligned_array.h"
#include "engine/cpu/cpu_kernels.h"
#include "engine/cpu/cpu_train_kernels.h"
#include "engine/model_base.h"
#include "engine/plan_cache.h"
#include "engine/tensor_match.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace stoker {
namespace {

using dnnl::memory;
using DataType = memory::data_type;
using Tag = memory::format_tag;

// Plans kept besides the full-batch one; a new batch size beyond this evicts the oldest.
constexpr size_t kMaxPartialPlans = 3;

struct Layer {
  int in = 0;
  int out = 0;
  bool relu = false;
  AlignedArray<float> weight;  // [out, in], fp32 master
  AlignedArray<float> bias;    // [out]
  AlignedArray<float> weight_grad;
  AlignedArray<float> bias_grad;
  AlignedArray<float> weight_velocity;
  AlignedArray<float> bias_velocity;
  AlignedArray<bf16_t> weight_bf16;  // bf16 only: the copy the matmuls read
  // [max_batch, out]: ReLU output in the compute type for hidden layers, fp32 logits for the last.
  AlignedArray<std::byte> output;
  AlignedArray<float> output_grad;        // [max_batch, out]: dLoss/d(pre-activation output)
  AlignedArray<bf16_t> output_grad_bf16;  // bf16 only: the copy the backward matmuls read
};

// A primitive with its arguments bound once. `c_args` views `args`: executing through the C API
// with it spares the C++ API's per-call conversion of the argument map (a heap allocation).
struct Op {
  dnnl::matmul primitive;
  std::unordered_map<int, memory> args;
  std::vector<dnnl_exec_arg_t> c_args;
};

// Everything one batch size needs: primitives with their bound arguments and their scratchpad.
struct Plan {
  int batch = 0;
  AlignedArray<std::byte> scratchpad;
  std::vector<Op> forward;      // per layer
  std::vector<Op> weight_grad;  // per layer: dW = dY^T X
  std::vector<Op> input_grad;   // per layer: dX = dY W (unused, left empty, for layer 0)
};

class CpuMlp final : public ModelBase {
 public:
  explicit CpuMlp(const MlpConfig& config);

  // Builds the full-batch plan and loads the initial weights.
  absl::Status Init();

  STOKER_MODEL_OVERRIDES;

 private:
  absl::StatusOr<StepResult> StepWithoutSamples(double learning_rate) override;
  // A tensor the model owns, by reference: weights/biases or their momentum buffers.
  struct TensorRef {
    std::string name;
    std::vector<int64_t> shape;
    float* data;
    size_t size;
  };
  std::vector<TensorRef> Tensors(bool optimizer_state) const;
  static std::vector<NamedTensor> Copy(const std::vector<TensorRef>& tensors);
  static absl::Status Assign(const std::vector<TensorRef>& tensors,
                             const std::vector<NamedTensor>& values);

  DataType ComputeType() const { return bf16_ ? DataType::bf16 : DataType::f32; }
  absl::StatusOr<std::unique_ptr<Plan>> BuildPlan(int batch);
  absl::StatusOr<Plan*> PlanFor(int batch);
  void LoadInput(const BatchView& batch);
  // Throws dnnl::error, like the C++ API, so that callers handle every oneDNN failure alike.
  void Run(const Op& op) {
    dnnl::error::wrap_c_api(
        dnnl_primitive_execute(op.primitive.get(), stream_.get(),
                               static_cast<int>(op.c_args.size()), op.c_args.data()),
        "could not execute a matmul");
  }
  void RefreshBf16Weights();
  // GradientReady(next_index++, ...) for `gradient`, once the work writing it has finished.
  void HandOver(AlignedArray<float>& gradient, int& next_index);
  // SGD with momentum on every layer (weight decay on the weights only).
  void ApplyOptimizer(double learning_rate);

  const MlpConfig config_;
  const ChannelNormalization normalization_;  // of uint8 samples, per channel
  const bool bf16_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  AlignedArray<std::byte> input_;  // [max_batch, input_features], compute type
  std::vector<Layer> layers_;
  std::unique_ptr<Plan> full_plan_;
  PartialPlanCache<Plan> partial_plans_{kMaxPartialPlans};
};

CpuMlp::CpuMlp(const MlpConfig& config)
    : ModelBase(/*gradient_test_hook=*/false),
      config_(config),
      normalization_(InputNormalization(config)),
      bf16_(config.precision == Precision::kBf16),
      engine_(dnnl::engine::kind::cpu, 0),
      stream_(engine_) {
  const size_t compute_bytes = bf16_ ? sizeof(bf16_t) : sizeof(float);
  const size_t max_batch = config.max_batch;
  input_ = AlignedArray<std::byte>(max_batch * config.input_features * compute_bytes);
  for (const MlpLayerShape& shape : MlpLayerShapes(config)) {
    Layer layer;
    layer.in = shape.in;
    layer.out = shape.out;
    layer.relu = shape.relu;
    const size_t weights = static_cast<size_t>(layer.out) * layer.in;
    layer.weight = AlignedArray<float>(weights);
    layer.bias = AlignedArray<float>(layer.out);
    layer.weight_grad = AlignedArray<float>(weights);
    layer.bias_grad = AlignedArray<float>(layer.out);
    layer.weight_velocity = AlignedArray<float>(weights);
    layer.bias_velocity = AlignedArray<float>(layer.out);
    const size_t outputs = max_batch * layer.out;
    layer.output = AlignedArray<std::byte>(outputs * (layer.relu ? compute_bytes : sizeof(float)));
    layer.output_grad = AlignedArray<float>(outputs);
    if (bf16_) {
      layer.weight_bf16 = AlignedArray<bf16_t>(weights);
      layer.output_grad_bf16 = AlignedArray<bf16_t>(outputs);
    }
    layers_.push_back(std::move(layer));
  }
}

absl::Status CpuMlp::Init() {
  STOKER_ASSIGN_OR_RETURN(full_plan_, BuildPlan(config_.max_batch));
  return SetParameters(InitialMlpParameters(config_));
}

absl::StatusOr<std::unique_ptr<Plan>> CpuMlp::BuildPlan(int batch) {
  auto plan = std::make_unique<Plan>();
  plan->batch = batch;
  const DataType compute = ComputeType();
  const memory::dim rows = batch;
  // Two separate attrs: copying a dnnl::primitive_attr shares the underlying object.
  dnnl::primitive_attr plain_attr;
  plain_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::primitive_attr relu_attr;
  relu_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops relu;
  relu.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  relu_attr.set_post_ops(relu);

  // Descriptors first, so that one scratchpad sized for the largest primitive can be shared (the
  // primitives run one after another).
  struct Pending {
    dnnl::matmul::primitive_desc pd;
    std::unordered_map<int, void*> buffers;
    Op* op;
  };
  std::vector<Pending> pending;
  const size_t count = layers_.size();
  plan->forward.resize(count);
  plan->weight_grad.resize(count);
  plan->input_grad.resize(count);
  try {
    for (size_t l = 0; l < count; ++l) {
      Layer& layer = layers_[l];
      const memory::dim in = layer.in, out = layer.out;
      void* input = l == 0 ? static_cast<void*>(input_.data()) : layers_[l - 1].output.data();
      void* weight = bf16_ ? static_cast<void*>(layer.weight_bf16.data()) : layer.weight.data();
      void* grad =
          bf16_ ? static_cast<void*>(layer.output_grad_bf16.data()) : layer.output_grad.data();
      const DataType output_type = layer.relu ? compute : DataType::f32;

      // Y = X W^T + b (then ReLU): W [out, in] read as an [in, out] matrix with transposed strides.
      dnnl::matmul::desc forward({{rows, in}, compute, Tag::ab}, {{in, out}, compute, Tag::ba},
                                 {{1, out}, DataType::f32, Tag::ab},
                                 {{rows, out}, output_type, Tag::ab});
      pending.push_back(
          {dnnl::matmul::primitive_desc(forward, layer.relu ? relu_attr : plain_attr, engine_),
           {{DNNL_ARG_SRC, input},
            {DNNL_ARG_WEIGHTS, weight},
            {DNNL_ARG_BIAS, layer.bias.data()},
            {DNNL_ARG_DST, layer.output.data()}},
           &plan->forward[l]});

      // dW [out, in] = dY^T [out, rows] X [rows, in].
      dnnl::matmul::desc weight_grad({{out, rows}, compute, Tag::ba},
                                     {{rows, in}, compute, Tag::ab},
                                     {{out, in}, DataType::f32, Tag::ab});
      pending.push_back({dnnl::matmul::primitive_desc(weight_grad, plain_attr, engine_),
                         {{DNNL_ARG_SRC, grad},
                          {DNNL_ARG_WEIGHTS, input},
                          {DNNL_ARG_DST, layer.weight_grad.data()}},
                         &plan->weight_grad[l]});

      // dX [rows, in] = dY [rows, out] W [out, in], into the previous layer's output gradient.
      // The first layer's input needs no gradient.
      if (l == 0) continue;
      dnnl::matmul::desc input_grad({{rows, out}, compute, Tag::ab}, {{out, in}, compute, Tag::ab},
                                    {{rows, in}, DataType::f32, Tag::ab});
      pending.push_back({dnnl::matmul::primitive_desc(input_grad, plain_attr, engine_),
                         {{DNNL_ARG_SRC, grad},
                          {DNNL_ARG_WEIGHTS, weight},
                          {DNNL_ARG_DST, layers_[l - 1].output_grad.data()}},
                         &plan->input_grad[l]});
    }
    size_t scratchpad_bytes = 0;
    for (const Pending& p : pending) {
      scratchpad_bytes = std::max(scratchpad_bytes, p.pd.scratchpad_desc().get_size());
    }
    plan->scratchpad = AlignedArray<std::byte>(scratchpad_bytes);
    for (Pending& p : pending) {
      p.op->primitive = dnnl::matmul(p.pd);
      for (const auto& [arg, pointer] : p.buffers) {
        p.op->args.emplace(arg,
                           memory(p.pd.query_md(dnnl::query::exec_arg_md, arg), engine_, pointer));
      }
      p.op->args.emplace(DNNL_ARG_SCRATCHPAD,
                         memory(p.pd.scratchpad_desc(), engine_, plan->scratchpad.data()));
      for (const auto& [arg, bound] : p.op->args) p.op->c_args.push_back({arg, bound.get()});
    }
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN could not build the ",
                                            PrecisionName(config_.precision),
                                            " MLP primitives for batch ", batch, ": ", e.what()));
  }
  return plan;
}

absl::StatusOr<Plan*> CpuMlp::PlanFor(int batch) {
  return partial_plans_.Get(full_plan_.get(), batch, [this](int size) { return BuildPlan(size); });
}

void CpuMlp::LoadInput(const BatchView& batch) {
  const int64_t n = static_cast<int64_t>(batch.count) * config_.input_features;
  if (batch.features != nullptr) {
    if (bf16_) {
      cpu::ConvertToBf16(batch.features, n, reinterpret_cast<bf16_t*>(input_.data()));
    } else {
      std::copy(batch.features, batch.features + n, reinterpret_cast<float*>(input_.data()));
    }
    return;
  }
  const cpu::ChannelAffine affine{normalization_.channels, normalization_.plane,
                                  normalization_.scale.data(), normalization_.shift.data()};
  if (bf16_) {
    cpu::NormalizeToBf16(batch.samples, n, affine, reinterpret_cast<bf16_t*>(input_.data()));
  } else {
    cpu::NormalizeToF32(batch.samples, n, affine, reinterpret_cast<float*>(input_.data()));
  }
}

absl::StatusOr<StepResult> CpuMlp::TrainStep(const BatchView& batch, double learning_rate) {
  STOKER_RETURN_IF_ERROR(ValidateBatch(config_, batch));
  STOKER_RETURN_IF_ERROR(ValidateLearningRate(learning_rate));
  // This rank's part of the global batch's mean.
  STOKER_ASSIGN_OR_RETURN(const float share, LocalGradientShare(reducer_));
  STOKER_ASSIGN_OR_RETURN(Plan * plan_pointer, PlanFor(batch.count));
  Plan& plan = *plan_pointer;
  const int rows = batch.count;
  StepResult result;
  try {
    LoadInput(batch);
    for (const Op& op : plan.forward) Run(op);
    Layer& last = layers_.back();
    const double loss_sum =
        cpu::SoftmaxCrossEntropy(reinterpret_cast<const float*>(last.output.data()), batch.labels,
                                 rows, last.out, last.output_grad.data(), nullptr);
    result.loss = static_cast<float>(loss_sum / rows);
    // The fast path has no loss scale to fold the share into: one pass over the logits' gradient
    // (rows x classes values), only when it changes anything.
    if (share != 1) {
      cpu::ScaleInPlace(last.output_grad.data(), static_cast<int64_t>(rows) * last.out, share);
    }

    int next_index = 0;  // GradientReady's
    for (size_t l = layers_.size(); l-- > 0;) {
      Layer& layer = layers_[l];
      bf16_t* grad_bf16 = bf16_ ? layer.output_grad_bf16.data() : nullptr;
      if (!layer.relu) {
        cpu::FinishOutputGrad<float>(nullptr, rows, layer.out, layer.output_grad.data(),
                                     layer.bias_grad.data(), grad_bf16);
      } else if (bf16_) {
        cpu::FinishOutputGrad(reinterpret_cast<const bf16_t*>(layer.output.data()), rows, layer.out,
                              layer.output_grad.data(), layer.bias_grad.data(), grad_bf16);
      } else {
        cpu::FinishOutputGrad(reinterpret_cast<const float*>(layer.output.data()), rows, layer.out,
                              layer.output_grad.data(), layer.bias_grad.data(), grad_bf16);
      }
      // Each gradient goes to the reducer as soon as it is final: the bias here, the weight after
      // its matmul (reverse Parameters() order), while the layers below still compute theirs.
      if (reducer_ != nullptr) HandOver(layer.bias_grad, next_index);
      Run(plan.weight_grad[l]);
      if (reducer_ != nullptr) HandOver(layer.weight_grad, next_index);
      if (l > 0) Run(plan.input_grad[l]);
    }
    stream_.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in TrainStep: ", e.what()));
  }
  if (reducer_ != nullptr) STOKER_RETURN_IF_ERROR(reducer_->Finish());
  ApplyOptimizer(learning_rate);
  return result;
}

absl::StatusOr<StepResult> CpuMlp::StepWithoutSamples(double learning_rate) {
  int next_index = 0;  // TrainStep's order: layers last to first, bias then weight
  for (size_t l = layers_.size(); l-- > 0;) {
    Layer& layer = layers_[l];
    std::fill_n(layer.bias_grad.data(), layer.bias_grad.size(), 0.0f);
    HandOver(layer.bias_grad, next_index);
    std::fill_n(layer.weight_grad.data(), layer.weight_grad.size(), 0.0f);
    HandOver(layer.weight_grad, next_index);
  }
  STOKER_RETURN_IF_ERROR(reducer_->Finish());
  ApplyOptimizer(learning_rate);
  return StepResult{};
}

void CpuMlp::HandOver(AlignedArray<float>& gradient, int& next_index) {
  stream_.wait();
  reducer_->GradientReady(next_index++, gradient.data(), static_cast<int64_t>(gradient.size()));
}

void CpuMlp::ApplyOptimizer(double learning_rate) {
  const float lr = static_cast<float>(learning_rate);
  const float momentum = static_cast<float>(config_.optimizer.momentum);
  const float weight_decay = static_cast<float>(config_.optimizer.weight_decay);
  for (Layer& layer : layers_) {
    cpu::SgdMomentumUpdate(static_cast<int64_t>(layer.out) * layer.in, lr, momentum, weight_decay,
                           layer.weight_grad.data(), layer.weight.data(),
                           layer.weight_velocity.data(),
                           bf16_ ? layer.weight_bf16.data() : nullptr);
    cpu::SgdMomentumUpdate(layer.out, lr, momentum, /*weight_decay=*/0.0f, layer.bias_grad.data(),
                           layer.bias.data(), layer.bias_velocity.data(), nullptr);
  }
}

absl::StatusOr<EvalResult> CpuMlp::Evaluate(const BatchView& batch) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  absl::StatusOr<Plan*> plan_or = PlanFor(batch.count);
  if (!plan_or.ok()) return plan_or.status();
  EvalResult result;
  result.count = batch.count;
  try {
    LoadInput(batch);
    for (const Op& op : (*plan_or)->forward) Run(op);
    stream_.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in Evaluate: ", e.what()));
  }
  const Layer& last = layers_.back();
  result.loss_sum =
      cpu::SoftmaxCrossEntropy(reinterpret_cast<const float*>(last.output.data()), batch.labels,
                               batch.count, last.out, nullptr, &result.correct);
  return result;
}

std::vector<CpuMlp::TensorRef> CpuMlp::Tensors(bool optimizer_state) const {
  std::vector<TensorRef> tensors;
  for (size_t l = 0; l < layers_.size(); ++l) {
    // The model owns these buffers; const here only means "as seen by a const caller".
    Layer& layer = const_cast<Layer&>(layers_[l]);
    const std::string suffix = optimizer_state ? ".momentum" : "";
    AlignedArray<float>& weight = optimizer_state ? layer.weight_velocity : layer.weight;
    AlignedArray<float>& bias = optimizer_state ? layer.bias_velocity : layer.bias;
    tensors.push_back({ParameterName(l, /*weight=*/true) + suffix,
                       {layer.out, layer.in},
                       weight.data(),
                       weight.size()});
    tensors.push_back(
        {ParameterName(l, /*weight=*/false) + suffix, {layer.out}, bias.data(), bias.size()});
  }
  return tensors;
}

std::vector<NamedTensor> CpuMlp::Copy(const std::vector<TensorRef>& tensors) {
  std::vector<NamedTensor> copies;
  for (const TensorRef& tensor : tensors) {
    copies.push_back(
        {tensor.name, tensor.shape, std::vector<float>(tensor.data, tensor.data + tensor.size)});
  }
  return copies;
}

absl::Status CpuMlp::Assign(const std::vector<TensorRef>& tensors,
                            const std::vector<NamedTensor>& values) {
  if (absl::Status s = CheckTensorsMatch(tensors, values); !s.ok()) return s;
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::copy(values[i].values.begin(), values[i].values.end(), tensors[i].data);
  }
  return absl::OkStatus();
}

std::vector<NamedTensor> CpuMlp::Parameters() const { return Copy(Tensors(false)); }

absl::Status CpuMlp::SetParameters(const std::vector<NamedTensor>& parameters) {
  if (absl::Status s = Assign(Tensors(false), parameters); !s.ok()) return s;
  RefreshBf16Weights();
  return absl::OkStatus();
}

std::vector<NamedTensor> CpuMlp::OptimizerState() const { return Copy(Tensors(true)); }

absl::Status CpuMlp::SetOptimizerState(const std::vector<NamedTensor>& state) {
  return Assign(Tensors(true), state);
}

void CpuMlp::RefreshBf16Weights() {
  if (!bf16_) return;
  for (Layer& layer : layers_) {
    cpu::ConvertToBf16(layer.weight.data(), layer.weight.size(), layer.weight_bf16.data());
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateCpuMlp(const MlpConfig& config) {
  STOKER_RETURN_IF_ERROR(ValidateMlpConfig(config));
  if (MlpNeedsNetwork(config)) {
    return absl::UnimplementedError(
        "the cpu MLP fast path does SGD with momentum in fp32 or bf16 only; Backend::CreateMlp "
        "routes fp16, AdamW, Nesterov and clipping to the network");
  }
  std::unique_ptr<CpuMlp> model;
  try {
    model = std::make_unique<CpuMlp>(config);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of memory allocating the MLP's buffers for max_batch ", config.max_batch));
  }
  if (absl::Status status = model->Init(); !status.ok()) return status;
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace stoker
