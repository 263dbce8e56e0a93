// The prepared training set: what PrepareTrainingSet writes for each format maps back to what
// LoadDataset reads; truncated, corrupt or stale files are errors naming them; a failed write
// leaves nothing behind; batches from a mapping are the batches of the data in memory.
#include "data/prepared_dataset.h"

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/loader.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using ::testing::HasSubstr;

constexpr int kCount = 23;

// 23 samples of {3, 2, 2} (channels first): byte j of sample i is 7i + j; labels i % 5.
LabeledSamples Bytes() {
  LabeledSamples data =
      testing::PatternSamples(kCount, {3, 2, 2}, [](int i, int j) { return 7 * i + j; });
  for (uint8_t& label : data.labels) label %= 5;
  data.classes = 5;
  return data;
}

LabeledSamples Floats() {
  LabeledSamples data = Bytes();
  data.sample_type = SampleType::kFloat32;
  data.sample_bytes = data.features * 4;
  std::vector<float> values;
  for (uint8_t b : data.samples) values.push_back(b * 0.25f - 3.0f);
  data.samples = testing::BytesOf(values);
  return data;
}

// Every field and byte of the view against what LoadDataset gives.
void ExpectSameData(const SamplesView& got, const LabeledSamples& want) {
  ASSERT_EQ(got.count, want.count);
  EXPECT_EQ(got.sample_type, want.sample_type);
  EXPECT_EQ(got.features, want.features);
  EXPECT_EQ(got.sample_bytes, want.sample_bytes);
  EXPECT_EQ(got.sample_dims, want.sample_dims);
  EXPECT_EQ(got.classes, want.classes);
  EXPECT_EQ(std::memcmp(got.samples, want.samples.data(), want.samples.size()), 0);
  EXPECT_EQ(std::memcmp(got.labels, want.labels.data(), want.labels.size()), 0);
}

// Runs `body` in a child process whose files may not grow past 5096 bytes (RLIMIT_FSIZE, with
// SIGXFSZ ignored, so a write past it fails with EFBIG) and returns the child's exit code (-1 if
// it did not exit). The limit stays in the child: the test process keeps writing freely.
int ExitCodeUnderFileSizeLimit(const std::function<int()>& body) {
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{.rlim_cur = 4096 + 1000, .rlim_max = RLIM_INFINITY};
    setrlimit(RLIMIT_FSIZE, &limit);
    _exit(body());
  }
  int wait_status = 0;
  if (waitpid(child, &wait_status, 0) != child || !WIFEXITED(wait_status)) return -1;
  return WEXITSTATUS(wait_status);
}

struct Case {
  const char* name;
  DatasetFiles files;
  SamplesStorage storage;  // with map_raw_sources
};

class PreparedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const LabeledSamples bytes = Bytes();
    std::vector<int> dims = {kCount};
    dims.insert(dims.end(), bytes.sample_dims.begin(), bytes.sample_dims.end());
    testing::WriteGzip(File("images.gz"), testing::IdxBytes(dims, bytes.samples));
    testing::WriteRaw(File("images.idx"), testing::IdxBytes(dims, bytes.samples));
    testing::WriteGzip(File("labels.gz"), testing::IdxBytes({kCount}, bytes.labels));
    testing::WriteRaw(File("u8.npy"), testing::NpyBytes("|u1", {kCount, 3, 2, 2}, bytes.samples));
    testing::WriteRaw(File("f32.npy"),
                      testing::NpyBytes("<f4", {kCount, 3, 2, 2}, Floats().samples, 2));
    const std::vector<int64_t> labels(bytes.labels.begin(), bytes.labels.end());
    testing::WriteRaw(File("labels.npy"),
                      testing::NpyBytes("<i8", {kCount}, testing::BytesOf(labels)));
    std::string csv = "label,a,b,c,d,e,f,g,h,i,j,k,l\n";
    const LabeledSamples floats = Floats();
    for (int i = 0; i < kCount; ++i) {
      csv += std::to_string(bytes.labels[i]);
      for (int j = 0; j < 12; ++j) {
        float v;
        std::memcpy(&v, floats.samples.data() + (i * 12 + j) * 4, 4);
        absl::StrAppend(&csv, ",", v);
      }
      csv += "\n";
    }
    testing::WriteText(File("data.csv"), csv);
  }

  std::string File(const std::string& name) const { return dir_.File(name); }

  // The same data in each format (and how PrepareTrainingSet stores it by default).
  std::vector<Case> Cases() const {
    return {
        {"idx gz", testing::Files("idx", File("images.gz"), File("labels.gz")),
         SamplesStorage::kCopy},
        {"idx raw", testing::Files("", File("images.idx"), File("labels.gz")),
         SamplesStorage::kSource},
        {"npy uint8", testing::Files("npy", File("u8.npy"), File("labels.npy")),
         SamplesStorage::kSource},
        {"npy float32", testing::Files("npy", File("f32.npy"), File("labels.npy")),
         SamplesStorage::kSource},
        {"csv", testing::Files("csv", File("data.csv")), SamplesStorage::kCopy},
    };
  }

  // Files left in the directory whose names start with `prefix`.
  std::vector<std::string> Leftovers(const std::string& prefix) const {
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(File(""))) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) == 0) found.push_back(name);
    }
    return found;
  }

  testing::TempDir dir_;
};

TEST_F(PreparedDatasetTest, EveryFormatRoundTripsAsLoadDatasetReadsIt) {
  for (const Case& c : Cases()) {
    for (bool map_raw : {true, false}) {
      for (int64_t limit : {0, 7}) {
        SCOPED_TRACE(::testing::Message()
                     << c.name << (map_raw ? " mapped" : " copied") << " limit " << limit);
        const std::string path = File("train.samples");
        absl::StatusOr<PreparedInfo> info =
            PrepareTrainingSet(c.files, limit, path, {.map_raw_sources = map_raw});
        ASSERT_TRUE(info.ok()) << info.status();
        EXPECT_EQ(info->storage, map_raw ? c.storage : SamplesStorage::kCopy);
        EXPECT_EQ(info->file_bytes, std::filesystem::file_size(path));
        absl::StatusOr<LabeledSamples> want = LoadDataset(c.files, limit);
        ASSERT_TRUE(want.ok()) << want.status();
        EXPECT_EQ(info->summary.count, want->count);
        EXPECT_EQ(info->summary.sample_dims, want->sample_dims);
        EXPECT_EQ(info->summary.classes, want->classes);
        absl::StatusOr<std::unique_ptr<MappedSamples>> mapped = MappedSamples::Open(path);
        ASSERT_TRUE(mapped.ok()) << mapped.status();
        ExpectSameData((*mapped)->view(), *want);
        EXPECT_EQ((*mapped)->samples_path(),
                  info->storage == SamplesStorage::kSource ? c.files.samples_path : path);
        if (info->storage == SamplesStorage::kCopy) {
          // The samples start on a page of their own, after the labels.
          EXPECT_EQ((*mapped)->layout().samples_offset % 4096, 0u);
          EXPECT_EQ(info->file_bytes, (*mapped)->layout().samples_offset +
                                          static_cast<uint64_t>(want->count) * want->sample_bytes);
        } else {
          EXPECT_EQ(info->file_bytes, (*mapped)->layout().labels_offset + want->count);
        }
        EXPECT_TRUE(Leftovers("train.samples.tmp").empty());
      }
    }
  }
}

