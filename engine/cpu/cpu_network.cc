// The cpu network: creation from the shared graph, the step (input, forward, backward, the
// optimizer) and evaluation. cpu_network_internal.h lists the other files.
#include "engine/cpu/cpu_network.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
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

CpuNetwork::CpuNetwork(const NetworkConfig& config, ParameterNaming naming)
    : ModelBase(/*gradient_test_hook=*/true),
      config_(config),
      normalization_(InputNormalization(config)),
      naming_(naming),
      engine_(dnnl::engine::kind::cpu, 0),
      stream_(engine_),
      loss_scale_(config.precision == Precision::kFp16 ? config.loss_scale.initial : 1.0f) {
  // Parameters and buffers, named and ordered as NetworkTensorSpecs lists them.
  for (const NetworkTensorSpec& spec : NetworkTensorSpecs(config, naming)) {
    Param param;
    param.name = spec.name;
    param.shape = spec.shape;
    param.trained = IsTrainedTensor(spec.kind);
    param.decayed = IsDecayedTensor(spec.kind);
    int64_t size = 1;
    for (int64_t d : spec.shape) size *= d;
    param.value = AlignedArray<float>(size);
    if (param.trained) {
      param.grad = AlignedArray<float>(size);
      param.state1 = AlignedArray<float>(size);
      if (adamw()) param.state2 = AlignedArray<float>(size);
    }
    params_.push_back(std::move(param));
  }
  NetworkGraph graph = BuildNetworkGraph(config);
  activations_ = std::move(graph.activations);
  buffers_.resize(graph.buffers);
  output_ = graph.output;
  for (GraphNode& node : graph.nodes) nodes_.push_back(CpuNode(std::move(node)));
  FuseRelus();
  FuseNormAdds();
  const size_t logits = static_cast<size_t>(config.max_batch) * config.classes;
  loss_grad_ = AlignedArray<float>(logits);
  logits_ = AlignedArray<float>(logits);
}

void CpuNetwork::FuseRelus() {
  for (size_t i = 0; i + 1 < nodes_.size(); ++i) {
    Node& node = nodes_[i];
    Node& next = nodes_[i + 1];
    if (node.type != Node::Type::kLayer || next.type != Node::Type::kLayer || node.fused_away ||
        next.in != node.out) {
      continue;
    }
    // Stoker's BatchNorm kernels apply the ReLU (OwnBatchNorm); evaluation's oneDNN primitive
    // with fuse_norm_relu runs in f32 where its bf16 one is not jit (PlanBatchNorm).
    if (IsBatchNorm(node.config.kind) && next.config.kind == Kind::kRelu && !fp16()) {
      node.fuse_relu = true;
      node.out = next.out;
      next.fused_away = true;
    } else if (node.config.kind == Kind::kRelu && next.config.kind == Kind::kMaxPool2d) {
      node.fused_away = true;
      next.relu_after = true;
      next.in = node.in;
      next.diff_src = node.diff_src;
      // oneDNN's pooling backward reads the masked gradient from a buffer; the own pool masks
      // on the fly.
      if (!next.own_pool) next.masked = NewBuffer();
    }
  }
}

void CpuNetwork::FuseNormAdds() {
  // fp16 rounds every layer's output to fp16 (RoundFp16): a fused sum would skip one rounding.
  if (fp16()) return;
  for (size_t a = 1; a < nodes_.size(); ++a) {
    Node& add = nodes_[a];
    if (add.type != Node::Type::kAdd || add.pre >= 0 ||
        (add.config.activation != LayerConfig::Activation::kRelu &&
         add.config.activation != LayerConfig::Activation::kNone)) {
      continue;
    }
    // Only the node right before the sum: the branch that runs last (the shortcut's, when there
    // is a projection), so the other input is ready when it runs. It must be a BatchNorm whose
    // output nothing else reads.
    Node& norm = nodes_[a - 1];
    if (norm.type != Node::Type::kLayer || !IsBatchNorm(norm.config.kind) || norm.fuse_relu ||
        norm.fused_away || (norm.out != add.in && norm.out != add.in2) || add.in == add.in2) {
      continue;
    }
    int readers = 0;
    for (const Node& n : nodes_) {
      readers += (n.in == norm.out) + (n.type == Node::Type::kAdd && n.in2 == norm.out);
    }
    if (readers != 1) continue;
    norm.sum_node = static_cast<int>(a);
    add.sum_in_norm = true;
  }
}

