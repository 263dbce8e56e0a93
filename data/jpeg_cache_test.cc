// The worker's JPEG cache (jpeg_cache.h) and image-folder sources reading through it
// (image_dataset.h): random crops are the same bytes with the cache as without it, in the epoch
// that builds it and in those that read it; a changed file is never read from its old copy;
// progressive JPEGs and PNGs are left as they are; damaged entries are found and the originals
// used; the bound holds, evicting the least recently used first; builders in several processes
// leave whole entries, an exact usage and no temporary files.
#include "data/jpeg_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

// clang-format off
#include <jpeglib.h>  // after <cstdio>
// clang-format on

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "data/image/image_codec.h"
#include "data/image/image_decoder.h"
#include "data/image/jpeg_restart.h"
#include "data/image_dataset.h"
#include "data/test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

// A smooth picture with some noise, different for every seed.
Image Picture(int width, int height, uint32_t seed) {
  Image image{width, height, 3, {}};
  image.pixels.resize(static_cast<size_t>(width) * height * 3);
  uint32_t state = seed * 2654435761u + 7;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) {
        state = state * 1664525u + 1013904223u;
        const double v = 128 + 80 * std::sin(x / (6.0 + seed % 7 + c) + y / 13.0 + seed) +
                         static_cast<int>(state >> 28) - 8;
        image.pixels[(static_cast<size_t>(y) * width + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return image;
}

std::vector<uint8_t> Jpeg(int width, int height, uint32_t seed) {
  absl::StatusOr<std::vector<uint8_t>> jpeg = EncodeJpeg(Picture(width, height, seed), 90);
  EXPECT_TRUE(jpeg.ok()) << jpeg.status();
  return *jpeg;
}

// What AddJpegRestartMarkers refuses: a progressive JPEG (libjpeg's simple progression).
std::vector<uint8_t> ProgressiveJpeg(int width, int height, uint32_t seed) {
  const Image image = Picture(width, height, seed);
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 90, TRUE);
  jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(image.pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * width * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  jpeg_destroy_compress(&cinfo);
  free(buffer);
  return out;
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

JpegFileIdentity Identify(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  absl::StatusOr<JpegFileIdentity> identity = IdentifyOpenFile(fd, path);
  close(fd);
  EXPECT_TRUE(identity.ok()) << identity.status();
  return *identity;
}

std::unique_ptr<JpegCache> OpenCache(const std::string& dir, int64_t max_bytes) {
  absl::StatusOr<std::unique_ptr<JpegCache>> cache =
      JpegCache::Open({.dir = dir, .max_bytes = max_bytes, .touch_interval = absl::ZeroDuration()});
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

struct CacheFiles {
  int marked = 0, negative = 0, temporaries = 0;
  int64_t marked_bytes = 0;
};

CacheFiles ListCache(const std::string& dir) {
  CacheFiles files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    if (e.path().parent_path().filename() == "tmp") {
      ++files.temporaries;
    } else if (absl::EndsWith(name, ".jpg")) {
      ++files.marked;
      files.marked_bytes += static_cast<int64_t>(e.file_size());
    } else if (absl::EndsWith(name, ".none")) {
      ++files.negative;
    }
  }
  return files;
}

// An image folder: 3 classes of 4 tall JPEGs (13 MCU rows: random crops mostly start below the
// top two, where the decoder slices), and in class 0 a progressive JPEG, a PNG named .jpg and a
// PNG.
constexpr int kPlainJpegs = 12;
constexpr int kSamples = 15;

void WriteFolder(const std::string& root) {
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 4; ++i) {
      WriteFile(absl::StrCat(root, "/c", c, "/img", i, ".jpg"), Jpeg(72, 200, c * 10 + i));
    }
  }
  WriteFile(root + "/c0/progressive.jpg", ProgressiveJpeg(64, 160, 99));
  const std::vector<uint8_t> png = *EncodePng(Picture(40, 90, 98));
  WriteFile(root + "/c0/png_named.jpg", png);
  WriteFile(root + "/c0/plain.png", png);
}

SampleIndex Index(const std::string& root) {
  absl::StatusOr<SampleIndex> index = BuildImageIndex("image_folder", root, nullptr);
  EXPECT_TRUE(index.ok()) << index.status();
  return std::move(*index);
}

constexpr uint32_t kBatch = 4;

// A RandomResizedCrop source over the folder, through the cache in `cache_dir` ("" = none).
std::unique_ptr<ImageBatchSource> Source(const std::string& root, const std::string& cache_dir,
                                         std::vector<std::string>* log = nullptr) {
  ImageSourceOptions options;
  options.transform.channels = 3;
  options.transform.size = 24;
  options.transform.random_resized_crop = true;
  options.transform.horizontal_flip = true;
  options.seed = 11;
  options.jpeg_cache_dir = cache_dir;
  options.jpeg_cache_bytes = int64_t{64} << 20;
  options.log = [log](const std::string& line) {
    if (log != nullptr) log->push_back(line);
  };
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> source =
      ImageBatchSource::Create(Index(root), kBatch, std::move(options));
  EXPECT_TRUE(source.ok()) << source.status();
  return std::move(*source);
}

// Every batch of epoch `epoch`, samples and labels.
std::vector<uint8_t> Epoch(ImageBatchSource& source, uint64_t epoch) {
  std::vector<uint8_t> out;
  std::vector<uint8_t> samples(kBatch * source.sample_bytes()), labels(kBatch);
  for (int64_t b = 0; b < source.batches_per_epoch(); ++b) {
    absl::StatusOr<uint32_t> made =
        source.Make(epoch * source.batches_per_epoch() + b, samples.data(), labels.data());
    EXPECT_TRUE(made.ok()) << made.status();
    EXPECT_EQ(*made, std::min<uint32_t>(kBatch, kSamples - b * kBatch)) << "a sample was skipped";
    out.insert(out.end(), samples.begin(), samples.begin() + *made * source.sample_bytes());
    out.insert(out.end(), labels.begin(), labels.begin() + *made);
  }
  return out;
}

TEST(JpegCacheTest, RandomCropsAreTheSameBytesWithAndWithoutTheCache) {
  const testing::TempDir dir;
  const std::string root = dir.File("folder"), cache_dir = dir.File("cache");
  WriteFolder(root);
  const std::unique_ptr<ImageBatchSource> plain = Source(root, "");
  std::vector<std::string> log;
  std::unique_ptr<ImageBatchSource> cached = Source(root, cache_dir, &log);
  EXPECT_EQ(plain->jpeg_cache_stats(), nullptr);
  ASSERT_NE(cached->jpeg_cache_stats(), nullptr);

  // Epoch 0 builds: every plain JPEG transcoded, the progressive one and the PNG named .jpg
  // given negative entries, the .png never looked up.
  EXPECT_EQ(Epoch(*cached, 0), Epoch(*plain, 0));
  const JpegCacheStats first = *cached->jpeg_cache_stats();
  EXPECT_EQ(first.hits, 0u);
  EXPECT_EQ(first.built, uint64_t{kPlainJpegs});
  EXPECT_EQ(first.not_transcodable, 2u);
  EXPECT_EQ(first.errors, 0u);
  EXPECT_GT(first.marked_bytes, 0u);
  CacheFiles files = ListCache(cache_dir);
  EXPECT_EQ(files.marked, kPlainJpegs);
  EXPECT_EQ(files.negative, 2);
  EXPECT_EQ(files.temporaries, 0);

  // Epoch 1 reads the copies.
  EXPECT_EQ(Epoch(*cached, 1), Epoch(*plain, 1));
  const JpegCacheStats second = JpegCacheStatsSince(*cached->jpeg_cache_stats(), first);
  EXPECT_EQ(second.hits, uint64_t{kPlainJpegs});
  EXPECT_EQ(second.built, 0u);
  EXPECT_EQ(second.not_transcodable, 2u);
  // Its summary line for epoch 0 was logged when epoch 1 began.
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0], absl::StrCat("jpeg cache, epoch 0: ", DescribeJpegCacheStats(first)));
  EXPECT_TRUE(absl::StrContains(log[0], "12 built")) << log[0];

  // A later job (a new source, a new JpegCache) finds them too.
  const std::unique_ptr<ImageBatchSource> later = Source(root, cache_dir);
  EXPECT_EQ(Epoch(*later, 3), Epoch(*plain, 3));
  EXPECT_EQ(later->jpeg_cache_stats()->hits, uint64_t{kPlainJpegs});
  EXPECT_EQ(later->jpeg_cache_stats()->built, 0u);

  // The copies are restart-indexed, and hold the originals' pixels.
  const std::unique_ptr<JpegCache> cache = OpenCache(cache_dir, int64_t{64} << 20);
  const std::string image = root + "/c1/img2.jpg";
  std::vector<uint8_t> copy;
  ASSERT_EQ(cache->Find(Identify(image), &copy), JpegCache::Found::kMarked);
  EXPECT_TRUE(IndexJpegRows(copy.data(), copy.size()).has_value());
  const std::vector<uint8_t> original = ReadFile(image);
  EXPECT_EQ(DecodeImage("copy", copy.data(), copy.size(), 3)->pixels,
            DecodeImage("original", original.data(), original.size(), 3)->pixels);
  // A region low in a copy is decoded from a slice of its MCU rows.
  image_internal::ImageDecoder decoder;
  ASSERT_TRUE(decoder.Open("copy", copy.data(), copy.size()).ok());
  ASSERT_TRUE(decoder.ReadRegion(3, 0, 72, 150, 170, [](int, const uint8_t*) {}).ok());
  EXPECT_EQ(decoder.sliced_images(), 1);
  cached.reset();  // logs epoch 1's line
  ASSERT_EQ(log.size(), 2u);
  EXPECT_TRUE(absl::StartsWith(log[1], "jpeg cache, epoch 1: 12 hits")) << log[1];
}

