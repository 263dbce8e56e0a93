#include "spec/model_preset.h"

#include "absl/strings/str_cat.h"

namespace stoker {
namespace {

v1::LayerSpec Conv(int channels, int kernel, int stride) {
  v1::LayerSpec layer;
  layer.set_type("conv2d");
  layer.set_out_channels(channels);
  layer.set_kernel(kernel);
  layer.set_stride(stride);
  layer.set_padding(kernel / 2);
  layer.set_bias(false);  // a batchnorm follows, whose shift makes a bias redundant
  return layer;
}

v1::LayerSpec Simple(const char* type) {
  v1::LayerSpec layer;
  layer.set_type(type);
  return layer;
}

// conv3x3-BN-ReLU-conv3x3-BN, plus a 1x1 projection when the shape changes; ReLU after the sum.
v1::LayerSpec BasicBlock(int in_channels, int channels, int stride) {
  v1::LayerSpec block;
  block.set_type("residual");
  block.set_activation("relu");
  *block.add_layers() = Conv(channels, 3, stride);
  *block.add_layers() = Simple("batchnorm2d");
  *block.add_layers() = Simple("relu");
  *block.add_layers() = Conv(channels, 3, 1);
  *block.add_layers() = Simple("batchnorm2d");
  if (stride != 1 || in_channels != channels) {
    *block.add_shortcut() = Conv(channels, 1, stride);
    *block.add_shortcut() = Simple("batchnorm2d");
  }
  return block;
}

}  // namespace

int ResnetWidth(const v1::ModelSpec& model) {
  if (model.width() != 0) return model.width();
  return model.depth() == 18 ? 64 : 16;
}

absl::StatusOr<v1::ModelSpec> ExpandModel(const v1::ModelSpec& model, int classes) {
  if (model.type() != "resnet") return model;
  if (!IsResnetDepth(model.depth())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.depth: must be one of ", ResnetDepthList(), " (got ", model.depth(), ")"));
  }
  const int width = ResnetWidth(model);
  if (width < 1 || width > kMaxResnetWidth) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.width: must be between 1 and ", kMaxResnetWidth, " (got ", width, ")"));
  }
  const bool resnet18 = model.depth() == 18;
  const int stages = resnet18 ? 4 : 3;
  const int blocks = resnet18 ? 2 : (model.depth() - 2) / 6;

  v1::ModelSpec expanded;
  expanded.set_type("cnn");
  *expanded.add_layers() = Conv(width, 3, 1);
  *expanded.add_layers() = Simple("batchnorm2d");
  *expanded.add_layers() = Simple("relu");
  int channels = width;
  for (int stage = 0; stage < stages; ++stage) {
    const int stage_channels = width << stage;
    for (int block = 0; block < blocks; ++block) {
      const int stride = stage > 0 && block == 0 ? 2 : 1;
      *expanded.add_layers() = BasicBlock(channels, stage_channels, stride);
      channels = stage_channels;
    }
  }
  *expanded.add_layers() = Simple("global_avgpool");
  *expanded.add_layers() = Simple("flatten");
  v1::LayerSpec linear = Simple("linear");
  linear.set_units(classes);
  *expanded.add_layers() = linear;
  return expanded;
}

}  // namespace stoker