int CpuNetwork::NewBuffer() {
  buffers_.emplace_back();
  return static_cast<int>(buffers_.size()) - 1;
}

Node CpuNetwork::CpuNode(GraphNode graph_node) const {
  Node node(std::move(graph_node));
  if (node.type != Node::Type::kLayer) return node;
  const LayerConfig& config = node.config;
  // oneDNN 2.6's pooling ran at 6.5 GB/s here, forward and backward, where a plain loop over the
  // channels streams at 2-3x that (docs/decisions.md): the common max pool (on NHWC, as every
  // image activation is) is Stoker's own.
  node.own_pool = config.kind == Kind::kMaxPool2d && config.kernel == node.stride &&
                  config.padding == 0 && config.kernel <= 15;
  const std::vector<int>& in = activations_[node.in].shape;
  if (IsBatchNorm(config.kind)) {
    node.mean = AlignedArray<float>(in[0]);
    node.variance = AlignedArray<float>(in[0]);
  }
  if (config.kind == Kind::kDropout) {
    int64_t size = config_.max_batch;
    for (int d : in) size *= d;
    node.keep = AlignedArray<uint8_t>(size);
  }
  return node;
}

absl::Status CpuNetwork::Init() {
  absl::StatusOr<std::unique_ptr<Plan>> plan = BuildPlan(config_.max_batch);
  if (!plan.ok()) return plan.status();
  full_plan_ = *std::move(plan);
  // Buffers, sized by the full plan's descriptors (aliases take the largest).
  std::vector<size_t> bytes(buffers_.size(), 0);
  auto need = [&](int buffer, size_t size) {
    if (buffer >= 0) bytes[buffer] = std::max(bytes[buffer], size);
  };
  for (size_t t = 0; t < activations_.size(); ++t) {
    need(activations_[t].value, full_plan_->value_md[t].get_size());
    need(activations_[t].grad, full_plan_->grad_md[t].get_size());
  }
  for (const Node& node : nodes_) {
    if (node.type == Node::Type::kFork) {
      need(node.extra, full_plan_->grad_md[node.in].get_size());
    } else if (node.type == Node::Type::kAdd) {
      need(node.pre, full_plan_->value_md[node.out].get_size());
    } else {
      need(node.diff_src, full_plan_->grad_md[node.in].get_size());
      need(node.masked, full_plan_->grad_md[node.out].get_size());
    }
  }
  for (size_t b = 0; b < buffers_.size(); ++b) buffers_[b] = AlignedArray<std::byte>(bytes[b]);
  if (InputIsPlanar()) input_planar_ = AlignedArray<std::byte>(bytes[activations_[0].value]);
  try {
    BuildWeightReorders();
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN could not build the weight reorders: ", e.what()));
  }
  // Plans bind pointers: rebuild the full plan now that every buffer exists.
  plan = BuildPlan(config_.max_batch);
  if (!plan.ok()) return plan.status();
  full_plan_ = *std::move(plan);
  return SetParameters(InitialNetworkParameters(config_, naming_));
}

void CpuNetwork::RefreshComputeWeights() {
  // Every small tensor in one parallel region, split evenly between the threads without a
  // barrier between tensors.
  const std::vector<Gather>& gathers = weight_gathers_;
#pragma omp parallel
  {
    const int threads = omp_get_num_threads();
    const int thread = omp_get_thread_num();
    for (const Gather& g : gathers) {
      const int64_t size = static_cast<int64_t>(g.index.size());
      RunGather(g, size * thread / threads, size * (thread + 1) / threads);
    }
  }
  for (const Op& op : weight_reorders_) Execute(op);
  stream_.wait();
  if (fp16()) {
    for (const Gather& g : weight_gathers_) {
      cpu::RoundToFp16InPlace(static_cast<float*>(g.to), g.index.size());
    }
    for (const Op& op : weight_reorders_) {
      const memory& copy = op.args.at(DNNL_ARG_TO);
      cpu::RoundToFp16InPlace(static_cast<float*>(copy.get_data_handle()),
                              copy.get_desc().get_size() / sizeof(float));
    }
  }
}

absl::StatusOr<Plan*> CpuNetwork::PlanFor(int batch) {
  return partial_plans_.Get(full_plan_.get(), batch, [this](int size) { return BuildPlan(size); });
}

