// Loader memory is bounded by the pipeline, not by the dataset: a WebDataset shard set several
// times larger than a memory cgroup trains to the end with the worker (and so its trainer and
// loaders) inside that cgroup, and each loader's anonymous memory stays small.
//
// The cgroup (v1 memory controller) is created nested under this test's own memory cgroup, gets
// only the worker's pid (its children inherit it when they are forked later) and is removed after
// the worker exited. Without a writable v1 memory controller the test is skipped, saying why.
//
// The shards are a few hundred synthetic photo-like JPEGs (bench/images/make_jpegs.py, made once
// per build directory) written many times under different keys by `stoker-dataset pack` (from an
// image folder of hard links), then synced and dropped from the page cache
// (POSIX_FADV_DONTNEED), so that every page the worker and loaders read is charged to the cgroup:
// the shards stream through a cache that cannot hold them. While the job trains, a sampler reads
// each loader's /proc/PID/status (RssAnon, RssFile, RssShmem, VmHWM) every 100 ms; VmHWM, the
// kernel's own peak of resident memory, also bounds what happens between two samples.
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/system_memory.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
// The cgroup's limit, and the dataset's size as a multiple of it (made a little larger than the
// 3x the test insists on, as the JPEGs' sizes vary).
constexpr int64_t kCgroupLimitBytes = 192 * kMiB;
constexpr double kDatasetOverLimit = 3.6;
constexpr double kRequiredDatasetOverLimit = 3.0;
// The claim under test: a loader's own memory beyond the ring, whatever the dataset's size.
constexpr int64_t kLoaderRssAnonLimitBytes = 64 * kMiB;
constexpr int kDistinctJpegs = 200;
constexpr int kSamplesPerShard = 1000;
constexpr int kLoaders = 2;
constexpr char kCgroupMemoryRoot[] = "/sys/fs/cgroup/memory";

absl::StatusOr<std::string> ReadFileText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes `value` to a cgroup control file in one write(2), as `echo VALUE > FILE` does.
absl::Status WriteControlFile(const std::string& path, const std::string& value) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot open for writing: ", std::strerror(errno)));
  }
  const ssize_t n = write(fd, value.data(), value.size());
  const int error = errno;
  close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot write '", value, "': ", std::strerror(error)));
  }
  return absl::OkStatus();
}

// "KEY VALUE" lines (memory.stat, memory.oom_control) as a map.
std::map<std::string, int64_t> ParseKeyValues(const std::string& text) {
  std::map<std::string, int64_t> values;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t value = 0;
    if (fields.size() == 2 && absl::SimpleAtoi(fields[1], &value)) {
      values[std::string(fields[0])] = value;
    }
  }
  return values;
}

// This process's memory cgroup path ("/a/b"), from /proc/self/cgroup's "N:memory:/a/b" line.
absl::StatusOr<std::string> OwnMemoryCgroupPath() {
  absl::StatusOr<std::string> text = ReadFileText("/proc/self/cgroup");
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "memory") return std::string(fields[2]);
    }
  }
  return absl::UnavailableError(
      "/proc/self/cgroup has no memory controller line (cgroup v2 only, or no memory cgroup)");
}

// A v1 memory cgroup nested under this process's own, with a limit.
class MemoryCgroup {
 public:
  // UNAVAILABLE (with the reason) when there is no writable v1 memory controller here, or when
  // this process is in the root memory cgroup (the test never makes a top-level cgroup).
  static absl::StatusOr<std::unique_ptr<MemoryCgroup>> Create(int64_t limit_bytes) {
    absl::StatusOr<std::string> own = OwnMemoryCgroupPath();
    if (!own.ok()) return own.status();
    if (*own == "/" || own->empty()) {
      return absl::UnavailableError(
          "this process is in the root memory cgroup; the test only nests a cgroup under its own");
    }
    const std::string parent = absl::StrCat(kCgroupMemoryRoot, *own);
    std::error_code error;
    if (!std::filesystem::exists(parent + "/memory.limit_in_bytes", error)) {
      return absl::UnavailableError(absl::StrCat(
          parent, "/memory.limit_in_bytes does not exist (no cgroup v1 memory controller here)"));
    }
    const std::string path = absl::StrCat(parent, "/stoker-test-", getpid());
    rmdir(path.c_str());  // a leftover of an earlier run with the same pid, if empty
    if (mkdir(path.c_str(), 0755) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
    }
    auto cgroup = std::unique_ptr<MemoryCgroup>(new MemoryCgroup(path));
    if (absl::Status s =
            WriteControlFile(path + "/memory.limit_in_bytes", absl::StrCat(limit_bytes));
        !s.ok()) {
      return absl::UnavailableError(s.message());
    }
    absl::StatusOr<int64_t> limit = cgroup->Number("memory.limit_in_bytes");
    if (!limit.ok() || *limit != limit_bytes) {
      return absl::UnavailableError(absl::StrCat(path, "/memory.limit_in_bytes did not take ",
                                                 limit_bytes, " (reads ", limit.value_or(-1), ")"));
    }
    return cgroup;
  }

