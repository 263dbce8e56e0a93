// The one network graph both backends run (network_graph.h): node order, parameter indices,
// gradient buffers and Dropout's hash layout, on the host.
#include "engine/network_graph.h"

#include <utility>
#include <vector>

#include "engine/model_shapes.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using namespace test_layers;  // NOLINT

// Which order each Dropout hashes its mask in, as the cpu lays the activation out: NHWC for an
// image, also after a Flatten (through elementwise layers and BatchNorm); the input and flat
// features as they are. The graph is the host half of the network: no device needed.
TEST(NetworkGraphTest, DropoutHashLayoutFollowsTheCpuActivationLayout) {
  using Node = GraphNode;
  auto layouts = [](const NetworkConfig& config) {
    const NetworkGraph graph = BuildNetworkGraph(config, {.input_gradient = false});
    std::vector<std::pair<int, int64_t>> result;
    for (const Node& node : graph.nodes) {
      if (node.type != Node::Type::kLayer || node.config.kind != Kind::kDropout) continue;
      const DropoutLayout layout = DropoutHashLayout(graph, node.in);
      result.push_back({layout.channels, layout.spatial});
    }
    return result;
  };
  using Layouts = std::vector<std::pair<int, int64_t>>;
  // Conv -> GELU -> Dropout on [6, 5, 5]; Linear -> GELU -> Dropout on 24 features.
  NetworkConfig gelu;
  gelu.input_shape = {3, 9, 9};
  gelu.layers = {Conv(6, 3, 2, 1), Of(Kind::kGelu), Dropout(0.25f), Pool(3, 2, 1),
                 Linear(24),       Of(Kind::kGelu), Dropout(0.5f),  Linear(7)};
  gelu.classes = 7;
  EXPECT_EQ(layouts(gelu), (Layouts{{6, 25}, {24, 1}}));

  NetworkConfig config;
  config.input_shape = {2, 6, 6};
  config.layers = {Conv(4, 3, 1, 0), Of(Kind::kFlatten), Dropout(0.5f),
                   Of(Kind::kRelu),  Dropout(0.5f),      Linear(3)};
  config.classes = 3;
  EXPECT_EQ(layouts(config), (Layouts{{4, 16}, {4, 16}}));

  // Straight off the input, before or after a Flatten: the input's own (NCHW) order.
  config.input_shape = {3, 4, 4};
  config.layers = {Dropout(0.5f), Of(Kind::kFlatten), Dropout(0.5f), Linear(3)};
  EXPECT_EQ(layouts(config), (Layouts{{48, 1}, {48, 1}}));
  // Behind an elementwise layer or a BatchNorm on the input: still the input's order.
  config.layers = {Of(Kind::kRelu), Dropout(0.5f), Linear(3)};
  EXPECT_EQ(layouts(config), (Layouts{{48, 1}}));
  config.layers = {Of(Kind::kBatchNorm2d), Dropout(0.5f), Linear(3)};
  EXPECT_EQ(layouts(config), (Layouts{{48, 1}}));
  // Inside a residual block after a conv, and after the block's sum (its main branch's layout).
  LayerConfig block = Of(Kind::kResidual);
  block.layers = {Conv(3, 3, 1, 1), Dropout(0.5f)};
  config.layers = {block, Dropout(0.5f), Linear(3)};
  EXPECT_EQ(layouts(config), (Layouts{{3, 16}, {3, 16}}));
}

// A block opens into fork, main branch, shortcut, add (Dropout's node index seeds its mask, so
// both backends must agree on it), and parameter indices follow NetworkTensorSpecs (bias-free layers take one, BatchNorm five).
TEST(NetworkGraphTest, ResidualBlocksOpenUpIntoForkBranchesAndAdd) {
  using Node = GraphNode;
  NetworkConfig config;
  config.input_shape = {2, 6, 6};
  LayerConfig no_bias = Conv(4, 3, 2, 1);
  no_bias.bias = false;
  LayerConfig projection = Conv(4, 1, 2, 0);
  projection.bias = false;
  LayerConfig block = Of(Kind::kResidual);
  block.layers = {no_bias, Of(Kind::kBatchNorm2d)};
  block.shortcut = {projection, Of(Kind::kBatchNorm2d)};
  block.activation = LayerConfig::Activation::kGelu;
  config.layers = {Conv(3, 3, 1, 1), block, Of(Kind::kGlobalAvgPool), Of(Kind::kFlatten),
                   Linear(5)};
  config.classes = 5;
  const NetworkGraph graph = BuildNetworkGraph(config, {.input_gradient = false});
  ASSERT_EQ(graph.nodes.size(), 10u);
  const std::vector<Node::Type> types = {Node::Type::kLayer, Node::Type::kFork,  Node::Type::kLayer,
                                         Node::Type::kLayer, Node::Type::kLayer, Node::Type::kLayer,
                                         Node::Type::kAdd,   Node::Type::kLayer, Node::Type::kLayer,
                                         Node::Type::kLayer};
  for (size_t i = 0; i < types.size(); ++i) EXPECT_EQ(graph.nodes[i].type, types[i]) << i;
  EXPECT_EQ(graph.nodes[0].weight, 0);
  EXPECT_EQ(graph.nodes[0].bias, 1);
  EXPECT_EQ(graph.nodes[2].weight, 2);
  EXPECT_EQ(graph.nodes[2].bias, -1);
  EXPECT_EQ(graph.nodes[3].norm, 3);
  EXPECT_EQ(graph.nodes[4].weight, 8);
  EXPECT_EQ(graph.nodes[5].norm, 9);
  EXPECT_EQ(graph.nodes[9].weight, 14);
  EXPECT_EQ(graph.nodes[9].bias, 15);
  EXPECT_EQ(NetworkTensorSpecs(config).size(), 16u);
  // The shortcut's first layer writes into the fork's extra buffer; GELU keeps its sum.
  EXPECT_EQ(graph.nodes[4].diff_src, graph.nodes[1].extra);
  EXPECT_NE(graph.nodes[6].pre, -1);
  EXPECT_TRUE(graph.nodes[6].needs_input2_grad);
}

