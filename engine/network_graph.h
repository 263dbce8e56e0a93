// A network config as the backends run it: one flat graph of nodes over activations, built by one
// function for both backends so that node order, activations, gradient buffers and parameter
// indices agree between them (a Dropout's mask hashes its node index; a checkpoint's tensors are
// the parameters in NetworkTensorSpecs' order).
//
// A residual block opens up into a kFork (its backward adds the shortcut's input gradient into
// the block input's), the main branch's nodes, the shortcut's, and a kAdd (out = activation(main +
// shortcut)). A network without residual blocks has one kLayer node per layer, in order, so the
// node index is the layer index. Buffers are numbered only (a backend allocates them in its own
// types and sizes); a Flatten's output is an alias of its input's value buffer.
#ifndef STOKER_ENGINE_NETWORK_GRAPH_H_
#define STOKER_ENGINE_NETWORK_GRAPH_H_

#include <cstdint>
#include <vector>

#include "engine/model_config.h"

namespace stoker {

// One activation of the graph (index 0 = the network input), per sample.
struct GraphActivation {
  std::vector<int> shape;  // {C, H, W} or {features}
  // The activation whose memory layout this one shares: ReLU, GELU, Dropout, Flatten and
  // BatchNorm keep their input's, a residual sum its main branch's; others are their own. The cpu
  // lays activations out by it (NHWC for images a layer made), and a Dropout hashes its mask in
  // that order on both backends.
  int origin = 0;
  int value = -1;           // buffer index
  int grad = -1;            // buffer index; -1 for the input without GraphOptions::input_gradient
  bool needs_grad = false;  // depends on a trained parameter
  int64_t per_sample() const;
};

struct GraphNode {
  enum class Type { kLayer, kFork, kAdd };
  Type type = Type::kLayer;
  LayerConfig config;  // kLayer: the layer; kAdd: the block (its activation); branches cleared
  int in = 0;          // kLayer: input; kAdd: the main branch's output; kFork: the block input
  int in2 = -1;        // kAdd: the shortcut's output (the block input for an identity shortcut)
  int out = -1;        // kLayer, kAdd
  int diff_src = -1;   // buffer backward writes the input gradient to (kFork: adds into)
  int diff_src2 = -1;  // kAdd: the projection shortcut output's gradient buffer (-1: identity)
  int extra = -1;      // kFork: the buffer added into diff_src (the shortcut's input gradient)
  int pre = -1;        // kAdd with GELU: the sum before the activation
  bool needs_input_grad = false;
  bool needs_input2_grad = false;  // kAdd
  int stride = 1;                  // EffectiveStride
  int weight = -1;  // index in NetworkTensorSpecs: Conv2d and Linear
  int bias = -1;    // -1 also for bias: false
  int norm = -1;    // BatchNorm: its weight; bias, running_mean, running_var and
                    // num_batches_tracked follow
};

struct NetworkGraph {
  std::vector<GraphNode> nodes;
  std::vector<GraphActivation> activations;
  int buffers = 0;  // buffer indices are 0 .. buffers - 1
  int output = 0;   // the logits' activation
};

struct GraphOptions {
  // Whether the network input has a gradient buffer (and the first layer's diff_src is it). The
  // cpu network allocates one; the cuda network does not (-1: nothing wants it).
  bool input_gradient = true;
};

// The graph of a config ValidateNetworkConfig accepts.
NetworkGraph BuildNetworkGraph(const NetworkConfig& config, GraphOptions options = {});

bool IsBatchNorm(LayerConfig::Kind kind);
// Layers whose output keeps their input's memory layout (GraphActivation::origin).
bool KeepsLayout(LayerConfig::Kind kind);

// The order in which a Dropout reading activation `in` hashes its mask, as the cpu network lays
// that activation out: an image another layer made is NHWC, and so is what keeps its layout; the
// network input stays C, H, W per sample. NHWC gives {C, H * W}; otherwise the identity,
// {values per sample, 1}.
struct DropoutLayout {
  int channels = 1;
  int64_t spatial = 1;
};
DropoutLayout DropoutHashLayout(const NetworkGraph& graph, int in);

}  // namespace stoker

#endif  // STOKER_ENGINE_NETWORK_GRAPH_H_
