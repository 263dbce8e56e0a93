#include "client/tensorboard.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

std::string RunShell(const std::string& command, int* exit_code) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  size_t n;
  while (pipe != nullptr && (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    output.append(buffer, n);
  }
  const int status = pipe == nullptr ? -1 : pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return output;
}

v1::MetricPoint Point(int64_t step, int epoch, double loss, double accuracy) {
  v1::MetricPoint p;
  p.set_step(step);
  p.set_epoch(epoch);
  p.set_attempt(1);
  p.set_time_unix_ms(1796447551000 + step);
  p.set_train_loss(loss);
  p.set_test_loss(accuracy < 0 ? -1 : loss * 1.5);
  p.set_test_accuracy(accuracy);
  p.set_samples_per_second(1000 + step);
  p.set_data_stall_ratio(0.25);
  return p;
}

TEST(TensorBoardTest, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // CRC-32C's published check value
  EXPECT_EQ(Crc32c(""), 0u);
}

// The written file, read back by tests/tfevents_reader.py (its own CRC-32C and protobuf decoding):
// every record's CRCs hold, and the steps, tags and values are the history's.
TEST(TensorBoardTest, AnIndependentReaderGetsTheHistoryBack) {
  const std::string dir = std::filesystem::temp_directory_path() / "stoker-tb-test";
  std::filesystem::remove_all(dir);
  const std::vector<v1::MetricPoint> epochs = {Point(100, 1, 0.5, 0.81),
                                               Point(200, 2, 0.25, 0.875)};
  const std::vector<v1::MetricPoint> steps = {Point(10, 1, 2.0, -1), Point(60, 1, 1.0, -1)};
  absl::StatusOr<std::string> path = WriteTensorBoardEvents(dir, "j-000001", epochs, steps);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_TRUE(absl::StrContains(*path, "/events.out.tfevents.")) << *path;
  int exit_code = 0;
  const std::string reader = STOKER_SOURCE_DIR "/tests/tfevents_reader.py";
  const std::string out = RunShell("python3 " + reader + " " + *path, &exit_code);
  ASSERT_EQ(exit_code, 0) << out;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u) << out;
  EXPECT_TRUE(absl::StrContains(lines[0], "\"file_version\": \"brain.Event:2\"")) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[1], "\"step\": 10")) << lines[1];
  EXPECT_TRUE(absl::StrContains(lines[1], "\"train/loss\": 2.0")) << lines[1];
  EXPECT_FALSE(absl::StrContains(lines[1], "test")) << "not measured at steps: " << lines[1];
  EXPECT_TRUE(absl::StrContains(lines[2], "\"train/loss\": 1.0")) << lines[2];
  EXPECT_TRUE(absl::StrContains(lines[3], "\"step\": 100")) << lines[3];
  // float32 of 0.81 as Python prints it.
  EXPECT_TRUE(absl::StrContains(lines[3], "\"epoch/test_accuracy\": 0.8100000023841858"))
      << lines[3];
  EXPECT_TRUE(absl::StrContains(lines[4], "\"epoch/test_accuracy\": 0.875")) << lines[4];
  EXPECT_TRUE(absl::StrContains(lines[4], "\"epoch/test_loss\": 0.375")) << lines[4];
  EXPECT_TRUE(absl::StrContains(lines[4], "\"wall_time\": 1796447551.2")) << lines[4];
  EXPECT_TRUE(absl::StrContains(lines[4], "\"epoch/data_stall_ratio\": 0.25")) << lines[4];

  // A flipped byte is caught by the reader's CRC check.
  std::string bytes;
  {
    std::ifstream in(*path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bytes[bytes.size() - 10] ^= 0x40;
  std::ofstream(*path, std::ios::binary | std::ios::trunc) << bytes;
  const std::string bad = RunShell("python3 " + reader + " " + *path, &exit_code);
  EXPECT_EQ(exit_code, 1) << bad;
  EXPECT_TRUE(absl::StrContains(bad, "bad data CRC")) << bad;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stoker
