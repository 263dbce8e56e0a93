#include "common/checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "gtest/gtest.h"

namespace stoker {
namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("stoker-ckpt-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static Checkpoint Sample() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    Checkpoint checkpoint;
    for (auto [name, shape] :
         {std::pair{"layers.0.weight", std::vector<int64_t>{3, 5}},
          std::pair{"layers.0.bias", std::vector<int64_t>{3}},
          std::pair{"optimizer.layers.0.weight.momentum", std::vector<int64_t>{3, 5}}}) {
      CheckpointTensor tensor{name, shape, {}};
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      for (int64_t i = 0; i < n; ++i) tensor.values.push_back(normal(rng));
      checkpoint.tensors.push_back(tensor);
    }
    checkpoint.metadata = {{"step", "1234"}, {"epoch", "3"}};
    return checkpoint;
  }

  std::filesystem::path dir_;
};

TEST_F(CheckpointTest, RoundTripsTensorsInOrderAndMetadata) {
  const std::string path = (dir_ / "model.safetensors").string();
  const Checkpoint written = Sample();
  ASSERT_TRUE(WriteCheckpoint(path, written).ok());
  absl::StatusOr<Checkpoint> read = ReadCheckpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->tensors.size(), written.tensors.size());
  for (size_t i = 0; i < written.tensors.size(); ++i) {
    EXPECT_EQ(read->tensors[i].name, written.tensors[i].name);
    EXPECT_EQ(read->tensors[i].shape, written.tensors[i].shape);
    EXPECT_EQ(read->tensors[i].values, written.tensors[i].values);
  }
  EXPECT_EQ(read->metadata, written.metadata);
  absl::StatusOr<std::map<std::string, std::string>> metadata = ReadCheckpointMetadata(path);
  ASSERT_TRUE(metadata.ok());
  EXPECT_EQ(metadata->at("step"), "1234");
  // Nothing temporary is left beside it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 1);
}

TEST_F(CheckpointTest, LayoutFollowsTheSafetensorsSpec) {
  const std::string path = (dir_ / "m.safetensors").string();
  ASSERT_TRUE(WriteCheckpoint(path, Sample()).ok());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);
  const std::string header = bytes.substr(8, header_length);
  EXPECT_EQ(header.front(), '{');
  EXPECT_NE(header.find(
                "\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[3,5],\"data_offsets\":[0,60]}"),
            std::string::npos)
      << header;
  EXPECT_EQ(bytes.size(), 8 + header_length + (15 + 3 + 15) * 4);
}

TEST_F(CheckpointTest, CorruptFilesAreRefusedWithTheReason) {
  const std::string path = (dir_ / "c.safetensors").string();
  ASSERT_TRUE(WriteCheckpoint(path, Sample()).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  EXPECT_FALSE(ParseCheckpoint(good.substr(0, 5), "short").ok());
  absl::StatusOr<Checkpoint> truncated = ParseCheckpoint(good.substr(0, good.size() - 4), "cut");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("data_offsets"), std::string::npos)
      << truncated.status();
  std::string bad_json = good;
  bad_json[8] = '[';
  EXPECT_FALSE(ParseCheckpoint(bad_json, "json").ok());
  std::string huge = good;
  huge[7] = 0x7f;
  absl::StatusOr<Checkpoint> too_long = ParseCheckpoint(huge, "huge");
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("header length"), std::string::npos);
  std::string f16 = good;
  f16.replace(f16.find("F32"), 3, "F16");
  absl::StatusOr<Checkpoint> dtype = ParseCheckpoint(f16, "dtype");
  ASSERT_FALSE(dtype.ok());
  EXPECT_NE(dtype.status().message().find("not supported"), std::string::npos);
  EXPECT_EQ(ReadCheckpoint((dir_ / "none").string()).status().code(), absl::StatusCode::kNotFound);

  // The metadata alone is read from the header, but a file cut short is refused there too (the
  // server checks uploads with it).
  ASSERT_TRUE(ReadCheckpointMetadata(path).ok());
  const std::string cut = (dir_ / "cut.safetensors").string();
  std::ofstream(cut, std::ios::binary) << good.substr(0, good.size() - 4);
  absl::StatusOr<std::map<std::string, std::string>> metadata = ReadCheckpointMetadata(cut);
  ASSERT_FALSE(metadata.ok());
  EXPECT_EQ(metadata.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(metadata.status().message().find("data_offsets"), std::string::npos)
      << metadata.status();
}

}  // namespace
}  // namespace stoker
