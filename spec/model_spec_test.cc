// model_spec on the cpu backend: the configs a job's model section becomes, the errors that name
// the job-file field, and the memory check that refuses a model too large to train; image
// datasets' [C, H, W] samples and their per-channel normalisation (dataset.image.mean and std),
// down to scripts/pytorch_eval.py scoring a checkpoint with the same normalisation.
#include "spec/model_spec.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint.h"
#include "engine/backend.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
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
  absl::StatusOr<MlpConfig> mlp = MlpConfigFromSpec(spec, {28, 28}, 10);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const MlpConfig& config = *mlp;
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

  status = NetworkConfigFromSpec(CnnSpec(), {2, 3, 28, 28}, 10).status();  // 4-D samples
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

// ---- Image datasets: [C, H, W] samples, dataset.image.mean and std ----

// CnnSpec's layers on an image_folder dataset with the given mean and std.
v1::JobSpec ImageSpec(const std::string& model_type, const std::vector<double>& mean,
                      const std::vector<double>& stdev) {
  v1::JobSpec spec = CnnSpec();
  if (model_type == "mlp") spec.mutable_model()->set_type("mlp");
  spec.mutable_dataset()->set_format("image_folder");
  v1::ImageSpec* image = spec.mutable_dataset()->mutable_image();
  for (double m : mean) image->add_mean(m);
  for (double s : stdev) image->add_std(s);
  return spec;
}

const std::vector<double> kMean = {0.485, 0.456, 0.406};
const std::vector<double> kStd = {0.229, 0.224, 0.225};

TEST(ModelSpecImageTest, MeanAndStdBecomePerChannelScaleAndShift) {
  const v1::JobSpec spec = ImageSpec("cnn", kMean, kStd);
  absl::StatusOr<NetworkConfig> cnn = NetworkConfigFromSpec(spec, {3, 32, 32}, 10);
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  EXPECT_EQ(cnn->input_shape, (std::vector<int>{3, 32, 32}));
  absl::StatusOr<MlpConfig> mlp = MlpConfigFromSpec(ImageSpec("mlp", kMean, kStd), {3, 32, 32}, 10);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_EQ(mlp->input_features, 3 * 32 * 32);
  EXPECT_EQ(mlp->input_channels, 3);
  for (const auto& [scale, shift] : {std::pair{cnn->input_scale, cnn->input_shift},
                                     std::pair{mlp->input_scale, mlp->input_shift}}) {
    ASSERT_EQ(scale.size(), 3u);
    ASSERT_EQ(shift.size(), 3u);
    for (int c = 0; c < 3; ++c) {
      // x = (pixel / 255 - mean) / std = pixel * scale + shift
      EXPECT_EQ(scale[c], static_cast<float>(1.0 / (255.0 * kStd[c]))) << c;
      EXPECT_EQ(shift[c], static_cast<float>(-kMean[c] / kStd[c])) << c;
      for (int pixel : {0, 77, 255}) {
        EXPECT_NEAR(pixel * scale[c] + shift[c], (pixel / 255.0 - kMean[c]) / kStd[c], 1e-5);
      }
    }
  }
  EXPECT_TRUE(ValidateModelForData(spec, {3, 32, 32}, 10).ok());

  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  absl::StatusOr<BuiltModel> built = BuildModel(*backend, spec, {3, 32, 32}, 10);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->description, "cnn 3x32x32 conv2d-relu-maxpool2d-flatten-linear");
  EXPECT_EQ(built->model->Parameters()[0].shape, (std::vector<int64_t>{8, 3, 3, 3}));
  const nlohmann::json arch = nlohmann::json::parse(built->architecture);
  EXPECT_EQ(arch["input_shape"], (std::vector<int>{3, 32, 32}));
  ASSERT_TRUE(arch["input_scale"].is_array()) << built->architecture;
  EXPECT_EQ(arch["input_scale"].size(), 3u);
  EXPECT_EQ(arch["input_scale"][2].get<float>(), cnn->input_scale[2]);
  EXPECT_EQ(arch["input_shift"][1].get<float>(), cnn->input_shift[1]);
  built = BuildModel(*backend, ImageSpec("mlp", kMean, kStd), {3, 32, 32}, 10);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->description, "mlp 3072-10");  // no hidden layers in CnnSpec
  EXPECT_EQ(nlohmann::json::parse(built->architecture)["input_channels"], 3);
}

