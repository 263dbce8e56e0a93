// CheckpointStore on a temporary directory: the layout, an upload's way into place, and the
// errors of a failed write.
#include "server/checkpoint_store.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::filesystem::temp_directory_path() /
            absl::StrCat("stoker_checkpoint_store_test_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(base_);
    std::filesystem::create_directories(base_);
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  std::filesystem::path base_;
};

TEST_F(CheckpointStoreTest, AnUploadIsCheckedSyncedAndRenamedIntoPlace) {
  const CheckpointStore store((base_ / "checkpoints").string());
  EXPECT_EQ(store.PathOf("job-1"), store.dir() + "/job-1.safetensors");
  EXPECT_GE(store.FreeBytes(), 0);  // read from the parent before the directory exists

  absl::StatusOr<std::string> upload = store.NewUploadPath("job-1", 2);
  ASSERT_TRUE(upload.ok()) << upload.status();
  EXPECT_TRUE(std::filesystem::is_directory(store.dir()));
  EXPECT_TRUE(absl::StartsWith(*upload, store.dir() + "/job-1.upload-a2-")) << *upload;

  Checkpoint checkpoint{{{"w", {2}, {1.0f, 2.0f}}}, {{"step", "7"}}};
  ASSERT_TRUE(WriteCheckpoint(*upload, checkpoint).ok());
  EXPECT_TRUE(store.CheckUpload(*upload, 7).ok());
  EXPECT_EQ(store.SyncUpload(*upload), 0);
  ASSERT_TRUE(store.Store("job-1", *upload).ok());
  EXPECT_FALSE(std::filesystem::exists(*upload));
  absl::StatusOr<Checkpoint> stored = ReadCheckpoint(store.PathOf("job-1"));
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->metadata.at("step"), "7");
}

// A server killed while an upload arrived left its partial file; the next start removes it and
// nothing else.
TEST_F(CheckpointStoreTest, AStartingServerRemovesUnfinishedUploadsOnly) {
  const CheckpointStore store(base_.string());
  absl::StatusOr<std::string> partial = store.NewUploadPath("j-000004", 3);
  ASSERT_TRUE(partial.ok()) << partial.status();
  std::ofstream(*partial) << std::string(1000, 'x');
  ASSERT_TRUE(WriteCheckpoint(store.PathOf("j-000004"), {{{"w", {1}, {1.0f}}}, {}}).ok());
  std::ofstream(base_ / "notes.txt") << "the user's";

  const CheckpointStore::Removed removed = store.RemoveUnfinishedUploads();
  EXPECT_EQ(removed.files, 1);
  EXPECT_EQ(removed.bytes, 1000u);
  EXPECT_FALSE(std::filesystem::exists(*partial));
  EXPECT_TRUE(ReadCheckpoint(store.PathOf("j-000004")).ok()) << "the stored checkpoint stays";
  EXPECT_TRUE(std::filesystem::exists(base_ / "notes.txt"));
  EXPECT_EQ(store.RemoveUnfinishedUploads().files, 0);
  EXPECT_EQ(CheckpointStore((base_ / "none").string()).RemoveUnfinishedUploads().files, 0)
      << "no directory yet";
}

TEST_F(CheckpointStoreTest, ABadUploadIsRefusedAndRemoved) {
  const CheckpointStore store(base_.string());
  const std::string garbage = (base_ / "garbage.upload").string();
  std::ofstream(garbage) << "not a checkpoint";
  absl::Status status = store.CheckUpload(garbage, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(), "checkpoint upload: ")) << status;
  EXPECT_FALSE(std::filesystem::exists(garbage));

  const std::string other_step = (base_ / "other.upload").string();
  ASSERT_TRUE(WriteCheckpoint(other_step, {{{"w", {1}, {1.0f}}}, {{"step", "3"}}}).ok());
  status = store.CheckUpload(other_step, 4);
  EXPECT_EQ(status.message(), "checkpoint upload: its metadata step does not match 4");
  EXPECT_FALSE(std::filesystem::exists(other_step));

  EXPECT_NE(store.SyncUpload((base_ / "missing").string()), 0);
  status = store.Store("job", (base_ / "missing").string());
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StartsWith(status.message(), "storing checkpoint: ")) << status;
  store.Discard((base_ / "missing").string());  // no error for a missing file
}

TEST_F(CheckpointStoreTest, AnUploadFileRemembersItsFirstFailure) {
  CheckpointUploadFile good((base_ / "good").string());
  EXPECT_TRUE(good.Append("abc"));
  EXPECT_TRUE(good.Close());
  EXPECT_EQ(good.error_number(), 0);
  EXPECT_EQ(std::filesystem::file_size(base_ / "good"), 3u);

  CheckpointUploadFile bad((base_ / "no-such-dir" / "file").string());
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(bad.Append("abc"));
  EXPECT_FALSE(bad.Close());
  EXPECT_EQ(bad.error_number(), ENOENT);

  if (std::filesystem::exists("/dev/full")) {
    CheckpointUploadFile full("/dev/full");
    full.Append(std::string(1 << 16, 'x'));
    EXPECT_FALSE(full.Close());
    EXPECT_EQ(full.error_number(), ENOSPC);
  }
}

}  // namespace
}  // namespace stoker
