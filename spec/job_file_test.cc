#include "spec/job_file.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace stoker {
namespace {

constexpr char kGoodJob[] = R"(name: fmnist
dataset:
  format: idx
  train_images: fashion-mnist/train-images-idx3-ubyte.gz
  train_labels: fashion-mnist/train-labels-idx1-ubyte.gz
  test_images: fashion-mnist/t10k-images-idx3-ubyte.gz
  test_labels: fashion-mnist/t10k-labels-idx1-ubyte.gz
model: {type: mlp, hidden: [64, 32]}
train:
  epochs: 3
  batch_size: 64
  precision: bf16
  optimizer: {type: sgd, lr: 0.1}
loader: {processes: auto, ring_slots: 4}
priority: 5
)";

TEST(JobFileTest, MapsEveryKeyOntoTheSpec) {
  absl::StatusOr<JobFile> file = ParseJobYaml(kGoodJob, "good.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  const v1::JobSpec& spec = file->spec;
  EXPECT_EQ(spec.name(), "fmnist");
  EXPECT_EQ(spec.dataset().train_labels(), "fashion-mnist/train-labels-idx1-ubyte.gz");
  ASSERT_EQ(spec.model().hidden_size(), 2);
  EXPECT_EQ(spec.model().hidden(0), 64);
  EXPECT_EQ(spec.model().hidden(1), 32);
  EXPECT_EQ(spec.train().epochs(), 3);
  EXPECT_EQ(spec.train().batch_size(), 64);
  EXPECT_EQ(spec.train().precision(), v1::PRECISION_BF16);
  EXPECT_DOUBLE_EQ(spec.train().optimizer().lr(), 0.1);
  EXPECT_EQ(spec.loader().processes(), 0);
  EXPECT_EQ(spec.loader().ring_slots(), 4);
  EXPECT_EQ(spec.priority(), 5);
  // Keys left out keep their defaults.
  EXPECT_DOUBLE_EQ(spec.train().optimizer().momentum(), 0.9);
  EXPECT_EQ(spec.train().seed(), 1);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  EXPECT_EQ(file->locations.at("train.batch_size"), "good.yaml:11:15");
}

TEST(JobFileTest, UnknownFieldIsNamedWithLineAndSuggestion) {
  absl::StatusOr<JobFile> file = ParseJobYaml("name: x\ntrain:\n  batch_sze: 5\n", "bad.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("bad.yaml:3:3"), std::string::npos) << file.status();
  EXPECT_NE(file.status().message().find("unknown field 'batch_sze' in train"), std::string::npos);
  EXPECT_NE(file.status().message().find("did you mean 'batch_size'"), std::string::npos);
}

TEST(JobFileTest, WrongTypesAreNamed) {
  absl::StatusOr<JobFile> file = ParseJobYaml("train:\n  epochs: ten\n", "t.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("t.yaml:2:11: train.epochs: expected an integer"),
            std::string::npos)
      << file.status();

  file = ParseJobYaml("train: {precision: fp8}\n", "p.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("unknown value 'fp8'"), std::string::npos);
  EXPECT_NE(file.status().message().find("bf16"), std::string::npos);

  file = ParseJobYaml("model: {hidden: 256}\n", "h.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("model.hidden: expected a list"), std::string::npos);

  file = ParseJobYaml("train: 5\n", "m.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("train: expected a mapping"), std::string::npos);
}

TEST(JobFileTest, DuplicateKeysAndSyntaxErrorsAreRefused) {
  absl::StatusOr<JobFile> file = ParseJobYaml("name: a\nname: b\n", "d.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("d.yaml:2:1: name: duplicate key"), std::string::npos)
      << file.status();

  file = ParseJobYaml("train: {epochs: [1, 2\n", "s.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("YAML syntax error"), std::string::npos);

  file = ParseJobYaml("", "e.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("empty"), std::string::npos);

  // A second document would have been dropped without a word; a leading or trailing "---" is fine.
  file = ParseJobYaml("name: a\n---\nname: b\n", "m.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("m.yaml:2:1: a second YAML document starts here"),
            std::string::npos)
      << file.status();
  file = ParseJobYaml("# c\nname: a\n...\n# more\n--- {name: b}\n", "m2.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("m2.yaml:3:1:"), std::string::npos) << file.status();
  EXPECT_TRUE(ParseJobYaml("%YAML 1.2\n---\nname: a\n---\n# end\n", "one.yaml").ok());
  EXPECT_TRUE(ParseJobYaml("name: a\n...\n", "dots.yaml").ok());
  EXPECT_TRUE(ParseJobYaml("name: |\n  ---\n", "block.yaml")
                  .status()
                  .message()
                  .find("second YAML document") == std::string::npos)
      << "an indented --- is a scalar's text";
}

TEST(JobFileTest, ValidationErrorsGetTheFieldsLine) {
  absl::StatusOr<JobFile> file = ParseJobYaml(
      "name: x\ntrain:\n  batch_size: -5\n"
      "dataset: {train_images: a, train_labels: b, test_images: c, test_labels: d}\n",
      "n.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::Status status = WithFileLocation(*file, ValidateJobSpec(file->spec));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("n.yaml:3:15: train.batch_size: must be between 1 and 65536 "
                                  "(got -5)"),
            std::string::npos)
      << status;
}

TEST(JobFileTest, ExampleJobFileIsValid) {
  absl::StatusOr<JobFile> file = ReadJobFile(STOKER_SOURCE_DIR "/examples/fashion-mnist-mlp.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(ValidateJobSpec(file->spec).ok()) << ValidateJobSpec(file->spec);
  EXPECT_EQ(file->spec.model().hidden_size(), 2);
}

TEST(JobFileTest, MlpHiddenDefaultsOnlyWhenLeftOut) {
  absl::StatusOr<JobFile> file = ParseJobYaml("name: x\n", "d.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->spec.model().hidden(), testing::ElementsAre(256, 128));
  file = ParseJobYaml("model: {type: mlp}\n", "d.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->spec.model().hidden(), testing::ElementsAre(256, 128));
  file = ParseJobYaml("model: {type: mlp, hidden: []}\n", "d.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->spec.model().hidden().empty());
  // no_hidden_layers (what `hidden: []` sends) written out asks for none too.
  file = ParseJobYaml("model: {type: mlp, no_hidden_layers: true}\n", "d.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->spec.model().hidden().empty());
  file = ParseJobYaml("model: {type: mlp, hidden: [32]}\n", "d.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->spec.model().hidden(), testing::ElementsAre(32));

  file = ParseJobYaml(
      "model:\n  type: cnn\n  hidden: [32]\n  layers: [{type: flatten}, {type: linear, units: "
      "10}]\n"
      "dataset: {train_images: a, train_labels: b, test_images: c, test_labels: d}\n",
      "c.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->spec.model().hidden_size(), 1);
  absl::Status status = WithFileLocation(*file, ValidateJobSpec(file->spec));
  EXPECT_NE(status.message().find("c.yaml:3:11: model.hidden: only for type mlp"),
            std::string::npos)
      << status;
  file = ParseJobYaml(
      "model:\n  type: cnn\n  layers: [{type: flatten}, {type: linear, units: 10}]\n", "c.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->spec.model().hidden().empty());
}

TEST(JobFileTest, CnnLayersAreAListOfMappings) {
  absl::StatusOr<JobFile> file = ReadJobFile(STOKER_SOURCE_DIR "/examples/fashion-mnist-cnn.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(ValidateJobSpec(file->spec).ok()) << ValidateJobSpec(file->spec);
  ASSERT_EQ(file->spec.model().layers_size(), 11);
  EXPECT_EQ(file->spec.model().layers(0).type(), "conv2d");
  EXPECT_EQ(file->spec.model().layers(0).out_channels(), 32);
  EXPECT_EQ(file->spec.model().layers(10).units(), 10);
  EXPECT_TRUE(file->spec.train().optimizer().nesterov());

  absl::StatusOr<JobFile> bad =
      ParseJobYaml("model:\n  type: cnn\n  layers:\n    - {type: conv2d, kernal: 3}\n", "l.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("l.yaml:4:"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("unknown field 'kernal' in model.layers[0]"),
            std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("did you mean 'kernel'"), std::string::npos);
}

constexpr char kResidualJob[] =
    "dataset: {train_images: a, train_labels: b, test_images: c, test_labels: d}\n"
    "model:\n"
    "  type: cnn\n"
    "  layers:\n"
    "    - {type: conv2d, out_channels: 8, kernel: 3, padding: 1, bias: false}\n"
    "    - {type: batchnorm2d, momentum: 0.01, eps: 0.001}\n"
    "    - type: residual\n"
    "      activation: gelu\n"
    "      layers:\n"
    "        - {type: conv2d, out_channels: 16, kernel: 3, stride: 2, padding: 1}\n"
    "        - {type: relu}\n"
    "      shortcut:\n"
    "        - {type: conv2d, out_channels: 16, kernel: 1, stride: 2}\n"
    "    - {type: global_avgpool}\n"
    "    - {type: linear, units: 10, bias: true}\n"
    "train: {label_smoothing: 0.1}\n";

TEST(JobFileTest, ResidualBlocksNestLayerLists) {
  absl::StatusOr<JobFile> file = ParseJobYaml(kResidualJob, "r.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(ValidateJobSpec(file->spec).ok()) << ValidateJobSpec(file->spec);
  const v1::ModelSpec& model = file->spec.model();
  ASSERT_EQ(model.layers_size(), 5);
  ASSERT_TRUE(model.layers(0).has_bias());
  EXPECT_FALSE(model.layers(0).bias());
  EXPECT_DOUBLE_EQ(model.layers(1).momentum(), 0.01);
  EXPECT_DOUBLE_EQ(model.layers(1).eps(), 0.001);
  EXPECT_FALSE(model.layers(1).has_bias());  // left out: the default (true) where it applies
  const v1::LayerSpec& block = model.layers(2);
  EXPECT_EQ(block.type(), "residual");
  EXPECT_EQ(block.activation(), "gelu");
  ASSERT_EQ(block.layers_size(), 2);
  EXPECT_EQ(block.layers(0).stride(), 2);
  ASSERT_EQ(block.shortcut_size(), 1);
  EXPECT_EQ(block.shortcut(0).kernel(), 1);
  ASSERT_TRUE(model.layers(4).has_bias());
  EXPECT_TRUE(model.layers(4).bias());
  EXPECT_DOUBLE_EQ(file->spec.train().label_smoothing(), 0.1);
}

TEST(JobFileTest, NestedMistakesNameTheirPathAndLine) {
  // A misspelt key inside a block's shortcut: found by the parser.
  std::string yaml = kResidualJob;
  yaml.replace(yaml.find("kernel: 1,"), 7, "kernal:");
  absl::StatusOr<JobFile> file = ParseJobYaml(yaml, "r.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find(
                "r.yaml:13:44: unknown field 'kernal' in model.layers[2].shortcut[0]"),
            std::string::npos)
      << file.status();
  // An out-of-range value inside the main branch: found by validation, placed by the file.
  yaml = kResidualJob;
  yaml.replace(yaml.find("stride: 2, padding: 1"), 9, "stride: 99");
  file = ParseJobYaml(yaml, "r.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::Status status = WithFileLocation(*file, ValidateJobSpec(file->spec));
  EXPECT_NE(status.message().find("r.yaml:10:63: model.layers[2].layers[0].stride: must be "
                                  "between 0 and 64 (got 99)"),
            std::string::npos)
      << status;
  // A field of another kind.
  yaml = kResidualJob;
  yaml.replace(yaml.find("{type: relu}"), 12, "{type: relu, bias: false}");
  file = ParseJobYaml(yaml, "r.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  status = WithFileLocation(*file, ValidateJobSpec(file->spec));
  EXPECT_NE(status.message().find("r.yaml:11:30: model.layers[2].layers[1].bias: only for conv2d "
                                  "and linear (this layer is a relu)"),
            std::string::npos)
      << status;
}

TEST(JobFileTest, AbsurdNestingIsRefusedWhileParsing) {
  std::string yaml = "model: {type: cnn, layers: [";
  for (int i = 0; i < 40; ++i) yaml += "{type: residual, layers: [";
  yaml += "{type: relu}";
  for (int i = 0; i < 40; ++i) yaml += "]}";
  yaml += "]}\n";
  absl::StatusOr<JobFile> file = ParseJobYaml(yaml, "deep.yaml");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("nested more than 32 mappings deep"), std::string::npos)
      << file.status();
}

TEST(JobFileTest, ResnetPresetParses) {
  absl::StatusOr<JobFile> file = ParseJobYaml(
      "dataset: {train_images: a, train_labels: b, test_images: c, test_labels: d}\n"
      "model: {type: resnet, depth: 20, width: 16}\n",
      "p.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(ValidateJobSpec(file->spec).ok()) << ValidateJobSpec(file->spec);
  EXPECT_EQ(file->spec.model().depth(), 20);
  EXPECT_TRUE(file->spec.model().hidden().empty());  // the mlp default is for mlps only
  file = ParseJobYaml(
      "dataset: {train_images: a, train_labels: b, test_images: c, test_labels: d}\n"
      "model: {type: resnet, depth: 21}\n",
      "p.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  const absl::Status status = WithFileLocation(*file, ValidateJobSpec(file->spec));
  EXPECT_NE(status.message().find("p.yaml:2:30: model.depth: must be one of 18, 20, 32, 44, 56 "
                                  "or 110 (got 21)"),
            std::string::npos)
      << status;
}

TEST(JobFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadJobFile("/nonexistent/job.yaml").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobFileTest, DirectoriesAndEndlessFilesAreRefusedByName) {
  absl::StatusOr<JobFile> dir = ReadJobFile("/tmp");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dir.status().message(), "/tmp: is a directory, not a job file");
  // /dev/zero never ends: only the limit + 1 bytes are read (this used to read until the memory
  // ran out).
  absl::StatusOr<JobFile> zero = ReadJobFile("/dev/zero");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().message(), "/dev/zero: job file larger than 1 MiB");
}

TEST(JobFileTest, TextThatIsNotUtf8IsNamedWithItsLine) {
  // yaml-cpp passes the bytes through; validation names the field, and its line, before the
  // spec is serialised (which fails on it, with only a log line).
  absl::StatusOr<JobFile> file =
      ParseJobYaml("name: x\ndataset:\n  train_images: \"caf\xe9/train.gz\"\n", "latin1.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  const absl::Status status = WithFileLocation(*file, ValidateJobSpec(file->spec));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "latin1.yaml:3:17: dataset.train_images: not valid UTF-8 (byte 0xe9 at offset 3)");
}

TEST(JobFileTest, ClassesAreADatasetField) {
  absl::StatusOr<JobFile> file = ParseJobYaml("dataset:\n  classes: 10\n", "c.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->spec.dataset().classes(), 10);
  for (int bad : {1, 257, -3}) {
    v1::JobSpec spec = ParseJobYaml(kGoodJob, "good.yaml")->spec;
    spec.mutable_dataset()->set_classes(bad);
    EXPECT_EQ(ValidateJobSpec(spec).message(),
              absl::StrCat("dataset.classes: must be between 2 and 256 (got ", bad, ")"));
  }
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

TEST(JobFileTest, ImageSettingsParseAndAnEmptyRandomResizedCropTurnsItOn) {
  absl::StatusOr<JobFile> file = ParseJobYaml(
      "dataset:\n  format: image_folder\n  train_images: imgs/train\n  test_images: imgs/test\n"
      "  image:\n    channels: 3\n    size: 224\n    resize: 256\n    random_resized_crop: {}\n"
      "    horizontal_flip: true\n    mean: [0.485, 0.456, 0.406]\n    std: [0.229, 0.224, "
      "0.225]\n    decode: fast\n",
      "img.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  const v1::ImageSpec& image = file->spec.dataset().image();
  EXPECT_TRUE(image.has_random_resized_crop());
  EXPECT_EQ(image.decode(), "fast");
  EXPECT_TRUE(image.random_resized_crop().scale().empty());
  EXPECT_EQ(image.size(), 224);
  EXPECT_EQ(image.mean_size(), 3);
  EXPECT_EQ(file->spec.dataset().max_bad_samples(), 100);  // the default
  EXPECT_TRUE(ValidateJobSpec(file->spec).ok()) << ValidateJobSpec(file->spec);

  absl::StatusOr<JobFile> off = ParseJobYaml(
      "dataset:\n  format: image_folder\n  train_images: a\n  test_images: b\n  image:\n"
      "    size: 32\n",
      "off.yaml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->spec.dataset().image().has_random_resized_crop());
}

TEST(JobFileTest, BadImageSettingsNameTheirLine) {
  absl::StatusOr<JobFile> file = ParseJobYaml(
      "dataset:\n  format: image_folder\n  train_images: a\n  test_images: b\n  image:\n"
      "    size: 32\n    random_resized_crop:\n      scale: [0.5, 0.1]\n",
      "bad.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(WithFileLocation(*file, ValidateJobSpec(file->spec)).message(),
            "bad.yaml:8:14: dataset.image.random_resized_crop.scale: must satisfy 0 < min <= max "
            "<= 1 (got [0.5, 0.1])");
}

}  // namespace
}  // namespace stoker