TEST(ModelSpecImageTest, OneValueServesEveryChannel) {
  // One mean, one std: one scale and one shift.
  absl::StatusOr<NetworkConfig> config =
      NetworkConfigFromSpec(ImageSpec("cnn", {0.5}, {0.25}), {3, 16, 16}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->input_scale, std::vector<float>{static_cast<float>(1 / 63.75)});
  EXPECT_EQ(config->input_shift, std::vector<float>{-2.0f});
  // A mean per channel and one std (and the other way round): a value per channel.
  config = NetworkConfigFromSpec(ImageSpec("cnn", {0.1, 0.2, 0.3}, {0.5}), {3, 16, 16}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->input_scale, std::vector<float>(3, static_cast<float>(1 / 127.5)));
  EXPECT_EQ(config->input_shift, (std::vector<float>{-0.2f, -0.4f, -0.6f}));
  // Only std: mean defaults to 0.5.
  config = NetworkConfigFromSpec(ImageSpec("cnn", {}, {0.5, 0.25, 1.0}), {3, 16, 16}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->input_shift, (std::vector<float>{-1.0f, -2.0f, -0.5f}));
  // Neither: the engine's defaults, as for IDX data (mean 0.5, std 0.5).
  const MlpConfig defaults;
  for (const v1::JobSpec& spec : {ImageSpec("cnn", {}, {}), CnnSpec()}) {
    config = NetworkConfigFromSpec(spec, {28, 28}, 10);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->input_shape, (std::vector<int>{1, 28, 28}));
    EXPECT_EQ(config->input_scale, defaults.input_scale);
    EXPECT_EQ(config->input_shift, defaults.input_shift);
  }
  // A single-channel image dataset's samples may come as {1, H, W} too.
  config = NetworkConfigFromSpec(ImageSpec("cnn", {0.2}, {0.3}), {1, 28, 28}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->input_shape, (std::vector<int>{1, 28, 28}));
  EXPECT_EQ(config->input_scale.size(), 1u);
}

TEST(ModelSpecImageTest, MeanOrStdCountThatFitsNoChannelCountIsRefused) {
  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  // Three means for grayscale images; three stds for grayscale images; an mlp and a cnn alike.
  for (const auto& [spec, field] :
       {std::pair{ImageSpec("cnn", kMean, {0.5}), "dataset.image.mean"},
        std::pair{ImageSpec("mlp", {0.5}, kStd), "dataset.image.std"},
        std::pair{ImageSpec("mlp", kMean, kStd), "dataset.image.mean"}}) {
    const std::vector<int> dims = {1, 28, 28};
    for (const absl::Status& status :
         {ValidateModelForData(spec, dims, 10), BuildModel(*backend, spec, dims, 10).status(),
          spec.model().type() == "cnn" ? NetworkConfigFromSpec(spec, dims, 10).status()
                                       : MlpConfigFromSpec(spec, dims, 10).status()}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      EXPECT_TRUE(absl::StartsWith(status.message(), field)) << status;
      EXPECT_TRUE(absl::StrContains(status.message(), "1 channel")) << status;
    }
  }
  // Two values for three channels.
  absl::Status status = ValidateModelForData(ImageSpec("cnn", {0.1, 0.2}, {}), {3, 28, 28}, 10);
  EXPECT_TRUE(absl::StartsWith(status.message(), "dataset.image.mean")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "3 channels")) << status;
}