void CpuNetwork::LoadInput(const Plan& plan, const BatchView& batch) {
  int64_t n = batch.count;
  for (int d : config_.input_shape) n *= d;
  std::byte* input = InputIsPlanar() ? input_planar_.data() : Value(0);
  if (batch.features != nullptr) {
    if (bf16()) {
      cpu::ConvertToBf16(batch.features, n, reinterpret_cast<bf16_t*>(input));
    } else {
      std::memcpy(input, batch.features, n * sizeof(float));
    }
  } else {
    const cpu::ChannelAffine affine{normalization_.channels, normalization_.plane,
                                    normalization_.scale.data(), normalization_.shift.data()};
    if (bf16()) {
      cpu::NormalizeToBf16(batch.samples, n, affine, reinterpret_cast<bf16_t*>(input));
    } else {
      cpu::NormalizeToF32(batch.samples, n, affine, reinterpret_cast<float*>(input));
    }
  }
  if (fp16()) cpu::RoundToFp16InPlace(reinterpret_cast<float*>(input), n);
  ExecuteAll(plan.input);
}

absl::Status CpuNetwork::CheckBatchNormValues(int batch) const {
  for (const Node& node : nodes_) {
    if (node.type != Node::Type::kLayer || !IsBatchNorm(node.config.kind)) continue;
    const std::vector<int>& shape = activations_[node.in].shape;
    int64_t per_channel = batch;
    for (size_t d = 1; d < shape.size(); ++d) per_channel *= shape[d];
    if (per_channel > 1) continue;
    return OneValuePerChannelError(node.config.kind, params_[node.norm].name, batch, shape);
  }
  return absl::OkStatus();
}

void CpuNetwork::UpdateRunningStatistics(int batch) {
  for (const Node& node : nodes_) {
    if (node.type == Node::Type::kLayer && IsBatchNorm(node.config.kind)) {
      UpdateRunningStatistics(node, batch);
    }
  }
}

void CpuNetwork::UpdateRunningStatistics(const Node& node, int batch) {
  // torch.nn.BatchNorm*d in training: running = (1 - momentum) * running + momentum * batch
  // statistic, the variance unbiased (n / (n - 1)); n > 1 (CheckBatchNormValues).
  int64_t n = batch;
  for (size_t d = 1; d < activations_[node.in].shape.size(); ++d) {
    n *= activations_[node.in].shape[d];
  }
  const double unbias = static_cast<double>(n) / static_cast<double>(n - 1);
  const float momentum = node.config.momentum;
  float* running_mean = params_[node.norm + 2].value.data();
  float* running_var = params_[node.norm + 3].value.data();
  for (size_t c = 0; c < node.mean.size(); ++c) {
    running_mean[c] = momentum * node.mean[c] + (1 - momentum) * running_mean[c];
    const float unbiased = static_cast<float>(node.variance[c] * unbias);
    running_var[c] = momentum * unbiased + (1 - momentum) * running_var[c];
  }
  params_[node.norm + 4].value[0] += 1;
}

const float* CpuNetwork::Forward(Plan& plan, bool training) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node& node = nodes_[i];
    const NodeOps& ops = plan.ops[i];
    if (node.type == Node::Type::kFork) continue;
    if (node.type == Node::Type::kAdd) {
      // In training, the BatchNorm before it wrote the sum (FuseNormAdds).
      if (!(node.sum_in_norm && training)) ExecuteAll(ops.forward);
      if (node.pre >= 0) RoundFp16(node.pre, plan.value_md[node.out]);
      RoundFp16(activations_[node.out].value, plan.value_md[node.out]);
      continue;
    }
    const int64_t elements = Elements(plan.value_md[node.out]);
    if (!ops.forward.empty()) {
      // BatchNorm in training keeps the batch's statistics in node.mean and node.variance; the
      // running ones follow once the step has succeeded (TrainStep).
      ExecuteAll(!training && !ops.eval.empty() ? ops.eval : ops.forward);
    } else if (node.config.kind == Kind::kDropout) {
      if (training && node.config.rate > 0) {
        const uint64_t stream = static_cast<uint64_t>(train_steps_) * 4096 + i;
        if (bf16()) {
          cpu::DropoutForward(reinterpret_cast<const bf16_t*>(Value(node.in)), elements,
                              node.config.rate, config_.seed, stream, node.keep.data(),
                              reinterpret_cast<bf16_t*>(Value(node.out)));
        } else {
          cpu::DropoutForward(reinterpret_cast<const float*>(Value(node.in)), elements,
                              node.config.rate, config_.seed, stream, node.keep.data(),
                              reinterpret_cast<float*>(Value(node.out)));
        }
      } else {
        std::memcpy(Value(node.out), Value(node.in), plan.value_md[node.out].get_size());
      }
    } else if (node.own_pool) {
      OwnMaxPool(i, plan, /*forward=*/true);
    } else if (IsBatchNorm(node.config.kind)) {
      if (training) {
        OwnBatchNorm(i, plan, /*forward=*/true);
      } else {
        ExecuteAll(ops.eval);
      }
    } else {
      continue;  // Flatten
    }
    RoundFp16(activations_[node.out].value, plan.value_md[node.out]);
  }
  stream_.wait();
  if (plan.value_md[output_].data_type() == DataType::f32) {
    return reinterpret_cast<const float*>(Value(output_));
  }
  cpu::ConvertBf16ToF32(reinterpret_cast<const bf16_t*>(Value(output_)),
                        static_cast<int64_t>(plan.batch) * config_.classes, logits_.data());
  return logits_.data();
}