TEST(JpegCacheTest, AChangedFileIsNeverReadFromItsOldCopy) {
  const testing::TempDir dir;
  const std::string cache_dir = dir.File("cache"), path = dir.File("a.jpg");
  WriteFile(path, Jpeg(64, 64, 1));
  const std::unique_ptr<JpegCache> cache = OpenCache(cache_dir, int64_t{16} << 20);
  const JpegFileIdentity before = Identify(path);
  const std::vector<uint8_t> bytes = ReadFile(path);
  ASSERT_EQ(cache->Store(before, bytes.data(), bytes.size()), JpegCache::Stored::kMarked);
  std::vector<uint8_t> copy;
  ASSERT_EQ(cache->Find(before, &copy), JpegCache::Found::kMarked);

  // Touched: another mtime, another key.
  const struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 678}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  const JpegFileIdentity touched = Identify(path);
  EXPECT_EQ(touched.mtime_ns, int64_t{12345} * 1000000000 + 678);
  EXPECT_NE(cache->EntryPath(touched), cache->EntryPath(before));
  EXPECT_EQ(cache->Find(touched, &copy), JpegCache::Found::kMissing);
  // Rewritten with the old mtime but another size: another key.
  WriteFile(path, Jpeg(64, 80, 2));
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  const JpegFileIdentity resized = Identify(path);
  EXPECT_EQ(resized.mtime_ns, touched.mtime_ns);
  EXPECT_NE(resized.size_bytes, touched.size_bytes);
  EXPECT_EQ(cache->Find(resized, &copy), JpegCache::Found::kMissing);
  // The same file under another path, or another inode: other keys.
  JpegFileIdentity other = before;
  other.path += "x";
  EXPECT_NE(cache->EntryPath(other), cache->EntryPath(before));
  other = before;
  ++other.inode;
  EXPECT_NE(cache->EntryPath(other), cache->EntryPath(before));

  // Through a source: an image replaced after its copy was made is decoded from its new bytes.
  const std::string root = dir.File("folder"), folder_cache = dir.File("folder_cache");
  WriteFolder(root);
  Epoch(*Source(root, folder_cache), 0);
  const std::vector<uint8_t> replacement = Jpeg(72, 200, 777);
  ASSERT_NE(replacement.size(), fs::file_size(root + "/c2/img1.jpg"))
      << "in the same clock tick, only the size tells the files apart";
  WriteFile(root + "/c2/img1.jpg", replacement);
  const std::unique_ptr<ImageBatchSource> cached = Source(root, folder_cache);
  EXPECT_EQ(Epoch(*cached, 0), Epoch(*Source(root, ""), 0));
  EXPECT_EQ(cached->jpeg_cache_stats()->hits, uint64_t{kPlainJpegs - 1});
  EXPECT_EQ(cached->jpeg_cache_stats()->built, 1u);
}

