// The resnet preset: the layers each depth expands to (counts, channels, strides, shortcuts) and
// the errors that name model.depth and model.width.
#include "spec/model_preset.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace stoker {
namespace {

v1::ModelSpec Resnet(int depth, int width = 0) {
  v1::ModelSpec model;
  model.set_type("resnet");
  model.set_depth(depth);
  model.set_width(width);
  return model;
}

// Checks one basic block: conv3x3(stride)-BN-ReLU-conv3x3-BN, a projection shortcut exactly
// when `projection`, ReLU after the sum; every conv without a bias.
void ExpectBasicBlock(const v1::LayerSpec& block, int channels, int stride, bool projection) {
  ASSERT_EQ(block.type(), "residual");
  EXPECT_EQ(block.activation(), "relu");
  ASSERT_EQ(block.layers_size(), 5);
  const char* kinds[] = {"conv2d", "batchnorm2d", "relu", "conv2d", "batchnorm2d"};
  for (int j = 0; j < 5; ++j) EXPECT_EQ(block.layers(j).type(), kinds[j]) << j;
  for (int j : {0, 3}) {
    EXPECT_EQ(block.layers(j).out_channels(), channels);
    EXPECT_EQ(block.layers(j).kernel(), 3);
    EXPECT_EQ(block.layers(j).padding(), 1);
    ASSERT_TRUE(block.layers(j).has_bias());
    EXPECT_FALSE(block.layers(j).bias());
  }
  EXPECT_EQ(block.layers(0).stride(), stride);
  EXPECT_EQ(block.layers(3).stride(), 1);
  if (!projection) {
    EXPECT_EQ(block.shortcut_size(), 0);
    return;
  }
  ASSERT_EQ(block.shortcut_size(), 2);
  EXPECT_EQ(block.shortcut(0).type(), "conv2d");
  EXPECT_EQ(block.shortcut(0).kernel(), 1);
  EXPECT_EQ(block.shortcut(0).stride(), stride);
  EXPECT_EQ(block.shortcut(0).padding(), 0);
  EXPECT_EQ(block.shortcut(0).out_channels(), channels);
  EXPECT_FALSE(block.shortcut(0).bias());
  EXPECT_EQ(block.shortcut(1).type(), "batchnorm2d");
}

TEST(ModelPresetTest, CifarDepthsExpandToThreeStagesOfBasicBlocks) {
  for (int depth : {20, 32, 44, 56, 110}) {
    SCOPED_TRACE(depth);
    const int n = (depth - 2) / 6;
    absl::StatusOr<v1::ModelSpec> model = ExpandModel(Resnet(depth), 10);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model->type(), "cnn");
    // stem (3) + 3n blocks + head (3)
    ASSERT_EQ(model->layers_size(), 3 + 3 * n + 3);
    EXPECT_EQ(model->layers(0).type(), "conv2d");
    EXPECT_EQ(model->layers(0).out_channels(), 16);
    EXPECT_EQ(model->layers(0).stride(), 1);
    EXPECT_FALSE(model->layers(0).bias());
    EXPECT_EQ(model->layers(1).type(), "batchnorm2d");
    EXPECT_EQ(model->layers(2).type(), "relu");
    for (int stage = 0; stage < 3; ++stage) {
      for (int block = 0; block < n; ++block) {
        SCOPED_TRACE(testing::Message() << "stage " << stage << " block " << block);
        const bool first = stage > 0 && block == 0;
        ExpectBasicBlock(model->layers(3 + stage * n + block), 16 << stage, first ? 2 : 1, first);
      }
    }
    const int head = 3 + 3 * n;
    EXPECT_EQ(model->layers(head).type(), "global_avgpool");
    EXPECT_EQ(model->layers(head + 1).type(), "flatten");
    EXPECT_EQ(model->layers(head + 2).type(), "linear");
    EXPECT_EQ(model->layers(head + 2).units(), 10);
    // Written out, it is a cnn that validation accepts: every list within its limits.
    v1::JobSpec spec = DefaultJobSpec();
    spec.mutable_dataset()->set_train_images("a");
    spec.mutable_dataset()->set_train_labels("b");
    spec.mutable_dataset()->set_test_images("c");
    spec.mutable_dataset()->set_test_labels("d");
    *spec.mutable_model() = *model;
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  }
}

TEST(ModelPresetTest, Depth18IsFourStagesOfTwoBlocksAndWidthScalesEveryStage) {
  absl::StatusOr<v1::ModelSpec> model = ExpandModel(Resnet(18), 100);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->layers_size(), 3 + 8 + 3);
  EXPECT_EQ(model->layers(0).out_channels(), 64);
  EXPECT_EQ(model->layers(0).kernel(), 3);  // a 3x3 stem, no max-pool
  EXPECT_EQ(model->layers(2).type(), "relu");
  for (int stage = 0; stage < 4; ++stage) {
    for (int block = 0; block < 2; ++block) {
      const bool first = stage > 0 && block == 0;
      ExpectBasicBlock(model->layers(3 + stage * 2 + block), 64 << stage, first ? 2 : 1, first);
    }
  }
  EXPECT_EQ(model->layers(13).units(), 100);

  model = ExpandModel(Resnet(20, 4), 10);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->layers(0).out_channels(), 4);
  EXPECT_EQ(model->layers(3 + 6).layers(0).out_channels(), 16);
}

TEST(ModelPresetTest, OtherModelsAreReturnedAsTheyAre) {
  v1::ModelSpec cnn;
  cnn.set_type("cnn");
  cnn.add_layers()->set_type("flatten");
  absl::StatusOr<v1::ModelSpec> model = ExpandModel(cnn, 10);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->SerializeAsString(), cnn.SerializeAsString());
}

TEST(ModelPresetTest, ABadDepthOrWidthIsNamedWithWhatIsAllowed) {
  absl::Status status = ExpandModel(Resnet(19), 10).status();
  EXPECT_EQ(status.message(), "model.depth: must be one of 18, 20, 32, 44, 56 or 110 (got 19)");
  status = ExpandModel(Resnet(20, 513), 10).status();
  EXPECT_TRUE(absl::StartsWith(status.message(), "model.width: must be between 1 and 512"))
      << status;
}

}  // namespace
}  // namespace stoker
