#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/dataset.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using namespace ::stoker::testing;  // NOLINT: the test helpers
using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<uint8_t> Iota(size_t n, uint8_t start = 0) {
  std::vector<uint8_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Bytes that deflate cannot shrink much, so a cut gzip file really lacks data.
std::vector<uint8_t> Noise(size_t n) {
  std::vector<uint8_t> v(n);
  uint32_t x = 12345;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

TEST(IdxReaderTest, ReadsRawFile) {
  TempDir dir;
  const std::string path = dir.File("images-idx3-ubyte");
  WriteRaw(path, IdxBytes({3, 2, 2}, Iota(12)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int>{3, 2, 2}));
  EXPECT_EQ(array->data, Iota(12));
}

TEST(IdxReaderTest, ReadsGzippedFile) {
  TempDir dir;
  const std::string path = dir.File("labels-idx1-ubyte.gz");
  const std::vector<uint8_t> data = Noise(100000);
  WriteGzip(path, IdxBytes({100000}, data));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int>{100000}));
  EXPECT_EQ(array->data, data);
}

TEST(IdxReaderTest, ReadsConcatenatedGzipMembers) {
  TempDir dir;
  const std::vector<uint8_t> whole = IdxBytes({4, 5}, Iota(20));
  WriteGzip(dir.File("a.gz"), std::vector<uint8_t>(whole.begin(), whole.begin() + 11));
  WriteGzip(dir.File("b.gz"), std::vector<uint8_t>(whole.begin() + 11, whole.end()));
  std::vector<uint8_t> joined = testing::ReadRaw(dir.File("a.gz"));
  const std::vector<uint8_t> second = testing::ReadRaw(dir.File("b.gz"));
  joined.insert(joined.end(), second.begin(), second.end());
  WriteRaw(dir.File("joined.gz"), joined);
  absl::StatusOr<IdxArray> array = ReadIdxFile(dir.File("joined.gz"));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->data, Iota(20));
}

TEST(IdxReaderTest, RejectsWrongMagic) {
  TempDir dir;
  const std::string path = dir.File("not-idx");
  std::vector<uint8_t> bytes = IdxBytes({2}, {1, 2});
  bytes[0] = 0x12;
  bytes[1] = 0x34;
  WriteRaw(path, bytes);
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_FALSE(array.ok());
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("bad IDX magic 0x12340801 at offset 0")));
}

TEST(IdxReaderTest, RejectsNonByteElementType) {
  TempDir dir;
  const std::string path = dir.File("floats-idx1");
  std::vector<uint8_t> bytes = IdxBytes({1}, {0, 0, 0, 0});
  bytes[2] = 0x0D;  // float
  WriteRaw(path, bytes);
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_FALSE(array.ok());
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("element type 0x0d at offset 2")));
}

TEST(IdxReaderTest, RejectsTruncatedRawData) {
  TempDir dir;
  const std::string path = dir.File("short-idx3-ubyte");
  WriteRaw(path, IdxBytes({3, 2, 2}, Iota(10)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_FALSE(array.ok());
  EXPECT_TRUE(absl::IsDataLoss(array.status())) << array.status();
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path),
                    HasSubstr("truncated: expected 12 data bytes after offset 16, got 10")));
}

TEST(IdxReaderTest, RejectsTruncatedHeader) {
  TempDir dir;
  const std::string path = dir.File("header-only");
  std::vector<uint8_t> bytes = IdxBytes({3, 2, 2}, {});
  bytes.resize(9);
  WriteRaw(path, bytes);
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_FALSE(array.ok());
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("expected 16 header bytes"), HasSubstr("got 9")));
}

TEST(IdxReaderTest, RejectsTrailingData) {
  TempDir dir;
  const std::string path = dir.File("long-idx1-ubyte");
  WriteRaw(path, IdxBytes({4}, Iota(6)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_FALSE(array.ok());
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("expected 4 data bytes after offset 8, got 6")));
}

TEST(IdxReaderTest, RejectsTruncatedGzip) {
  TempDir dir;
  const std::string whole = dir.File("whole.gz");
  WriteGzip(whole, IdxBytes({50000}, Noise(50000)));
  std::vector<uint8_t> bytes = testing::ReadRaw(whole);
  ASSERT_GT(bytes.size(), 40000u);
  bytes.resize(bytes.size() / 2);
  const std::string path = dir.File("cut-idx1-ubyte.gz");
  WriteRaw(path, bytes);
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_FALSE(array.ok());
  EXPECT_TRUE(absl::IsDataLoss(array.status())) << array.status();
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("gzip: unexpected end of file"),
                    HasSubstr(absl::StrCat("offset ", bytes.size()))));
}

