// stoker-dataset run as a program: an IDX subset exported as an image folder and packed into
// shards, then indexed both ways; the same samples (bytes and labels) in the expected orders.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "data/dataset.h"
#include "data/image/image_codec.h"
#include "data/image/jpeg_restart.h"
#include "data/index/index_test_util.h"
#include "data/index/sample_index.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using namespace ::stoker::testing;  // NOLINT: the test helpers
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kImages = 23;
constexpr int kHeight = 5;
constexpr int kWidth = 4;

// 23 gray 5x4 images (smooth, so that JPEG keeps them close) with labels (5 i) % 12: 12 classes,
// so class directories get two digits.
struct SmallIdx {
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;
};

SmallIdx WriteSmallIdx(const TempDir& dir) {
  SmallIdx idx;
  for (int i = 0; i < kImages; ++i) {
    for (int y = 0; y < kHeight; ++y) {
      for (int x = 0; x < kWidth; ++x)
        idx.pixels.push_back(static_cast<uint8_t>(8 * i + 6 * y + 4 * x));
    }
    idx.labels.push_back(static_cast<uint8_t>((5 * i) % 12));
  }
  testing::WriteGzip(dir.File("images.gz"), IdxBytes({kImages, kHeight, kWidth}, idx.pixels));
  testing::WriteRaw(dir.File("labels"), IdxBytes({kImages}, idx.labels));
  return idx;
}

// Runs stoker-dataset; returns its stdout, and its stderr unless `with_stderr` is false.
std::string Tool(const std::string& arguments, int* status, bool with_stderr = true) {
  std::string output;
  *status = RunShell(absl::StrCat(STOKER_DATASET_PATH, " ", arguments), &output, with_stderr);
  return output;
}

TEST(DatasetTool, ExportThenPackGivesTheSameSamplesBothWays) {
  TempDir dir;
  const SmallIdx idx = WriteSmallIdx(dir);
  int status = 0;
  std::string output =
      Tool(absl::StrCat("export-idx --images ", dir.File("images.gz"), " --labels ",
                        dir.File("labels"), " --out ", dir.File("png"), " --limit 20"),
           &status);
  ASSERT_EQ(status, 0) << output;
  EXPECT_THAT(output, HasSubstr("20/20 images"));

  absl::StatusOr<SampleIndex> folder = BuildImageFolderIndex(dir.File("png"), nullptr);
  ASSERT_TRUE(folder.ok()) << folder.status();
  ASSERT_EQ(folder->count(), 20);
  std::vector<std::string> classes;
  for (int c = 0; c < 12; ++c) classes.push_back(absl::StrFormat("%02d", c));
  EXPECT_EQ(folder->class_names(), classes);
  // The IDX order, stably sorted by label.
  std::vector<int> expected(20);
  std::iota(expected.begin(), expected.end(), 0);
  std::stable_sort(expected.begin(), expected.end(),
                   [&](int a, int b) { return idx.labels[a] < idx.labels[b]; });
  for (int64_t k = 0; k < folder->count(); ++k) {
    const int i = expected[k];
    EXPECT_EQ(folder->SampleName(k),
              absl::StrFormat("%s/%02d/%06d.png", dir.File("png"), idx.labels[i], i));
    EXPECT_EQ(folder->sample(k).label, idx.labels[i]);
    EXPECT_EQ(folder->sample(k).encoding, kIndexedPng);
    const std::string png = SampleBytes(*folder, k);
    absl::StatusOr<Image> image = DecodeImage("png", reinterpret_cast<const uint8_t*>(png.data()),
                                              png.size(), /*channels=*/1);
    ASSERT_TRUE(image.ok()) << image.status();
    ASSERT_EQ(image->width, kWidth);
    ASSERT_EQ(image->height, kHeight);
    EXPECT_TRUE(std::equal(image->pixels.begin(), image->pixels.end(),
                           idx.pixels.begin() + i * kHeight * kWidth))
        << "sample " << i;
  }

  output = Tool(absl::StrCat("pack --root ", dir.File("png"), " --out ", dir.File("shards/s"),
                             " --samples-per-shard 6 --seed 3"),
                &status, /*with_stderr=*/false);
  ASSERT_EQ(status, 0) << output;
  const std::string pattern(absl::StripTrailingAsciiWhitespace(output));
  EXPECT_EQ(pattern, dir.File("shards/s-{000000..000003}.tar"));
  absl::StatusOr<SampleIndex> shards = BuildShardIndex(pattern, nullptr);
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->count(), 20);
  EXPECT_EQ(shards->shard_begin(1), 6);
  EXPECT_EQ(shards->shard_begin(3), 18);
  const std::vector<uint32_t> order = EpochPermutation(20, 3, 0);
  std::vector<int> shard_labels;
  for (int64_t k = 0; k < shards->count(); ++k) {
    const int64_t f = order[k];
    EXPECT_EQ(shards->SampleName(k), absl::StrFormat("%s:%06d.png", shards->source_path(k / 6), k));
    EXPECT_EQ(SampleBytes(*shards, k), SampleBytes(*folder, f)) << k;  // not re-encoded
    EXPECT_EQ(shards->sample(k).label, folder->sample(f).label) << k;
    EXPECT_EQ(shards->sample(k).encoding, kIndexedPng);
    if (k < 6) shard_labels.push_back(shards->sample(k).label);
  }
  // The first shard mixes classes.
  std::sort(shard_labels.begin(), shard_labels.end());
  EXPECT_GE(std::unique(shard_labels.begin(), shard_labels.end()) - shard_labels.begin(), 3);
  // Complete shards only: no temporary files are left.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.File("shards")),
                          std::filesystem::directory_iterator()),
            4);
  EXPECT_EQ(std::filesystem::status(dir.File("shards/s-000000.tar")).permissions() &
                std::filesystem::perms::others_read,
            std::filesystem::perms::others_read);
}