TEST(JpegCacheTest, FilesThatCannotBeTranscodedGetNegativeEntries) {
  const testing::TempDir dir;
  const std::unique_ptr<JpegCache> cache = OpenCache(dir.File("cache"), int64_t{16} << 20);
  std::vector<uint8_t> copy;
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> files = {
      {"progressive.jpg", ProgressiveJpeg(48, 48, 3)},
      {"png.jpg", *EncodePng(Picture(20, 20, 4))},
      {"cut.jpg", [] {
         std::vector<uint8_t> jpeg = Jpeg(64, 64, 5);
         jpeg.resize(jpeg.size() / 2);
         return jpeg;
       }()}};
  for (const auto& [name, bytes] : files) {
    SCOPED_TRACE(name);
    WriteFile(dir.File(name), bytes);
    const JpegFileIdentity file = Identify(dir.File(name));
    EXPECT_EQ(cache->Find(file, &copy), JpegCache::Found::kMissing);
    EXPECT_EQ(cache->Store(file, bytes.data(), bytes.size()), JpegCache::Stored::kNotTranscodable);
    EXPECT_TRUE(fs::exists(dir.File("cache/" + cache->EntryPath(file, /*negative=*/true))));
    EXPECT_FALSE(fs::exists(dir.File("cache/" + cache->EntryPath(file))));
    EXPECT_EQ(cache->Find(file, &copy), JpegCache::Found::kNotTranscodable);
    // Stored again (another builder): still a negative entry, nothing else.
    EXPECT_EQ(cache->Store(file, bytes.data(), bytes.size()), JpegCache::Stored::kNotTranscodable);
  }
  EXPECT_EQ(cache->stats().not_transcodable, 9u);
  EXPECT_EQ(cache->stats().built, 0u);
  EXPECT_EQ(cache->stats().errors, 0u);
  EXPECT_EQ(cache->RecordedUsageBytes(), 0) << "negative entries count no bytes";
}

