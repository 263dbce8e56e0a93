#include "engine/network_graph.h"

#include <utility>

#include "engine/model_shapes.h"

namespace stoker {
namespace {

using Kind = LayerConfig::Kind;

class GraphBuilder {
 public:
  explicit GraphBuilder(const NetworkConfig& config) : config_(config) {}

  NetworkGraph Build(GraphOptions options) && {
    const int input = NewActivation(config_.input_shape, 0);
    if (!options.input_gradient) graph_.activations[input].grad = -1;
    graph_.output = AddBranch(config_.layers, input, graph_.activations[input].grad);
    return std::move(graph_);
  }

 private:
  int NewBuffer() { return graph_.buffers++; }

  // origin < 0: the activation is its own layout origin.
  int NewActivation(std::vector<int> shape, int origin) {
    GraphActivation activation;
    activation.shape = std::move(shape);
    activation.origin = origin < 0 ? static_cast<int>(graph_.activations.size()) : origin;
    activation.value = NewBuffer();
    activation.grad = NewBuffer();
    graph_.activations.push_back(std::move(activation));
    return static_cast<int>(graph_.activations.size()) - 1;
  }

  int AddBranch(const std::vector<LayerConfig>& layers, int in, int first_diff_src) {
    for (size_t j = 0; j < layers.size(); ++j) {
      in = AddLayer(layers[j], in, j == 0 ? first_diff_src : graph_.activations[in].grad);
    }
    return in;
  }

  int AddResidual(const LayerConfig& config, int in, int diff_src) {
    std::vector<GraphActivation>& acts = graph_.activations;
    GraphNode fork;
    fork.type = GraphNode::Type::kFork;
    fork.in = in;
    fork.diff_src = diff_src;
    fork.needs_input_grad = acts[in].needs_grad;
    const size_t fork_index = graph_.nodes.size();
    graph_.nodes.push_back(std::move(fork));
    const int main = AddBranch(config.layers, in, diff_src);
    int shortcut = in;
    int extra = acts[main].grad;  // identity: the sum's gradient itself
    if (!config.shortcut.empty()) {
      extra = NewBuffer();
      shortcut = AddBranch(config.shortcut, in, extra);
    }
    graph_.nodes[fork_index].extra = extra;
    GraphNode add;
    add.type = GraphNode::Type::kAdd;
    add.config = config;
    add.config.layers.clear();
    add.config.shortcut.clear();
    add.in = main;
    add.in2 = shortcut;
    add.diff_src = acts[main].grad;
    add.needs_input_grad = acts[main].needs_grad || acts[shortcut].needs_grad;
    if (!config.shortcut.empty()) {
      add.diff_src2 = acts[shortcut].grad;
      add.needs_input2_grad = acts[shortcut].needs_grad;
    }
    if (config.activation == LayerConfig::Activation::kGelu) add.pre = NewBuffer();
    add.out = NewActivation(acts[main].shape, acts[main].origin);
    acts[add.out].needs_grad = add.needs_input_grad;
    const int out = add.out;
    graph_.nodes.push_back(std::move(add));
    return out;
  }

  int AddLayer(const LayerConfig& config, int in, int diff_src) {
    if (config.kind == Kind::kResidual) return AddResidual(config, in, diff_src);
    std::vector<GraphActivation>& acts = graph_.activations;
    GraphNode node;
    node.config = config;
    node.in = in;
    node.diff_src = diff_src;
    node.needs_input_grad = acts[in].needs_grad;
    node.stride = EffectiveStride(config);
    bool has_parameters = false;
    if (config.kind == Kind::kConv2d || config.kind == Kind::kLinear) {
      node.weight = next_param_++;
      if (config.bias) node.bias = next_param_++;
      has_parameters = true;
    } else if (IsBatchNorm(config.kind)) {
      node.norm = next_param_;
      next_param_ += 5;
      has_parameters = true;
    }
    std::vector<int> shape = *LayerOutputShape(config, acts[in].shape);
    if (config.kind == Kind::kFlatten) {
      GraphActivation alias;
      alias.shape = std::move(shape);
      alias.origin = acts[in].origin;
      alias.value = acts[in].value;
      alias.grad = diff_src;
      acts.push_back(std::move(alias));
      node.out = static_cast<int>(acts.size()) - 1;
    } else {
      node.out = NewActivation(std::move(shape), KeepsLayout(config.kind) ? acts[in].origin : -1);
    }
    acts[node.out].needs_grad = node.needs_input_grad || has_parameters;
    const int out = node.out;
    graph_.nodes.push_back(std::move(node));
    return out;
  }

  const NetworkConfig& config_;
  NetworkGraph graph_;
  int next_param_ = 0;
};

}  // namespace

int64_t GraphActivation::per_sample() const {
  int64_t product = 1;
  for (int d : shape) product *= d;
  return product;
}

NetworkGraph BuildNetworkGraph(const NetworkConfig& config, GraphOptions options) {
  return GraphBuilder(config).Build(options);
}

bool IsBatchNorm(Kind kind) { return kind == Kind::kBatchNorm2d || kind == Kind::kBatchNorm1d; }

bool KeepsLayout(Kind kind) {
  return kind == Kind::kFlatten || kind == Kind::kRelu || kind == Kind::kGelu ||
         kind == Kind::kDropout || IsBatchNorm(kind);
}

DropoutLayout DropoutHashLayout(const NetworkGraph& graph, int in) {
  const GraphActivation& activation = graph.activations[in];
  const GraphActivation& origin = graph.activations[activation.origin];
  // The input arrives as C, H, W per sample and stays so on the cpu (NHWC only when C = 1, the
  // same memory): the identity.
  if (activation.origin > 0 && origin.shape.size() == 3) {
    return {.channels = origin.shape[0],
            .spatial = static_cast<int64_t>(origin.shape[1]) * origin.shape[2]};
  }
  return {.channels = static_cast<int>(activation.per_sample()), .spatial = 1};
}

}  // namespace stoker