TEST_F(PreparedDatasetTest, ClassesAreTheDeclaredOnesOrTheLabelsAndAreChecked) {
  DatasetFiles files = testing::Files("npy", File("u8.npy"), File("labels.npy"));
  for (bool map_raw : {true, false}) {
    files.classes = 12;
    absl::StatusOr<PreparedInfo> info =
        PrepareTrainingSet(files, 0, File("a.samples"), {.map_raw_sources = map_raw});
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->summary.classes, 12);
    absl::StatusOr<std::unique_ptr<MappedSamples>> mapped = MappedSamples::Open(File("a.samples"));
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    EXPECT_EQ((*mapped)->view().classes, 12);
    files.classes = 0;  // the labels' max + 1
    info = PrepareTrainingSet(files, 0, File("b.samples"), {.map_raw_sources = map_raw});
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->summary.classes, 5);
    // Declared below a label: refused, naming the labels file and the sample; no file written.
    files.classes = 3;
    const absl::Status refused =
        PrepareTrainingSet(files, 0, File("c.samples"), {.map_raw_sources = map_raw}).status();
    EXPECT_TRUE(absl::IsOutOfRange(refused)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr(File("labels.npy") + ": sample index 3 has label 3"));
    EXPECT_FALSE(std::filesystem::exists(File("c.samples")));
    EXPECT_TRUE(Leftovers("c.samples").empty());
  }
}

TEST_F(PreparedDatasetTest, TruncationsAreErrorsNamingTheFile) {
  for (const char* source : {"images.gz", "images.idx"}) {
    const DatasetFiles files = testing::Files("idx", File(source), File("labels.gz"));
    ASSERT_TRUE(PrepareTrainingSet(files, 0, File("train.samples")).ok());
    const std::vector<uint8_t> whole = testing::ReadRaw(File("train.samples"));
    // Every length through the header and labels, then a stride through the samples (the parser
    // meets every length in ParseStaysInsideItsBytes, without the file system).
    for (size_t size = 0; size < whole.size(); size += size < 160 ? 1 : 97) {
      testing::WriteRaw(File("cut.samples"),
                        std::vector<uint8_t>(whole.begin(), whole.begin() + size));
      absl::StatusOr<std::unique_ptr<MappedSamples>> mapped =
          MappedSamples::Open(File("cut.samples"));
      ASSERT_FALSE(mapped.ok()) << source << " cut to " << size;
      EXPECT_THAT(mapped.status().message(), HasSubstr(File("cut.samples") + ": ")) << size;
      if (size >= 88) {
        EXPECT_THAT(mapped.status().message(), HasSubstr("truncated")) << size;
      }
    }
    // One byte more is as wrong.
    std::vector<uint8_t> longer = whole;
    longer.push_back(0);
    testing::WriteRaw(File("long.samples"), longer);
    EXPECT_THAT(MappedSamples::Open(File("long.samples")).status().message(),
                HasSubstr("unexpected trailing data"));
  }
}

TEST_F(PreparedDatasetTest, CorruptHeadersAndLabelsAreErrorsWithTheirOffset) {
  const DatasetFiles files = testing::Files("idx", File("images.gz"), File("labels.gz"));
  ASSERT_TRUE(PrepareTrainingSet(files, 0, File("train.samples")).ok());
  const std::vector<uint8_t> good = testing::ReadRaw(File("train.samples"));
  absl::StatusOr<std::unique_ptr<MappedSamples>> mapped =
      MappedSamples::Open(File("train.samples"));
  ASSERT_TRUE(mapped.ok());
  const size_t header_bytes = (*mapped)->layout().labels_offset;
  ASSERT_EQ(header_bytes, 88u + 4 * 3);
  // Any bit of the header flipped: refused (the magic by name, the rest by the checksum).
  for (size_t at = 0; at < header_bytes; ++at) {
    for (int bit : {0, 7}) {
      std::vector<uint8_t> bad = good;
      bad[at] ^= static_cast<uint8_t>(1 << bit);
      testing::WriteRaw(File("bad.samples"), bad);
      const absl::Status status = MappedSamples::Open(File("bad.samples")).status();
      ASSERT_FALSE(status.ok()) << "byte " << at << " bit " << bit;
      EXPECT_THAT(status.message(), HasSubstr(File("bad.samples") + ": ")) << at;
    }
  }
  // A label outside the classes (5): the sample and the byte offset.
  std::vector<uint8_t> bad = good;
  bad[header_bytes + 9] = 200;
  testing::WriteRaw(File("bad.samples"), bad);
  absl::Status status = MappedSamples::Open(File("bad.samples")).status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("label 200 of sample 9 is not below 5 classes (byte "
                                          "offset " +
                                          std::to_string(header_bytes + 9) + ")"));
  // Another version, checksum and all: an agent and a loader from different builds.
  bad = good;
  bad[8] = 2;
  bad[16] = bad[17] = bad[18] = bad[19] = 0;
  testing::WriteRaw(File("bad.samples"), bad);
  status = MappedSamples::Open(File("bad.samples")).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("version 2; this build reads version 1"));
  // Not a prepared file at all.
  EXPECT_THAT(MappedSamples::Open(File("images.gz")).status().message(),
              HasSubstr("not a prepared samples file"));
}

