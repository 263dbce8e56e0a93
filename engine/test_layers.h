// Test-only shorthands for LayerConfig and small configs, shared by the cpu and cuda tests.
#ifndef STOKER_ENGINE_TEST_LAYERS_H_
#define STOKER_ENGINE_TEST_LAYERS_H_

#include "engine/model_config.h"

namespace stoker::test_layers {

using Kind = LayerConfig::Kind;

inline LayerConfig Of(Kind kind) {
  LayerConfig layer;
  layer.kind = kind;
  return layer;
}
inline LayerConfig Conv(int out_channels, int kernel, int stride, int padding) {
  LayerConfig layer = Of(Kind::kConv2d);
  layer.out_channels = out_channels;
  layer.kernel = kernel;
  layer.stride = stride;
  layer.padding = padding;
  return layer;
}
// stride 0: the kernel size (PyTorch's default).
inline LayerConfig Pool(int kernel, int stride = 0, int padding = 0) {
  LayerConfig layer = Of(Kind::kMaxPool2d);
  layer.kernel = kernel;
  layer.stride = stride;
  layer.padding = padding;
  return layer;
}
inline LayerConfig Linear(int units) {
  LayerConfig layer = Of(Kind::kLinear);
  layer.units = units;
  return layer;
}
inline LayerConfig Dropout(float rate) {
  LayerConfig layer = Of(Kind::kDropout);
  layer.rate = rate;
  return layer;
}

// A tiny MLP 6-5-4-3 with odd shapes (no multiple of 8 anywhere), fixed seed, batches up to 8.
inline MlpConfig OddShapedMlp() {
  MlpConfig config;
  config.input_features = 6;
  config.hidden = {5, 4};
  config.classes = 3;
  config.max_batch = 8;
  config.seed = 42;
  return config;
}

}  // namespace stoker::test_layers

#endif  // STOKER_ENGINE_TEST_LAYERS_H_