// Rewrites the entry at `path` (header + payload) with `payload` and a correct header, as a
// damaged JPEG that passes the checks.
void WriteEntry(const std::string& path, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> entry = {'S', 'T', 'K', 'J', 'R', 'S', 'T', '1'};
  for (int i = 0; i < 8; ++i) entry.push_back(static_cast<uint8_t>(payload.size() >> (8 * i)));
  const uint32_t crc = static_cast<uint32_t>(crc32(0, payload.data(), payload.size()));
  for (int i = 0; i < 4; ++i) entry.push_back(static_cast<uint8_t>(crc >> (8 * i)));
  entry.insert(entry.end(), 4, 0);
  entry.insert(entry.end(), payload.begin(), payload.end());
  WriteFile(path, entry);
}

TEST(JpegCacheTest, DamagedEntriesAreFoundAndTheOriginalsUsed) {
  const testing::TempDir dir;
  const std::string root = dir.File("folder"), cache_dir = dir.File("cache");
  WriteFolder(root);
  Epoch(*Source(root, cache_dir), 0);
  const std::unique_ptr<JpegCache> cache = OpenCache(cache_dir, int64_t{64} << 20);
  auto entry = [&](const std::string& image) {
    return cache_dir + "/" + cache->EntryPath(Identify(root + image));
  };
  const int64_t usage = cache->RecordedUsageBytes();
  ASSERT_EQ(usage, ListCache(cache_dir).marked_bytes);
  // Truncated; a byte of the payload changed; the magic overwritten; all garbage; a payload whose
  // header and CRC are right but which does not decode (its second half cut off).
  fs::resize_file(entry("/c0/img0.jpg"), fs::file_size(entry("/c0/img0.jpg")) - 100);
  std::vector<uint8_t> bytes = ReadFile(entry("/c0/img1.jpg"));
  bytes[bytes.size() / 2] ^= 0x5a;
  WriteFile(entry("/c0/img1.jpg"), bytes);
  bytes = ReadFile(entry("/c1/img0.jpg"));
  bytes[0] = 'X';
  WriteFile(entry("/c1/img0.jpg"), bytes);
  bytes.assign(bytes.size(), 0x37);
  WriteFile(entry("/c1/img1.jpg"), bytes);
  bytes = ReadFile(entry("/c2/img3.jpg"));
  WriteEntry(entry("/c2/img3.jpg"), std::vector<uint8_t>(bytes.begin() + 24, bytes.begin() + 40));

  const std::unique_ptr<ImageBatchSource> cached = Source(root, cache_dir);
  EXPECT_EQ(Epoch(*cached, 0), Epoch(*Source(root, ""), 0));
  const JpegCacheStats& stats = *cached->jpeg_cache_stats();
  EXPECT_EQ(stats.errors, 5u);
  EXPECT_EQ(stats.hits, uint64_t{kPlainJpegs - 5 + 1}) << "the undecodable copy was a hit";
  EXPECT_EQ(stats.built, 4u) << "rebuilt, all but the one that failed to decode";
  // The next epoch reads good copies of the four, the fifth is built again.
  EXPECT_EQ(Epoch(*cached, 1), Epoch(*Source(root, ""), 1));
  EXPECT_EQ(stats.errors, 5u);
  EXPECT_EQ(stats.built, 5u);
  std::vector<uint8_t> copy;
  for (const char* image :
       {"/c0/img0.jpg", "/c0/img1.jpg", "/c1/img0.jpg", "/c1/img1.jpg", "/c2/img3.jpg"}) {
    EXPECT_EQ(cache->Find(Identify(root + image), &copy), JpegCache::Found::kMarked) << image;
  }
  // Entries shrunk behind the cache's back are subtracted at their new sizes when deleted: the
  // usage then counts too much, never too little.
  EXPECT_GE(cache->RecordedUsageBytes(), ListCache(cache_dir).marked_bytes);
}

