#include "data/image_dataset.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "data/prepared_dataset.h"
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
  out.count = view.count;
  out.sample_type = view.sample_type;
  out.features = view.features;
  out.sample_bytes = view.sample_bytes;
  out.sample_dims = view.sample_dims;
  out.classes = view.classes;
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

TEST(ImageDatasetTest, BadImagesAreSkippedCountedAndNamedUntilTooMany) {
  ImageFolder folder(2, 4, 4, 1);
  const std::string bad1 = folder.root() + "/class0/img1.png";
  const std::string bad2 = folder.root() + "/class1/img2.png";
  std::filesystem::resize_file(bad1, 30);
  std::ofstream(bad2, std::ios::trunc) << "not a png";
  std::atomic<uint64_t> bad_total{0};
  std::vector<std::string> lines;
  ImageSourceOptions options = Options(4, 1);
  options.bad_samples_total = &bad_total;
  options.max_bad_samples = 2;
  options.log = [&](const std::string& line) { lines.push_back(line); };
  absl::StatusOr<std::unique_ptr<ImageBatchSource>> source =
      ImageBatchSource::Create(Index(folder.root()), 8, options);
  ASSERT_TRUE(source.ok());
  const Batch batch = MakeBatch(**source, 0, 8);  // the whole epoch in one batch
  EXPECT_EQ(batch.count, 6u);
  EXPECT_EQ(bad_total.load(), 2u);
  ASSERT_EQ(lines.size(), 2u);
  std::sort(lines.begin(), lines.end());
  EXPECT_TRUE(absl::StrContains(lines[0], bad1)) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[1], bad2)) << lines[1];
  // The next epoch meets them again: past max_bad_samples, Make fails naming them.
  std::vector<uint8_t> samples(8 * 16), labels(8);
  absl::StatusOr<uint32_t> failed = (*source)->Make(1, samples.data(), labels.data());
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(failed.status()));
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "dataset.max_bad_samples (2)"))
      << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), bad1)) << failed.status();
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
}

}  // namespace
}  // namespace stoker
