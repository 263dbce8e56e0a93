#include "data/image_dataset.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/index/index_test_util.h"
#include "data/job_region.h"
#include "data/prepared_dataset.h"
#include "data/rank_slice_test_util.h"
#include "data/test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

// An image folder of `per_class` PNGs in each of `classes` classes; pixel values encode
// (class, index) so a sample can be recognised after decoding.
class ImageFolder {
 public:
  ImageFolder(int classes, int per_class, int side, int channels)
      : root_(std::filesystem::temp_directory_path() /
              absl::StrCat("stoker_image_dataset_", getpid(), "_", next_++)) {
    for (int c = 0; c < classes; ++c) {
      const std::string dir = absl::StrCat(root_, "/class", c);
      std::filesystem::create_directories(dir);
      for (int i = 0; i < per_class; ++i) {
        Image image{side, side, channels, {}};
        image.pixels.assign(static_cast<size_t>(side) * side * channels,
                            static_cast<uint8_t>(c * 40 + i));
        absl::StatusOr<std::vector<uint8_t>> png = EncodePng(image);
        EXPECT_TRUE(png.ok()) << png.status();
        std::ofstream(absl::StrCat(dir, "/img", i, ".png"), std::ios::binary)
            .write(reinterpret_cast<const char*>(png->data()), png->size());
      }
    }
  }
  ~ImageFolder() { std::filesystem::remove_all(root_); }
  const std::string& root() const { return root_; }

 private:
  static inline int next_ = 0;
  std::string root_;
};

SampleIndex Index(const std::string& root) {
  absl::StatusOr<SampleIndex> index = BuildImageIndex("image_folder", root, nullptr);
  EXPECT_TRUE(index.ok()) << index.status();
  return std::move(*index);
}

// The test split as the trainer gets it: WriteImageTestSplit into `dir`/test.samples, mapped,
// and copied out (the file is removed).
absl::StatusOr<LabeledSamples> TestSplit(const SampleIndex& train, const SampleIndex& test,
                                         const ImageTransform& eval, int classes, int64_t limit,
                                         int threads, int64_t max_bad_samples,
                                         const testing::TempDir& dir,
                                         const std::function<void(const std::string&)>& log = {}) {
  const std::string path = dir.File("test.samples");
  absl::StatusOr<DatasetSummary> written =
      WriteImageTestSplit(train, test, eval, classes, limit, threads, max_bad_samples, log, path);
  if (!written.ok()) return written.status();
  absl::StatusOr<std::unique_ptr<MappedSamples>> mapped = MappedSamples::Open(path);
  if (!mapped.ok()) return mapped.status();
  const SamplesView& view = (*mapped)->view();
  EXPECT_EQ(view.count, written->count);
  LabeledSamples out;
  static_cast<SamplesShape&>(out) = view;
  out.samples.assign(view.samples, view.samples + view.count * view.sample_bytes);
  out.labels.assign(view.labels, view.labels + view.count);
  std::filesystem::remove(path);
  return out;
}

ImageSourceOptions Options(int side, int channels) {
  ImageSourceOptions options;
  options.transform.channels = channels;
  options.transform.size = side;
  options.transform.horizontal_flip = true;
  options.seed = 7;
  return options;
}

struct Batch {
  std::vector<uint8_t> samples, labels;
  uint32_t count = 0;
};

Batch MakeBatch(ImageBatchSource& source, uint64_t batch, uint32_t batch_size) {
  Batch out;
  out.samples.resize(static_cast<size_t>(batch_size) * source.sample_bytes());
  out.labels.resize(batch_size);
  absl::StatusOr<uint32_t> count = source.Make(batch, out.samples.data(), out.labels.data());
  EXPECT_TRUE(count.ok()) << count.status();
  out.count = count.value_or(0);
  return out;
}

