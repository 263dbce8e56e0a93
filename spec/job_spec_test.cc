#include "spec/job_spec.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace stoker {
namespace {

v1::JobSpec ValidSpec() {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_dataset()->set_train_images("a/train-images");
  spec.mutable_dataset()->set_train_labels("a/train-labels");
  spec.mutable_dataset()->set_test_images("a/test-images");
  spec.mutable_dataset()->set_test_labels("a/test-labels");
  spec.mutable_model()->add_hidden(32);
  return spec;
}

TEST(JobSpecTest, DefaultsPlusPathsAreValid) { EXPECT_TRUE(ValidateJobSpec(ValidSpec()).ok()); }

TEST(JobSpecTest, EachBadFieldIsNamed) {
  struct Case {
    std::function<void(v1::JobSpec*)> mutate;
    std::string expected_prefix;
  };
  std::vector<Case> cases = {
      {[](v1::JobSpec* s) { s->mutable_train()->set_batch_size(-5); }, "train.batch_size:"},
      {[](v1::JobSpec* s) { s->mutable_train()->set_epochs(0); }, "train.epochs:"},
      {[](v1::JobSpec* s) { s->mutable_train()->mutable_optimizer()->set_lr(-1); },
       "train.optimizer.lr:"},
      {[](v1::JobSpec* s) { s->mutable_model()->set_hidden(0, 0); }, "model.hidden[0]:"},
      {[](v1::JobSpec* s) { s->mutable_model()->set_type("transformer"); }, "model.type:"},
      {[](v1::JobSpec* s) { s->set_name("bad name!"); }, "name:"},
      {[](v1::JobSpec* s) { s->mutable_dataset()->clear_test_labels(); }, "dataset.test_labels:"},
      {[](v1::JobSpec* s) { s->mutable_loader()->set_ring_slots(1); }, "loader.ring_slots:"},
      {[](v1::JobSpec* s) { s->mutable_train()->set_precision(static_cast<v1::Precision>(42)); },
       "train.precision:"},
      {[](v1::JobSpec* s) {
         s->mutable_model()->set_type("cnn");
         s->mutable_model()->clear_hidden();
       },
       "model.layers:"},
      {[](v1::JobSpec* s) {
         s->mutable_model()->set_type("cnn");
         s->mutable_model()->add_layers()->set_type("flatten");
       },
       "model.hidden:"},
      {[](v1::JobSpec* s) {
         s->mutable_model()->set_type("cnn");
         s->mutable_model()->clear_hidden();
         s->mutable_model()->add_layers()->set_type("conv3d");
       },
       "model.layers[0].type:"},
      {[](v1::JobSpec* s) {
         s->mutable_model()->set_type("cnn");
         s->mutable_model()->clear_hidden();
         v1::LayerSpec* conv = s->mutable_model()->add_layers();
         conv->set_type("conv2d");
         conv->set_kernel(3);
       },
       "model.layers[0].out_channels:"},
      {[](v1::JobSpec* s) { s->mutable_train()->mutable_optimizer()->set_type("lion"); },
       "train.optimizer.type:"},
      {[](v1::JobSpec* s) { s->mutable_train()->mutable_optimizer()->set_beta2(1.5); },
       "train.optimizer.beta2:"},
      {[](v1::JobSpec* s) { s->mutable_resources()->set_replicas(-1); }, "resources.replicas:"},
      {[](v1::JobSpec* s) { s->mutable_resources()->set_replicas(257); }, "resources.replicas:"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = ValidSpec();
    c.mutate(&spec);
    absl::Status status = ValidateJobSpec(spec);
    ASSERT_FALSE(status.ok()) << c.expected_prefix;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message().substr(0, c.expected_prefix.size()), c.expected_prefix) << status;
  }
}

TEST(JobSpecTest, ReplicasTakeOneGpuEachAtMost) {
  v1::JobSpec spec = ValidSpec();
  for (int replicas : {0, 1, 2, 256}) {
    spec.mutable_resources()->set_replicas(replicas);
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << replicas;
  }
  spec.mutable_resources()->set_replicas(257);
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "resources.replicas: must be between 0 and 256 (got 257)");
  // Ranks of one GPU each; a rank of several GPUs is refused, saying what to ask for.
  spec.mutable_resources()->set_gpus(1);
  spec.mutable_resources()->set_replicas(1);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.mutable_resources()->set_replicas(2);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.mutable_resources()->set_gpus(2);
  const absl::Status gpus = ValidateJobSpec(spec);
  EXPECT_EQ(gpus.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpus.message(),
            "resources.gpus: 2 with replicas 2: each data-parallel rank trains on one GPU; ask "
            "for gpus: 1 and replicas: 4 instead");
  spec.mutable_resources()->set_replicas(1);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

// A cnn whose layer 1 is a residual block; `mutate` changes it before validation.
absl::Status ValidateWithBlock(const std::function<void(v1::LayerSpec*)>& mutate) {
  v1::JobSpec spec = ValidSpec();
  v1::ModelSpec* model = spec.mutable_model();
  model->set_type("cnn");
  model->clear_hidden();
  v1::LayerSpec* conv = model->add_layers();
  conv->set_type("conv2d");
  conv->set_out_channels(8);
  conv->set_kernel(3);
  v1::LayerSpec* block = model->add_layers();
  block->set_type("residual");
  v1::LayerSpec* inner = block->add_layers();
  inner->set_type("conv2d");
  inner->set_out_channels(8);
  inner->set_kernel(3);
  inner->set_padding(1);
  inner->set_bias(false);
  block->add_layers()->set_type("batchnorm2d");
  model->add_layers()->set_type("flatten");
  model->add_layers()->set_type("linear");
  model->mutable_layers(3)->set_units(10);
  mutate(block);
  return ValidateJobSpec(spec);
}

TEST(JobSpecTest, NestedLayersAreValidatedByTheirPath) {
  EXPECT_TRUE(ValidateWithBlock([](v1::LayerSpec*) {}).ok()) << ValidateWithBlock([](auto*) {});
  struct Case {
    std::function<void(v1::LayerSpec*)> mutate;
    std::string expected;
  };
  std::vector<Case> cases = {
      {[](v1::LayerSpec* b) { b->mutable_layers(0)->set_out_channels(0); },
       "model.layers[1].layers[0].out_channels: must be between 1 and 4096 (got 0)"},
      {[](v1::LayerSpec* b) {
         v1::LayerSpec* s = b->add_shortcut();
         s->set_type("conv2d");
         s->set_out_channels(8);
         s->set_kernel(65);
       },
       "model.layers[1].shortcut[0].kernel: must be between 1 and 64 (got 65)"},
      {[](v1::LayerSpec* b) { b->mutable_layers(1)->set_type("batchnorm3d"); },
       "model.layers[1].layers[1].type: unsupported value 'batchnorm3d'"},
      {[](v1::LayerSpec* b) { b->mutable_layers(1)->set_bias(false); },
       "model.layers[1].layers[1].bias: only for conv2d and linear (this layer is a batchnorm2d)"},
      {[](v1::LayerSpec* b) { b->mutable_layers(0)->set_momentum(0.5); },
       "model.layers[1].layers[0].momentum: only for batchnorm2d and batchnorm1d"},
      {[](v1::LayerSpec* b) { b->mutable_layers(1)->set_momentum(1.5); },
       "model.layers[1].layers[1].momentum: must be in [0, 1] (got 1.5)"},
      {[](v1::LayerSpec* b) { b->mutable_layers(1)->set_eps(0); },
       "model.layers[1].layers[1].eps: must be in (0, 1] (got 0)"},
      {[](v1::LayerSpec* b) { b->set_activation("tanh"); },
       "model.layers[1].activation: unsupported value 'tanh' (supported: relu, gelu, none)"},
      {[](v1::LayerSpec* b) { b->clear_layers(); },
       "model.layers[1].layers: a residual block needs its main branch"},
      {[](v1::LayerSpec* b) { b->mutable_layers(1)->set_activation("relu"); },
       "model.layers[1].layers[1].activation: only for residual"},
      {[](v1::LayerSpec* b) { b->mutable_layers(1)->add_layers()->set_type("relu"); },
       "model.layers[1].layers[1].layers: only for residual"},
      {[](v1::LayerSpec* b) {
         for (int i = 0; i < 65; ++i) b->add_shortcut()->set_type("relu");
       },
       "model.layers[1].shortcut: at most 64 layers (got 65)"},
      {[](v1::LayerSpec* b) {
         // Residual blocks 5 deep: model.layers[1] is depth 1.
         v1::LayerSpec* at = b;
         for (int d = 0; d < 4; ++d) {
           v1::LayerSpec* inner = at->add_layers();
           inner->set_type("residual");
           inner->add_layers()->set_type("relu");
           at = inner;
         }
       },
       "model.layers[1].layers[2].layers[1].layers[1].layers[1]: residual blocks nest at most 4 "
       "deep (this one is at depth 5)"},
      {[](v1::LayerSpec* b) {
         // 8 blocks of 64: more than 512 layers in all although no list holds more than 64.
         for (int k = 0; k < 8; ++k) {
           v1::LayerSpec* inner = b->add_shortcut();
           inner->set_type("residual");
           for (int i = 0; i < 64; ++i) inner->add_layers()->set_type("relu");
         }
       },
       "model.layers[1].shortcut[7].layers[52]: more than 512 layers in all, counting those inside "
       "residual blocks"},
  };
  for (const Case& c : cases) {
    const absl::Status status = ValidateWithBlock(c.mutate);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_EQ(status.message().substr(0, c.expected.size()), c.expected) << status;
  }
}

TEST(JobSpecTest, ResnetTakesDepthAndWidthOnly) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->clear_hidden();
  spec.mutable_model()->set_type("resnet");
  spec.mutable_model()->set_depth(20);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.mutable_model()->set_width(32);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.mutable_train()->set_label_smoothing(0.1);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  struct Case {
    std::function<void(v1::JobSpec*)> mutate;
    std::string expected;
  };
  std::vector<Case> cases = {
      {[](v1::JobSpec* s) { s->mutable_model()->set_depth(19); },
       "model.depth: must be one of 18, 20, 32, 44, 56 or 110 (got 19)"},
      {[](v1::JobSpec* s) { s->mutable_model()->clear_depth(); },
       "model.depth: must be one of 18, 20, 32, 44, 56 or 110 (got 0)"},
      {[](v1::JobSpec* s) { s->mutable_model()->set_width(600); },
       "model.width: must be between 0 and 512 (got 600)"},
      {[](v1::JobSpec* s) { s->mutable_model()->add_layers()->set_type("relu"); },
       "model.layers: only for type cnn (a resnet takes model.depth and model.width)"},
      {[](v1::JobSpec* s) { s->mutable_model()->add_hidden(8); },
       "model.hidden: only for type mlp (a resnet takes model.depth and model.width)"},
      {[](v1::JobSpec* s) { s->mutable_train()->set_label_smoothing(1); },
       "train.label_smoothing: must be in [0, 1) (got 1)"},
      {[](v1::JobSpec* s) {
         s->mutable_model()->set_type("cnn");
         s->mutable_model()->add_layers()->set_type("flatten");
       },
       "model.depth: only for type resnet"},
  };
  for (const Case& c : cases) {
    v1::JobSpec bad = spec;
    c.mutate(&bad);
    const absl::Status status = ValidateJobSpec(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_EQ(status.message().substr(0, c.expected.size()), c.expected) << status;
  }
  // Label smoothing is an option of every model's loss (an mlp's trains on the network path).
  v1::JobSpec mlp = ValidSpec();
  mlp.mutable_train()->set_label_smoothing(0.1);
  EXPECT_TRUE(ValidateJobSpec(mlp).ok()) << ValidateJobSpec(mlp);
}

class DataRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::filesystem::temp_directory_path() / ("stoker-root-" + std::to_string(getpid()));
    std::filesystem::create_directories(base_ / "root" / "sub");
    std::ofstream(base_ / "root" / "sub" / "data.bin") << "x";
    std::ofstream(base_ / "secret") << "s";
    std::filesystem::create_symlink(base_ / "secret", base_ / "root" / "escape");
    root_ = (base_ / "root").string();
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  std::filesystem::path base_;
  std::string root_;
};