void CpuNetwork::OwnBatchNorm(size_t index, const Plan& plan, bool forward) {
  Node& node = nodes_[index];
  const Dims dims = plan.value_md[node.in].dims();  // N, C[, H, W]
  const int64_t rows = dims.size() == 4 ? dims[0] * dims[2] * dims[3] : dims[0];
  const cpu::NormShape shape = {
      .rows = rows, .channels = static_cast<int>(dims[1]), .eps = node.config.eps};
  const Param& scale = params_[node.norm];
  const Param& shift = params_[node.norm + 1];
  double* work = node.norm_work.data();
  auto run = [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    const T* x = reinterpret_cast<const T*>(Value(node.in));
    T* y = reinterpret_cast<T*>(Value(node.out));
    if (forward) {
      // With a residual sum fused in, the block's output: this BatchNorm's output plus the sum's
      // other input, ReLU'd when the block has one. Else its own output (its ReLU fused, if any).
      const T* add = nullptr;
      bool relu = node.fuse_relu;
      T* out = y;
      if (node.sum_node >= 0) {
        const Node& sum = nodes_[node.sum_node];
        add = reinterpret_cast<const T*>(Value(sum.in == node.out ? sum.in2 : sum.in));
        relu = sum.config.activation == LayerConfig::Activation::kRelu;
        out = reinterpret_cast<T*>(Value(sum.out));
      }
      cpu::BatchNormForward(x, shape, scale.value.data(), shift.value.data(), add, relu,
                            node.mean.data(), node.variance.data(), out, work);
      return;
    }
    // With a ReLU'd sum fused in, the sum's ReLU backward is done here (its node skips it): g =
    // the block output's gradient where the output is positive, written where this BatchNorm's
    // output gradient lives and, when the sum's other input keeps its gradient elsewhere (a
    // projection shortcut), there too. Else: the ReLU fused after this BatchNorm, if any.
    const T* dy = reinterpret_cast<const T*>(Grad(node.out));
    const T* relu_y = node.fuse_relu ? y : nullptr;
    T* g_out = nullptr;
    T* g_out2 = nullptr;
    if (node.sum_node >= 0 && nodes_[node.sum_node].BackwardInNorm()) {
      const Node& sum = nodes_[node.sum_node];
      const bool main = sum.in == node.out;
      const int other = main ? (sum.needs_input2_grad ? sum.diff_src2 : -1)
                             : (sum.needs_input_grad ? sum.diff_src : -1);
      if (other >= 0 && other != (main ? sum.diff_src : sum.diff_src2)) {
        g_out2 = reinterpret_cast<T*>(Buffer(other));
      }
      g_out = reinterpret_cast<T*>(Grad(node.out));
      dy = reinterpret_cast<const T*>(Grad(sum.out));
      relu_y = reinterpret_cast<const T*>(Value(sum.out));
    }
    cpu::BatchNormBackward(
        x, dy, relu_y, shape, node.mean.data(), node.variance.data(), scale.value.data(),
        params_[node.norm].grad.data(), params_[node.norm + 1].grad.data(),
        node.needs_input_grad ? reinterpret_cast<T*>(Buffer(node.diff_src)) : nullptr, g_out,
        g_out2, work);
  };
  if (plan.value_md[node.in].data_type() == DataType::bf16) {
    run(static_cast<bf16_t*>(nullptr));
  } else {
    run(static_cast<float*>(nullptr));
  }
}

