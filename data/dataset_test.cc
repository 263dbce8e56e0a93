// LoadDataset and ProbeDatasetFiles over the three formats, with the same data in each.
#include "data/dataset.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using namespace ::stoker::testing;  // NOLINT: the test helpers
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kCount = 5;
constexpr int kHeight = 2, kWidth = 3;

// Pixel values of sample i, and its label.
std::vector<uint8_t> Pixels() {
  std::vector<uint8_t> pixels;
  for (int i = 0; i < kCount * kHeight * kWidth; ++i) pixels.push_back(static_cast<uint8_t>(i * 9));
  return pixels;
}
std::vector<uint8_t> Labels() { return {4, 0, 2, 2, 1}; }

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteGzip(dir_.File("images.gz"), IdxBytes({kCount, kHeight, kWidth}, Pixels()));
    WriteRaw(dir_.File("images.idx"), IdxBytes({kCount, kHeight, kWidth}, Pixels()));
    WriteRaw(dir_.File("labels.idx"), IdxBytes({kCount}, Labels()));
    WriteRaw(dir_.File("u8.npy"), NpyBytes("|u1", {kCount, kHeight, kWidth}, Pixels()));
    std::vector<float> floats;
    for (uint8_t p : Pixels()) floats.push_back(p / 255.f);
    WriteRaw(dir_.File("f32.npy"), NpyBytes("<f4", {kCount, kHeight * kWidth}, BytesOf(floats)));
    const std::vector<uint8_t> label_bytes = Labels();
    const std::vector<int64_t> labels(label_bytes.begin(), label_bytes.end());
    WriteRaw(dir_.File("labels.npy"), NpyBytes("<i8", {kCount}, BytesOf(labels)));
    std::string csv = "f0,f1,f2,f3,f4,f5,label\n";
    for (int i = 0; i < kCount; ++i) {
      for (int j = 0; j < kHeight * kWidth; ++j) {
        absl::StrAppendFormat(&csv, "%.9g,", floats[i * kHeight * kWidth + j]);
      }
      absl::StrAppend(&csv, Labels()[i], "\n");
    }
    WriteText(dir_.File("data.csv"), csv);
  }

  DatasetFiles Files(const std::string& format, const std::string& samples,
                     const std::string& labels) {
    DatasetFiles files;
    files.format = format;
    files.samples_path = dir_.File(samples);
    files.labels_path = labels.empty() ? "" : dir_.File(labels);
    files.label_column = -1;
    return files;
  }

  // LoadDataset and ProbeDatasetFiles agree.
  LabeledSamples LoadAndProbe(const DatasetFiles& files, int64_t limit) {
    absl::StatusOr<LabeledSamples> data = LoadDataset(files, limit);
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok()) return {};
    absl::StatusOr<DatasetSummary> summary = ProbeDatasetFiles(files, limit);
    EXPECT_TRUE(summary.ok()) << summary.status();
    if (summary.ok()) {
      EXPECT_EQ(summary->count, data->count);
      EXPECT_EQ(summary->sample_type, data->sample_type);
      EXPECT_EQ(summary->features, data->features);
      EXPECT_EQ(summary->sample_bytes, data->sample_bytes);
      EXPECT_EQ(summary->sample_dims, data->sample_dims);
      EXPECT_EQ(summary->classes, data->classes);
    }
    return *std::move(data);
  }

  TempDir dir_;
};

TEST_F(DatasetTest, Uint8FormatsGiveTheSameSamples) {
  for (const DatasetFiles& files :
       {Files("idx", "images.gz", "labels.idx"), Files("", "images.idx", "labels.idx"),
        Files("npy", "u8.npy", "labels.npy")}) {
    SCOPED_TRACE(files.samples_path);
    const LabeledSamples data = LoadAndProbe(files, 0);
    EXPECT_EQ(data.count, kCount);
    EXPECT_EQ(data.sample_type, SampleType::kUint8);
    EXPECT_THAT(data.sample_dims, ElementsAre(kHeight, kWidth));
    EXPECT_EQ(data.features, 6);
    EXPECT_EQ(data.sample_bytes, 6);
    EXPECT_EQ(data.samples, Pixels());
    EXPECT_EQ(data.labels, Labels());
    EXPECT_EQ(data.classes, 5);
  }
}