TEST(ModelSpecImageTest, ThreeDimensionalSamplesOfEveryFormatAreChannelsFirst) {
  // IDX/NPY samples with a third dimension are [C, H, W], as PyTorch lays them out.
  absl::StatusOr<NetworkConfig> network = NetworkConfigFromSpec(CnnSpec(), {3, 32, 32}, 10);
  ASSERT_TRUE(network.ok()) << network.status();
  EXPECT_EQ(network->input_shape, (std::vector<int>{3, 32, 32}));
  // An mlp takes them flat, with the default normalisation.
  v1::JobSpec mlp = CnnSpec();
  mlp.mutable_model()->set_type("mlp");
  absl::StatusOr<MlpConfig> config = MlpConfigFromSpec(mlp, {32, 32, 3}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->input_features, 3072);
  EXPECT_EQ(config->input_channels, 1);
  EXPECT_EQ(config->input_scale, MlpConfig().input_scale);
}

// ---- Vision models: residual blocks, BatchNorm, the resnet preset ----

v1::JobSpec ResnetSpec(int depth, int width = 0) {
  return ParsedSpec(std::string(kDataset) + "model: {type: resnet, depth: " +
                    std::to_string(depth) + ", width: " + std::to_string(width) + "}\n");
}

// Every new field at least once: bias-free conv and linear, BatchNorm2d/1d with their own
// momentum and eps, average pooling, a block with a projection, one with an identity shortcut and
// GELU, one without activation, a block inside a block, label smoothing.
constexpr char kResidualModel[] =
    "model:\n"
    "  type: cnn\n"
    "  layers:\n"
    "    - {type: conv2d, out_channels: 6, kernel: 3, padding: 1, bias: false}\n"
    "    - {type: batchnorm2d, momentum: 0.2, eps: 0.001}\n"
    "    - {type: relu}\n"
    "    - type: residual\n"
    "      layers:\n"
    "        - {type: conv2d, out_channels: 8, kernel: 3, stride: 2, padding: 1, bias: false}\n"
    "        - {type: batchnorm2d}\n"
    "        - {type: relu}\n"
    "        - {type: conv2d, out_channels: 8, kernel: 3, padding: 1}\n"
    "      shortcut:\n"
    "        - {type: conv2d, out_channels: 8, kernel: 1, stride: 2, bias: false}\n"
    "        - {type: batchnorm2d}\n"
    "    - type: residual\n"
    "      activation: gelu\n"
    "      layers:\n"
    "        - {type: conv2d, out_channels: 8, kernel: 3, padding: 1}\n"
    "        - type: residual\n"
    "          activation: none\n"
    "          layers: [{type: batchnorm2d}, {type: relu}]\n"
    "    - {type: avgpool2d, kernel: 2}\n"
    "    - {type: flatten}\n"
    "    - {type: linear, units: 12, bias: false}\n"
    "    - {type: batchnorm1d, momentum: 0.3}\n"
    "    - {type: relu}\n"
    "    - {type: linear, units: 4}\n"
    "train: {label_smoothing: 0.1, batch_size: 64}\n";