void CpuNetwork::OwnMaxPool(size_t index, const Plan& plan, bool forward) {
  Node& node = nodes_[index];
  const Dims dims = plan.value_md[node.in].dims();  // N, C, H, W
  const cpu::PoolShape shape = {.batch = static_cast<int>(dims[0]),
                                .height = static_cast<int>(dims[2]),
                                .width = static_cast<int>(dims[3]),
                                .channels = static_cast<int>(dims[1]),
                                .kernel = node.config.kernel};
  uint8_t* positions = reinterpret_cast<uint8_t*>(node.workspace.data());
  if (forward) {
    if (bf16()) {
      cpu::MaxPoolForward(reinterpret_cast<const bf16_t*>(Value(node.in)), shape, node.relu_after,
                          reinterpret_cast<bf16_t*>(Value(node.out)), positions);
    } else {
      cpu::MaxPoolForward(reinterpret_cast<const float*>(Value(node.in)), shape, node.relu_after,
                          reinterpret_cast<float*>(Value(node.out)), positions);
    }
    return;
  }
  if (bf16()) {
    const bf16_t* y = reinterpret_cast<const bf16_t*>(Value(node.out));
    cpu::MaxPoolBackward(reinterpret_cast<const bf16_t*>(Grad(node.out)),
                         node.relu_after ? y : nullptr, positions, shape,
                         reinterpret_cast<bf16_t*>(Buffer(node.diff_src)));
  } else {
    const float* y = reinterpret_cast<const float*>(Value(node.out));
    cpu::MaxPoolBackward(reinterpret_cast<const float*>(Grad(node.out)),
                         node.relu_after ? y : nullptr, positions, shape,
                         reinterpret_cast<float*>(Buffer(node.diff_src)));
  }
}

void CpuNetwork::Backward(Plan& plan) {
  int next_index = 0;  // GradientReady's
  for (size_t i = nodes_.size(); i-- > 0;) {
    const Node& node = nodes_[i];
    const NodeOps& ops = plan.ops[i];
    if (node.type == Node::Type::kFork) {
      if (!node.needs_input_grad) continue;
      ExecuteAll(ops.backward_data);
      RoundFp16(node.diff_src, plan.grad_md[node.in]);
      continue;
    }
    if (node.type == Node::Type::kAdd) {
      // A ReLU'd sum fused into the BatchNorm before it: that BatchNorm's backward does its part.
      if (!node.BackwardInNorm()) ExecuteAll(ops.backward_data);
      if (node.needs_input_grad) RoundFp16(node.diff_src, plan.grad_md[node.in]);
      if (node.needs_input2_grad) RoundFp16(node.diff_src2, plan.grad_md[node.in2]);
      continue;
    }
    ExecuteAll(ops.backward_weights);
    // BatchNorm's training passes are Stoker's own, so that they can take a residual block's
    // sum and ReLU (FuseNormAdds), which oneDNN 2.6's primitive cannot.
    if (IsBatchNorm(node.config.kind)) OwnBatchNorm(i, plan, /*forward=*/false);
    // The plain gradient right away (not after the whole backward): final here, so a reducer can
    // start summing it while the layers below still compute theirs.
    if (node.grad_gather >= 0) {
      const Gather& gather = grad_gathers_[node.grad_gather];
      RunGather(gather, 0, static_cast<int64_t>(gather.index.size()));
    }
    if (node.grad_reorder >= 0) Execute(grad_reorders_[node.grad_reorder]);
    if (reducer_ != nullptr && (node.weight >= 0 || node.norm >= 0)) {
      HandOverGradients(node, next_index);
    }
    if (!node.needs_input_grad) continue;
    const int64_t elements = Elements(plan.grad_md[node.in]);
    if (!ops.backward_data.empty()) {
      ExecuteAll(ops.backward_data);
    } else if (IsBatchNorm(node.config.kind)) {
      // Its backward (run above) gave the input gradient.
    } else if (node.config.kind == Kind::kDropout) {
      std::byte* diff_src = Buffer(node.diff_src);
      if (node.config.rate > 0) {
        if (bf16()) {
          cpu::DropoutBackward(reinterpret_cast<const bf16_t*>(Grad(node.out)), node.keep.data(),
                               elements, node.config.rate, reinterpret_cast<bf16_t*>(diff_src));
        } else {
          cpu::DropoutBackward(reinterpret_cast<const float*>(Grad(node.out)), node.keep.data(),
                               elements, node.config.rate, reinterpret_cast<float*>(diff_src));
        }
      } else {
        std::memcpy(diff_src, Grad(node.out), plan.grad_md[node.in].get_size());
      }
    } else if (node.own_pool) {
      OwnMaxPool(i, plan, /*forward=*/false);
    } else {
      continue;  // Flatten
    }
    RoundFp16(node.diff_src, plan.grad_md[node.in]);
  }
  stream_.wait();
}

