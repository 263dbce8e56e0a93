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
