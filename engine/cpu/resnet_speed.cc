// Training speed of the cpu network on a ResNet-20-like model (issue 15): conv3x3 16 + BN + ReLU,
// three stages of three basic blocks (16, 32, 64 channels; stride 2 with a 1x1 conv + BN
// projection at stages 2 and 3), global average pooling, Linear 10, on 28x28x1 inputs
// (Fashion-MNIST shaped), SGD with momentum and weight decay. Prints training samples/s for fp32
// and bf16. Compare with resnet_speed_pytorch.py (the same network in PyTorch).
//
//   resnet_speed [--batch 128] [--steps 30] [--warmup 3]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace stoker {
namespace {

using Kind = LayerConfig::Kind;

LayerConfig Make(Kind kind) {
  LayerConfig layer;
  layer.kind = kind;
  return layer;
}
LayerConfig Conv(int channels, int kernel, int stride) {
  LayerConfig layer = Make(Kind::kConv2d);
  layer.out_channels = channels;
  layer.kernel = kernel;
  layer.stride = stride;
  layer.padding = kernel / 2;
  layer.bias = false;
  return layer;
}

// PyTorch's CIFAR ResNet-20 block layout with projection shortcuts (option B).
NetworkConfig ResNet20(int batch, Precision precision) {
  NetworkConfig config;
  config.input_shape = {1, 28, 28};
  config.layers = {Conv(16, 3, 1), Make(Kind::kBatchNorm2d), Make(Kind::kRelu)};
  int in_channels = 16;
  for (int stage = 0; stage < 3; ++stage) {
    const int channels = 16 << stage;
    for (int block = 0; block < 3; ++block) {
      const int stride = stage > 0 && block == 0 ? 2 : 1;
      LayerConfig residual = Make(Kind::kResidual);
      residual.layers = {Conv(channels, 3, stride), Make(Kind::kBatchNorm2d), Make(Kind::kRelu),
                         Conv(channels, 3, 1), Make(Kind::kBatchNorm2d)};
      if (stride != 1 || in_channels != channels) {
        residual.shortcut = {Conv(channels, 1, stride), Make(Kind::kBatchNorm2d)};
      }
      config.layers.push_back(residual);
      in_channels = channels;
    }
  }
  config.layers.push_back(Make(Kind::kGlobalAvgPool));
  config.layers.push_back(Make(Kind::kFlatten));
  LayerConfig linear = Make(Kind::kLinear);
  linear.units = 10;
  config.layers.push_back(linear);
  config.classes = 10;
  config.max_batch = batch;
  config.precision = precision;
  config.optimizer.learning_rate = 0.1;
  config.optimizer.momentum = 0.9;
  config.optimizer.weight_decay = 5e-4;
  return config;
}

int Run(int batch, int steps, int warmup) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  std::mt19937 rng(1);
  std::vector<uint8_t> samples(static_cast<size_t>(batch) * 784), labels(batch);
  for (uint8_t& v : samples) v = static_cast<uint8_t>(rng() & 255);
  for (uint8_t& v : labels) v = static_cast<uint8_t>(rng() % 10);
  BatchView view;
  view.samples = samples.data();
  view.labels = labels.data();
  view.count = batch;
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const NetworkConfig config = ResNet20(batch, precision);
    absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateNetwork(config);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
      return 1;
    }
    float loss = 0;
    for (int s = 0; s < warmup; ++s) loss = (*model)->TrainStep(view, 0.1)->loss;
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      absl::StatusOr<StepResult> step = (*model)->TrainStep(view, 0.1);
      if (!step.ok()) {
        std::fprintf(stderr, "%s\n", step.status().ToString().c_str());
        return 1;
      }
      loss = step->loss;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "stoker cpu %s: batch %d, %d steps, %.1f samples/s (%.1f ms/step), last loss %.4f, "
        "%.1f MFLOP/sample forward\n",
        PrecisionName(precision), batch, steps, steps * batch / seconds, 1000 * seconds / steps,
        loss, NetworkForwardFlopsPerSample(config) / 1e6);
  }
  return 0;
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) {
  int batch = 128, steps = 30, warmup = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--batch") == 0) batch = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--warmup") == 0) warmup = std::atoi(argv[i + 1]);
  }
  if (batch < 1 || batch > 4096 || steps < 1 || warmup < 0) {
    std::fprintf(stderr, "usage: resnet_speed [--batch 1..4096] [--steps N] [--warmup N]\n");
    return 2;
  }
  return stoker::Run(batch, steps, warmup);
}