TEST(ImageDatasetTest, BatchesAreTheSameFromEverySourceAndCoverTheEpoch) {
  ImageFolder folder(3, 5, 6, 3);
  const uint32_t batch_size = 4;
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> a =
      ImageBatchSource::Create(Index(folder.root()), batch_size, Options(6, 3));
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> b =
      ImageBatchSource::Create(Index(folder.root()), batch_size, Options(6, 3));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->batches_per_epoch(), 4);
  EXPECT_EQ((*a)->sample_bytes(), 3 * 6 * 6);
  std::vector<int> seen(15, 0);
  // Made in another order by the second source: the same bytes.
  for (uint64_t batch : {3, 0, 2, 1, 5}) {
    const Batch x = MakeBatch(**a, batch, batch_size);
    const Batch y = MakeBatch(**b, batch, batch_size);
    EXPECT_EQ(x.samples, y.samples) << "batch " << batch;
    EXPECT_EQ(x.labels, y.labels) << "batch " << batch;
    if (batch >= 4) continue;
    EXPECT_EQ(x.count, batch == 3 ? 3u : 4u);
    for (uint32_t s = 0; s < x.count; ++s) {
      // Constant images: every pixel says which one it is; CHW of 3 channels.
      const uint8_t value = x.samples[s * 108];
      const int label = value / 40;
      EXPECT_EQ(label, x.labels[s]);
      ++seen[label * 5 + value % 40];
    }
  }
  EXPECT_EQ(seen, std::vector<int>(15, 1)) << "every sample exactly once per epoch";
}

// Confined to a data root: a class directory and an image leading outside it through symbolic
// links are left out (named to the log, counted in the index), a link inside it is followed, the
// index keeps the root, and a file swapped for a link to the outside after indexing is refused
// when it is read (PERMISSION_DENIED), not only when it was indexed.
TEST(ImageDatasetTest, AnIndexConfinedToTheDataRootLeavesOutAndRefusesWhatLeadsOutside) {
  ImageFolder data_root(3, 2, 8, 1);
  ImageFolder outside(1, 2, 8, 1);
  const std::string folder = data_root.root() + "/folder";
  std::filesystem::create_directories(folder);
  std::filesystem::rename(data_root.root() + "/class0", folder + "/a");
  std::filesystem::rename(data_root.root() + "/class1", folder + "/b");
  std::filesystem::create_directory_symlink(outside.root() + "/class0", folder + "/c");
  std::filesystem::create_symlink(outside.root() + "/class0/img0.png", folder + "/a/zz.png");
  std::filesystem::create_directory_symlink(data_root.root() + "/class2", folder + "/d");

  std::vector<std::string> lines;
  absl::StatusOr<SampleIndex> index = BuildImageIndex(
      "image_folder", folder, [&](const std::string& line) { lines.push_back(line); },
      data_root.root());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->class_names(), (std::vector<std::string>{"a", "b", "d"}));
  EXPECT_EQ(index->count(), 6);  // a, b and the inside link d: 2 each
  EXPECT_EQ(index->outside(), 2);
  char real[PATH_MAX];
  ASSERT_NE(realpath(data_root.root().c_str(), real), nullptr);
  EXPECT_EQ(index->root(), real);
  const std::string log = absl::StrJoin(lines, "\n");
  EXPECT_TRUE(absl::StrContains(log, folder + "/c")) << log;
  EXPECT_TRUE(absl::StrContains(log, folder + "/a/zz.png")) << log;
  EXPECT_TRUE(absl::StrContains(log, "2 entries of " + folder + " left out")) << log;
  EXPECT_FALSE(absl::StrContains(log, outside.root())) << log;

  // Unconfined, the same folder follows every link (torchvision's behaviour).
  absl::StatusOr<SampleIndex> open = BuildImageIndex("image_folder", folder, nullptr);
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ(open->count(), 9);
  EXPECT_EQ(open->root(), "");

  // Swapped after indexing: the first sample of "a" now leads outside.
  const std::string first = std::string(index->source_path(index->sample(0).source));
  std::filesystem::remove(first);
  std::filesystem::create_symlink(outside.root() + "/class0/img1.png", first);
  FileCache files;
  std::vector<uint8_t> bytes;
  const absl::Status read = ReadSampleBytes(*index, 0, files, bytes);
  EXPECT_TRUE(absl::IsPermissionDenied(read)) << read;
  EXPECT_TRUE(absl::StrContains(read.message(), "leads outside the data root")) << read;
  EXPECT_TRUE(ReadSampleBytes(*index, 1, files, bytes).ok());
  // The probe the server runs at submit leaves out the same class.
  absl::StatusOr<ImageDatasetProbe> probe =
      ProbeImageDataset("image_folder", folder, data_root.root());
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->class_names, (std::vector<std::string>{"a", "b", "d"}));
}