void CpuNetwork::HandOverGradients(const Node& node, int& next_index) {
  stream_.wait();  // the primitives that wrote them have finished
  // Reverse Parameters() order within the node, as across nodes: the order is then exactly the
  // reverse of Parameters()' trained tensors.
  const int params[] = {node.norm >= 0 ? node.norm + 1 : node.bias,
                        node.norm >= 0 ? node.norm : node.weight};
  for (const int p : params) {
    if (p < 0) continue;
    if (p == 0) ApplyInjectedGradient();
    Param& param = params_[p];
    reducer_->GradientReady(next_index++, param.grad.data(),
                            static_cast<int64_t>(param.grad.size()));
  }
}

void CpuNetwork::ApplyInjectedGradient() {
  if (const std::optional<float> value = TakeInjectedGradient()) params_[0].grad[0] += *value;
}

double CpuNetwork::Loss(const float* logits, const uint8_t* labels, int rows, float* grad,
                        int64_t* correct) const {
  const double plain =
      cpu::SoftmaxCrossEntropy(logits, labels, rows, config_.classes, grad, correct);
  if (config_.label_smoothing == 0) return plain;
  return cpu::SmoothLabels(logits, labels, rows, config_.classes, config_.label_smoothing, grad);
}

absl::StatusOr<StepResult> CpuNetwork::TrainStep(const BatchView& batch, double learning_rate) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  if (absl::Status status = ValidateLearningRate(learning_rate); !status.ok()) return status;
  STOKER_RETURN_IF_ERROR(CheckBatchNormValues(batch.count));
  // This rank's part of the global batch's mean: folded into the loss scale's multiply below
  // (one product, exact for fp32 and bf16 whose scale is 1).
  STOKER_ASSIGN_OR_RETURN(const float share, LocalGradientShare(reducer_));
  STOKER_ASSIGN_OR_RETURN(Plan * plan_pointer, PlanFor(batch.count));
  Plan& plan = *plan_pointer;
  const int rows = batch.count;
  const int64_t logit_count = static_cast<int64_t>(rows) * config_.classes;
  StepResult result;
  try {
    LoadInput(plan, batch);
    const float* logits = Forward(plan, /*training=*/true);
    result.loss =
        static_cast<float>(Loss(logits, batch.labels, rows, loss_grad_.data(), nullptr) / rows);
    // The loss gradient enters backward in the compute type, times the loss scale (and share).
    const float scale = loss_scale_ * share;
    if (bf16()) {
      cpu::ScaleToBf16(loss_grad_.data(), logit_count, scale,
                       reinterpret_cast<bf16_t*>(Grad(output_)));
    } else {
      cpu::ScaleToF32(loss_grad_.data(), logit_count, scale, fp16(),
                      reinterpret_cast<float*>(Grad(output_)));
    }
    Backward(plan);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in TrainStep: ", e.what()));
  }
  if (reducer_ != nullptr) STOKER_RETURN_IF_ERROR(reducer_->Finish());
  UpdateRunningStatistics(plan.batch);
  return FinishStep(learning_rate, result);
}

absl::StatusOr<StepResult> CpuNetwork::StepWithoutSamples(double learning_rate) {
  // Zero gradients through the reducer in Backward's order (nodes in reverse); no forward, so
  // BatchNorm's running statistics stay as they are.
  int next_index = 0;
  for (size_t i = nodes_.size(); i-- > 0;) {
    const Node& node = nodes_[i];
    if (node.type != Node::Type::kLayer || (node.weight < 0 && node.norm < 0)) continue;
    for (const int p : {node.weight, node.bias, node.norm, node.norm >= 0 ? node.norm + 1 : -1}) {
      if (p >= 0) std::fill_n(params_[p].grad.data(), params_[p].grad.size(), 0.0f);
    }
    HandOverGradients(node, next_index);
  }
  STOKER_RETURN_IF_ERROR(reducer_->Finish());
  StepResult result;
  result.loss = 0;
  return FinishStep(learning_rate, result);
}