TEST(JpegCacheTest, TheBoundHoldsAndTheLeastRecentlyUsedGoFirst) {
  const testing::TempDir dir;
  const std::string cache_dir = dir.File("cache");
  constexpr int kFiles = 14;
  std::vector<std::string> paths;
  int64_t largest = 0;
  for (int i = 0; i < kFiles; ++i) {
    paths.push_back(dir.File(absl::StrCat("f", i, ".jpg")));
    const std::vector<uint8_t> jpeg = Jpeg(96, 96, 50 + i);
    WriteFile(paths.back(), jpeg);
    largest = std::max<int64_t>(largest,
                                24 + AddJpegRestartMarkers("f", jpeg.data(), jpeg.size())->size());
  }
  const int64_t bound = 6 * largest;
  const std::unique_ptr<JpegCache> cache = OpenCache(cache_dir, bound);
  auto store = [&](int i) {
    const std::vector<uint8_t> bytes = ReadFile(paths[i]);
    return cache->Store(Identify(paths[i]), bytes.data(), bytes.size());
  };
  std::vector<uint8_t> copy;
  auto find = [&](int i) { return cache->Find(Identify(paths[i]), &copy); };
  for (int i = 0; i < 5; ++i) ASSERT_EQ(store(i), JpegCache::Stored::kMarked);
  EXPECT_EQ(cache->stats().evicted, 0u);
  // File 0 is read before every store: always the most recently used but for the newest.
  for (int i = 5; i < kFiles; ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(find(0), JpegCache::Found::kMarked);
    ASSERT_EQ(store(i), JpegCache::Stored::kMarked);
    const CacheFiles files = ListCache(cache_dir);
    EXPECT_LE(files.marked_bytes, bound);
    EXPECT_EQ(cache->RecordedUsageBytes(), files.marked_bytes);
    EXPECT_EQ(find(i), JpegCache::Found::kMarked) << "the newest stays";
  }
  EXPECT_GT(cache->stats().evicted, 0u);
  EXPECT_EQ(find(0), JpegCache::Found::kMarked) << "the most recently used stays";
  EXPECT_EQ(find(1), JpegCache::Found::kMissing) << "the least recently used went first";
  EXPECT_EQ(cache->stats().not_stored, 0u);

  // An entry larger than the whole bound is not stored.
  const std::unique_ptr<JpegCache> tiny = OpenCache(dir.File("tiny"), largest / 2);
  const std::vector<uint8_t> bytes = ReadFile(paths[0]);
  EXPECT_EQ(tiny->Store(Identify(paths[0]), bytes.data(), bytes.size()),
            JpegCache::Stored::kNoRoom);
  EXPECT_EQ(ListCache(dir.File("tiny")).temporaries, 0);
}