  ~MemoryCgroup() {
    if (!removed_) Remove().IgnoreError();
  }

  // Moves process `pid` (all its threads) into the cgroup.
  absl::Status Adopt(pid_t pid) {
    return WriteControlFile(path_ + "/cgroup.procs", absl::StrCat(pid));
  }

  // Removes the cgroup once its processes are gone (waits up to 10 s for them to exit); the
  // caller stops them first. Its remaining page cache charges go to the parent.
  absl::Status Remove() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (rmdir(path_.c_str()) != 0) {
      if (errno == ENOENT) break;
      if (errno != EBUSY || absl::Now() > deadline) {
        return absl::InternalError(
            absl::StrCat("cannot remove ", path_, ": ", std::strerror(errno),
                         "; its processes: ", ReadFileText(path_ + "/cgroup.procs").value_or("?")));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    removed_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Number(const std::string& file) const {
    absl::StatusOr<std::string> text = ReadFileText(path_ + "/" + file);
    if (!text.ok()) return text.status();
    int64_t value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) {
      return absl::DataLossError(absl::StrCat(path_, "/", file, ": not a number: ", *text));
    }
    return value;
  }

  std::map<std::string, int64_t> KeyValues(const std::string& file) const {
    return ParseKeyValues(ReadFileText(path_ + "/" + file).value_or(""));
  }

  const std::string& path() const { return path_; }
  // The path as /proc/PID/cgroup names it (relative to the hierarchy's root).
  std::string relative_path() const { return path_.substr(std::strlen(kCgroupMemoryRoot)); }

 private:
  explicit MemoryCgroup(std::string path) : path_(std::move(path)) {}

  std::string path_;
  bool removed_ = false;
};

struct ProcessMemory {
  int64_t rss_anon_bytes = 0;
  int64_t rss_file_bytes = 0;
  int64_t rss_shmem_bytes = 0;
  int64_t peak_rss_bytes = 0;  // VmHWM: the largest RssAnon + RssFile + RssShmem so far
  bool in_cgroup = false;
};

// RssAnon, RssFile, RssShmem and VmHWM of `pid`, and whether it is in memory cgroup `cgroup` (a
// path as /proc/PID/cgroup writes it); nothing once the process is gone.
std::optional<ProcessMemory> ReadProcessMemory(pid_t pid, const std::string& cgroup) {
  absl::StatusOr<std::string> status = ReadFileText(absl::StrCat("/proc/", pid, "/status"));
  absl::StatusOr<std::string> groups = ReadFileText(absl::StrCat("/proc/", pid, "/cgroup"));
  if (!status.ok() || !groups.ok()) return std::nullopt;
  ProcessMemory memory;
  int found = 0;
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    for (auto [key, out] : {std::pair{"RssAnon:", &memory.rss_anon_bytes},
                            std::pair{"RssFile:", &memory.rss_file_bytes},
                            std::pair{"RssShmem:", &memory.rss_shmem_bytes},
                            std::pair{"VmHWM:", &memory.peak_rss_bytes}}) {
      if (!absl::ConsumePrefix(&line, key)) continue;
      int64_t kib = 0;
      if (absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(line), " kB"), &kib)) {
        *out = kib * 1024;
        ++found;
      }
    }
  }
  if (found != 4) return std::nullopt;  // a zombie has no memory lines
  memory.in_cgroup = absl::StrContains(*groups, absl::StrCat(":memory:", cgroup, "\n"));
  return memory;
}

struct PeakMemory {
  int64_t rss_anon_bytes = 0;
  int64_t rss_file_bytes = 0;
  int64_t rss_shmem_bytes = 0;
  int64_t peak_rss_bytes = 0;
  int samples = 0;
  bool always_in_cgroup = true;
};