TEST_F(DataRootTest, ResolvesFilesInside) {
  absl::StatusOr<std::string> path = ResolveUnderDataRoot(root_, "sub/data.bin", "f");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, std::filesystem::canonical(base_ / "root/sub/data.bin").string());
  // An absolute path inside the root is fine too.
  EXPECT_TRUE(ResolveUnderDataRoot(root_, *path, "f").ok());
}

TEST_F(DataRootTest, RefusesEscapes) {
  for (const std::string& bad :
       {std::string("../secret"), std::string("sub/../../secret"), (base_ / "secret").string(),
        std::string("/etc/passwd"), std::string("escape")}) {
    absl::StatusOr<std::string> path = ResolveUnderDataRoot(root_, bad, "dataset.train_images");
    ASSERT_FALSE(path.ok()) << bad;
    EXPECT_EQ(path.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(path.status().message().find("dataset.train_images"), std::string::npos);
    // The path as written, never the server's data root or where a symlink leads.
    EXPECT_NE(path.status().message().find("'" + bad + "'"), std::string::npos) << path.status();
    if (bad[0] != '/') {
      EXPECT_EQ(path.status().message().find(base_.string()), std::string::npos) << path.status();
    }
  }
  EXPECT_EQ(ResolveUnderDataRoot(root_, "escape", "dataset.train_images").status().message(),
            "dataset.train_images: path 'escape' leads out of the data root through a symlink "
            "(symlinks may not leave it)");
  absl::StatusOr<std::string> missing = ResolveUnderDataRoot(root_, "sub/none.bin", "f");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "f: file 'sub/none.bin' not found under the data root");
  EXPECT_FALSE(ResolveUnderDataRoot(root_, "sub", "f").ok());  // a directory
  absl::StatusOr<std::string> no_root = ResolveUnderDataRoot(root_ + "/none", "sub/data.bin", "f");
  ASSERT_FALSE(no_root.ok());
  EXPECT_EQ(no_root.status().message().find(root_), std::string::npos) << no_root.status();
}

