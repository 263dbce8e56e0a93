// The stoker-loader binary (worker/loader_main.cc) started as the agent starts it: fork + exec
// with the region fd inherited, the training set prepared in a file it maps, the job's spec in
// job.pb.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/loader.h"
#include "data/prepared_dataset.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stoker.pb.h"

namespace stoker {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr int kCount = 103;
constexpr int kBatchSize = 8;  // 13 batches per epoch, the last one of 7
constexpr uint64_t kSeed = 7;

// Byte 0 of a sample is its index.
LabeledSamples SmallData() {
  return testing::PatternSamples(kCount, {2, 3}, [](int i, int j) { return i + 37 * j; });
}

// FNV-1a over a batch stream: batch numbers, counts, samples and labels.
class StreamHash {
 public:
  void Add(const void* bytes, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      hash_ = (hash_ ^ static_cast<const uint8_t*>(bytes)[i]) * 0x100000001b3ull;
    }
  }
  void AddBatch(uint64_t batch, uint32_t count, const uint8_t* samples, const uint8_t* labels,
                int sample_bytes) {
    Add(&batch, sizeof(batch));
    Add(&count, sizeof(count));
    Add(samples, static_cast<size_t>(count) * sample_bytes);
    Add(labels, count);
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

uint64_t ExpectedStreamHash(const LabeledSamples& data, uint64_t total_batches) {
  BatchMaker maker(data, kBatchSize, kSeed);
  std::vector<uint8_t> samples(kBatchSize * data.sample_bytes), labels(kBatchSize);
  StreamHash hash;
  for (uint64_t b = 0; b < total_batches; ++b) {
    const uint32_t count = *maker.Make(b, samples.data(), labels.data());
    hash.AddBatch(b, count, samples.data(), labels.data(), data.sample_bytes);
  }
  return hash.value();
}

// A job on disk and a region, and the loader processes that fill it.
class LoaderProcessTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kEpochs = 2;

  void SetUp() override {
    data_ = SmallData();
    std::vector<int> image_dims = {kCount, 2, 3};
    testing::WriteGzip(dir_.File("images.gz"), testing::IdxBytes(image_dims, data_.samples));
    testing::WriteRaw(dir_.File("labels"), testing::IdxBytes({kCount}, data_.labels));
    WriteJob(dir_.File("images.gz"), dir_.File("labels"));
  }

  // The job's spec (the loader takes its seed, delay and augmentation from it) and, as the agent
  // does, its training set prepared into train.samples (`map_raw_sources` as PrepareOptions).
  void WriteJob(const std::string& images, const std::string& labels, int delay_ms = 0,
                const std::string& format = "idx", bool map_raw_sources = true) {
    v1::JobSpec spec;
    spec.set_name("loader-test");
    spec.mutable_dataset()->set_format(format);
    spec.mutable_dataset()->set_train_images(images);
    spec.mutable_dataset()->set_train_labels(labels);
    spec.mutable_train()->set_seed(kSeed);
    spec.mutable_train()->set_batch_size(kBatchSize);
    spec.mutable_loader()->set_delay_ms(delay_ms);
    *spec.mutable_loader()->mutable_augment() = augment_;
    std::ofstream out(dir_.File("job.pb"), std::ios::binary | std::ios::trunc);
    ASSERT_TRUE(spec.SerializeToOstream(&out));
    const DatasetFiles files = testing::Files(format, images, labels);
    absl::StatusOr<PreparedInfo> prepared = PrepareTrainingSet(
        files, 0, dir_.File("train.samples"), {.map_raw_sources = map_raw_sources});
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    prepared_storage_ = prepared->storage;
  }

  std::unique_ptr<JobRegion> MakeRegion(uint32_t loaders, uint32_t slots) {
    RingGeometry g;
    g.slot_count = slots;
    g.batch_size = kBatchSize;
    g.sample_bytes = static_cast<uint32_t>(data_.sample_bytes);
    g.sample_type = data_.sample_type;
    g.loader_count = loaders;
    g.total_batches = kEpochs * BatchesPerEpoch(kCount, kBatchSize);
    absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
    EXPECT_TRUE(region.ok()) << region.status();
    if (!region.ok()) return nullptr;
    (*region)->SetConsumerPid(getpid());
    return *std::move(region);
  }

  // Starts `stoker-loader` with the region fd inherited; its stderr goes to `stderr_path`.
  pid_t Spawn(const JobRegion& region, std::vector<std::string> args,
              const std::string& stderr_path = "/dev/null") {
    args.insert(args.begin(), STOKER_LOADER_PATH);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int fd = region.fd();
    const pid_t pid = fork();
    if (pid == 0) {
      const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (err < 0 || dup2(err, STDERR_FILENO) < 0 || !ClearCloexec(fd).ok()) _exit(120);
      execv(argv[0], argv.data());
      _exit(127);
    }
    EXPECT_GT(pid, 0);
    reaper_.Add(pid);
    return pid;
  }

  pid_t SpawnLoader(const JobRegion& region, int index) {
    return Spawn(region,
                 {"--region-fd", std::to_string(region.fd()), "--index", std::to_string(index),
                  "--job", dir_.File("job.pb"), "--data", dir_.File("train.samples")});
  }

  // Runs loader 0 of the job on `data`, expects exit code `code` and returns what it printed.
  std::string RunLoaderExpectingExit(const JobRegion& region, int code,
                                     const std::string& data = "") {
    const pid_t pid =
        Spawn(region,
              {"--region-fd", std::to_string(region.fd()), "--index", "0", "--job",
               dir_.File("job.pb"), "--data", data.empty() ? dir_.File("train.samples") : data},
              dir_.File("stderr"));
    EXPECT_EQ(ExitCode(pid), code);
    std::ifstream in(dir_.File("stderr"));
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }
  // Exit code 2: the job's data or options do not fit.
  std::string RunLoaderExpectingBadInput(const JobRegion& region) {
    return RunLoaderExpectingExit(region, 2);
  }

  // Exit code of `pid`, or -1 if it did not exit normally within the timeout.
  int ExitCode(pid_t pid, milliseconds timeout = milliseconds(5000)) {
    const int status = testing::WaitChild(pid, timeout);
    reaper_.Forget(pid);
    return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // Consumes batches [first, end) and adds them to `hash`.
  void Consume(JobRegion& region, uint64_t first, uint64_t end, StreamHash& hash) {
    for (uint64_t b = first; b < end; ++b) {
      absl::StatusOr<ReadableBatch> batch = region.WaitReadable(b, absl::Seconds(10));
      ASSERT_TRUE(batch.ok()) << "batch " << b << ": " << batch.status();
      hash.AddBatch(b, batch->count, batch->samples, batch->labels, data_.sample_bytes);
      region.Release(b);
    }
  }

  uint64_t RunWithLoaders(uint32_t loaders, uint32_t slots) {
    auto region = MakeRegion(loaders, slots);
    if (region == nullptr) return 0;
    std::vector<pid_t> pids;
    for (uint32_t k = 0; k < loaders; ++k) pids.push_back(SpawnLoader(*region, k));
    StreamHash hash;
    Consume(*region, 0, region->geometry().total_batches, hash);
    for (pid_t pid : pids) EXPECT_EQ(ExitCode(pid), 0);
    EXPECT_EQ(region->stats().loader_batches_total.load(), region->geometry().total_batches);
    EXPECT_GT(region->stats().loader_busy_ns_total.load(), 0u);
    return hash.value();
  }

  testing::TempDir dir_;
  testing::ChildReaper reaper_;
  LabeledSamples data_;
  v1::AugmentSpec augment_;
  SamplesStorage prepared_storage_ = SamplesStorage::kCopy;
};

TEST_F(LoaderProcessTest, StreamIsTheSameForAnyNumberOfLoaders) {
  const uint64_t expected = ExpectedStreamHash(data_, kEpochs * 13);
  ASSERT_EQ(prepared_storage_, SamplesStorage::kCopy);  // gzipped IDX: decoded into the file
  EXPECT_EQ(RunWithLoaders(1, 4), expected);
  EXPECT_EQ(RunWithLoaders(2, 4), expected);
  EXPECT_EQ(RunWithLoaders(3, 2), expected);
  EXPECT_EQ(RunWithLoaders(4, 4), expected);
}

// A raw IDX file is mapped in place (the prepared file holds the labels only), or copied: the
// same stream either way.
TEST_F(LoaderProcessTest, RawIdxMappedInPlaceOrCopiedGivesTheSameStream) {
  testing::WriteRaw(dir_.File("images.raw"), testing::IdxBytes({kCount, 2, 3}, data_.samples));
  const uint64_t expected = ExpectedStreamHash(data_, kEpochs * 13);
  WriteJob(dir_.File("images.raw"), dir_.File("labels"));
  ASSERT_EQ(prepared_storage_, SamplesStorage::kSource);
  EXPECT_LT(std::filesystem::file_size(dir_.File("train.samples")), 4096u);
  EXPECT_EQ(RunWithLoaders(2, 4), expected);
  WriteJob(dir_.File("images.raw"), dir_.File("labels"), 0, "idx", /*map_raw_sources=*/false);
  ASSERT_EQ(prepared_storage_, SamplesStorage::kCopy);
  EXPECT_EQ(RunWithLoaders(3, 2), expected);
}

// Every loader maps the one prepared file (shared page cache), none reads the dataset files.
TEST_F(LoaderProcessTest, LoadersMapTheOnePreparedFile) {
  auto region = MakeRegion(2, 2);
  ASSERT_NE(region, nullptr);
  const std::vector<pid_t> pids = {SpawnLoader(*region, 0), SpawnLoader(*region, 1)};
  // Both fill the ring and wait for the consumer: they have mapped their data by then.
  for (uint64_t b = 0; b < 2; ++b) ASSERT_TRUE(region->WaitReadable(b, absl::Seconds(10)).ok());
  const std::string prepared = std::filesystem::canonical(dir_.File("train.samples")).string();
  for (pid_t pid : pids) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string line, mapped;
    while (std::getline(maps, line)) {
      if (line.find(prepared) != std::string::npos) mapped = line;
    }
    // "r--s": read-only and shared.
    EXPECT_THAT(mapped, HasSubstr(" r--s ")) << "pid " << pid << " does not map " << prepared;
  }
  region->RequestStop();
  for (pid_t pid : pids) EXPECT_EQ(ExitCode(pid), 0);
}

// What `loader.processes: auto` does mid-job, through real loader processes: 4 loaders, then an
// era of 2 (loaders 2 and 3 finish what they owe and exit 0 before the job ends), then an era of
// 3 (loader 2 is started again). The stream is the one any fixed number of loaders makes.
TEST_F(LoaderProcessTest, ShrinkingAndGrowingTheLoaderCountKeepsTheStream) {
  const uint64_t total = kEpochs * 13;
  ASSERT_GE(total, 24u);
  auto region = MakeRegion(4, 3);
  ASSERT_NE(region, nullptr);
  std::vector<pid_t> pids;
  for (int k = 0; k < 4; ++k) pids.push_back(SpawnLoader(*region, k));
  StreamHash hash;
  Consume(*region, 0, 5, hash);
  ASSERT_TRUE(region->ChangeLoaderCount(5 + 3, 2).ok());
  Consume(*region, 5, 12, hash);
  // Loaders 2 and 3 own nothing from batch 8 on: they are done, long before the job is.
  EXPECT_EQ(ExitCode(pids[2]), 0);
  EXPECT_EQ(ExitCode(pids[3]), 0);
  ASSERT_TRUE(region->ChangeLoaderCount(20, 3).ok());
  pids[2] = SpawnLoader(*region, 2);
  Consume(*region, 12, total, hash);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(ExitCode(pids[k]), 0) << "loader " << k;
  EXPECT_EQ(hash.value(), ExpectedStreamHash(data_, total));
  EXPECT_EQ(region->stats().loader_batches_total.load(), total);
}

// The same samples as float32 (value = byte / 4), written as NPY and as CSV.
LabeledSamples FloatData(const LabeledSamples& bytes) {
  LabeledSamples data = bytes;
  data.sample_type = SampleType::kFloat32;
  data.sample_bytes = data.features * 4;
  std::vector<float> values;
  for (uint8_t b : bytes.samples) values.push_back(b / 4.0f);
  data.samples = testing::BytesOf(values);
  return data;
}

TEST_F(LoaderProcessTest, Float32NpyAndCsvStreamThroughLoaderProcesses) {
  data_ = FloatData(data_);
  std::vector<float> values(data_.samples.size() / 4);
  std::memcpy(values.data(), data_.samples.data(), data_.samples.size());
  testing::WriteRaw(dir_.File("x.npy"),
                    testing::NpyBytes("<f4", {kCount, 2, 3}, data_.samples, /*major=*/2));
  const std::vector<int64_t> labels(data_.labels.begin(), data_.labels.end());
  testing::WriteRaw(dir_.File("y.npy"),
                    testing::NpyBytes("<i8", {kCount}, testing::BytesOf(labels)));
  std::string csv = "label,f0,f1,f2,f3,f4,f5\n";
  for (int i = 0; i < kCount; ++i) {
    csv += std::to_string(data_.labels[i]);
    for (int j = 0; j < 6; ++j) absl::StrAppend(&csv, ",", values[i * 6 + j]);
    csv += "\n";
  }
  testing::WriteText(dir_.File("d.csv"), csv);
  const uint64_t expected = ExpectedStreamHash(data_, kEpochs * 13);

  WriteJob(dir_.File("x.npy"), dir_.File("y.npy"), 0, "npy");
  EXPECT_EQ(prepared_storage_, SamplesStorage::kSource);
  EXPECT_EQ(RunWithLoaders(2, 4), expected);
  WriteJob(dir_.File("x.npy"), dir_.File("y.npy"), 0, "npy", /*map_raw_sources=*/false);
  EXPECT_EQ(prepared_storage_, SamplesStorage::kCopy);
  EXPECT_EQ(RunWithLoaders(2, 4), expected);
  WriteJob(dir_.File("d.csv"), "", 0, "csv");
  EXPECT_EQ(prepared_storage_, SamplesStorage::kCopy);
  EXPECT_EQ(RunWithLoaders(3, 2), expected);
}

TEST_F(LoaderProcessTest, SampleTypeMismatchExitsTwo) {
  data_ = FloatData(data_);  // the region expects float32; the job's IDX files are uint8
  auto region = MakeRegion(1, 2);
  ASSERT_NE(region, nullptr);
  const std::string message = RunLoaderExpectingBadInput(*region);
  EXPECT_THAT(message, HasSubstr("samples are uint8 but the ring's slots hold float32 samples"));
}

// An augmentation that does not fit the samples (2x3 images cannot take a crop padding of 3) is
// the job's error: exit 2, for good.
TEST_F(LoaderProcessTest, AugmentationThatDoesNotFitExitsTwo) {
  augment_.set_crop_padding(3);
  WriteJob(dir_.File("images.gz"), dir_.File("labels"));
  auto region = MakeRegion(1, 2);
  ASSERT_NE(region, nullptr);
  const std::string message = RunLoaderExpectingBadInput(*region);
  EXPECT_THAT(message, HasSubstr(dir_.File("train.samples")));
  EXPECT_THAT(message, HasSubstr("crop_padding 3 must be in [0, 2] for images of 2x3"));
}

// The agent refuses an unknown format when it prepares the training set; a file the loader does
// not know is refused by its magic (exit 1: the next attempt prepares the data again).
TEST_F(LoaderProcessTest, UnknownFormatAndUnknownFileAreRefused) {
  const DatasetFiles files = testing::Files("hdf5", dir_.File("images.gz"), dir_.File("labels"));
  const absl::Status status = PrepareTrainingSet(files, 0, dir_.File("other.samples")).status();
  EXPECT_THAT(status.message(), HasSubstr("dataset format 'hdf5' is not supported"));
  EXPECT_FALSE(std::filesystem::exists(dir_.File("other.samples")));
  auto region = MakeRegion(1, 2);
  ASSERT_NE(region, nullptr);
  const std::string message = RunLoaderExpectingExit(*region, 1, dir_.File("images.gz"));
  EXPECT_THAT(message, HasSubstr(dir_.File("images.gz") + ": not a prepared dataset"));
}

TEST_F(LoaderProcessTest, KilledLoaderIsReplacedAndStreamIsUnchanged) {
  const uint64_t total = kEpochs * 13;
  auto region = MakeRegion(2, 3);
  ASSERT_NE(region, nullptr);
  const pid_t first = SpawnLoader(*region, 0);
  pid_t second = SpawnLoader(*region, 1);
  StreamHash hash;
  Consume(*region, 0, 9, hash);
  // Loader 1 has published what fits in the ring and waits for a slot; kill it mid-job.
  ASSERT_EQ(kill(second, SIGKILL), 0);
  EXPECT_EQ(ExitCode(second), -1);
  second = SpawnLoader(*region, 1);
  Consume(*region, 9, total, hash);
  EXPECT_EQ(ExitCode(first), 0);
  EXPECT_EQ(ExitCode(second), 0);
  EXPECT_EQ(hash.value(), ExpectedStreamHash(data_, total));
}

TEST_F(LoaderProcessTest, StopEndsLoadersQuietly) {
  WriteJob(dir_.File("images.gz"), dir_.File("labels"), /*delay_ms=*/1);
  auto region = MakeRegion(2, 2);
  ASSERT_NE(region, nullptr);
  const pid_t a = SpawnLoader(*region, 0);
  const pid_t b = SpawnLoader(*region, 1);
  StreamHash hash;
  Consume(*region, 0, 3, hash);
  region->RequestStop();
  EXPECT_EQ(ExitCode(a, milliseconds(1000)), 0);
  EXPECT_EQ(ExitCode(b, milliseconds(1000)), 0);
}

// A truncated dataset file is refused when the training set is prepared (both ways), naming the
// file and what is missing; a truncated or corrupt prepared file is refused by the loader, naming
// it and the byte offset (exit 1: the next attempt prepares it again).
TEST_F(LoaderProcessTest, CorruptDataIsRefusedNamingTheFile) {
  std::vector<uint8_t> truncated = testing::IdxBytes({kCount, 2, 3}, data_.samples);
  truncated.resize(truncated.size() - 5);
  testing::WriteRaw(dir_.File("short-images"), truncated);
  for (bool map_raw_sources : {true, false}) {
    const DatasetFiles files =
        testing::Files("idx", dir_.File("short-images"), dir_.File("labels"));
    const absl::Status status = PrepareTrainingSet(files, 0, dir_.File("short.samples"),
                                                   {.map_raw_sources = map_raw_sources})
                                    .status();
    EXPECT_THAT(status.message(), HasSubstr(dir_.File("short-images")));
    EXPECT_THAT(status.message(), HasSubstr("expected 618 data bytes after offset 16, got 613"));
  }

  auto region = MakeRegion(1, 2);
  ASSERT_NE(region, nullptr);
  std::vector<uint8_t> prepared = testing::ReadRaw(dir_.File("train.samples"));
  prepared.resize(prepared.size() - 5);
  testing::WriteRaw(dir_.File("cut.samples"), prepared);
  std::string message = RunLoaderExpectingExit(*region, 1, dir_.File("cut.samples"));
  EXPECT_THAT(message, HasSubstr(dir_.File("cut.samples") + ": truncated"));
  prepared = testing::ReadRaw(dir_.File("train.samples"));
  prepared[24] ^= 1;  // the sample count
  testing::WriteRaw(dir_.File("bad.samples"), prepared);
  message = RunLoaderExpectingExit(*region, 1, dir_.File("bad.samples"));
  EXPECT_THAT(message, HasSubstr(dir_.File("bad.samples") + ": corrupt header: checksum"));
  EXPECT_EQ(region->stats().loader_batches_total.load(), 0u);
}

// A prepared file cut short under a running loader: its next read of the lost pages raises SIGBUS,
// which it reports, naming the file, and exits 1 (the agent respawns it; the respawned loader
// then refuses the file as truncated).
TEST_F(LoaderProcessTest, AFileTruncatedUnderARunningLoaderIsReportedNotACrash) {
  auto region = MakeRegion(1, 2);
  ASSERT_NE(region, nullptr);
  const pid_t pid = Spawn(*region,
                          {"--region-fd", std::to_string(region->fd()), "--index", "0", "--job",
                           dir_.File("job.pb"), "--data", dir_.File("train.samples")},
                          dir_.File("stderr"));
  for (uint64_t b = 0; b < 2; ++b) ASSERT_TRUE(region->WaitReadable(b, absl::Seconds(10)).ok());
  ASSERT_EQ(truncate(dir_.File("train.samples").c_str(), 4096), 0);  // the samples are gone
  region->Release(0);
  region->Release(1);
  EXPECT_EQ(ExitCode(pid), 1);
  std::ifstream in(dir_.File("stderr"));
  const std::string message((std::istreambuf_iterator<char>(in)), {});
  EXPECT_THAT(message, HasSubstr("stoker-loader[0]: SIGBUS reading the mapped training set: " +
                                 dir_.File("train.samples")));
  EXPECT_THAT(RunLoaderExpectingExit(*region, 1),
              HasSubstr(dir_.File("train.samples") + ": truncated"));
}

// A data-parallel job through real loader processes: each of N ranks has its own region (batch
// kBatchSize, total_batches counting the job's global batches of N x kBatchSize) filled by two
// loaders started with --rank r --replicas N; batch b of the ranks, put together in rank order,
// is batch b of one rank with batch N x kBatchSize, augmentation included. 103 samples leave a
// last global batch of 7: rank 0's alone, the other ranks publish it empty (count 0).
TEST_F(LoaderProcessTest, RanksTogetherMakeTheStreamOfOneRankWithTheGlobalBatch) {
  augment_.set_crop_padding(1);
  augment_.set_horizontal_flip(true);
  WriteJob(dir_.File("images.gz"), dir_.File("labels"));
  for (const uint32_t replicas : {2u, 3u}) {
    SCOPED_TRACE(::testing::Message() << replicas << " ranks");
    const int64_t per_epoch = BatchesPerEpoch(kCount, replicas * kBatchSize);
    std::vector<std::unique_ptr<JobRegion>> regions;
    std::vector<pid_t> pids;
    for (uint32_t r = 0; r < replicas; ++r) {
      RingGeometry g;
      g.slot_count = 3;
      g.batch_size = kBatchSize;
      g.sample_bytes = static_cast<uint32_t>(data_.sample_bytes);
      g.loader_count = 2;
      g.total_batches = kEpochs * per_epoch;
      absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
      ASSERT_TRUE(region.ok()) << region.status();
      (*region)->SetConsumerPid(getpid());
      for (int k = 0; k < 2; ++k) {
        pids.push_back(Spawn(
            **region, {"--region-fd", std::to_string((*region)->fd()), "--index", std::to_string(k),
                       "--job", dir_.File("job.pb"), "--data", dir_.File("train.samples"), "--rank",
                       std::to_string(r), "--replicas", std::to_string(replicas)}));
      }
      regions.push_back(*std::move(region));
    }
    BatchMaker single(data_, replicas * kBatchSize, kSeed,
                      AugmentOptions{.crop_padding = 1, .horizontal_flip = true});
    std::vector<uint8_t> samples(replicas * kBatchSize * data_.sample_bytes);
    std::vector<uint8_t> labels(replicas * kBatchSize);
    int empty = 0;
    for (uint64_t b = 0; b < kEpochs * per_epoch; ++b) {
      std::vector<uint8_t> joined_samples, joined_labels;
      for (uint32_t r = 0; r < replicas; ++r) {
        absl::StatusOr<ReadableBatch> batch = regions[r]->WaitReadable(b, absl::Seconds(10));
        ASSERT_TRUE(batch.ok()) << "rank " << r << " batch " << b << ": " << batch.status();
        empty += batch->count == 0;
        joined_samples.insert(joined_samples.end(), batch->samples,
                              batch->samples + batch->count * data_.sample_bytes);
        joined_labels.insert(joined_labels.end(), batch->labels, batch->labels + batch->count);
        regions[r]->Release(b);
      }
      const uint32_t count = *single.Make(b, samples.data(), labels.data());
      ASSERT_EQ(joined_labels.size(), count) << "batch " << b;
      EXPECT_TRUE(std::equal(joined_samples.begin(), joined_samples.end(), samples.begin()))
          << "batch " << b;
      EXPECT_TRUE(std::equal(joined_labels.begin(), joined_labels.end(), labels.begin()))
          << "batch " << b;
    }
    // The last global batch of each epoch: every rank but rank 0 had nothing.
    EXPECT_EQ(empty, static_cast<int>(kEpochs * (replicas - 1)));
    for (pid_t pid : pids) EXPECT_EQ(ExitCode(pid), 0);
    for (const auto& region : regions) {
      EXPECT_EQ(region->stats().loader_batches_total.load(), kEpochs * per_epoch);
    }
  }
}

TEST_F(LoaderProcessTest, BadArgumentsExit64) {
  auto region = MakeRegion(2, 2);
  ASSERT_NE(region, nullptr);
  const std::string fd = std::to_string(region->fd());
  EXPECT_EQ(ExitCode(Spawn(*region, {"--region-fd", fd, "--index", "0"})), 64);
  EXPECT_EQ(
      ExitCode(Spawn(*region, {"--region-fd", fd, "--index", "0", "--job", dir_.File("job.pb")})),
      64)
      << "no --data";
  EXPECT_EQ(ExitCode(Spawn(*region, {"--region-fd", "x", "--index", "0", "--job", "j"})), 64);
  EXPECT_EQ(ExitCode(Spawn(*region, {"--bogus", "1"})), 64);
  const std::string data = dir_.File("train.samples");
  // Index out of range for a 2-loader region.
  EXPECT_EQ(ExitCode(Spawn(*region, {"--region-fd", fd, "--index", "2", "--job",
                                     dir_.File("job.pb"), "--data", data})),
            64);
  // Ranks outside the replicas, and replicas outside 1..256.
  for (const auto& [rank, replicas] : std::vector<std::pair<std::string, std::string>>{
           {"2", "2"}, {"0", "0"}, {"0", "257"}, {"-1", "2"}, {"x", "2"}}) {
    EXPECT_EQ(
        ExitCode(Spawn(*region, {"--region-fd", fd, "--index", "0", "--job", dir_.File("job.pb"),
                                 "--data", data, "--rank", rank, "--replicas", replicas})),
        64)
        << "--rank " << rank << " --replicas " << replicas;
  }
  // A region fd that is not a region.
  EXPECT_EQ(ExitCode(Spawn(*region, {"--region-fd", "0", "--index", "0", "--job",
                                     dir_.File("job.pb"), "--data", data})),
            1);
  // No such prepared file.
  EXPECT_EQ(ExitCode(Spawn(*region, {"--region-fd", fd, "--index", "0", "--job",
                                     dir_.File("job.pb"), "--data", dir_.File("none")})),
            1);
}

}  // namespace
}  // namespace stoker