// The parser reads nothing outside the bytes it is given (ASan checks this in the fuzz target):
// every prefix of a good file, in a buffer of exactly that size, is refused.
TEST_F(PreparedDatasetTest, ParseStaysInsideItsBytes) {
  for (const char* source : {"images.gz", "images.idx"}) {
    const DatasetFiles files = testing::Files("idx", File(source), File("labels.gz"));
    ASSERT_TRUE(PrepareTrainingSet(files, 0, File("train.samples")).ok());
    const std::vector<uint8_t> good = testing::ReadRaw(File("train.samples"));
    for (size_t size = 0; size < good.size(); ++size) {
      const std::vector<uint8_t> copy(good.begin(), good.begin() + size);
      EXPECT_FALSE(ParsePreparedSamples("x", copy.data(), size).ok()) << source << " " << size;
    }
    const absl::StatusOr<PreparedLayout> layout =
        ParsePreparedSamples("x", good.data(), good.size());
    ASSERT_TRUE(layout.ok()) << layout.status();
    if (std::string(source) == "images.idx") {
      EXPECT_EQ(layout->source_path, File("images.idx"));
      EXPECT_EQ(layout->samples_offset, 20u);  // the IDX magic, then 4 dims (count, 3, 2, 2)
    } else {
      EXPECT_EQ(layout->source_path, "");
      EXPECT_EQ(layout->samples_offset, 4096u);
    }
  }
}

TEST_F(PreparedDatasetTest, ASourceThatChangedIsRefusedNotMapped) {
  const DatasetFiles files = testing::Files("npy", File("u8.npy"), File("labels.npy"));
  ASSERT_TRUE(PrepareTrainingSet(files, 0, File("train.samples")).ok());
  ASSERT_TRUE(MappedSamples::Open(File("train.samples")).ok());
  // Truncated: mapping it would fault past its end.
  std::vector<uint8_t> source = testing::ReadRaw(File("u8.npy"));
  testing::WriteRaw(File("u8.npy"), std::vector<uint8_t>(source.begin(), source.end() - 40));
  absl::Status status = MappedSamples::Open(File("train.samples")).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(File("u8.npy") + ": changed since the training set"));
  // Rewritten with other bytes of the same size: the modification time tells.
  source[source.size() - 1] ^= 0xff;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  testing::WriteRaw(File("u8.npy"), source);
  status = MappedSamples::Open(File("train.samples")).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  // Gone.
  std::filesystem::remove(File("u8.npy"));
  status = MappedSamples::Open(File("train.samples")).status();
  EXPECT_THAT(status.message(), HasSubstr(File("u8.npy") + ": cannot open"));
}