// Samples the memory of the job's processes (found by their command line) every 100 ms until
// destroyed.
class MemorySampler {
 public:
  MemorySampler(std::string cluster_dir, pid_t worker, std::string cgroup)
      : cluster_dir_(std::move(cluster_dir)), worker_(worker), cgroup_(std::move(cgroup)) {
    thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
  }

  // Stops sampling; the figures are final after this.
  void Stop() {
    thread_.request_stop();
    if (thread_.joinable()) thread_.join();
  }

  const std::map<pid_t, PeakMemory>& loaders() const { return loaders_; }
  const std::map<pid_t, PeakMemory>& trainers() const { return trainers_; }
  const PeakMemory& worker() const { return worker_peak_; }
  int rounds() const { return rounds_; }

 private:
  void Run(std::stop_token stop) {
    while (!stop.stop_requested()) {
      for (pid_t pid : FindProcesses({"stoker-loader", cluster_dir_})) Sample(pid, loaders_[pid]);
      for (pid_t pid : FindProcesses({"stoker-trainer", cluster_dir_})) {
        Sample(pid, trainers_[pid]);
      }
      Sample(worker_, worker_peak_);
      ++rounds_;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  void Sample(pid_t pid, PeakMemory& peak) {
    const std::optional<ProcessMemory> memory = ReadProcessMemory(pid, cgroup_);
    if (!memory) return;
    peak.rss_anon_bytes = std::max(peak.rss_anon_bytes, memory->rss_anon_bytes);
    peak.rss_file_bytes = std::max(peak.rss_file_bytes, memory->rss_file_bytes);
    peak.rss_shmem_bytes = std::max(peak.rss_shmem_bytes, memory->rss_shmem_bytes);
    peak.peak_rss_bytes = std::max(peak.peak_rss_bytes, memory->peak_rss_bytes);
    peak.always_in_cgroup = peak.always_in_cgroup && memory->in_cgroup;
    ++peak.samples;
  }

  const std::string cluster_dir_;
  const pid_t worker_;
  const std::string cgroup_;
  // Written by the sampling thread only; read after Stop() joined it.
  std::map<pid_t, PeakMemory> loaders_;
  std::map<pid_t, PeakMemory> trainers_;
  PeakMemory worker_peak_;
  int rounds_ = 0;
  std::jthread thread_;  // last: stopped and joined before the members above go
};

double MiB(int64_t bytes) { return static_cast<double>(bytes) / kMiB; }

// Writes dirty pages of `path` to disk and drops the file from the page cache, so that the next
// reader's cgroup is charged for every page it reads. The number of bytes of the file.
absl::StatusOr<int64_t> SyncAndDropFromPageCache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  struct stat st = {};
  const bool ok = fstat(fd, &st) == 0 && fdatasync(fd) == 0 &&
                  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  const int error = errno;
  close(fd);
  if (!ok) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot sync and drop from the page cache: ", std::strerror(error)));
  }
  return static_cast<int64_t>(st.st_size);
}

class MemoryCgroupTest : public ::testing::Test {
 protected:
  // The distinct JPEGs, made once per build directory (making them is the slow part).
  // UNAVAILABLE when /usr/bin/python3 or its numpy and PIL are missing.
  absl::StatusOr<std::string> DistinctJpegs() {
    const std::string dir =
        absl::StrCat(STOKER_TEST_BINARY_DIR, "/memory_cgroup_jpegs-v1-", kDistinctJpegs);
    std::error_code error;
    if (std::filesystem::is_directory(dir, error)) return dir;
    const CommandResult modules = RunCommand("/usr/bin/python3 -c 'import numpy, PIL'");
    if (modules.exit_code != 0) {
      return absl::UnavailableError(
          absl::StrCat("/usr/bin/python3 with numpy and PIL makes the JPEGs: ", modules.output));
    }
    const std::string partial = absl::StrCat(dir, ".partial-", getpid());
    std::filesystem::remove_all(partial, error);
    const CommandResult made = RunCommand(absl::StrCat("/usr/bin/python3 ", STOKER_SOURCE_DIR,
                                                       "/bench/images/make_jpegs.py ", partial,
                                                       " --count ", kDistinctJpegs, " --seed 7"));
    if (made.exit_code != 0) {
      return absl::InternalError(absl::StrCat("bench/images/make_jpegs.py: ", made.output));
    }
    // Another test process may have made it meanwhile: then keep theirs.
    if (rename(partial.c_str(), dir.c_str()) != 0) std::filesystem::remove_all(partial, error);
    return dir;
  }

  TestCluster cluster_;
};