TEST(ModelSpecVisionTest, Resnet20HasTorchsParameterCount) {
  // 1 input channel: counted by hand (stem 144 + 32, stages 14016, 51648 and 205696, head 650)
  // and by torch (PytorchEvalTest below builds the same network).
  absl::StatusOr<NetworkConfig> config = NetworkConfigFromSpec(ResnetSpec(20), {28, 28}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(NetworkParameterCount(*config), 272186);
  // 3 blocks of 6 layers (the block and 5 inside) per stage, 2 projections of 2, stem and head.
  EXPECT_EQ(NetworkLayerCount(*config), 3 + 9 * 6 + 2 * 2 + 3);
  EXPECT_EQ(config->layers.size(), 15u);
  EXPECT_TRUE(ValidateModelForData(ResnetSpec(20), {28, 28}, 10).ok());
  // The published figure for CIFAR-10: 3 input channels.
  config = NetworkConfigFromSpec(ResnetSpec(20), {3, 32, 32}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(NetworkParameterCount(*config), 272474);
  config = NetworkConfigFromSpec(ResnetSpec(56), {3, 32, 32}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(NetworkParameterCount(*config), 855770);

  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  absl::StatusOr<BuiltModel> built = BuildModel(*backend, ResnetSpec(20), {28, 28}, 10);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->description, "resnet-20 width 16 1x28x28 (64 layers, 272186 parameters)");
  // The engine's tensors: the same trained values, plus 3 buffers for each of the 21 BatchNorms.
  int64_t trained = 0;
  int buffers = 0;
  for (const NamedTensor& tensor : built->model->Parameters()) {
    if (absl::StrContains(tensor.name, "running_") ||
        absl::StrContains(tensor.name, "num_batches_tracked")) {
      ++buffers;
    } else {
      trained += static_cast<int64_t>(tensor.values.size());
    }
  }
  EXPECT_EQ(trained, 272186);
  EXPECT_EQ(buffers, 3 * 21);
}

TEST(ModelSpecVisionTest, NestedLayersBecomeTheEngineConfig) {
  const v1::JobSpec spec = ParsedSpec(std::string(kDataset) + kResidualModel);
  absl::StatusOr<NetworkConfig> config = NetworkConfigFromSpec(spec, {3, 8, 8}, 4);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FLOAT_EQ(config->label_smoothing, 0.1f);
  ASSERT_EQ(config->layers.size(), 11u);
  EXPECT_FALSE(config->layers[0].bias);
  EXPECT_FLOAT_EQ(config->layers[1].momentum, 0.2f);
  EXPECT_FLOAT_EQ(config->layers[1].eps, 0.001f);
  const LayerConfig& block = config->layers[3];
  ASSERT_EQ(block.kind, LayerConfig::Kind::kResidual);
  EXPECT_EQ(block.activation, LayerConfig::Activation::kRelu);  // the default
  ASSERT_EQ(block.layers.size(), 4u);
  EXPECT_EQ(block.layers[0].stride, 2);
  EXPECT_TRUE(block.layers[3].bias);
  ASSERT_EQ(block.shortcut.size(), 2u);
  EXPECT_EQ(config->layers[4].activation, LayerConfig::Activation::kGelu);
  EXPECT_EQ(config->layers[4].layers[1].activation, LayerConfig::Activation::kNone);
  EXPECT_FLOAT_EQ(config->layers[8].momentum, 0.3f);
  EXPECT_TRUE(ValidateModelForData(spec, {3, 8, 8}, 4).ok())
      << ValidateModelForData(spec, {3, 8, 8}, 4);

  // The architecture JSON carries every field, nested.
  const nlohmann::json arch = nlohmann::json::parse(ArchitectureJson(*config));
  EXPECT_EQ(arch["label_smoothing"], 0.1);
  EXPECT_EQ(arch["layers"][0]["bias"], false);
  EXPECT_EQ(arch["layers"][1]["momentum"], 0.2);
  EXPECT_EQ(arch["layers"][1]["eps"], 0.001);
  EXPECT_EQ(arch["layers"][3]["type"], "residual");
  EXPECT_EQ(arch["layers"][3]["activation"], "relu");
  EXPECT_EQ(arch["layers"][3]["layers"][0]["stride"], 2);
  EXPECT_EQ(arch["layers"][3]["shortcut"][0]["kernel"], 1);
  EXPECT_EQ(arch["layers"][4]["shortcut"].size(), 0u);
  EXPECT_EQ(arch["layers"][4]["layers"][1]["activation"], "none");
  EXPECT_EQ(arch["layers"][5]["stride"], 2);  // the effective stride of avgpool2d
  EXPECT_EQ(arch["layers"][7]["bias"], false);

  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  absl::StatusOr<BuiltModel> built = BuildModel(*backend, spec, {3, 8, 8}, 4);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_TRUE(absl::StartsWith(
      built->description,
      "cnn 3x8x8 conv2d-batchnorm2d-relu-residual(conv2d-batchnorm2d-relu-conv2d | "
      "conv2d-batchnorm2d)-residual(conv2d-residual(batchnorm2d-relu))-avgpool2d-flatten-linear-"
      "batchnorm1d-relu-linear ("))
      << built->description;
  EXPECT_EQ(built->architecture, ArchitectureJson(*config));
}

TEST(ModelSpecVisionTest, TheLayersAsYamlReadBackAsTheSameNetwork) {
  for (const v1::JobSpec& spec :
       {ParsedSpec(std::string(kDataset) + kResidualModel), ResnetSpec(20), ResnetSpec(18, 8)}) {
    absl::StatusOr<NetworkConfig> config = NetworkConfigFromSpec(spec, {3, 8, 8}, 4);
    ASSERT_TRUE(config.ok()) << config.status();
    const std::string yaml = NetworkLayersYaml(*config);
    absl::StatusOr<JobFile> file = ParseJobYaml(std::string(kDataset) + yaml, "expanded.yaml");
    ASSERT_TRUE(file.ok()) << file.status() << "\n" << yaml;
    EXPECT_TRUE(ValidateJobSpec(file->spec).ok()) << ValidateJobSpec(file->spec);
    absl::StatusOr<NetworkConfig> again = NetworkConfigFromSpec(file->spec, {3, 8, 8}, 4);
    ASSERT_TRUE(again.ok()) << again.status();
    again->label_smoothing = config->label_smoothing;  // a train field, not in the layers
    EXPECT_EQ(ArchitectureJson(*again), ArchitectureJson(*config)) << yaml;
    // The comments' parameter counts of the top-level layers add up to the network's.
    int64_t sum = 0;
    for (absl::string_view line : absl::StrSplit(yaml, '\n')) {
      if (!absl::StartsWith(line, "    - ")) continue;  // top-level entries only
      const size_t comma = line.rfind(", ");
      int64_t count = 0;
      ASSERT_TRUE(
          absl::SimpleAtoi(line.substr(comma + 2, line.rfind(" parameters") - comma - 2), &count))
          << line;
      sum += count;
    }
    EXPECT_EQ(sum, NetworkParameterCount(*config)) << yaml;
  }
  absl::StatusOr<NetworkConfig> config = NetworkConfigFromSpec(ResnetSpec(20), {28, 28}, 10);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string yaml = NetworkLayersYaml(*config);
  EXPECT_TRUE(absl::StrContains(
      yaml,
      "    - {type: conv2d, out_channels: 16, kernel: 3, stride: 1, padding: 1, bias: false}  # "
      "16x28x28, 144 parameters\n"))
      << yaml;
  EXPECT_TRUE(absl::StrContains(yaml,
                                "    - type: residual  # 32x14x14, 14528 parameters\n"
                                "      activation: relu\n"
                                "      layers:\n"
                                "        - {type: conv2d, out_channels: 32, kernel: 3, "
                                "stride: 2, padding: 1, bias: false}  # 32x14x14, 4608 "
                                "parameters\n"))
      << yaml;
  EXPECT_TRUE(absl::StrContains(yaml, "    - {type: linear, units: 10}  # 10, 650 parameters\n"))
      << yaml;
}

TEST(ModelSpecVisionTest, NestedErrorsNameTheLayersPath) {
  v1::JobSpec spec = ParsedSpec(std::string(kDataset) + kResidualModel);
  // The shortcut's output (stride 1: 8x8) does not match the main branch's (4x4).
  spec.mutable_model()->mutable_layers(3)->mutable_shortcut(0)->set_stride(1);
  absl::Status status = ValidateModelForData(spec, {3, 8, 8}, 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(), "model.layers[3]")) << status;
  spec = ParsedSpec(std::string(kDataset) + kResidualModel);
  spec.mutable_model()->mutable_layers(4)->mutable_layers(0)->set_kernel(9);
  status = ValidateModelForData(spec, {3, 8, 8}, 4);
  EXPECT_TRUE(absl::StartsWith(status.message(), "model.layers[4].layers[0] (conv2d): ")) << status;
  // A resnet's layers are not in the file: the message says where they come from.
  status = ValidateModelForData(ResnetSpec(20), {784}, 10);
  EXPECT_TRUE(absl::StartsWith(status.message(), "model: resnet-20 on samples of 784: layers[0] "))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "--dry-run")) << status;
}