TEST(ImageDatasetTest, BadImagesAreSkippedCountedAndNamedUntilTooMany) {
  ImageFolder folder(2, 4, 4, 1);
  const std::string bad1 = folder.root() + "/class0/img1.png";
  const std::string bad2 = folder.root() + "/class1/img2.png";
  std::filesystem::resize_file(bad1, 30);
  std::ofstream(bad2, std::ios::trunc) << "not a png";
  // Two loaders of one job share the region's counters.
  std::atomic<uint64_t> bad_total{0};
  BadSampleSet bad_samples;
  std::vector<std::string> lines;
  ImageSourceOptions options = Options(4, 1);
  options.bad_samples_total = &bad_total;
  options.bad_samples = &bad_samples;
  options.max_bad_samples = 2;
  options.log = [&](const std::string& line) { lines.push_back(line); };
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> first =
      ImageBatchSource::Create(Index(folder.root()), 8, options);
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> second =
      ImageBatchSource::Create(Index(folder.root()), 8, options);
  ASSERT_TRUE(first.ok() && second.ok());
  // Each batch is a whole epoch; the loaders take turns. The same two images are skipped every
  // epoch, by either loader: every skip is counted, but they are two bad samples, named once, and
  // the limit of 2 is not passed however long the job runs.
  for (uint64_t epoch = 0; epoch < 6; ++epoch) {
    const Batch batch = MakeBatch(epoch % 2 == 0 ? **first : **second, epoch, 8);
    EXPECT_EQ(batch.count, 6u) << "epoch " << epoch;
    EXPECT_EQ(bad_total.load(), 2 * (epoch + 1));
  }
  EXPECT_EQ(bad_samples.distinct.load(), 2u);
  ASSERT_EQ(lines.size(), 2u);
  std::sort(lines.begin(), lines.end());
  EXPECT_TRUE(absl::StrContains(lines[0], bad1)) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[1], bad2)) << lines[1];
  // A third bad image (a file broken mid-job) passes the limit: Make fails naming it.
  const std::string bad3 = folder.root() + "/class1/img0.png";
  std::ofstream(bad3, std::ios::trunc) << "broken later";
  std::vector<uint8_t> samples(8 * 16), labels(8);
  absl::StatusOr<uint32_t> failed = (*second)->Make(6, samples.data(), labels.data());
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(failed.status()));
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "3 samples could not be decoded"))
      << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "dataset.max_bad_samples (2)"))
      << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), bad3)) << failed.status();
}

TEST(ImageDatasetTest, TheBadSampleSetCountsEachSampleOnceUntilItIsFull) {
  BadSampleSet set;
  const std::vector<uint64_t> samples = {0, 7, 8191, 8192, uint64_t{1} << 30};
  for (uint64_t sample : samples) EXPECT_TRUE(set.Insert(sample)) << sample;
  for (uint64_t sample : samples) EXPECT_FALSE(set.Insert(sample)) << sample;
  EXPECT_EQ(set.distinct.load(), 5u);
  // Filled to half its slots, it counts every insert (a job with that many bad images fails
  // sooner, never later).
  for (uint64_t sample = 100; set.distinct.load() < BadSampleSet::kSlots / 2; ++sample) {
    set.Insert(sample);
  }
  EXPECT_TRUE(set.Insert(0));
  EXPECT_EQ(set.distinct.load(), BadSampleSet::kSlots / 2 + 1);
}