// The agent and the trainer size the ring, the loaders and the model by
// AvailableSystemMemoryBytes: inside a memory cgroup (a container's limit) that must be the
// cgroup's room, not the host's free memory.
TEST(MemoryCgroupLimit, AProcessInsideSeesTheCgroupsRoomNotTheHosts) {
  constexpr int64_t kLimit = 96 * kMiB;
  absl::StatusOr<std::unique_ptr<MemoryCgroup>> cgroup = MemoryCgroup::Create(kLimit);
  if (!cgroup.ok()) {
    GTEST_SKIP() << "no writable cgroup v1 memory controller for a nested test cgroup: "
                 << cgroup.status().message();
  }
  int go[2], result[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(result), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char byte;
    if (read(go[0], &byte, 1) != 1) _exit(1);
    const absl::StatusOr<int64_t> available = AvailableSystemMemoryBytes();
    const int64_t value = available.ok() ? *available : -1;
    _exit(write(result[1], &value, sizeof(value)) == sizeof(value) ? 0 : 1);
  }
  close(go[0]);
  close(result[1]);
  const absl::Status adopted = (*cgroup)->Adopt(child);
  EXPECT_EQ(write(go[1], "g", 1), 1);
  close(go[1]);
  int64_t seen = -2;
  EXPECT_EQ(read(result[0], &seen, sizeof(seen)), static_cast<ssize_t>(sizeof(seen)));
  close(result[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(adopted.ok()) << adopted.message();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_GT(seen, 0);
  EXPECT_LE(seen, kLimit);
  absl::StatusOr<int64_t> outside = AvailableSystemMemoryBytes();
  ASSERT_TRUE(outside.ok());
  EXPECT_GT(*outside, kLimit) << "this machine is expected to have more than the test's limit free";
  EXPECT_TRUE((*cgroup)->Remove().ok());
}

TEST_F(MemoryCgroupTest, ShardsSeveralTimesLargerThanTheCgroupTrainToTheEnd) {
  absl::StatusOr<std::unique_ptr<MemoryCgroup>> cgroup = MemoryCgroup::Create(kCgroupLimitBytes);
  if (!cgroup.ok()) {
    GTEST_SKIP() << "no writable cgroup v1 memory controller for a nested test cgroup: "
                 << cgroup.status().message();
  }
  const std::string root = cluster_.dir() + "/data";
  std::filesystem::create_directories(root);
  struct statfs fs = {};
  ASSERT_EQ(statfs(root.c_str(), &fs), 0) << root << ": " << std::strerror(errno);
  if (fs.f_type == TMPFS_MAGIC) {
    GTEST_SKIP() << root << " is on tmpfs: shards there are shared memory charged to whoever "
                 << "wrote them, not page cache the cgroup can reclaim";
  }
  const int64_t target_bytes = static_cast<int64_t>(kDatasetOverLimit * kCgroupLimitBytes);
  if (static_cast<int64_t>(fs.f_bavail) * fs.f_bsize < target_bytes + 512 * kMiB) {
    GTEST_SKIP() << root << " has less than " << MiB(target_bytes + 512 * kMiB)
                 << " MiB free for the shards";
  }

  // The training set: the distinct JPEGs linked many times under other names (an image folder of
  // hard links), packed into shards; the test set: the distinct JPEGs in one shard.
  const absl::Time make_start = absl::Now();
  const absl::StatusOr<std::string> made_jpegs = DistinctJpegs();
  if (absl::IsUnavailable(made_jpegs.status())) GTEST_SKIP() << made_jpegs.status().message();
  ASSERT_TRUE(made_jpegs.ok()) << made_jpegs.status();
  const std::string& jpegs = *made_jpegs;
  std::vector<std::filesystem::path> files;
  int64_t distinct_bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(jpegs)) {
    if (!entry.is_regular_file()) continue;
    files.push_back(entry.path());
    distinct_bytes += static_cast<int64_t>(entry.file_size());
  }
  ASSERT_EQ(files.size(), static_cast<size_t>(kDistinctJpegs)) << jpegs;
  const int64_t copies = (target_bytes + distinct_bytes - 1) / distinct_bytes;
  const std::string folder = root + "/folder";
  for (int64_t c = 0; c < copies; ++c) {
    for (const std::filesystem::path& file : files) {
      const std::filesystem::path link = std::filesystem::path(folder) /
                                         file.parent_path().filename() /
                                         absl::StrFormat("c%03d_%s", c, file.filename().string());
      std::filesystem::create_directories(link.parent_path());
      std::error_code error;
      std::filesystem::create_hard_link(file, link, error);
      if (error) std::filesystem::copy_file(file, link);  // another file system
    }
  }
  for (auto [from, to, per_shard] : {std::tuple{folder, root + "/shards/train", kSamplesPerShard},
                                     std::tuple{jpegs, root + "/shards/test", kDistinctJpegs}}) {
    const CommandResult packed =
        RunCommand(absl::StrCat(STOKER_DATASET_PATH, " pack --root ", from, " --out ", to,
                                " --samples-per-shard ", per_shard));
    ASSERT_EQ(packed.exit_code, 0) << packed.output;
  }
  std::filesystem::remove_all(folder);
  const int64_t samples = copies * kDistinctJpegs;
  const int64_t shards = (samples + kSamplesPerShard - 1) / kSamplesPerShard;
  int64_t dataset_bytes = 0;
  for (int64_t s = 0; s < shards; ++s) {
    absl::StatusOr<int64_t> bytes =
        SyncAndDropFromPageCache(absl::StrFormat("%s/shards/train-%06d.tar", root, s));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    dataset_bytes += *bytes;
  }
  const absl::Duration make_time = absl::Now() - make_start;
  ASSERT_GE(static_cast<double>(dataset_bytes), kRequiredDatasetOverLimit * kCgroupLimitBytes)
      << "the shards are not several times larger than the cgroup's limit";

  cluster_.StartServer({"--data-root", root});
  const pid_t worker = cluster_.StartWorker("w1", {"--data-root", root});
  // Before the worker can have forked anything: the trainer and loaders are forked later, by the
  // worker, and so start in the cgroup.
  if (absl::Status adopted = (*cgroup)->Adopt(worker); !adopted.ok()) {
    cluster_.KillWorker(worker, SIGTERM);
    GTEST_SKIP() << "cannot move the worker into the test cgroup: " << adopted.message();
  }
  absl::Cleanup remove_cgroup = [&] {
    cluster_.KillWorker(worker, SIGTERM);  // its trainer and loaders die with it
    const absl::Status removed = (*cgroup)->Remove();
    EXPECT_TRUE(removed.ok()) << removed;
  };

  v1::JobSpec spec = DefaultJobSpec();
  spec.set_name("memory-cgroup");
  spec.set_max_retries(0);  // a loader killed for memory fails the job, not a retry
  v1::DatasetSpec* data = spec.mutable_dataset();
  data->set_format("shards");
  data->set_train_images(absl::StrFormat("shards/train-{000000..%06d}.tar", shards - 1));
  data->set_test_images("shards/test-000000.tar");
  data->set_classes(10);
  data->set_test_limit(100);
  data->set_max_bad_samples(0);  // every image is good: one failing to decode is a failure
  v1::ImageSpec* image = data->mutable_image();
  image->set_channels(3);
  image->set_size(32);
  image->mutable_random_resized_crop();
  image->set_horizontal_flip(true);
  spec.mutable_model()->add_hidden(64);
  spec.mutable_train()->set_epochs(1);
  spec.mutable_train()->set_batch_size(64);
  spec.mutable_loader()->set_processes(kLoaders);
  spec.mutable_resources()->set_gpus(0);

  MemorySampler sampler(cluster_.dir(), worker, (*cgroup)->relative_path());
  const absl::Time train_start = absl::Now();
  absl::StatusOr<v1::Job> done = cluster_.RunJob(spec, absl::Minutes(4));
  const absl::Duration train_time = absl::Now() - train_start;
  sampler.Stop();
  ASSERT_TRUE(done.ok()) << done.status();

  const absl::StatusOr<int64_t> max_usage = (*cgroup)->Number("memory.max_usage_in_bytes");
  const absl::StatusOr<int64_t> failcnt = (*cgroup)->Number("memory.failcnt");
  const std::map<std::string, int64_t> oom = (*cgroup)->KeyValues("memory.oom_control");
  const std::map<std::string, int64_t> stat = (*cgroup)->KeyValues("memory.stat");
  const int64_t charged_bytes = stat.count("pgpgin") ? stat.at("pgpgin") * 4096 : -1;

  // The figures, for bench/RESULTS.md.
  std::string figures = absl::StrFormat(
      "dataset: %d samples in %d shards, %.1f MiB (%.2fx the cgroup's %.0f MiB limit), made in "
      "%.1f s\n"
      "job: %s in %.1f s (%.0f samples/s), test accuracy %.3f\n"
      "cgroup: max usage %.1f MiB, failcnt %d, pages charged (pgpgin) %.1f MiB, "
      "under_oom %d, oom_kill %d\n",
      samples, shards, MiB(dataset_bytes), static_cast<double>(dataset_bytes) / kCgroupLimitBytes,
      MiB(kCgroupLimitBytes), absl::ToDoubleSeconds(make_time), JobStateName(done->state()),
      absl::ToDoubleSeconds(train_time), samples / absl::ToDoubleSeconds(train_time),
      done->progress().test_accuracy(), MiB(max_usage.value_or(-1)), failcnt.value_or(-1),
      MiB(charged_bytes), oom.count("under_oom") ? oom.at("under_oom") : -1,
      oom.count("oom_kill") ? oom.at("oom_kill") : -1);
  int64_t loaders_rss_anon_bytes = 0;
  for (const auto& [pid, peak] : sampler.loaders()) {
    loaders_rss_anon_bytes += peak.rss_anon_bytes;
    absl::StrAppendFormat(&figures,
                          "loader pid %d: max RssAnon %.1f MiB, max RssFile %.1f MiB, max RssShmem "
                          "%.1f MiB, VmHWM %.1f MiB (%d samples)\n",
                          pid, MiB(peak.rss_anon_bytes), MiB(peak.rss_file_bytes),
                          MiB(peak.rss_shmem_bytes), MiB(peak.peak_rss_bytes), peak.samples);
  }
  for (const auto& [pid, peak] : sampler.trainers()) {
    absl::StrAppendFormat(&figures, "trainer pid %d: max RssAnon %.1f MiB, max RssFile %.1f MiB\n",
                          pid, MiB(peak.rss_anon_bytes), MiB(peak.rss_file_bytes));
  }
  absl::StrAppendFormat(
      &figures,
      "worker pid %d: max RssAnon %.1f MiB; loaders' max RssAnon summed %.1f MiB; "
      "%d sampling rounds\n",
      worker, MiB(sampler.worker().rss_anon_bytes), MiB(loaders_rss_anon_bytes), sampler.rounds());
  std::cout << figures;

  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error() << "\n" << figures;
  EXPECT_EQ(done->attempt(), 1) << figures;
  // Both loaders were seen, several times each, always inside the cgroup, and none was replaced
  // (a loader killed and respawned would show as a third pid).
  ASSERT_EQ(sampler.loaders().size(), static_cast<size_t>(kLoaders)) << figures;
  for (const auto& [pid, peak] : sampler.loaders()) {
    EXPECT_GE(peak.samples, 5) << "loader " << pid << " was hardly sampled\n" << figures;
    EXPECT_TRUE(peak.always_in_cgroup) << "loader " << pid << " ran outside " << (*cgroup)->path();
    EXPECT_GT(peak.rss_anon_bytes, 0) << "loader " << pid;
    EXPECT_LE(peak.rss_anon_bytes, kLoaderRssAnonLimitBytes)
        << "loader " << pid << "'s anonymous memory\n"
        << figures;
    // Between samples too: the peak resident size less the largest file and shared memory seen
    // is at most the peak anonymous memory.
    EXPECT_LE(peak.peak_rss_bytes - peak.rss_file_bytes - peak.rss_shmem_bytes,
              kLoaderRssAnonLimitBytes)
        << "loader " << pid << "'s VmHWM: its anonymous memory spiked between samples\n"
        << figures;
  }
  EXPECT_TRUE(sampler.worker().always_in_cgroup);
  // No OOM in the cgroup, though it was full; the pages charged to it add up to at least the
  // dataset, so the shards streamed through it.
  ASSERT_TRUE(oom.count("under_oom")) << "memory.oom_control: no under_oom line";
  EXPECT_EQ(oom.at("under_oom"), 0) << figures;
  if (oom.count("oom_kill")) {
    EXPECT_EQ(oom.at("oom_kill"), 0) << figures;
  }
  ASSERT_TRUE(max_usage.ok()) << max_usage.status();
  EXPECT_LE(*max_usage, kCgroupLimitBytes);
  // The cgroup was full, its limit hit (reclaim, not spare memory, kept the job going).
  ASSERT_TRUE(failcnt.ok()) << failcnt.status();
  EXPECT_GT(*failcnt, 0) << figures;
  EXPECT_GE(charged_bytes, dataset_bytes)
      << "the dataset did not pass through the cgroup's page cache\n"
      << figures;
}

}  // namespace
}  // namespace stoker::testing