// batch_size 1 gives a BatchNorm1d, or a BatchNorm2d on a 1x1 plane, one value per channel in
// every training batch: refused at submit naming the field and the layer; a BatchNorm2d on a
// larger plane trains on batch 1 (H x W values per channel), and batch 2 is fine everywhere.
TEST(ModelSpecVisionTest, BatchSizeOneWithASingleValueBatchNormIsRefused) {
  v1::JobSpec spec = ParsedSpec(std::string(kDataset) + kResidualModel);
  spec.mutable_train()->set_batch_size(1);
  absl::Status status = ValidateModelForData(spec, {3, 8, 8}, 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StartsWith(status.message(),
                       "train.batch_size: 1 gives model.layers[8] (batchnorm1d) one value per "
                       "channel"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "Expected more than 1 value per channel"))
      << status;
  spec.mutable_train()->set_batch_size(2);
  EXPECT_TRUE(ValidateModelForData(spec, {3, 8, 8}, 4).ok());

  const std::string nested = std::string(kDataset) +
                             "model:\n"
                             "  type: cnn\n"
                             "  layers:\n"
                             "    - {type: batchnorm2d}\n"
                             "    - {type: conv2d, out_channels: 4, kernel: 4}\n"
                             "    - type: residual\n"
                             "      layers: [{type: conv2d, out_channels: 4, kernel: 1}]\n"
                             "      shortcut: [{type: batchnorm2d}]\n"
                             "    - {type: flatten}\n"
                             "    - {type: linear, units: 4}\n"
                             "train: {batch_size: 1}\n";
  status = ValidateModelForData(ParsedSpec(nested), {4, 4}, 4);
  EXPECT_TRUE(absl::StartsWith(status.message(),
                               "train.batch_size: 1 gives "
                               "model.layers[2].shortcut[0] (batchnorm2d) one"))
      << status;
  // On 4x4 inputs the first BatchNorm2d sees 16 values per channel; the conv makes 1x1 planes.
  EXPECT_TRUE(ValidateModelForData(ParsedSpec(nested), {8, 8}, 4).ok());
}