TEST(DatasetTool, JpegExportAndOneShard) {
  TempDir dir;
  const SmallIdx idx = WriteSmallIdx(dir);
  int status = 0;
  std::string output = Tool(
      absl::StrCat("export-idx --images ", dir.File("images.gz"), " --labels ", dir.File("labels"),
                   " --out ", dir.File("jpg"), " --format jpeg --quality 100"),
      &status);
  ASSERT_EQ(status, 0) << output;
  absl::StatusOr<SampleIndex> folder = BuildImageFolderIndex(dir.File("jpg"), nullptr);
  ASSERT_TRUE(folder.ok()) << folder.status();
  ASSERT_EQ(folder->count(), kImages);
  for (int64_t k = 0; k < folder->count(); ++k) {
    EXPECT_TRUE(absl::EndsWith(folder->SampleName(k), ".jpg"));
    EXPECT_EQ(folder->sample(k).encoding, kIndexedJpeg);
    const std::string jpeg = SampleBytes(*folder, k);
    absl::StatusOr<Image> image =
        DecodeImage("jpeg", reinterpret_cast<const uint8_t*>(jpeg.data()), jpeg.size(), 1);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->width, kWidth);
  }
  output = Tool(absl::StrCat("pack --root ", dir.File("jpg"), " --out ", dir.File("one")), &status,
                /*with_stderr=*/false);
  ASSERT_EQ(status, 0) << output;
  EXPECT_EQ(absl::StripTrailingAsciiWhitespace(output), dir.File("one-000000.tar"));
  EXPECT_THAT(output, Not(HasSubstr("restart")));  // stdout holds only the pattern
  absl::StatusOr<SampleIndex> shards = BuildShardIndex(dir.File("one-000000.tar"), nullptr);
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(shards->count(), kImages);
  EXPECT_EQ(shards->sample(0).encoding, kIndexedJpeg);
  // Each JPEG is stored with a restart marker every MCU row, and decodes to the same pixels as
  // the file it came from; --keep-jpeg-bytes stores the files unchanged.
  output = Tool(
      absl::StrCat("pack --keep-jpeg-bytes --root ", dir.File("jpg"), " --out ", dir.File("kept")),
      &status, /*with_stderr=*/false);
  ASSERT_EQ(status, 0) << output;
  absl::StatusOr<SampleIndex> kept = BuildShardIndex(dir.File("kept-000000.tar"), nullptr);
  ASSERT_TRUE(kept.ok()) << kept.status();
  const std::vector<uint32_t> order = EpochPermutation(kImages, 1, 0);
  for (int64_t k = 0; k < shards->count(); ++k) {
    const std::string marked = SampleBytes(*shards, k);
    const std::string original = SampleBytes(*folder, order[k]);
    EXPECT_EQ(SampleBytes(*kept, k), original) << k;
    const auto* bytes = reinterpret_cast<const uint8_t*>(marked.data());
    EXPECT_TRUE(IndexJpegRows(bytes, marked.size()).has_value()) << k;
    EXPECT_FALSE(IndexJpegRows(reinterpret_cast<const uint8_t*>(original.data()), original.size())
                     .has_value());
    const Image a = *DecodeImage("marked", bytes, marked.size(), 1);
    const Image b = *DecodeImage("original", reinterpret_cast<const uint8_t*>(original.data()),
                                 original.size(), 1);
    EXPECT_EQ(a.pixels, b.pixels) << k;
  }
  // The progress line says what was done.
  output =
      Tool(absl::StrCat("pack --root ", dir.File("jpg"), " --out ", dir.File("again")), &status);
  EXPECT_THAT(output, HasSubstr(absl::StrCat(kImages, " JPEGs given restart markers")));
}