TEST(ImageDatasetTest, TestSplitClassesAreMatchedByName) {
  ImageFolder train(3, 2, 4, 1);
  ImageFolder test(3, 2, 4, 1);
  // The test folder lacks class0: its class1 and class2 are labels 1 and 2 of the training set.
  std::filesystem::remove_all(test.root() + "/class0");
  ImageTransform eval;
  eval.channels = 1;
  eval.size = 4;
  const testing::TempDir work;
  absl::StatusOr<LabeledSamples> split =
      TestSplit(Index(train.root()), Index(test.root()), eval, 3, 0, 2, 0, work);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->count, 4);
  EXPECT_EQ(split->labels, (std::vector<uint8_t>{1, 1, 2, 2}));
  EXPECT_EQ(split->samples[0], 40);  // class1/img0
  EXPECT_EQ(split->sample_dims, (std::vector<int>{1, 4, 4}));

  std::filesystem::rename(test.root() + "/class2", test.root() + "/zebra");
  absl::StatusOr<LabeledSamples> unknown =
      TestSplit(Index(train.root()), Index(test.root()), eval, 3, 0, 1, 0, work);
  EXPECT_TRUE(absl::StartsWith(unknown.status().message(),
                               "test class directory 'zebra' has no counterpart"))
      << unknown.status();
}

// The trainer's test split, written chunk by chunk into a prepared samples file: every decodable
// image, in index order, relabelled by class name, a bad image skipped, over more than one chunk.
TEST(ImageDatasetTest, TheTestSplitWrittenToAFileHoldsEveryDecodableImage) {
  ImageFolder train(4, 1, 4, 1);
  ImageFolder test(4, 180, 4, 1);  // 540 samples after removing class0: chunks of 512 and 28
  std::filesystem::remove_all(test.root() + "/class0");
  const std::string bad = test.root() + "/class2/img7.png";
  std::ofstream(bad, std::ios::trunc) << "not a png";
  ImageTransform eval;
  eval.channels = 1;
  eval.size = 4;
  const SampleIndex train_index = Index(train.root());
  const SampleIndex test_index = Index(test.root());
  const testing::TempDir work;
  const std::string path = work.File("test.samples");
  std::vector<std::string> lines;
  absl::StatusOr<DatasetSummary> written = WriteImageTestSplit(
      train_index, test_index, eval, 4, 0, 3, 1,
      [&](const std::string& line) { lines.push_back(line); }, path);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->count, 539);
  EXPECT_EQ(written->classes, 4);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(absl::StrContains(lines[0], bad)) << lines[0];
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(work.File("")), {}), 1)
      << "no temporary file is left";
  absl::StatusOr<std::unique_ptr<MappedSamples>> mapped = MappedSamples::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const SamplesView& view = (*mapped)->view();
  ASSERT_EQ(view.count, 539);
  EXPECT_EQ(view.classes, 4);
  EXPECT_EQ(view.sample_dims, (std::vector<int>{1, 4, 4}));
  EXPECT_EQ(view.sample_bytes, 16);
  // The expected samples, from the index alone: image classC/imgI.png is uniformly C * 40 + I
  // (as a uint8), and test class C is the training set's class C too (class0 only exists there).
  int64_t k = 0;
  for (int64_t i = 0; i < test_index.count(); ++i) {
    const std::string name = test_index.SampleName(i);
    if (name == bad) continue;
    const size_t c_at = name.rfind("/class") + 6, i_at = name.rfind("/img") + 4;
    const int c = std::stoi(name.substr(c_at)), n = std::stoi(name.substr(i_at));
    ASSERT_LT(k, view.count);
    EXPECT_EQ(view.labels[k], c) << name;
    for (int b = 0; b < 16; ++b) {
      ASSERT_EQ(view.samples[k * 16 + b], static_cast<uint8_t>(c * 40 + n)) << name;
    }
    ++k;
  }
  EXPECT_EQ(k, view.count);
}

