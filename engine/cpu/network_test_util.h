// Shared by the engine tests (MLP and network): random batches, model creation, a double-precision
// reference of a network's loss (PyTorch semantics), and the gradient a model applies, for
// finite differences.
#ifndef STOKER_ENGINE_CPU_NETWORK_TEST_UTIL_H_
#define STOKER_ENGINE_CPU_NETWORK_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/model_shapes.h"

namespace stoker::testing_util {

// Float features in [-1, 1) and labels < classes, from a fixed seed.
struct FeatureBatch {
  std::vector<float> features;
  std::vector<uint8_t> labels;
  int count = 0;
  BatchView View() const {
    BatchView view;
    view.labels = labels.data();
    view.count = count;
    view.features = features.data();
    return view;
  }
};
FeatureBatch RandomFeatures(int count, int features, int classes, uint64_t seed);

// The cpu backend's network, or nullptr after a test failure.
std::unique_ptr<Model> MakeNetwork(const NetworkConfig& config);

using DoubleParams = std::vector<std::vector<double>>;
DoubleParams ToDouble(const std::vector<NamedTensor>& tensors);

// Mean softmax cross-entropy of the network in double (dropout as identity).
double ReferenceLoss(const NetworkConfig& config, const DoubleParams& params,
                     const FeatureBatch& batch);

// Mean loss of the network in double over the whole batch, every layer kind included: BatchNorm
// normalises by the batch's statistics (biased variance) when `training`, by the running ones in
// `params` otherwise; residual blocks as activation(main(x) + shortcut(x)); AvgPool2d with
// count_include_pad; the loss with config.label_smoothing (PyTorch's formula); dropout as
// identity. `params` in NetworkTensorSpecs order (buffers included).
double ReferenceBatchLoss(const NetworkConfig& config, const DoubleParams& params,
                          const FeatureBatch& batch, bool training);

// The gradient a model applies, recovered from one plain SGD step (momentum 0, no decay):
// g = (w_before - w_after) / lr.
DoubleParams StepGradient(Model& model, const BatchView& batch, double lr, float* loss);

// sqrt(sum (a - b)^2 / sum b^2).
double RelativeDifference(const std::vector<double>& a, const std::vector<double>& b);

// d loss / d params[t][i] by a central difference of `loss` (a function of the parameters) with
// step `h`.
template <typename LossFn>
double CentralDifference(const DoubleParams& params, size_t t, size_t i, double h, LossFn loss) {
  DoubleParams shifted = params;
  shifted[t][i] = params[t][i] + h;
  const double plus = loss(shifted);
  shifted[t][i] = params[t][i] - h;
  return (plus - loss(shifted)) / (2 * h);
}

// A tiny network for the gradient checks: `layers` on `input_shape`, 3 classes, batches of up to
// 4, plain SGD (no momentum, no decay), initialised from `seed`.
NetworkConfig TinyNet(std::vector<int> input_shape, std::vector<LayerConfig> layers, uint64_t seed);

// Values per sample: the product of config.input_shape.
int Features(const NetworkConfig& config);

// Checks the fp32 model's training loss and the gradient of every trained tensor (not BatchNorm's
// buffers) against the double reference in training mode and its central differences (h = 1e-5):
// |g - fd| <= relative |fd| + absolute per element, and that some |fd| exceeds 1e-2 (the check is
// not vacuous). With `check_evaluate`, Evaluate's loss must match the reference too (networks
// whose evaluation is their training pass: no BatchNorm).
void CheckGradient(const NetworkConfig& config, int count, uint64_t seed, double relative,
                   double absolute, bool check_evaluate);

// Expects the two models' parameters to be bit-identical, tensor by tensor; `label` starts each
// failure message.
void ExpectSameParameters(const Model& a, const Model& b, const std::string& label);

}  // namespace stoker::testing_util

#endif  // STOKER_ENGINE_CPU_NETWORK_TEST_UTIL_H_