TEST(DatasetTool, ExitCodesAndErrorsNameTheFile) {
  TempDir dir;
  WriteSmallIdx(dir);
  int status = 0;
  std::string output = Tool("", &status);
  EXPECT_EQ(status, 64) << output;
  output = Tool("export-idx --images a --labels b --out c --format gif", &status);
  EXPECT_EQ(status, 64) << output;
  output = Tool("pack --root a --out b --samples-per-shard 0", &status);
  EXPECT_EQ(status, 64) << output;

  output = Tool(absl::StrCat("export-idx --images ", dir.File("images.gz"), " --labels ",
                             dir.File("missing"), " --out ", dir.File("o")),
                &status);
  EXPECT_EQ(status, 2) << output;
  EXPECT_THAT(output, HasSubstr(dir.File("missing")));

  // Labels that do not match the images.
  testing::WriteRaw(dir.File("short-labels"), IdxBytes({3}, {0, 1, 2}));
  output = Tool(absl::StrCat("export-idx --images ", dir.File("images.gz"), " --labels ",
                             dir.File("short-labels"), " --out ", dir.File("o")),
                &status);
  EXPECT_EQ(status, 2) << output;
  EXPECT_THAT(output, HasSubstr("expected 23 labels"));

  testing::WriteString(dir.File("used/file"), "x");
  output = Tool(absl::StrCat("export-idx --images ", dir.File("images.gz"), " --labels ",
                             dir.File("labels"), " --out ", dir.File("used")),
                &status);
  EXPECT_EQ(status, 2) << output;
  EXPECT_THAT(output, HasSubstr(dir.File("used") + ": exists and is not empty"));

  output =
      Tool(absl::StrCat("pack --root ", dir.File("nothing"), " --out ", dir.File("s")), &status);
  EXPECT_EQ(status, 2) << output;
  EXPECT_THAT(output, HasSubstr(dir.File("nothing")));

  output = Tool(
      absl::StrCat("export-fashion-mnist --out ", dir.File("f"), " --source ", dir.File("nope")),
      &status);
  EXPECT_EQ(status, 2) << output;
  EXPECT_THAT(output, HasSubstr("dataset-fashion-mnist"));
}

}  // namespace
}  // namespace stoker