TEST_F(DatasetTest, Float32FormatsGiveTheSameSamples) {
  const LabeledSamples npy = LoadAndProbe(Files("npy", "f32.npy", "labels.npy"), 0);
  const LabeledSamples csv = LoadAndProbe(Files("csv", "data.csv", ""), 0);
  for (const LabeledSamples* data : {&npy, &csv}) {
    EXPECT_EQ(data->count, kCount);
    EXPECT_EQ(data->sample_type, SampleType::kFloat32);
    EXPECT_EQ(data->features, 6);
    EXPECT_EQ(data->sample_bytes, 24);
    EXPECT_EQ(data->labels, Labels());
  }
  EXPECT_EQ(npy.samples, csv.samples);  // %.9g prints a float so that it reads back exactly
  float value;
  std::memcpy(&value, npy.samples.data() + 4 * 7, 4);
  EXPECT_EQ(value, Pixels()[7] / 255.f);
}

TEST_F(DatasetTest, LimitKeepsTheFirstSamplesAndCountsTheirClasses) {
  for (const DatasetFiles& files :
       {Files("idx", "images.gz", "labels.idx"), Files("npy", "u8.npy", "labels.npy"),
        Files("csv", "data.csv", "")}) {
    SCOPED_TRACE(files.samples_path);
    const LabeledSamples data = LoadAndProbe(files, 3);
    EXPECT_EQ(data.count, 3);
    EXPECT_THAT(data.labels, ElementsAre(4, 0, 2));
    EXPECT_EQ(data.samples.size(), 3u * data.sample_bytes);
    EXPECT_EQ(data.classes, 5);
  }
  EXPECT_EQ(LoadAndProbe(Files("idx", "images.gz", "labels.idx"), 2).classes, 5);
  EXPECT_EQ(LoadAndProbe(Files("npy", "u8.npy", "labels.npy"), 1).classes, 5);
  EXPECT_EQ(LoadAndProbe(Files("npy", "u8.npy", "labels.npy"), 100).count, kCount);
}

// One label of 200 in a 10-class dataset used to make it a 201-class one, silently. Labels are
// checked against the declared class count, or, without one, may not skip classes.
TEST_F(DatasetTest, LabelsOutsideTheClassesAreRefusedNamingTheFirstSample) {
  for (DatasetFiles files : {Files("idx", "images.gz", "labels.idx"),
                             Files("npy", "u8.npy", "labels.npy"), Files("csv", "data.csv", "")}) {
    SCOPED_TRACE(files.samples_path);
    const std::string labels_file =
        files.labels_path.empty() ? files.samples_path : files.labels_path;
    files.classes = 10;  // labels 4, 0, 2, 2, 1
    EXPECT_EQ(LoadAndProbe(files, 0).classes, 10);
    files.classes = 3;
    for (const absl::Status& status :
         {LoadDataset(files, 0).status(), ProbeDatasetFiles(files, 0).status()}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
      EXPECT_EQ(status.message(), labels_file +
                                      ": sample index 0 has label 4; dataset.classes "
                                      "is 3, so labels must be 0 to 2");
    }
    files.classes_declared = false;  // the test split of a job that does not declare classes
    EXPECT_THAT(LoadDataset(files, 0).status().message(),
                HasSubstr("has label 4, but the training labels give classes 0 to 2"));

    files.classes = 0;
    files.every_class_present = true;  // the training split of such a job: no class skipped
    for (const absl::Status& status :
         {LoadDataset(files, 0).status(), ProbeDatasetFiles(files, 0).status()}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
      EXPECT_THAT(status.message(), HasSubstr(labels_file + ": sample index 0 has label 4, but "
                                                            "no sample has label 3: a wrong "
                                                            "label?"));
    }
    EXPECT_THAT(ProbeDatasetFiles(files, 3).status().message(),
                HasSubstr("sample index 0 has label 4, but no sample has label 1:"));
    files.every_class_present = false;
    EXPECT_EQ(LoadAndProbe(files, 0).classes, 5);  // as before: the largest label + 1
  }
}