TEST_F(DataRootTest, ErrorsAboutResolvedFilesNameThePathsAsWritten) {
  std::filesystem::create_symlink("sub/data.bin", base_ / "root" / "link.bin");
  std::ofstream(base_ / "root" / "sub" / "other.bin") << "y";
  v1::JobSpec written = DefaultJobSpec();
  written.mutable_dataset()->set_train_images("link.bin");
  written.mutable_dataset()->set_train_labels("sub/other.bin");
  written.mutable_dataset()->set_test_images("sub/other.bin");
  written.mutable_dataset()->set_test_labels("sub/other.bin");
  v1::JobSpec resolved = written;
  ASSERT_TRUE(ResolveDatasetPaths(root_, &resolved).ok());
  const std::string real = resolved.dataset().train_images();
  EXPECT_EQ(real, std::filesystem::canonical(base_ / "root/sub/data.bin").string());
  // The file as the job named it: not its absolute path, nor the symlink's target.
  EXPECT_EQ(DatasetPathsAsWritten(real + ": truncated at offset 16", written, resolved),
            "link.bin: truncated at offset 16");
}

// Kept in the Utf8Test suite (it moved here from common/utf8_test.cc with job_spec).
TEST(Utf8Test, ValidateJobSpecNamesTheFieldBeforeAnythingIsSerialised) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_dataset()->set_train_images("fashion-mnist/\xfftrain.gz");
  const absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "dataset.train_images: not valid UTF-8 (byte 0xff at offset 14)");

  spec = DefaultJobSpec();
  spec.mutable_model()->set_type("cnn");
  spec.mutable_model()->add_layers()->set_type("flatten");
  spec.mutable_model()->add_layers()->set_type("line\xe9r");
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "model.layers[1].type: not valid UTF-8 (byte 0xe9 at offset 4)");
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