TEST(JpegCacheTest, ConcurrentBuildersLeaveWholeEntriesAndAnExactUsage) {
  const testing::TempDir dir;
  constexpr int kFiles = 16, kProcesses = 4;
  std::vector<std::string> paths;
  int64_t total = 0;
  for (int i = 0; i < kFiles; ++i) {
    paths.push_back(dir.File(absl::StrCat("f", i, ".jpg")));
    const std::vector<uint8_t> jpeg = Jpeg(80, 120, 200 + i);
    WriteFile(paths.back(), jpeg);
    total +=
        24 + static_cast<int64_t>(AddJpegRestartMarkers("f", jpeg.data(), jpeg.size())->size());
  }
  // Room for all, then for about a third (builders evict one another's entries).
  for (const int64_t bound : {2 * total, total / 3}) {
    SCOPED_TRACE(bound);
    const std::string cache_dir = dir.File(absl::StrCat("cache", bound));
    std::vector<pid_t> children;
    for (int p = 0; p < kProcesses; ++p) {
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        int failures = 0;
        {
          absl::StatusOr<std::unique_ptr<JpegCache>> cache =
              JpegCache::Open({.dir = cache_dir, .max_bytes = bound});
          if (!cache.ok()) _exit(100);
          std::vector<uint8_t> copy;
          for (int round = 0; round < 3; ++round) {
            for (int k = 0; k < kFiles; ++k) {
              const int i = (k * (p + 1) + p) % kFiles;  // each process in its own order
              const std::vector<uint8_t> bytes = ReadFile(paths[i]);
              const JpegFileIdentity file = Identify(paths[i]);
              if ((*cache)->Find(file, &copy) == JpegCache::Found::kMarked) continue;
              const JpegCache::Stored stored = (*cache)->Store(file, bytes.data(), bytes.size());
              if (stored == JpegCache::Stored::kError ||
                  stored == JpegCache::Stored::kNotTranscodable ||
                  (bound > total && stored != JpegCache::Stored::kMarked)) {
                ++failures;
              }
            }
          }
          if ((*cache)->stats().errors > 0) failures += 1000;
        }
        _exit(std::min(failures, 99));
      }
      children.push_back(pid);
    }
    for (const pid_t pid : children) {
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "a builder failed: status " << status;
    }
    const CacheFiles files = ListCache(cache_dir);
    EXPECT_EQ(files.temporaries, 0);
    EXPECT_EQ(files.negative, 0);
    EXPECT_LE(files.marked_bytes, bound);
    const std::unique_ptr<JpegCache> cache = OpenCache(cache_dir, bound);
    EXPECT_EQ(cache->RecordedUsageBytes(), files.marked_bytes);
    int present = 0;
    std::vector<uint8_t> copy;
    for (const std::string& path : paths) {
      if (cache->Find(Identify(path), &copy) != JpegCache::Found::kMarked) continue;
      ++present;
      const std::vector<uint8_t> original = ReadFile(path);
      EXPECT_EQ(DecodeImage("copy", copy.data(), copy.size(), 3)->pixels,
                DecodeImage("original", original.data(), original.size(), 3)->pixels);
    }
    EXPECT_EQ(present, files.marked);
    if (bound > total) {
      EXPECT_EQ(present, kFiles);
    }
    EXPECT_EQ(cache->stats().errors, 0u);
  }
}

TEST(JpegCacheTest, AKilledWritersTemporaryIsRemovedOnceStale) {
  const testing::TempDir dir;
  const std::string cache_dir = dir.File("cache");
  OpenCache(cache_dir, int64_t{1} << 20);
  WriteFile(cache_dir + "/tmp/123-abc.part", {1, 2, 3});
  WriteFile(cache_dir + "/tmp/456-def.part", {1, 2, 3});
  const struct timespec old[2] = {{0, UTIME_OMIT}, {1000, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, (cache_dir + "/tmp/123-abc.part").c_str(), old, 0), 0);
  OpenCache(cache_dir, int64_t{1} << 20);
  EXPECT_FALSE(fs::exists(cache_dir + "/tmp/123-abc.part"));
  EXPECT_TRUE(fs::exists(cache_dir + "/tmp/456-def.part")) << "a young one may be being written";
}

TEST(JpegCacheTest, OpenRefusesWhatCannotWork) {
  const testing::TempDir dir;
  EXPECT_TRUE(absl::IsInvalidArgument(JpegCache::Open({.dir = ""}).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(JpegCache::Open({.dir = dir.File("c"), .max_bytes = 0}).status()));
  WriteFile(dir.File("file"), {1});
  EXPECT_TRUE(absl::IsUnavailable(JpegCache::Open({.dir = dir.File("file/c")}).status()));
  // A usage file lost: recounted from the entries.
  const std::string cache_dir = dir.File("cache");
  {
    const std::unique_ptr<JpegCache> cache = OpenCache(cache_dir, int64_t{1} << 20);
    WriteFile(dir.File("a.jpg"), Jpeg(64, 64, 9));
    const std::vector<uint8_t> bytes = ReadFile(dir.File("a.jpg"));
    ASSERT_EQ(cache->Store(Identify(dir.File("a.jpg")), bytes.data(), bytes.size()),
              JpegCache::Stored::kMarked);
  }
  fs::remove(cache_dir + "/usage");
  const std::unique_ptr<JpegCache> cache = OpenCache(cache_dir, int64_t{1} << 20);
  EXPECT_GT(cache->RecordedUsageBytes(), 0);
  EXPECT_EQ(cache->RecordedUsageBytes(), ListCache(cache_dir).marked_bytes);
}

}  // namespace
}  // namespace stoker
