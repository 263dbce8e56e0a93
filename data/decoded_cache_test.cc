#include "data/decoded_cache.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "data/image/image_codec.h"
#include "data/image_dataset.h"
#include "data/rank_slice_test_util.h"
#include "data/test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

// `classes` x `per_class` RGB PNGs of 12x10 pixels whose values differ per pixel and per image,
// so a resize mixes them and a wrong sample shows.
std::string MakeFolder(const testing::TempDir& dir, const std::string& name, int classes,
                       int per_class) {
  const std::string root = dir.File(name);
  for (int c = 0; c < classes; ++c) {
    const std::string class_dir = absl::StrCat(root, "/c", c);
    std::filesystem::create_directories(class_dir);
    for (int i = 0; i < per_class; ++i) {
      Image image{10, 12, 3, {}};
      image.pixels.resize(10 * 12 * 3);
      for (size_t p = 0; p < image.pixels.size(); ++p) {
        image.pixels[p] = static_cast<uint8_t>(p * 7 + c * 50 + i * 13);
      }
      absl::StatusOr<std::vector<uint8_t>> png = EncodePng(image);
      EXPECT_TRUE(png.ok()) << png.status();
      std::ofstream(absl::StrCat(class_dir, "/", i, ".png"), std::ios::binary)
          .write(reinterpret_cast<const char*>(png->data()), png->size());
    }
  }
  return root;
}

SampleIndex Index(const std::string& root) {
  absl::StatusOr<SampleIndex> index = BuildImageIndex("image_folder", root, nullptr);
  EXPECT_TRUE(index.ok()) << index.status();
  return std::move(*index);
}

// Resize + center crop: deterministic.
ImageTransform Eval() {
  ImageTransform t;
  t.channels = 3;
  t.size = 8;
  t.resize = 9;
  return t;
}

// With and without the cache: the same batches, the same bad samples counted and named; also
// with a train_limit subset and for a second data-parallel rank.
TEST(DecodedCacheTest, CachedBatchesEqualDecodedOnesAndBadImagesStayBad) {
  testing::TempDir dir;
  const std::string root = MakeFolder(dir, "train", 3, 7);
  const std::string bad = root + "/c1/3.png";
  std::filesystem::resize_file(bad, 40);
  for (const int64_t limit : {int64_t{0}, int64_t{13}}) {
    for (const uint32_t rank : {0u, 1u}) {
      SCOPED_TRACE(absl::StrCat("limit ", limit, " rank ", rank));
      const SampleIndex index = Index(root);
      const std::string path = dir.File(absl::StrCat("train.samples.decoded-", limit, "-", rank));
      absl::StatusOr<DecodedCacheInfo> info = WriteDecodedCache(index, Eval(), limit, 2, path);
      ASSERT_TRUE(info.ok()) << info.status();
      const int64_t kept = limit > 0 ? limit : 21;
      EXPECT_EQ(info->decoded + info->absent, kept);
      EXPECT_LE(info->absent, 1);
      EXPECT_EQ(info->file_bytes, std::filesystem::file_size(path));
      absl::StatusOr<std::unique_ptr<DecodedCache>> cache =
          DecodedCache::Open(path, index, TransformOutputBytes(Eval()));
      ASSERT_TRUE(cache.ok()) << cache.status();

      std::atomic<uint64_t> bad_plain{0}, bad_cached{0};
      std::vector<std::string> lines_plain, lines_cached;
      auto options = [&](std::atomic<uint64_t>* bad_total, std::vector<std::string>* lines) {
        ImageSourceOptions o;
        o.transform = Eval();
        o.seed = 11;
        o.limit = limit;
        o.rank = rank;
        o.replicas = 2;
        o.bad_samples_total = bad_total;
        o.log = [lines](const std::string& line) { lines->push_back(line); };
        return o;
      };
      ImageSourceOptions cached_options = options(&bad_cached, &lines_cached);
      cached_options.decoded_cache = std::move(*cache);
      absl::StatusOr<std::unique_ptr<ImageBatchSource>> plain =
          ImageBatchSource::Create(Index(root), 3, options(&bad_plain, &lines_plain));
      absl::StatusOr<std::unique_ptr<ImageBatchSource>> cached =
          ImageBatchSource::Create(Index(root), 3, std::move(cached_options));
      ASSERT_TRUE(plain.ok() && cached.ok());
      const uint64_t batches = 2 * static_cast<uint64_t>((*plain)->batches_per_epoch());
      uint32_t total = 0;
      for (uint64_t b = 0; b < batches; ++b) {
        const testing::MadeBatch x = testing::MakeInto(**plain, b, 3);
        const testing::MadeBatch y = testing::MakeInto(**cached, b, 3);
        EXPECT_EQ(x.samples, y.samples) << "batch " << b;
        EXPECT_EQ(x.labels, y.labels) << "batch " << b;
        total += x.count;
      }
      EXPECT_GT(total, 0u);
      EXPECT_EQ(bad_plain.load(), bad_cached.load());
      EXPECT_EQ(lines_plain, lines_cached);
      for (const std::string& line : lines_cached) EXPECT_TRUE(absl::StrContains(line, "3.png"));
    }
  }
}