v1::JobSpec ImageSpecJob(const std::string& format) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_dataset()->set_format(format);
  spec.mutable_dataset()->set_train_images(format == "shards" ? "s/train-{0..3}.tar" : "f/train");
  spec.mutable_dataset()->set_test_images(format == "shards" ? "s/test-0.tar" : "f/test");
  spec.mutable_dataset()->mutable_image()->set_size(32);
  spec.mutable_model()->add_hidden(32);
  return spec;
}

TEST(JobSpecTest, ImageDatasetsValidate) {
  for (const std::string format : {"image_folder", "shards"}) {
    EXPECT_TRUE(ValidateJobSpec(ImageSpecJob(format)).ok())
        << ValidateJobSpec(ImageSpecJob(format));
    for (const std::string decode : {"exact", "fast"}) {
      v1::JobSpec spec = ImageSpecJob(format);
      spec.mutable_dataset()->mutable_image()->set_decode(decode);
      EXPECT_TRUE(ValidateJobSpec(spec).ok()) << decode << ": " << ValidateJobSpec(spec);
    }
  }
  struct Case {
    std::function<void(v1::JobSpec*)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::JobSpec* s) { s->mutable_dataset()->set_train_labels("x"); },
       "dataset.train_labels: must be empty for image_folder (the class is the image's "
       "directory)"},
      {[](v1::JobSpec* s) { s->mutable_dataset()->set_train_images("f/{a,b}"); },
       "dataset.train_images: brace patterns are for format shards; an image_folder is one "
       "directory"},
      {[](v1::JobSpec* s) { s->mutable_dataset()->mutable_image()->set_channels(2); },
       "dataset.image.channels: must be 1, 3 or 0 for the first image's (got 2)"},
      {[](v1::JobSpec* s) { s->mutable_dataset()->mutable_image()->set_decode("quick"); },
       "dataset.image.decode: unsupported value 'quick' (supported: exact, fast)"},
      {[](v1::JobSpec* s) {
         s->mutable_dataset()->mutable_image()->set_size(0);
         s->mutable_dataset()->mutable_image()->mutable_random_resized_crop();
       },
       "dataset.image.random_resized_crop: needs dataset.image.size (the side of the samples)"},
      {[](v1::JobSpec* s) { s->mutable_dataset()->mutable_image()->set_resize(16); },
       "dataset.image.resize: must be at least dataset.image.size (32; got 16)"},
      {[](v1::JobSpec* s) {
         s->mutable_dataset()->mutable_image()->mutable_random_resized_crop()->add_ratio(1);
       },
       "dataset.image.random_resized_crop.ratio: needs two values [min, max] (got 1)"},
      {[](v1::JobSpec* s) {
         s->mutable_dataset()->mutable_image()->add_std(0.2);
         s->mutable_dataset()->mutable_image()->add_std(0);
       },
       "dataset.image.std: needs 1 value, or one per channel (got 2)"},
      {[](v1::JobSpec* s) { s->mutable_dataset()->mutable_image()->add_std(0); },
       "dataset.image.std[0]: must be in (1e-6, 1e6] (got 0)"},
      {[](v1::JobSpec* s) { s->mutable_dataset()->set_max_bad_samples(-1); },
       "dataset.max_bad_samples: must be between 0 and 2147483647 (got -1)"},
      {[](v1::JobSpec* s) { s->mutable_dataset()->set_shuffle_buffer(0); },
       "dataset.shuffle_buffer: must be between 1 and 10000000 (got 0)"},
      {[](v1::JobSpec* s) { s->mutable_dataset()->set_decoded_cache("yes"); },
       "dataset.decoded_cache: unsupported value 'yes' (supported: auto, off)"},
      {[](v1::JobSpec* s) { s->mutable_loader()->mutable_augment()->set_horizontal_flip(true); },
       "loader.augment: is for decoded datasets (idx, npy, csv); images take dataset.image "
       "(random_resized_crop, horizontal_flip)"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = ImageSpecJob("image_folder");
    c.mutate(&spec);
    EXPECT_EQ(ValidateJobSpec(spec).message(), c.message);
  }
  v1::JobSpec idx = ValidSpec();
  idx.mutable_dataset()->mutable_image()->set_size(8);
  EXPECT_EQ(ValidateJobSpec(idx).message(),
            "dataset.image: only for format image_folder or shards (the format is idx)");
  v1::JobSpec idx_cache = ValidSpec();
  idx_cache.mutable_dataset()->set_decoded_cache("off");
  EXPECT_EQ(ValidateJobSpec(idx_cache).message(),
            "dataset.decoded_cache: only for format image_folder or shards (the format is idx)");
  idx_cache.mutable_dataset()->set_decoded_cache("auto");
  EXPECT_TRUE(ValidateJobSpec(idx_cache).ok());
  v1::JobSpec off = ImageSpecJob("shards");
  off.mutable_dataset()->set_decoded_cache("off");
  EXPECT_TRUE(ValidateJobSpec(off).ok()) << ValidateJobSpec(off);
}