TEST_F(PreparedDatasetTest, WriteRefusesWhatTheFormatCannotHold) {
  LabeledSamples data = Bytes();
  data.classes = 0;
  EXPECT_THAT(WritePreparedSamples(View(data), File("x.samples")).message(),
              HasSubstr("classes must be 1 to 256, not 0"));
  data.classes = 4;  // label 4 occurs
  EXPECT_THAT(WritePreparedSamples(View(data), File("x.samples")).message(),
              HasSubstr("sample index 4 has label 4, not below classes 4"));
  data.classes = 5;
  data.sample_dims = std::vector<int>(17, 1);
  data.sample_dims[0] = 12;
  EXPECT_THAT(WritePreparedSamples(View(data), File("x.samples")).message(),
              HasSubstr("samples have 17 dimensions"));
  data.sample_dims = {3, 2, 2};
  data.sample_bytes = 13;
  EXPECT_THAT(WritePreparedSamples(View(data), File("x.samples")).message(),
              HasSubstr("samples of 13 bytes do not match their dimensions"));
  EXPECT_TRUE(Leftovers("x.samples").empty());
}

// A write that fails midway (here: the file size limit) names the file, says how far it got, and
// leaves neither the file nor its temporary behind; a file already there stays as it was.
TEST_F(PreparedDatasetTest, AFailedWriteNamesTheFileAndRemovesIt) {
  testing::WriteText(File("train.samples"), "an older file");
  const int exit_code = ExitCodeUnderFileSizeLimit([&] {
    LabeledSamples big =
        testing::PatternSamples(1000, {28, 28}, [](int i, int j) { return i ^ j; });
    const absl::Status status = WritePreparedSamples(View(big), File("train.samples"));
    const std::string message(status.message());
    const bool named = absl::IsUnavailable(status) &&
                       message == File("train.samples") +
                                      ": cannot write the prepared training set: File too large "
                                      "(0.0 of 0.8 MiB written; the partial file is removed)";
    return status.ok() ? 10 : !named ? (fprintf(stderr, "%s\n", message.c_str()), 11) : 0;
  });
  EXPECT_EQ(exit_code, 0);
  EXPECT_EQ(Leftovers("train.samples"), std::vector<std::string>{"train.samples"});
  EXPECT_EQ(testing::ReadRaw(File("train.samples")).size(), 13u) << "the older file is kept";
}

// A full disk, where this machine lets an unprivileged process mount a small tmpfs of its own (a
// user and mount namespace); skipped where it does not.
TEST_F(PreparedDatasetTest, AFullDiskNamesTheFileAndWhatToDo) {
  const std::string mount_point = File("small");
  std::filesystem::create_directories(mount_point);
  const uid_t uid = getuid();
  const gid_t gid = getgid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A mount namespace of our own (as root), else a user namespace too, mapping us to its root.
    if (unshare(CLONE_NEWNS) != 0) {
      if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) _exit(77);
      auto write_file = [](const std::string& path, const std::string& text) {
        FILE* f = fopen(path.c_str(), "w");
        const bool ok = f != nullptr && fputs(text.c_str(), f) >= 0;
        return f != nullptr && fclose(f) == 0 && ok;
      };
      if (!write_file("/proc/self/setgroups", "deny") ||
          !write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
          !write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")) {
        _exit(77);
      }
    }
    // Nothing mounted here may reach the machine's namespace.
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(77);
    if (mount("stoker-test", mount_point.c_str(), "tmpfs", 0, "size=64k") != 0) _exit(77);
    LabeledSamples big =
        testing::PatternSamples(1000, {28, 28}, [](int i, int j) { return i ^ j; });
    const std::string path = mount_point + "/train.samples";
    const absl::Status status = WritePreparedSamples(View(big), path);
    const std::string message(status.message());
    std::error_code error;
    const bool empty = std::filesystem::is_empty(mount_point, error) && !error;
    const bool named =
        absl::IsUnavailable(status) &&
        message.find(path +
                     ": cannot write the prepared training set: No space left on device (") == 0 &&
        message.find("the partial file is removed): free space in the worker's --work-dir") !=
            std::string::npos;
    if (!named) fprintf(stderr, "%s\n", message.c_str());
    umount(mount_point.c_str());
    _exit(status.ok() ? 10 : !named ? 11 : !empty ? 12 : 0);
  }
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status));
  if (WEXITSTATUS(wait_status) == 77) GTEST_SKIP() << "no tmpfs of our own here";
  EXPECT_EQ(WEXITSTATUS(wait_status), 0) << "10: written anyway, 11: message, 12: left a file";
}