TEST(ImageDatasetTest, AFailedTestSplitWriteLeavesNoFile) {
  ImageFolder train(2, 1, 4, 1);
  ImageFolder test(2, 3, 4, 1);
  ImageTransform eval;
  eval.channels = 1;
  eval.size = 4;
  const SampleIndex train_index = Index(train.root());
  const SampleIndex test_index = Index(test.root());
  // A work directory that does not exist: UNAVAILABLE naming the file.
  const std::string missing = test.root() + "/missing/test.samples";
  absl::StatusOr<DatasetSummary> nowhere =
      WriteImageTestSplit(train_index, test_index, eval, 2, 0, 1, 0, nullptr, missing);
  EXPECT_TRUE(absl::IsUnavailable(nowhere.status())) << nowhere.status();
  EXPECT_TRUE(absl::StrContains(nowhere.status().message(), missing)) << nowhere.status();
  // Too many bad images, found after the file was begun: the temporary file goes.
  std::ofstream(test.root() + "/class1/img2.png", std::ios::trunc) << "not a png";
  const SampleIndex with_bad = Index(test.root());
  const std::string dir = test.root() + "/work";  // after indexing: not a class
  std::filesystem::create_directories(dir);
  absl::StatusOr<DatasetSummary> bad =
      WriteImageTestSplit(train_index, with_bad, eval, 2, 0, 1, 0, nullptr, dir + "/test.samples");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "dataset.max_bad_samples (0)"))
      << bad.status();
  // A label the job does not have (shards-like: more test classes than the job's).
  absl::StatusOr<DatasetSummary> out_of_range =
      WriteImageTestSplit(train_index, with_bad, eval, 1, 0, 1, 5, nullptr, dir + "/test.samples");
  EXPECT_TRUE(absl::IsOutOfRange(out_of_range.status())) << out_of_range.status();
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 0);
}

TEST(ImageDatasetTest, ALimitKeepsARandomSubsetNotTheFirstClasses) {
  ImageFolder folder(4, 10, 4, 1);
  ImageSourceOptions options = Options(4, 1);
  options.limit = 8;
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> source =
      ImageBatchSource::Create(Index(folder.root()), 8, options);
  ASSERT_TRUE(source.ok());
  EXPECT_EQ((*source)->count(), 8);
  const Batch epoch0 = MakeBatch(**source, 0, 8);
  const Batch epoch1 = MakeBatch(**source, 1, 8);
  ASSERT_EQ(epoch0.count, 8u);
  std::set<uint8_t> labels(epoch0.labels.begin(), epoch0.labels.end());
  EXPECT_GE(labels.size(), 2u) << "the first 8 of the index are all class 0";
  // The same 8 samples every epoch, in another order.
  std::multiset<uint8_t> a, b;
  for (uint32_t s = 0; s < 8; ++s) {
    a.insert(epoch0.samples[s * 16]);
    b.insert(epoch1.samples[s * 16]);
  }
  EXPECT_EQ(a, b);
  // The test split's limit picks the same kind of subset.
  ImageTransform eval;
  eval.channels = 1;
  eval.size = 4;
  const testing::TempDir work;
  const SampleIndex index = Index(folder.root());
  absl::StatusOr<LabeledSamples> split = TestSplit(index, index, eval, 4, 8, 1, 0, work);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->count, 8);
  EXPECT_GE(std::set<uint8_t>(split->labels.begin(), split->labels.end()).size(), 2u);
  for (int64_t i = 0; i < split->count; ++i) {
    EXPECT_EQ(split->samples[i * 16] / 40, split->labels[i]) << "labels follow their samples";
  }
}

TEST(ImageDatasetTest, ProbeSeesClassesFirstImageAndMissingShards) {
  ImageFolder folder(2, 1, 5, 3);
  absl::StatusOr<ImageDatasetProbe> probe = ProbeImageDataset("image_folder", folder.root());
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->class_names, (std::vector<std::string>{"class0", "class1"}));
  ASSERT_TRUE(probe->first.has_value());
  EXPECT_EQ(probe->first->width, 5);
  EXPECT_EQ(probe->first->channels, 3);
  absl::StatusOr<ImageDatasetProbe> shards =
      ProbeImageDataset("shards", folder.root() + "/s-{0..3}.tar");
  EXPECT_TRUE(absl::IsNotFound(shards.status()));
  EXPECT_EQ(shards.status().message(),
            absl::StrCat("shard ", folder.root(),
                         "/s-0.tar not found (4 of the 4 shards the pattern names are missing)"));
  EXPECT_TRUE(absl::IsNotFound(ProbeImageDataset("image_folder", "/nonexistent").status()));

  // A class whose images sit only in a subdirectory is fine (the index walks it, as torchvision
  // does); a class without any image is refused naming it, as the index would at start.
  std::filesystem::create_directories(folder.root() + "/class2/nested/deeper");
  std::filesystem::copy_file(folder.root() + "/class0/" +
                                 std::filesystem::directory_iterator(folder.root() + "/class0")
                                     ->path()
                                     .filename()
                                     .string(),
                             folder.root() + "/class2/nested/deeper/a.png");
  std::ofstream(folder.root() + "/class2/notes.txt") << "not an image";
  EXPECT_TRUE(ProbeImageDataset("image_folder", folder.root()).ok());
  std::filesystem::create_directories(folder.root() + "/class3/sub");
  std::ofstream(folder.root() + "/class3/sub/readme.txt") << "not an image";
  absl::StatusOr<ImageDatasetProbe> empty = ProbeImageDataset("image_folder", folder.root());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(),
            absl::StrCat(folder.root(),
                         "/class3: class directory without any .jpg, .jpeg or .png file; remove it "
                         "or add its images"));
}