// ---- scripts/pytorch_eval.py scores a checkpoint with the model's normalisation ----

std::string ScriptPath() {
  // This file is spec/model_spec_test.cc; the build compiles it by its absolute path.
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "scripts" /
          "pytorch_eval.py")
      .string();
}

// Runs `command`, returning its exit code and what it printed (stdout and stderr).
int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, n);
  return pclose(pipe);
}

// An uncompressed IDX file of uint8 values with the given dimensions.
void WriteIdx(const std::string& path, const std::vector<int>& dims,
              const std::vector<uint8_t>& data) {
  std::ofstream out(path, std::ios::binary);
  const char magic[4] = {0, 0, 8, static_cast<char>(dims.size())};
  out.write(magic, 4);
  for (int d : dims) {
    const char be[4] = {static_cast<char>(d >> 24), static_cast<char>(d >> 16),
                        static_cast<char>(d >> 8), static_cast<char>(d)};
    out.write(be, 4);
  }
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

class PytorchEvalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string output;
    if (RunCommand("/usr/bin/python3 -c 'import torch'", &output) != 0) {
      GTEST_SKIP() << "/usr/bin/python3 has no torch (Debian's python3-torch): " << output;
    }
    char pattern[] = "/tmp/model_spec_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Writes `count` random samples of `dims` and their labels (< classes) as IDX files.
  void WriteTestSet(const std::vector<int>& dims, int count, int classes) {
    std::mt19937_64 rng(17);
    int64_t features = 1;
    for (int d : dims) features *= d;
    samples_.resize(count * features);
    labels_.resize(count);
    for (uint8_t& p : samples_) p = static_cast<uint8_t>(rng() >> 56);
    for (uint8_t& l : labels_) l = static_cast<uint8_t>(rng() % classes);
    std::vector<int> image_dims = {count};
    image_dims.insert(image_dims.end(), dims.begin(), dims.end());
    WriteIdx(dir_ + "/images.idx", image_dims, samples_);
    WriteIdx(dir_ + "/labels.idx", {count}, labels_);
  }

  // Stoker's mean loss of `model` on the test set.
  double StokerLoss(Model& model) {
    absl::StatusOr<EvalResult> eval =
        model.Evaluate({samples_.data(), labels_.data(), static_cast<int>(labels_.size())});
    EXPECT_TRUE(eval.ok()) << eval.status();
    return eval.ok() ? eval->loss_sum / eval->count : NAN;
  }

  // The mean loss pytorch_eval.py reports for `model`'s weights under `architecture`.
  double PytorchLoss(const Model& model, const std::string& architecture) {
    Checkpoint checkpoint;
    for (const NamedTensor& t : model.Parameters()) {
      checkpoint.tensors.push_back({t.name, t.shape, t.values});
    }
    for (const NamedTensor& t : model.OptimizerState()) {  // as the trainer saves it
      checkpoint.tensors.push_back({"optimizer." + t.name, t.shape, t.values});
    }
    checkpoint.metadata["model"] = architecture;
    const std::string path = dir_ + "/model.safetensors";
    EXPECT_TRUE(WriteCheckpoint(path, checkpoint).ok());
    std::string output;
    const int code = RunCommand("/usr/bin/python3 " + ScriptPath() + " " + path + " --images " +
                                    dir_ + "/images.idx --labels " + dir_ + "/labels.idx",
                                &output);
    EXPECT_EQ(code, 0) << output;
    const size_t at = output.find("loss=");
    double loss = NAN;
    EXPECT_TRUE(
        at != std::string::npos &&
        absl::SimpleAtod(output.substr(at + 5, output.find_first_of(" \n", at) - at - 5), &loss))
        << output;
    return loss;
  }

  std::string dir_;
  std::vector<uint8_t> samples_;
  std::vector<uint8_t> labels_;
};