TEST(IdxReaderTest, RejectsCorruptGzip) {
  TempDir dir;
  const std::string path = dir.File("corrupt.gz");
  WriteGzip(path, IdxBytes({50000}, Noise(50000)));
  std::vector<uint8_t> bytes = testing::ReadRaw(path);
  // Past the 10-byte gzip header, a stored or dynamic block's bits become nonsense or the CRC
  // check fails; either way the data must be refused.
  for (size_t i = 10; i < bytes.size() - 8; i += 97) bytes[i] ^= 0x5a;
  WriteRaw(path, bytes);
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_FALSE(array.ok());
  EXPECT_THAT(array.status().message(), AllOf(HasSubstr(path), HasSubstr("gzip: corrupt data")));
}

TEST(IdxReaderTest, MissingFileNamesIt) {
  TempDir dir;
  const std::string path = dir.File("absent.gz");
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_FALSE(array.ok());
  EXPECT_TRUE(absl::IsNotFound(array.status())) << array.status();
  EXPECT_THAT(array.status().message(), HasSubstr(path));
}

TEST(LoadIdxDatasetTest, LoadsAndLimits) {
  TempDir dir;
  WriteGzip(dir.File("images.gz"), IdxBytes({5, 2, 3}, Iota(30)));
  WriteRaw(dir.File("labels"), IdxBytes({5}, {3, 1, 4, 1, 5}));
  absl::StatusOr<LabeledSamples> all = LoadIdxDataset(dir.File("images.gz"), dir.File("labels"), 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->count, 5);
  EXPECT_EQ(all->sample_bytes, 6);
  EXPECT_EQ(all->sample_dims, (std::vector<int>{2, 3}));
  EXPECT_EQ(all->classes, 6);
  EXPECT_EQ(all->samples, Iota(30));

  absl::StatusOr<LabeledSamples> some =
      LoadIdxDataset(dir.File("images.gz"), dir.File("labels"), 2);
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(some->count, 2);
  EXPECT_EQ(some->samples, Iota(12));
  EXPECT_EQ(some->labels, (std::vector<uint8_t>{3, 1}));
  EXPECT_EQ(some->classes, 4);
}

TEST(LoadIdxDatasetTest, RejectsCountMismatch) {
  TempDir dir;
  WriteRaw(dir.File("images"), IdxBytes({5, 2}, Iota(10)));
  WriteRaw(dir.File("labels"), IdxBytes({4}, {0, 1, 2, 3}));
  absl::StatusOr<LabeledSamples> data = LoadIdxDataset(dir.File("images"), dir.File("labels"), 0);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), AllOf(HasSubstr(dir.File("images")), HasSubstr("5 images"),
                                             HasSubstr(dir.File("labels")), HasSubstr("4 labels")));
}

TEST(LoadIdxDatasetTest, RejectsLabelsWithTwoDimensions) {
  TempDir dir;
  WriteRaw(dir.File("images"), IdxBytes({2, 2}, Iota(4)));
  WriteRaw(dir.File("labels"), IdxBytes({2, 1}, {0, 1}));
  absl::StatusOr<LabeledSamples> data = LoadIdxDataset(dir.File("images"), dir.File("labels"), 0);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr(dir.File("labels")));
}

TEST(LoadIdxDatasetTest, ReadsFashionMnist) {
  const std::string root = STOKER_FASHION_MNIST_DIR;
  const std::string images = root + "/train-images-idx3-ubyte.gz";
  const std::string labels = root + "/train-labels-idx1-ubyte.gz";
  if (!std::filesystem::exists(images) || !std::filesystem::exists(labels)) {
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << root;
  }
  absl::StatusOr<LabeledSamples> data = LoadIdxDataset(images, labels, 0);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 60000);
  EXPECT_EQ(data->sample_dims, (std::vector<int>{28, 28}));
  EXPECT_EQ(data->sample_bytes, 784);
  EXPECT_EQ(data->classes, 10);
  EXPECT_EQ(data->samples.size(), 60000u * 784u);
  // Fashion-MNIST is balanced: 6000 of each class.
  std::vector<int> per_class(10);
  for (uint8_t label : data->labels) ++per_class[label];
  EXPECT_EQ(per_class, std::vector<int>(10, 6000));
}

}  // namespace
}  // namespace stoker