TEST(ImageDatasetTest, FirstImageHeaderPrefersColour) {
  ImageFolder folder(2, 1, 4, 1);
  {
    // class1's image in colour: one colour image among the first makes the job RGB.
    Image rgb{4, 4, 3, std::vector<uint8_t>(48, 9)};
    absl::StatusOr<std::vector<uint8_t>> png = EncodePng(rgb);
    ASSERT_TRUE(png.ok());
    std::ofstream(folder.root() + "/class1/img0.png", std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(png->data()), png->size());
  }
  absl::StatusOr<ImageHeader> header = FirstImageHeader(Index(folder.root()));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->channels, 3);
  EXPECT_EQ(header->height, 4);
  // The server's probe at submit (and the dry run) decide alike.
  absl::StatusOr<ImageDatasetProbe> probe = ProbeImageDataset("image_folder", folder.root());
  ASSERT_TRUE(probe.ok()) << probe.status();
  ASSERT_TRUE(probe->first.has_value());
  EXPECT_EQ(probe->first->channels, 3);
}

// Data-parallel ranks (loader.h, SliceOfRank) over image datasets: textured 12x12 RGB images, so
// that a crop or a flip drawn for another position would show. Channel 0 of pixel (0, 0) is the
// image's number; the label is number % 3.
std::string TexturedPng(int number) {
  Image image{12, 12, 3, {}};
  for (int y = 0; y < 12; ++y) {
    for (int x = 0; x < 12; ++x) {
      for (int c = 0; c < 3; ++c) {
        image.pixels.push_back(static_cast<uint8_t>(
            x == 0 && y == 0 && c == 0 ? number : (number * 37 + x * 13 + y * 5 + c * 71) % 256));
      }
    }
  }
  absl::StatusOr<std::vector<uint8_t>> png = EncodePng(image);
  EXPECT_TRUE(png.ok()) << png.status();
  return std::string(png->begin(), png->end());
}

// `count` textured images as an image folder (class<label>/img<number>.png) under `root`.
void WriteTexturedFolder(const std::string& root, int count) {
  for (int i = 0; i < count; ++i) {
    testing::WriteString(absl::StrCat(root, "/class", i % 3, "/img", i, ".png"), TexturedPng(i));
  }
}

// The same as WebDataset shards of `per_shard` samples each: `dir`/s-{0..K-1}.tar; returns the
// pattern.
std::string WriteTexturedShards(const std::string& dir, int count, int per_shard) {
  std::filesystem::create_directories(dir);
  int shards = 0;
  for (int first = 0; first < count; first += per_shard, ++shards) {
    std::vector<std::pair<std::string, std::string>> members;
    for (int i = first; i < std::min(count, first + per_shard); ++i) {
      const std::string key = absl::StrCat("sample", 1000 + i);
      members.emplace_back(key + ".png", TexturedPng(i));
      members.emplace_back(key + ".cls", std::to_string(i % 3));
    }
    testing::WriteShard(absl::StrCat(dir, "/s-", shards, ".tar"), members);
  }
  return absl::StrCat(dir, "/s-{0..", shards - 1, "}.tar");
}