// Batches made from the mapping are the batches of the same data in memory: plain and augmented
// ({3, 2, 2} is channels first), copied and mapped in place, through RunLoader with 1 and 3
// loader threads.
TEST_F(PreparedDatasetTest, BatchesFromTheMappingAreTheBatchesOfTheDataInMemory) {
  const LabeledSamples bytes = Bytes();
  for (bool map_raw : {true, false}) {
    const DatasetFiles files = testing::Files("npy", File("u8.npy"), File("labels.npy"));
    ASSERT_TRUE(
        PrepareTrainingSet(files, 0, File("train.samples"), {.map_raw_sources = map_raw}).ok());
    for (const AugmentOptions augment :
         {AugmentOptions{}, AugmentOptions{.crop_padding = 1, .horizontal_flip = true}}) {
      const LoaderOptions options{.index = 0, .seed = 9, .delay_ms = 0, .augment = augment};
      absl::StatusOr<std::unique_ptr<BatchSource>> source =
          OpenPreparedDataset(File("train.samples"), 4, options);
      ASSERT_TRUE(source.ok()) << source.status();
      EXPECT_EQ((*source)->batches_per_epoch(), 6);
      EXPECT_EQ((*source)->sample_type(), SampleType::kUint8);
      EXPECT_EQ((*source)->sample_bytes(), 12);
      BatchMaker memory(bytes, 4, 9, augment);
      std::vector<uint8_t> a(4 * 12), b(4 * 12), la(4), lb(4);
      for (uint64_t batch = 0; batch < 18; ++batch) {
        absl::StatusOr<uint32_t> n = (*source)->Make(batch, a.data(), la.data());
        ASSERT_TRUE(n.ok());
        ASSERT_EQ(*n, *memory.Make(batch, b.data(), lb.data()));
        EXPECT_EQ(std::memcmp(a.data(), b.data(), *n * 12), 0) << batch;
        EXPECT_EQ(std::memcmp(la.data(), lb.data(), *n), 0) << batch;
      }
    }
    // Through RunLoader on a ring, loader threads each with a source of their own.
    const uint64_t total = 3 * 6;
    auto stream = [&](uint32_t loaders, bool mapped) {
      RingGeometry g;
      g.slot_count = 3;
      g.batch_size = 4;
      g.sample_bytes = 12;
      g.loader_count = loaders;
      g.total_batches = total;
      absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
      EXPECT_TRUE(region.ok());
      (*region)->SetConsumerPid(getpid());
      std::vector<std::thread> threads;
      std::vector<absl::Status> results(loaders);
      for (uint32_t k = 0; k < loaders; ++k) {
        threads.emplace_back([&, k] {
          const LoaderOptions options{.index = k, .seed = 5, .delay_ms = 0, .augment = {}};
          if (!mapped) {
            results[k] = RunLoader(**region, bytes, options);
            return;
          }
          absl::StatusOr<std::unique_ptr<BatchSource>> source =
              OpenPreparedDataset(File("train.samples"), 4, options);
          results[k] = source.ok() ? RunLoader(**region, **source, options) : source.status();
        });
      }
      std::vector<uint8_t> seen;
      for (uint64_t batch = 0; batch < total; ++batch) {
        absl::StatusOr<ReadableBatch> got = (*region)->WaitReadable(batch, absl::Seconds(10));
        EXPECT_TRUE(got.ok()) << got.status();
        if (!got.ok()) break;
        seen.insert(seen.end(), got->samples, got->samples + got->count * 12);
        seen.insert(seen.end(), got->labels, got->labels + got->count);
        (*region)->Release(batch);
      }
      (*region)->RequestStop();
      for (std::thread& t : threads) t.join();
      for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
      return seen;
    };
    const std::vector<uint8_t> expected = stream(1, false);
    ASSERT_EQ(expected.size(), 3u * kCount * 13);
    EXPECT_EQ(stream(1, true), expected);
    EXPECT_EQ(stream(3, true), expected);
  }
}