TEST_F(DatasetTest, RejectsBadFileSets) {
  EXPECT_THAT(LoadDataset(Files("parquet", "u8.npy", "labels.npy"), 0).status().message(),
              HasSubstr("dataset format 'parquet' is not supported"));
  EXPECT_THAT(ProbeDatasetFiles(Files("csv", "data.csv", "labels.npy"), 0).status().message(),
              HasSubstr("a separate labels file"));
  EXPECT_THAT(LoadDataset(Files("npy", "u8.npy", ""), 0).status().message(),
              HasSubstr("no labels file"));
  // Samples that are labels, and counts that disagree.
  EXPECT_THAT(LoadDataset(Files("npy", "labels.npy", "labels.npy"), 0).status().message(),
              HasSubstr("samples must be uint8 or float32"));
  WriteRaw(dir_.File("four.npy"), NpyBytes("|u1", {4}, {1, 2, 3, 4}));
  for (const auto& probe : {true, false}) {
    const absl::Status status =
        probe ? ProbeDatasetFiles(Files("npy", "u8.npy", "four.npy"), 0).status()
              : LoadDataset(Files("npy", "u8.npy", "four.npy"), 0).status();
    EXPECT_THAT(status.message(),
                HasSubstr("holds 5 samples but " + dir_.File("four.npy") + " holds 4 labels"));
  }
  // An empty dataset.
  WriteRaw(dir_.File("empty.npy"), NpyBytes("|u1", {0, 3}, {}));
  WriteRaw(dir_.File("no-labels.npy"), NpyBytes("|u1", {0}, {}));
  EXPECT_THAT(LoadDataset(Files("npy", "empty.npy", "no-labels.npy"), 0).status().message(),
              HasSubstr("holds no samples"));
  EXPECT_THAT(ProbeDatasetFiles(Files("npy", "empty.npy", "no-labels.npy"), 0).status().message(),
              HasSubstr("holds no samples"));
  // Samples without features.
  WriteRaw(dir_.File("flat.npy"), NpyBytes("|u1", {5, 0}, {}));
  EXPECT_THAT(LoadDataset(Files("npy", "flat.npy", "labels.npy"), 0).status().message(),
              HasSubstr("samples have no features"));
}

TEST_F(DatasetTest, ProbeFindsTruncatedRawFilesFromTheirSize) {
  std::vector<uint8_t> bytes = IdxBytes({kCount, kHeight, kWidth}, Pixels());
  bytes.resize(bytes.size() - 1);
  WriteRaw(dir_.File("short.idx"), bytes);
  EXPECT_THAT(ProbeDatasetFiles(Files("idx", "short.idx", "labels.idx"), 0).status().message(),
              HasSubstr(dir_.File("short.idx") +
                        ": truncated: expected 30 data bytes after offset 16, got 29"));
  bytes = NpyBytes("<f4", {kCount, 6}, std::vector<uint8_t>(kCount * 24));
  bytes.resize(bytes.size() + 4);
  WriteRaw(dir_.File("long.npy"), bytes);
  EXPECT_THAT(ProbeDatasetFiles(Files("npy", "long.npy", "labels.npy"), 0).status().message(),
              HasSubstr("unexpected trailing data"));
  // IDX headers are checked too.
  WriteRaw(dir_.File("bad.idx"), {0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0});
  EXPECT_THAT(ProbeDatasetFiles(Files("idx", "bad.idx", "labels.idx"), 0).status().message(),
              HasSubstr("unsupported IDX element type 0x0d at offset 2"));
}

TEST(DatasetFashionMnistTest, ProbeMatchesLoad) {
  const std::string root = STOKER_FASHION_MNIST_DIR;
  if (!std::filesystem::exists(root + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << root;
  }
  DatasetFiles files;
  files.format = "idx";
  files.samples_path = root + "/t10k-images-idx3-ubyte.gz";
  files.labels_path = root + "/t10k-labels-idx1-ubyte.gz";
  absl::StatusOr<DatasetSummary> summary = ProbeDatasetFiles(files, 0);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->count, 10000);
  EXPECT_EQ(summary->features, 784);
  EXPECT_EQ(summary->sample_bytes, 784);
  EXPECT_THAT(summary->sample_dims, ElementsAre(28, 28));
  EXPECT_EQ(summary->classes, 10);
  absl::StatusOr<LabeledSamples> data = LoadDataset(files, 0);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 10000);
  EXPECT_EQ(data->classes, 10);
}

}  // namespace
}  // namespace stoker