// Training transforms: RandomResizedCrop to 8 and a flip, or none (the image as it is, so its
// number can be read back).
ImageSourceOptions TexturedOptions(bool random, uint32_t rank, uint32_t replicas) {
  ImageSourceOptions options;
  options.transform.channels = 3;
  if (random) {
    options.transform.size = 8;
    options.transform.random_resized_crop = true;
    options.transform.horizontal_flip = true;
  } else {
    options.transform.expect_height = 12;
    options.transform.expect_width = 12;
  }
  options.seed = 5;
  options.shuffle_buffer = 4;
  options.rank = rank;
  options.replicas = replicas;
  return options;
}

// For 2 and 3 ranks of batch 4 over 2 epochs: the ranks' batches b, in rank order, are batch b of
// one rank of batch 8 or 12, byte for byte, with random crops and flips; without them each
// image is in exactly one rank's batch per epoch. 18 images leave last global batches of 2 (2
// ranks: rank 1 empty) and 6 (3 ranks: 4, 2, and rank 2 empty); 21 leave 5 (4, 1) and 9 (4, 4,
// 1).
void ExpectRanksSliceTheImageStream(const std::function<SampleIndex()>& index, int count) {
  constexpr uint32_t kRankBatch = 4;
  for (const uint32_t replicas : {2u, 3u}) {
    for (const bool random : {true, false}) {
      SCOPED_TRACE(::testing::Message() << count << " images, " << replicas << " ranks"
                                        << (random ? ", random crop and flip" : ""));
      absl::StatusOr<std::unique_ptr<ImageBatchSource>> single =
          ImageBatchSource::Create(index(), replicas * kRankBatch, TexturedOptions(random, 0, 1));
      ASSERT_TRUE(single.ok()) << single.status();
      std::vector<std::unique_ptr<ImageBatchSource>> sources;
      std::vector<BatchSource*> ranks;
      for (uint32_t r = 0; r < replicas; ++r) {
        absl::StatusOr<std::unique_ptr<ImageBatchSource>> source =
            ImageBatchSource::Create(index(), kRankBatch, TexturedOptions(random, r, replicas));
        ASSERT_TRUE(source.ok()) << source.status();
        sources.push_back(*std::move(source));
        ranks.push_back(sources.back().get());
      }
      const int64_t per_epoch = (*single)->batches_per_epoch();
      ASSERT_EQ(per_epoch, BatchesPerEpoch(count, replicas * kRankBatch));
      const auto made = testing::ExpectRanksMakeTheSingleStream(**single, ranks, kRankBatch, count,
                                                                2 * per_epoch);
      if (random) continue;
      for (int64_t epoch = 0; epoch < 2; ++epoch) {
        std::vector<int> seen(static_cast<size_t>(count), 0);
        for (uint32_t r = 0; r < replicas; ++r) {
          for (int64_t b = epoch * per_epoch; b < (epoch + 1) * per_epoch; ++b) {
            const testing::MadeBatch& batch = made[r][static_cast<size_t>(b)];
            for (uint32_t s = 0; s < batch.count; ++s) {
              const int number = batch.samples[s * 3 * 12 * 12];  // channel 0, pixel (0, 0)
              ASSERT_LT(number, count);
              EXPECT_EQ(batch.labels[s], number % 3);
              ++seen[static_cast<size_t>(number)];
            }
          }
        }
        EXPECT_EQ(seen, std::vector<int>(static_cast<size_t>(count), 1)) << "epoch " << epoch;
      }
    }
  }
}

TEST(ImageRankSliceTest, ImageFolderRanksMakeTheSingleRankStream) {
  for (const int count : {18, 21}) {
    const testing::TempDir dir;
    WriteTexturedFolder(dir.File("folder"), count);
    ExpectRanksSliceTheImageStream([&] { return Index(dir.File("folder")); }, count);
  }
}

// Shards: every rank walks the same shard order and shuffle-buffer stream of the epoch and takes
// its slice of it.
TEST(ImageRankSliceTest, ShardRanksMakeTheSingleRankStream) {
  for (const int count : {18, 21}) {
    const testing::TempDir dir;
    const std::string pattern = WriteTexturedShards(dir.File("shards"), count, 5);
    ExpectRanksSliceTheImageStream(
        [&] {
          absl::StatusOr<SampleIndex> index = BuildImageIndex("shards", pattern, nullptr);
          EXPECT_TRUE(index.ok()) << index.status();
          return std::move(*index);
        },
        count);
  }
}