// The streaming writer: chunks appended under a reserve larger than what comes, the count fixed
// at Finish; the file parses, maps back to the same bytes, and nothing else is left.
TEST_F(PreparedDatasetTest, TheStreamingWriterFixesTheCountAtFinish) {
  const LabeledSamples data = Bytes();  // 23 samples of 12 bytes, 5 classes
  const std::string path = File("test.samples");
  absl::StatusOr<std::unique_ptr<PreparedSamplesWriter>> writer =
      PreparedSamplesWriter::Begin(path, 5000, SampleType::kUint8, data.sample_dims, 5);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ(Leftovers("test.samples").size(), 1u) << "a temporary file while it is written";
  EXPECT_TRUE(Leftovers("test.samples.tmp-").size() == 1);
  for (int first : {0, 10, 11}) {
    const int n = first == 0 ? 10 : first == 10 ? 1 : kCount - 11;
    ASSERT_TRUE(
        (*writer)
            ->Append(data.samples.data() + first * data.sample_bytes, data.labels.data() + first, n)
            .ok());
  }
  EXPECT_EQ((*writer)->count(), kCount);
  absl::StatusOr<uint64_t> bytes = (*writer)->Finish();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(Leftovers("test.samples"), std::vector<std::string>{"test.samples"});
  const std::vector<uint8_t> file = testing::ReadRaw(path);
  EXPECT_EQ(file.size(), *bytes);
  absl::StatusOr<PreparedLayout> layout = ParsePreparedSamples(path, file.data(), file.size());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->count, kCount);
  EXPECT_EQ(layout->classes, 5);
  EXPECT_EQ(layout->sample_dims, data.sample_dims);
  EXPECT_TRUE(layout->source_path.empty());
  // The labels' reserve (5000 bytes) lies between them and the samples.
  EXPECT_EQ(layout->samples_offset, 8192u);
  EXPECT_EQ(file.size(), 8192u + kCount * 12);
  absl::StatusOr<std::unique_ptr<MappedSamples>> mapped = MappedSamples::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ExpectSameData((*mapped)->view(), data);
  // Finished once only.
  EXPECT_FALSE((*writer)->Finish().ok());
}