// The loaders copy from the cache: with the image files gone, the batches still come, the same
// as while the files were there.
TEST(DecodedCacheTest, CachedSamplesDoNotTouchTheFiles) {
  testing::TempDir dir;
  const std::string root = MakeFolder(dir, "train", 2, 5);
  const std::string path = dir.File("cache");
  ASSERT_TRUE(WriteDecodedCache(Index(root), Eval(), 0, 2, path).ok());
  ImageSourceOptions options;
  options.transform = Eval();
  options.seed = 3;
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> plain =
      ImageBatchSource::Create(Index(root), 4, options);
  ASSERT_TRUE(plain.ok());
  const testing::MadeBatch before = testing::MakeInto(**plain, 1, 4);
  absl::StatusOr<std::unique_ptr<DecodedCache>> cache =
      DecodedCache::Open(path, Index(root), TransformOutputBytes(Eval()));
  ASSERT_TRUE(cache.ok()) << cache.status();
  for (int64_t i = 0; i < 10; ++i) EXPECT_NE((*cache)->Sample(i), nullptr) << i;
  EXPECT_EQ((*cache)->Sample(10), nullptr);
  options.decoded_cache = std::move(*cache);
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> cached =
      ImageBatchSource::Create(Index(root), 4, options);
  ASSERT_TRUE(cached.ok());
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_regular_file()) std::filesystem::resize_file(entry.path(), 0);
  }
  const testing::MadeBatch after = testing::MakeInto(**cached, 1, 4);
  EXPECT_EQ(after.count, 4u);
  EXPECT_EQ(before.samples, after.samples);
  EXPECT_EQ(before.labels, after.labels);
}

TEST(DecodedCacheTest, OpenRefusesAnotherIndexATruncatedFileAndNoFile) {
  testing::TempDir dir;
  const SampleIndex index = Index(MakeFolder(dir, "a", 2, 3));
  const SampleIndex other = Index(MakeFolder(dir, "b", 2, 4));
  const std::string path = dir.File("cache");
  ASSERT_TRUE(WriteDecodedCache(index, Eval(), 0, 1, path).ok());
  const size_t bytes = TransformOutputBytes(Eval());
  EXPECT_TRUE(DecodedCache::Open(path, index, bytes).ok());
  EXPECT_EQ(DecodedCache::Open(path, other, bytes).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodedCache::Open(path, index, bytes + 3).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodedCache::Open(dir.File("none"), index, bytes).status().code(),
            absl::StatusCode::kNotFound);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  absl::StatusOr<std::unique_ptr<DecodedCache>> truncated = DecodedCache::Open(path, index, bytes);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(truncated.status().message(), path));
  // A file that is no cache at all, of the right size.
  std::ofstream(path, std::ios::trunc | std::ios::binary)
      << std::string(DecodedCacheFileBytes(index.count(), bytes), 'x');
  EXPECT_EQ(DecodedCache::Open(path, index, bytes).status().code(), absl::StatusCode::kDataLoss);
}

TEST(DecodedCacheTest, WriteRefusesRandomTransformsAndLeavesNothingOnError) {
  testing::TempDir dir;
  const SampleIndex index = Index(MakeFolder(dir, "a", 2, 3));
  ImageTransform flip = Eval();
  flip.horizontal_flip = true;
  EXPECT_EQ(WriteDecodedCache(index, flip, 0, 1, dir.File("c")).status().code(),
            absl::StatusCode::kInvalidArgument);
  ImageTransform crop = Eval();
  crop.random_resized_crop = true;
  EXPECT_EQ(WriteDecodedCache(index, crop, 0, 1, dir.File("c")).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A directory that does not exist: UNAVAILABLE (the worker's disk, not the dataset).
  absl::Status missing = WriteDecodedCache(index, Eval(), 0, 1, dir.File("no/c")).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(missing.message(), dir.File("no/c")));
  // Stopped: CANCELLED, and neither the cache nor its temporary file is left.
  const std::string out = dir.File("out");
  std::filesystem::create_directories(out);
  EXPECT_EQ(WriteDecodedCache(index, Eval(), 0, 1, out + "/c", [] { return true; }).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_TRUE(std::filesystem::is_empty(out));
}

TEST(DecodedCacheTest, RefusalNamesWhyNot) {
  ImageTransform random = Eval();
  random.horizontal_flip = true;
  constexpr int64_t kGiB = int64_t{1} << 30;
  EXPECT_EQ(DecodedCacheRefusal("", Eval(), 100 << 20, 4 * kGiB, 4 * kGiB), "");
  EXPECT_EQ(DecodedCacheRefusal("auto", Eval(), 100 << 20, 4 * kGiB, 4 * kGiB), "");
  EXPECT_TRUE(absl::StrContains(DecodedCacheRefusal("off", Eval(), 1, 4 * kGiB, 4 * kGiB), "off"));
  EXPECT_TRUE(
      absl::StrContains(DecodedCacheRefusal("auto", random, 1, 4 * kGiB, 4 * kGiB), "random"));
  EXPECT_TRUE(absl::StrContains(DecodedCacheRefusal("auto", Eval(), kGiB + 1, 4 * kGiB, 8 * kGiB),
                                "quarter of the memory"));
  EXPECT_TRUE(absl::StrContains(DecodedCacheRefusal("auto", Eval(), kGiB, 8 * kGiB, kGiB),
                                "half the free disk"));
  EXPECT_NE(DecodedCacheRefusal("auto", Eval(), 1, -1, 4 * kGiB), "");
  EXPECT_NE(DecodedCacheRefusal("auto", Eval(), 1, 4 * kGiB, -1), "");
}

}  // namespace
}  // namespace stoker
