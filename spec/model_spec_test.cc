// model_spec on the cpu backend: the configs a job's model section becomes, the errors that name
// the job-file field, and the memory check that refuses a model too large to train.
#include "spec/model_spec.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "spec/job_file.h"
#include "spec/job_spec.h"

namespace stoker {
namespace {

v1::JobSpec ParsedSpec(const std::string& yaml) {
  absl::StatusOr<JobFile> file = ParseJobYaml(yaml, "job.yaml");
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? file->spec : v1::JobSpec();
}

constexpr char kDataset[] =
    "dataset: {format: idx, train_images: a, train_labels: b, test_images: c, test_labels: d}\n";

v1::JobSpec CnnSpec() {
  return ParsedSpec(std::string(kDataset) +
                    "model:\n"
                    "  type: cnn\n"
                    "  layers:\n"
                    "    - {type: conv2d, out_channels: 8, kernel: 3, padding: 1}\n"
                    "    - {type: relu}\n"
                    "    - {type: maxpool2d, kernel: 2}\n"
                    "    - {type: flatten}\n"
                    "    - {type: linear, units: 10}\n");
}

std::unique_ptr<Backend> Cpu() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

TEST(ModelSpecTest, AnMlpWithoutHiddenWidthsGetsTheDocumentedDefault) {
  const v1::JobSpec spec = ParsedSpec(std::string(kDataset) + "model: {type: mlp}\n");
  const MlpConfig config = MlpConfigFromSpec(spec, 784, 10);
  EXPECT_EQ(config.hidden,
            std::vector<int>(std::begin(kDefaultMlpHidden), std::end(kDefaultMlpHidden)));
  EXPECT_EQ(config.hidden, (std::vector<int>{256, 128}));
  EXPECT_EQ(config.input_features, 784);
  EXPECT_EQ(config.classes, 10);
  EXPECT_EQ(config.max_batch, spec.train().batch_size());

  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  absl::StatusOr<BuiltModel> built = BuildModel(*backend, spec, {28, 28}, 10);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->description, "mlp 784-256-128-10");
  EXPECT_TRUE(absl::StrContains(built->architecture, "\"hidden\":[256,128]"))
      << built->architecture;
  // weight and bias of each of the three linear layers
  const std::vector<NamedTensor> parameters = built->model->Parameters();
  EXPECT_EQ(parameters.size(), 6u);
}

TEST(ModelSpecTest, ACnnTakesImagesAsOneChannelAndBuildsItsLayers) {
  const v1::JobSpec spec = CnnSpec();
  absl::StatusOr<NetworkConfig> config = NetworkConfigFromSpec(spec, {28, 28}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->input_shape, (std::vector<int>{1, 28, 28}));
  ASSERT_EQ(config->layers.size(), 5u);
  EXPECT_EQ(config->layers[0].kind, LayerConfig::Kind::kConv2d);
  EXPECT_EQ(config->layers[0].out_channels, 8);
  EXPECT_EQ(config->layers[4].units, 10);
  EXPECT_TRUE(ValidateModelForData(spec, {28, 28}, 10).ok());

  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  absl::StatusOr<BuiltModel> built = BuildModel(*backend, spec, {28, 28}, 10);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->description, "cnn 1x28x28 conv2d-relu-maxpool2d-flatten-linear");
  // conv2d [8,1,3,3] + [8]; linear [10, 8*14*14] + [10]
  const std::vector<NamedTensor> parameters = built->model->Parameters();
  ASSERT_EQ(parameters.size(), 4u);
  EXPECT_EQ(parameters[0].shape, (std::vector<int64_t>{8, 1, 3, 3}));
  EXPECT_EQ(parameters[2].shape, (std::vector<int64_t>{10, 8 * 14 * 14}));
}

TEST(ModelSpecTest, ErrorsNameTheLayerAsTheJobFileDoes) {
  v1::JobSpec spec = CnnSpec();
  spec.mutable_model()->mutable_layers(0)->set_kernel(40);
  absl::Status status = ValidateModelForData(spec, {28, 28}, 10);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(), "model.layers[0]")) << status;

  spec = CnnSpec();
  spec.mutable_model()->mutable_layers(1)->set_type("no-such-layer");
  status = NetworkConfigFromSpec(spec, {28, 28}, 10).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(), "model.layers[1].type")) << status;

  status = ValidateModelForData(CnnSpec(), {28, 28}, 7);  // 10 logits for 7 classes
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(), "model")) << status;

  status = NetworkConfigFromSpec(CnnSpec(), {3, 28, 28}, 10).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(), "model.type: ")) << status;
}

TEST(ModelSpecTest, AModelTooLargeForTheMachineIsRefusedBeforeAllocating) {
  v1::JobSpec spec = ParsedSpec(std::string(kDataset) + "model: {type: mlp, hidden: [16384]}\n");
  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  // 2^22 inputs into 16384 units: 2^36 weights, hundreds of GiB to train.
  absl::StatusOr<BuiltModel> built = BuildModel(*backend, spec, {1 << 22}, 10);
  EXPECT_EQ(built.status().code(), absl::StatusCode::kResourceExhausted) << built.status();
  EXPECT_TRUE(absl::StrContains(built.status().message(), "this machine")) << built.status();
}

}  // namespace
}  // namespace stoker