TEST_F(PreparedDatasetTest, TheStreamingWriterLeavesNoFileOnAnError) {
  const std::vector<int> dims = {2, 2};
  const std::vector<uint8_t> samples(4 * 3, 9);
  const std::vector<uint8_t> labels = {0, 1, 7};
  // A directory that does not exist: UNAVAILABLE naming the path.
  absl::StatusOr<std::unique_ptr<PreparedSamplesWriter>> nowhere =
      PreparedSamplesWriter::Begin(File("missing/test.samples"), 3, SampleType::kUint8, dims, 4);
  EXPECT_TRUE(absl::IsUnavailable(nowhere.status())) << nowhere.status();
  EXPECT_THAT(nowhere.status().message(), HasSubstr(File("missing/test.samples")));
  // What the format cannot hold, refused before any file.
  EXPECT_TRUE(absl::IsInvalidArgument(
      PreparedSamplesWriter::Begin(File("a.samples"), 0, SampleType::kUint8, dims, 4).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      PreparedSamplesWriter::Begin(File("a.samples"), 3, SampleType::kUint8, dims, 300).status()));
  EXPECT_TRUE(Leftovers("a.samples").empty());
  {
    // A label not below the classes: refused at Finish, the temporary file removed.
    auto writer = PreparedSamplesWriter::Begin(File("a.samples"), 3, SampleType::kUint8, dims, 4);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append(samples.data(), labels.data(), 3).ok());
    const absl::StatusOr<uint64_t> finished = (*writer)->Finish();
    EXPECT_TRUE(absl::IsInvalidArgument(finished.status())) << finished.status();
    EXPECT_THAT(finished.status().message(), HasSubstr("label 7"));
    EXPECT_TRUE(Leftovers("a.samples").empty());
  }
  {
    // More than reserved: refused, and every later call says so.
    auto writer = PreparedSamplesWriter::Begin(File("a.samples"), 2, SampleType::kUint8, dims, 4);
    ASSERT_TRUE(writer.ok());
    EXPECT_TRUE(absl::IsInvalidArgument((*writer)->Append(samples.data(), labels.data(), 3)));
    EXPECT_TRUE(absl::IsInvalidArgument((*writer)->Finish().status()));
    EXPECT_TRUE(Leftovers("a.samples").empty());
  }
  {
    // Nothing appended: no samples, no file.
    auto writer = PreparedSamplesWriter::Begin(File("a.samples"), 2, SampleType::kUint8, dims, 4);
    ASSERT_TRUE(writer.ok());
    EXPECT_TRUE(absl::IsInvalidArgument((*writer)->Finish().status()));
    EXPECT_TRUE(Leftovers("a.samples").empty());
  }
  {
    // Abandoned before Finish.
    auto writer = PreparedSamplesWriter::Begin(File("a.samples"), 2, SampleType::kUint8, dims, 4);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append(samples.data(), labels.data(), 2).ok());
  }
  EXPECT_TRUE(Leftovers("a.samples").empty());
}

TEST_F(PreparedDatasetTest, TheStreamingWriterNamesAFailedWriteAndRemovesIt) {
  const int exit_code = ExitCodeUnderFileSizeLimit([&] {
    LabeledSamples big =
        testing::PatternSamples(1000, {28, 28}, [](int i, int j) { return i ^ j; });
    auto writer = PreparedSamplesWriter::Begin(File("test.samples"), 1000, SampleType::kUint8,
                                               {28, 28}, big.classes);
    if (!writer.ok()) return 12;
    absl::Status status = (*writer)->Append(big.samples.data(), big.labels.data(), 1000);
    const bool again = (*writer)->Finish().status() == status;
    const std::string message(status.message());
    const bool named = absl::IsUnavailable(status) &&
                       message == File("test.samples") +
                                      ": cannot write the prepared samples: File too large "
                                      "(0.0 of 0.8 MiB written; the partial file is removed)";
    return status.ok() ? 10
           : !named    ? (fprintf(stderr, "%s\n", message.c_str()), 11)
           : !again    ? 13
                       : 0;
  });
  EXPECT_EQ(exit_code, 0);
  EXPECT_TRUE(Leftovers("test.samples").empty());
}

TEST_F(PreparedDatasetTest, OpenPreparedDatasetKnowsFilesByTheirMagic) {
  testing::WriteText(File("short"), "STOK");
  absl::Status status = OpenPreparedDataset(File("short"), 4, {}).status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(File("short") + ": truncated: 4 bytes"));
  status = OpenPreparedDataset(File("data.csv"), 4, {}).status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(File("data.csv") + ": not a prepared dataset: magic \"label,a,\""));
  EXPECT_TRUE(absl::IsNotFound(OpenPreparedDataset(File("none"), 4, {}).status()));
  // Augmenting flat samples is the job's mistake: INVALID_ARGUMENT (the loader exits 2).
  const DatasetFiles csv = testing::Files("csv", File("data.csv"));
  ASSERT_TRUE(PrepareTrainingSet(csv, 0, File("flat.samples")).ok());
  status =
      OpenPreparedDataset(File("flat.samples"), 4, {.augment = {.horizontal_flip = true}}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("augmentation needs images"));
}

}  // namespace
}  // namespace stoker