StepResult CpuNetwork::FinishStep(double learning_rate, StepResult result) {
  // Counted also by a step without samples: every rank's dropout stream stays at the same step.
  ++train_steps_;
  ApplyInjectedGradient();  // alone; a reducer's step applied it before the reducer saw it

  if (fp16()) {
    // GradScaler: skip on inf/NaN and back off; grow after growth_interval finite steps.
    bool finite = true;
    for (const Param& param : params_) {
      if (param.trained) finite = finite && cpu::AllFinite(param.grad.data(), param.grad.size());
    }
    if (!finite) {
      loss_scale_ *= config_.loss_scale.backoff_factor;
      growth_tracker_ = 0;
      result.skipped = true;
      result.loss_scale = loss_scale_;
      return result;
    }
    const float inverse_scale = 1.0f / loss_scale_;
    for (Param& param : params_) {
      if (param.trained) cpu::ScaleInPlace(param.grad.data(), param.grad.size(), inverse_scale);
    }
  }
  ApplyOptimizer(static_cast<float>(learning_rate));
  if (fp16() && ++growth_tracker_ >= config_.loss_scale.growth_interval) {
    loss_scale_ *= config_.loss_scale.growth_factor;
    growth_tracker_ = 0;
  }
  result.loss_scale = loss_scale_;
  return result;
}

void CpuNetwork::ApplyOptimizer(float learning_rate) {
  const OptimizerConfig& opt = config_.optimizer;
  if (opt.clip_grad_norm > 0) {
    double sum_squares = 0;
    for (const Param& param : params_) {
      if (param.trained) sum_squares += cpu::SumOfSquares(param.grad.data(), param.grad.size());
    }
    // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1.
    const double coefficient = opt.clip_grad_norm / (std::sqrt(sum_squares) + 1e-6);
    if (coefficient < 1) {
      for (Param& param : params_) {
        if (!param.trained) continue;
        cpu::ScaleInPlace(param.grad.data(), param.grad.size(), static_cast<float>(coefficient));
      }
    }
  }
  ++optimizer_steps_;
  for (Param& param : params_) {
    if (!param.trained) continue;  // BatchNorm's buffers
    // Conv2d and Linear weights only: never biases or BatchNorm's parameters.
    const float weight_decay = param.decayed ? static_cast<float>(opt.weight_decay) : 0.0f;
    if (adamw()) {
      cpu::AdamWUpdate(param.value.size(), learning_rate, static_cast<float>(opt.beta1),
                       static_cast<float>(opt.beta2), static_cast<float>(opt.eps), weight_decay,
                       optimizer_steps_, param.grad.data(), param.value.data(), param.state1.data(),
                       param.state2.data());
    } else {
      cpu::SgdUpdate(param.value.size(), learning_rate, static_cast<float>(opt.momentum),
                     weight_decay, opt.nesterov, param.grad.data(), param.value.data(),
                     param.state1.data());
    }
  }
  RefreshComputeWeights();
}

absl::StatusOr<EvalResult> CpuNetwork::Evaluate(const BatchView& batch) {
  if (absl::Status status = ValidateBatch(config_, batch); !status.ok()) return status;
  absl::StatusOr<Plan*> plan_or = PlanFor(batch.count);
  if (!plan_or.ok()) return plan_or.status();
  EvalResult result;
  result.count = batch.count;
  const float* logits = nullptr;
  try {
    LoadInput(**plan_or, batch);
    logits = Forward(**plan_or, /*training=*/false);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in Evaluate: ", e.what()));
  }
  result.loss_sum = Loss(logits, batch.labels, batch.count, nullptr, &result.correct);
  return result;
}

}  // namespace stoker::cpu_network_internal

namespace stoker {

absl::StatusOr<std::unique_ptr<Model>> CreateCpuNetwork(const NetworkConfig& config,
                                                        ParameterNaming naming) {
  using cpu_network_internal::CpuNetwork;
  STOKER_RETURN_IF_ERROR(ValidateNetworkConfig(config));
  std::unique_ptr<CpuNetwork> model;
  try {
    model = std::make_unique<CpuNetwork>(config, naming);
    STOKER_RETURN_IF_ERROR(model->Init());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of memory allocating the network's buffers for max_batch ", config.max_batch));
  }
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace stoker