// RGB images with a mean and std per channel: pytorch_eval.py's loss equals Stoker's, for a cnn
// and an mlp (trained a little); the same weights under the first channel's values for all three
// score measurably differently, so the agreement is the per-channel normalisation's.
TEST_F(PytorchEvalTest, ScoresWithPerChannelNormalisation) {
  const std::vector<int> dims = {3, 8, 8};
  WriteTestSet(dims, 64, 4);
  const std::vector<double> mean = {0.2, 0.5, 0.8}, stdev = {0.2, 0.5, 0.9};
  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  for (const std::string type : {"cnn", "mlp"}) {
    SCOPED_TRACE(type);
    auto build = [&](const std::vector<double>& m, const std::vector<double>& s) {
      v1::JobSpec spec = ImageSpec(type, m, s);
      spec.mutable_model()->mutable_layers(4)->set_units(4);  // 4 classes
      return BuildModel(*backend, spec, dims, 4);
    };
    absl::StatusOr<BuiltModel> built = build(mean, stdev);
    absl::StatusOr<BuiltModel> first_channel = build({mean[0]}, {stdev[0]});
    ASSERT_TRUE(built.ok()) << built.status();
    ASSERT_TRUE(first_channel.ok()) << first_channel.status();
    // Fitted to the test set, so that the loss depends on what the inputs are.
    const BatchView test_set{samples_.data(), labels_.data(), static_cast<int>(labels_.size())};
    for (int step = 0; step < 20; ++step) ASSERT_TRUE(built->model->TrainStep(test_set, 0.05).ok());
    ASSERT_TRUE(first_channel->model->SetParameters(built->model->Parameters()).ok());

    const double stoker = StokerLoss(*built->model);
    EXPECT_NEAR(PytorchLoss(*built->model, built->architecture), stoker, 1e-4 * stoker);
    const double uniform = StokerLoss(*first_channel->model);
    // Ten times the tolerance above: pytorch_eval.py with one channel's values would fail it.
    EXPECT_GT(std::abs(uniform - stoker), 1e-3 * stoker) << "a check that could not tell";
  }
}