// Identity shortcuts: backward writes the sum's gradient into the main branch output's gradient
// buffer, the main branch's first layer overwrites the block input's gradient, and the fork then
// adds the sum's gradient (its `extra`) into it. A block straight on the input wants no input
// gradient at all.
TEST(NetworkGraphTest, IdentityShortcutGradientsAddUp) {
  using Node = GraphNode;
  NetworkConfig config;
  config.input_shape = {2, 6, 6};
  LayerConfig no_bias = Conv(2, 3, 1, 1);
  no_bias.bias = false;
  LayerConfig block = Of(Kind::kResidual);
  block.layers = {no_bias, Of(Kind::kBatchNorm2d)};
  config.layers = {block, Conv(3, 3, 1, 1), block, Of(Kind::kGlobalAvgPool), Linear(4)};
  config.layers[2].layers[0].out_channels = 3;
  config.classes = 4;
  const NetworkGraph graph = BuildNetworkGraph(config, {.input_gradient = false});
  ASSERT_EQ(graph.nodes.size(), 11u);
  const std::vector<Node::Type> types = {Node::Type::kFork,  Node::Type::kLayer, Node::Type::kLayer,
                                         Node::Type::kAdd,   Node::Type::kLayer, Node::Type::kFork,
                                         Node::Type::kLayer, Node::Type::kLayer, Node::Type::kAdd,
                                         Node::Type::kLayer, Node::Type::kLayer};
  for (size_t i = 0; i < types.size(); ++i) EXPECT_EQ(graph.nodes[i].type, types[i]) << i;
  auto grad_of = [&](int activation) { return graph.activations[activation].grad; };
  // On the input: nothing before it trains.
  EXPECT_FALSE(graph.nodes[0].needs_input_grad);
  EXPECT_EQ(graph.nodes[0].diff_src, -1);
  EXPECT_FALSE(graph.nodes[1].needs_input_grad);
  // After the conv: the fork, the main branch's first layer and the conv's output share the
  // gradient buffer; the fork adds the sum's gradient, which the add writes into the main
  // branch output's buffer (and nowhere else: no projection, ReLU needs no kept sum).
  const Node& fork = graph.nodes[5];
  const Node& add = graph.nodes[8];
  EXPECT_TRUE(fork.needs_input_grad);
  EXPECT_EQ(fork.diff_src, grad_of(graph.nodes[4].out));
  EXPECT_EQ(graph.nodes[6].diff_src, fork.diff_src);
  EXPECT_EQ(graph.nodes[7].diff_src, grad_of(graph.nodes[6].out));
  EXPECT_EQ(add.diff_src, grad_of(graph.nodes[7].out));
  EXPECT_EQ(fork.extra, add.diff_src);
  EXPECT_EQ(add.in2, fork.in);
  EXPECT_EQ(add.diff_src2, -1);
  EXPECT_FALSE(add.needs_input2_grad);
  EXPECT_EQ(add.pre, -1);
  EXPECT_NE(fork.extra, fork.diff_src);
}

// The cpu network's option: the input has a gradient buffer, and the first layer writes it.
TEST(NetworkGraphTest, TheInputGradientBufferIsAnOption) {
  NetworkConfig config;
  config.input_shape = {1, 4, 4};
  config.layers = {Conv(2, 3, 1, 1), Of(Kind::kFlatten), Linear(3)};
  config.classes = 3;
  const NetworkGraph with = BuildNetworkGraph(config);
  const NetworkGraph without = BuildNetworkGraph(config, {.input_gradient = false});
  EXPECT_GE(with.activations[0].grad, 0);
  EXPECT_EQ(with.nodes[0].diff_src, with.activations[0].grad);
  EXPECT_EQ(without.activations[0].grad, -1);
  EXPECT_EQ(without.nodes[0].diff_src, -1);
  // The Flatten is an alias of the conv's output value; its gradient is the Linear's diff_src.
  EXPECT_EQ(with.activations[with.nodes[1].out].value, with.activations[with.nodes[0].out].value);
  EXPECT_EQ(with.activations[with.nodes[1].out].grad, with.nodes[2].diff_src);
  EXPECT_EQ(with.output, with.nodes[2].out);
  EXPECT_TRUE(with.activations[with.output].needs_grad);
  EXPECT_FALSE(with.nodes[0].needs_input_grad);
  EXPECT_TRUE(with.nodes[2].needs_input_grad);
}

}  // namespace
}  // namespace stoker