TEST(JobSpecTest, ShardPatternsResolveTheirDirectoryOnly) {
  const std::string root =
      std::filesystem::temp_directory_path() / ("stoker_shards_" + std::to_string(getpid()));
  std::filesystem::create_directories(root + "/s/imgs/cat");
  v1::JobSpec spec = ImageSpecJob("shards");
  ASSERT_TRUE(ResolveDatasetPaths(root, &spec).ok());
  const std::string real_root = std::filesystem::canonical(root);
  EXPECT_EQ(spec.dataset().train_images(), real_root + "/s/train-{0..3}.tar");
  EXPECT_EQ(
      DatasetPathsAsWritten(real_root + "/s/train-2.tar: not found", ImageSpecJob("shards"), spec),
      "s/train-2.tar: not found");
  v1::JobSpec braces_in_dir = ImageSpecJob("shards");
  braces_in_dir.mutable_dataset()->set_train_images("{a,b}/t.tar");
  EXPECT_EQ(ResolveDatasetPaths(root, &braces_in_dir).message(),
            "dataset.train_images: brace patterns may only name files, not directories (got "
            "'{a,b}/t.tar')");
  v1::JobSpec folder = ImageSpecJob("image_folder");
  folder.mutable_dataset()->set_train_images("s/imgs");
  folder.mutable_dataset()->set_test_images("s/imgs");
  ASSERT_TRUE(ResolveDatasetPaths(root, &folder).ok());
  EXPECT_EQ(folder.dataset().train_images(), real_root + "/s/imgs");
  folder.mutable_dataset()->set_train_images("s/none");
  EXPECT_EQ(ResolveDatasetPaths(root, &folder).message(),
            "dataset.train_images: directory 's/none' not found under the data root");
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace stoker