// pytorch_eval.py's module tree for an architecture has the engine's tensors, name for name and
// shape for shape in the same order (num_batches_tracked as PyTorch's int64 scalar), and torch
// counts the parameters NetworkParameterCount counts: ResNet-20's 272,186 (1 channel) and
// 272,474 (3 channels), ResNet-18, and a network with every new layer field.
TEST_F(PytorchEvalTest, RebuildsResidualNetworksWithTheEnginesTensors) {
  struct Case {
    v1::JobSpec spec;
    std::vector<int> dims;
    int classes;
  };
  const Case cases[] = {{ResnetSpec(20), {28, 28}, 10},
                        {ResnetSpec(20), {3, 32, 32}, 10},
                        {ResnetSpec(18, 8), {3, 16, 16}, 100},
                        {ParsedSpec(std::string(kDataset) + kResidualModel), {3, 8, 8}, 4}};
  for (const Case& c : cases) {
    absl::StatusOr<NetworkConfig> config = NetworkConfigFromSpec(c.spec, c.dims, c.classes);
    ASSERT_TRUE(config.ok()) << config.status();
    SCOPED_TRACE(NetworkDescription(c.spec.model(), *config));
    const std::string path = dir_ + "/arch.json";
    std::ofstream(path) << ArchitectureJson(*config);
    std::string output;
    ASSERT_EQ(RunCommand("/usr/bin/python3 " + ScriptPath() + " --parameters " + path, &output), 0)
        << output;
    std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipEmpty());
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines[0], absl::StrCat("parameters=", NetworkParameterCount(*config)));
    const std::vector<NetworkTensorSpec> tensors = NetworkTensorSpecs(*config);
    ASSERT_EQ(lines.size(), tensors.size() + 1) << output;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const bool counter = tensors[i].kind == NetworkTensorKind::kBatchesTracked;
      EXPECT_EQ(lines[i + 1], absl::StrCat(tensors[i].name, " [",
                                           counter ? "" : absl::StrJoin(tensors[i].shape, ", "),
                                           "] ", counter ? "int64" : "float32"));
    }
  }
}

// A residual network with BatchNorm (2d and 1d, own momentum and eps), average pooling, bias-free
// layers and label smoothing on RGB images, trained a little so that the running statistics and
// num_batches_tracked are not their initial values: pytorch_eval.py, loading the checkpoint
// strictly and evaluating in eval() mode, reports Stoker's loss.
TEST_F(PytorchEvalTest, ScoresResidualNetworksWithBatchNorm) {
  const std::vector<int> dims = {3, 8, 8};
  WriteTestSet(dims, 64, 4);
  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  const v1::JobSpec spec = ParsedSpec(std::string(kDataset) + kResidualModel);
  absl::StatusOr<BuiltModel> built = BuildModel(*backend, spec, dims, 4);
  ASSERT_TRUE(built.ok()) << built.status();
  const BatchView test_set{samples_.data(), labels_.data(), static_cast<int>(labels_.size())};
  for (int step = 0; step < 20; ++step) ASSERT_TRUE(built->model->TrainStep(test_set, 0.05).ok());
  bool tracked = false;
  for (const NamedTensor& t : built->model->Parameters()) {
    if (absl::EndsWith(t.name, "num_batches_tracked")) tracked = t.values.at(0) == 20;
  }
  EXPECT_TRUE(tracked) << "the batch counter did not reach 20";
  const double stoker = StokerLoss(*built->model);
  EXPECT_NEAR(PytorchLoss(*built->model, built->architecture), stoker, 1e-4 * stoker);
}

// A checkpoint from before per-channel values (scalar input_scale and input_shift, no
// input_channels) still loads and scores as it did.
TEST_F(PytorchEvalTest, ScoresCheckpointsWithScalarValues) {
  WriteTestSet({28, 28}, 50, 10);
  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  v1::JobSpec spec = ParsedSpec(std::string(kDataset) + "model: {type: mlp, hidden: [32]}\n");
  absl::StatusOr<BuiltModel> built = BuildModel(*backend, spec, {28, 28}, 10);
  ASSERT_TRUE(built.ok()) << built.status();
  nlohmann::json arch = nlohmann::json::parse(built->architecture);
  ASSERT_TRUE(arch["input_scale"].is_number()) << built->architecture;
  ASSERT_TRUE(arch["input_shift"].is_number()) << built->architecture;
  arch.erase("input_channels");
  const double stoker = StokerLoss(*built->model);
  EXPECT_NEAR(PytorchLoss(*built->model, arch.dump()), stoker, 1e-4 * stoker);
}

}  // namespace
}  // namespace stoker