// Bad images in a rank's slice are skipped as they are for one rank: the ranks' batches still
// make the single rank's (which skips the same images), and a slice of only bad images is a batch
// of 0 samples that RunLoader publishes like any other.
TEST(ImageRankSliceTest, BadImagesAreSkippedInEachRanksSlice) {
  const testing::TempDir dir;
  WriteTexturedFolder(dir.File("folder"), 18);
  for (int i : {0, 4, 9, 10, 11, 12, 13, 14, 17}) {
    testing::WriteString(absl::StrCat(dir.File("folder"), "/class", i % 3, "/img", i, ".png"),
                         "not a png");
  }
  auto options = [](uint32_t rank, uint32_t replicas) {
    ImageSourceOptions o = TexturedOptions(true, rank, replicas);
    o.max_bad_samples = 1000;
    return o;
  };
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> single =
      ImageBatchSource::Create(Index(dir.File("folder")), 4, options(0, 1));
  ASSERT_TRUE(single.ok()) << single.status();
  std::vector<std::unique_ptr<ImageBatchSource>> sources;
  std::vector<BatchSource*> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    sources.push_back(*ImageBatchSource::Create(Index(dir.File("folder")), 2, options(r, 2)));
    ranks.push_back(sources.back().get());
  }
  const auto made = testing::ExpectRanksMakeTheSingleStream(**single, ranks, 2, 18, 10,
                                                            /*counts_are_slices=*/false);
  int empty_but_not_by_slice = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    for (uint64_t b = 0; b < 10; ++b) {
      const RankSlice slice = SliceOfRank(18, 2, r, 2, static_cast<int64_t>(b % 5));
      empty_but_not_by_slice += made[r][b].count == 0 && slice.end > slice.first;
    }
  }
  ASSERT_GT(empty_but_not_by_slice, 0) << "no slice of only bad images: pick other bad ones";

  // Through the ring: rank 1's loader publishes every batch, the empty ones with count 0.
  RingGeometry g;
  g.slot_count = 2;
  g.batch_size = 2;
  g.sample_bytes = static_cast<uint32_t>(ranks[1]->sample_bytes());
  g.total_batches = 10;
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
  ASSERT_TRUE(region.ok()) << region.status();
  (*region)->SetConsumerPid(getpid());
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> rank1 =
      ImageBatchSource::Create(Index(dir.File("folder")), 2, options(1, 2));
  ASSERT_TRUE(rank1.ok());
  absl::Status loaded;
  std::thread loader([&] { loaded = RunLoader(**region, **rank1, LoaderOptions{}); });
  for (uint64_t b = 0; b < 10; ++b) {
    absl::StatusOr<ReadableBatch> batch = (*region)->WaitReadable(b, absl::Seconds(10));
    ASSERT_TRUE(batch.ok()) << "batch " << b << ": " << batch.status();
    EXPECT_EQ(batch->count, made[1][b].count) << "batch " << b;
    EXPECT_TRUE(std::equal(made[1][b].samples.begin(), made[1][b].samples.end(), batch->samples))
        << "batch " << b;
    (*region)->Release(b);
  }
  loader.join();
  EXPECT_TRUE(loaded.ok()) << loaded;
}

TEST(ImageRankSliceTest, RanksOutsideTheReplicasAreRefused) {
  const testing::TempDir dir;
  WriteTexturedFolder(dir.File("folder"), 3);
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> source =
      ImageBatchSource::Create(Index(dir.File("folder")), 2, TexturedOptions(true, 3, 3));
  EXPECT_TRUE(absl::IsInvalidArgument(source.status())) << source.status();
  EXPECT_EQ(source.status().message(),
            "rank 3 is out of range: a job of 3 replicas has ranks 0 to 2");
  source = ImageBatchSource::Create(Index(dir.File("folder")), 2, TexturedOptions(true, 0, 0));
  EXPECT_TRUE(absl::IsInvalidArgument(source.status())) << source.status();
}

}  // namespace
}  // namespace stoker
