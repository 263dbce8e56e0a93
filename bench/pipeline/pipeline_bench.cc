// Input-pipeline benchmark: real stoker-loader processes feeding a consumer through the job's
// ring. Prints key=value lines that bench/run_pipeline.sh turns into a table.
//
//   throughput  Fashion-MNIST, batches of 256, K loader processes; the consumer normalises every
//               batch to float32 ((x/255 - mean)/std), as a training step's input would be.
//   ring        raw ring bandwidth with 1 MiB slots (a producer thread streams into a slot as a
//               loader does; the consumer reads it in place, or copies it out) against one
//               core's memcpy of 1 MiB: cache-hot (one destination) and over the ring's working
//               set (one destination per slot).
//   overlap     loaders that take L ms per batch (loader.delay_ms) and a consumer that takes C ms:
//               serial time (a 1-slot ring), pipelined time, the ideal max(C, L/K) * n, and the
//               consumer's stall fraction against 1 - C / max(C, L/K). Both sides sleep rather
//               than spin: the machine has two cores.
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/pipeline/pipeline_util.h"
#include "data/dataset.h"
#include "data/job_region.h"
#include "data/prepared_dataset.h"
#include "data/stream_copy.h"
#include "stoker.pb.h"

ABSL_FLAG(std::string, loader, STOKER_LOADER_PATH, "the stoker-loader executable");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST directory");
ABSL_FLAG(std::string, parts, "throughput,ring,overlap", "what to measure, comma-separated");
ABSL_FLAG(int, epochs, 30, "throughput: epochs of Fashion-MNIST per loader count");
ABSL_FLAG(std::string, loaders, "1,2", "throughput: loader process counts");
ABSL_FLAG(int, batch, 256, "throughput: samples per batch");
ABSL_FLAG(int, slots, 8, "ring slots (throughput and overlap)");
ABSL_FLAG(int, ring_mib, 1024, "ring: MiB moved through the ring per repeat");
ABSL_FLAG(int, repeats, 5, "ring: repeats (the best is reported; the machine is shared)");
ABSL_FLAG(std::string, ring_slots, "2,4,8", "ring: slot counts (slots of 1 MiB)");
ABSL_FLAG(bool, ring_pin, true,
          "ring: run the producer and the consumer on two different CPUs (when there are two)");
ABSL_FLAG(int, overlap_batches, 40, "overlap: batches per run");

namespace {

using stoker::bench::Clock;
using stoker::bench::Seconds;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "pipeline_bench: %s\n", what.c_str());
  std::exit(1);
}

// A scratch directory for job files and synthetic data, removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "stoker-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) Die("mkdtemp failed");
    path_ = pattern;
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes the job file `path` for the loaders and, as the agent does before it starts them, the
// prepared training set `path`.data (their --data).
void WriteJob(const std::string& path, const std::string& images, const std::string& labels,
              int batch_size, int delay_ms) {
  stoker::v1::JobSpec spec;
  spec.set_name("pipeline-bench");
  spec.mutable_dataset()->set_format("idx");
  spec.mutable_dataset()->set_train_images(images);
  spec.mutable_dataset()->set_train_labels(labels);
  spec.mutable_train()->set_seed(1);
  spec.mutable_train()->set_batch_size(batch_size);
  spec.mutable_loader()->set_delay_ms(delay_ms);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!spec.SerializeToOstream(&out)) Die("cannot write " + path);
  stoker::DatasetFiles files;
  files.format = "idx";
  files.samples_path = images;
  files.labels_path = labels;
  absl::StatusOr<stoker::PreparedInfo> prepared =
      stoker::PrepareTrainingSet(files, 0, path + ".data");
  if (!prepared.ok()) Die(std::string(prepared.status().message()));
}

// Starts K stoker-loader processes on `region` as the agent does (fork + exec, fd inherited).
std::vector<pid_t> SpawnLoaders(const stoker::JobRegion& region, const std::string& job) {
  absl::StatusOr<std::vector<pid_t>> pids = stoker::bench::SpawnLoaders(
      region, absl::GetFlag(FLAGS_loader), {"--job", job, "--data", job + ".data"});
  if (!pids.ok()) Die(std::string(pids.status().message()));
  return *std::move(pids);
}

void ReapLoaders(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      Die(absl::StrCat("loader ", pid, " failed (wait status ", status, ")"));
    }
  }
}

std::unique_ptr<stoker::JobRegion> MakeRegion(const stoker::RingGeometry& geometry) {
  absl::StatusOr<std::unique_ptr<stoker::JobRegion>> region = stoker::JobRegion::Create(geometry);
  if (!region.ok()) Die(std::string(region.status().message()));
  (*region)->SetConsumerPid(getpid());
  return *std::move(region);
}

stoker::ReadableBatch MustRead(stoker::JobRegion& region, uint64_t batch) {
  absl::StatusOr<stoker::ReadableBatch> readable = region.WaitReadable(batch, absl::Seconds(60));
  if (!readable.ok()) Die(std::string(readable.status().message()));
  return *readable;
}

// --- throughput ---------------------------------------------------------------------------

void Throughput(const ScratchDir& scratch) {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  const std::string images = dir + "/train-images-idx3-ubyte.gz";
  const std::string labels = dir + "/train-labels-idx1-ubyte.gz";
  absl::StatusOr<std::vector<int>> dims = stoker::ReadIdxHeaderDims(images);
  if (!dims.ok()) Die(std::string(dims.status().message()));
  const int64_t count = (*dims)[0];
  const int sample_bytes = (*dims)[1] * (*dims)[2];
  const int batch_size = absl::GetFlag(FLAGS_batch);
  const int epochs = absl::GetFlag(FLAGS_epochs);
  WriteJob(scratch.File("throughput.pb"), images, labels, batch_size, 0);
  // Fashion-MNIST's pixel mean and standard deviation (of x / 255), as torchvision examples use.
  constexpr float kMean = 0.2860f, kStd = 0.3530f;
  const float scale = 1.0f / (255.0f * kStd), bias = -kMean / kStd;
  std::vector<float> normalized(static_cast<size_t>(batch_size) * sample_bytes);

  const std::vector<std::string> loader_counts = absl::StrSplit(absl::GetFlag(FLAGS_loaders), ',');
  for (const std::string& k : loader_counts) {
    stoker::RingGeometry g;
    g.slot_count = absl::GetFlag(FLAGS_slots);
    g.batch_size = batch_size;
    g.sample_bytes = sample_bytes;
    g.loader_count = std::stoi(k);
    g.total_batches = epochs * stoker::BatchesPerEpoch(count, batch_size);
    auto region = MakeRegion(g);
    const Clock::time_point spawned = Clock::now();
    const std::vector<pid_t> pids = SpawnLoaders(*region, scratch.File("throughput.pb"));
    Clock::time_point first{};
    uint64_t samples_after_first = 0;
    double checksum = 0;
    for (uint64_t b = 0; b < g.total_batches; ++b) {
      const stoker::ReadableBatch batch = MustRead(*region, b);
      if (b == 0) first = Clock::now();
      const size_t n = static_cast<size_t>(batch.count) * sample_bytes;
      for (size_t i = 0; i < n; ++i) normalized[i] = batch.samples[i] * scale + bias;
      checksum += normalized[n / 2] + batch.labels[0];
      if (b > 0) samples_after_first += batch.count;
      region->Release(b);
    }
    const Clock::time_point end = Clock::now();
    ReapLoaders(pids);
    std::printf(
        "throughput system=stoker workers=%s batch=%d epochs=%d samples=%llu seconds=%.4f "
        "samples_per_s=%.0f startup_s=%.3f checksum=%.1f\n",
        k.c_str(), batch_size, epochs, static_cast<unsigned long long>(samples_after_first),
        Seconds(end - first), samples_after_first / Seconds(end - first), Seconds(first - spawned),
        checksum);
    std::fflush(stdout);
  }
}

// --- raw ring bandwidth -------------------------------------------------------------------

// One core copying 1 MiB at a time from `source` into `buffers` in turn.
double MemcpyGbPerS(const std::vector<uint8_t>& source, std::vector<std::vector<uint8_t>>& buffers,
                    uint64_t copies) {
  const Clock::time_point start = Clock::now();
  for (uint64_t i = 0; i < copies; ++i) {
    std::vector<uint8_t>& sink = buffers[i % buffers.size()];
    std::memcpy(sink.data(), source.data(), source.size());
    asm volatile("" : : "r"(sink.data()) : "memory");  // keep every copy
  }
  return static_cast<double>(copies) * source.size() / 1e9 / Seconds(Clock::now() - start);
}

// The first two CPUs this process may run on, or nothing when it has only one.
std::vector<int> TwoCpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  if (cpus.size() < 2) cpus.clear();
  return cpus;
}

void PinThisThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Reads every 8-byte word of `bytes` (a multiple of 64) and folds them into one value, as fast
// as one core reads: what a consumer that uses the batch in place (the trainer's normalisation,
// a DMA engine reading a pinned slot) must at least do.
uint64_t ReadAll(const uint8_t* data, size_t bytes) {
  uint64_t lanes[8] = {};
  for (size_t offset = 0; offset < bytes; offset += 64) {
    uint64_t line[8];
    std::memcpy(line, data + offset, sizeof(line));
    for (int i = 0; i < 8; ++i) lanes[i] ^= line[i];
  }
  uint64_t folded = 0;
  for (uint64_t lane : lanes) folded += lane;
  return folded;
}

enum class Consumer { kRead, kCopy };

// A producer thread copies 1 MiB into each slot as a loader does (StreamCopy); the consumer
// reads the slot in place (kRead) or copies it out as a staging copy would (kCopy), then
// releases it. With --ring_pin the two run on two different CPUs, as a loader and the trainer
// would on an idle machine, instead of wherever the scheduler moves them.
double RingGbPerS(const std::vector<uint8_t>& source, uint32_t slots, uint64_t batches,
                  Consumer consumer) {
  const size_t slot_bytes = source.size();
  stoker::RingGeometry g;
  g.slot_count = slots;
  g.batch_size = 1;
  g.sample_bytes = static_cast<uint32_t>(slot_bytes);
  // The first pass over the slots faults their pages in (the memcpy buffers are already
  // touched, too) and is not timed.
  g.total_batches = batches + slots;
  auto region = MakeRegion(g);
  std::vector<uint8_t> sink(slot_bytes);
  const std::vector<int> cpus = absl::GetFlag(FLAGS_ring_pin) ? TwoCpus() : std::vector<int>{};
  cpu_set_t before;
  pthread_getaffinity_np(pthread_self(), sizeof(before), &before);
  if (!cpus.empty()) PinThisThread(cpus[1]);
  Clock::time_point start;
  std::thread producer([&] {
    if (!cpus.empty()) PinThisThread(cpus[0]);
    for (uint64_t b = 0; b < batches + slots; ++b) {
      absl::StatusOr<stoker::WritableBatch> slot =
          region->WaitWritable(b, absl::InfiniteDuration());
      if (!slot.ok()) Die(std::string(slot.status().message()));
      stoker::StreamCopy(slot->samples, source.data(), slot_bytes);  // as a loader writes
      slot->labels[0] = static_cast<uint8_t>(b);
      region->Publish(b, 1);
    }
  });
  uint64_t check = 0;
  for (uint64_t b = 0; b < batches + slots; ++b) {
    if (b == slots) start = Clock::now();
    const stoker::ReadableBatch batch = MustRead(*region, b);
    if (consumer == Consumer::kRead) {
      check += ReadAll(batch.samples, slot_bytes);
    } else {
      std::memcpy(sink.data(), batch.samples, slot_bytes);
      check += sink[b % slot_bytes];
    }
    check += batch.labels[0];
    region->Release(b);
  }
  producer.join();
  pthread_setaffinity_np(pthread_self(), sizeof(before), &before);
  const double gb_per_s =
      static_cast<double>(batches) * slot_bytes / 1e9 / Seconds(Clock::now() - start);
  if (check == 0) std::printf("#\n");
  return gb_per_s;
}

void RingBandwidth() {
  constexpr size_t kSlotBytes = 1 << 20;
  const uint64_t batches = absl::GetFlag(FLAGS_ring_mib);
  std::vector<uint8_t> source(kSlotBytes);
  for (size_t i = 0; i < kSlotBytes; ++i) source[i] = static_cast<uint8_t>(i * 131);
  const std::vector<std::string> slot_counts = absl::StrSplit(absl::GetFlag(FLAGS_ring_slots), ',');
  for (const std::string& slots_text : slot_counts) {
    const uint32_t slots = static_cast<uint32_t>(std::stoul(slots_text));
    std::vector<std::vector<uint8_t>> hot(1, std::vector<uint8_t>(kSlotBytes));
    std::vector<std::vector<uint8_t>> same(slots, std::vector<uint8_t>(kSlotBytes));
    double memcpy_hot = 0, memcpy_same = 0, ring_read = 0, ring_copy = 0;
    // Alternate the three and keep each one's best: the machine is shared.
    for (int repeat = 0; repeat < absl::GetFlag(FLAGS_repeats); ++repeat) {
      memcpy_hot = std::max(memcpy_hot, MemcpyGbPerS(source, hot, batches));
      memcpy_same = std::max(memcpy_same, MemcpyGbPerS(source, same, batches));
      ring_read = std::max(ring_read, RingGbPerS(source, slots, batches, Consumer::kRead));
      ring_copy = std::max(ring_copy, RingGbPerS(source, slots, batches, Consumer::kCopy));
    }
    std::printf(
        "ring slot_bytes=%zu slots=%u gb=%.2f read_gb_per_s=%.2f copy_gb_per_s=%.2f "
        "memcpy_hot_gb_per_s=%.2f memcpy_same_ws_gb_per_s=%.2f\n",
        kSlotBytes, slots, batches * kSlotBytes / 1e9, ring_read, ring_copy, memcpy_hot,
        memcpy_same);
    std::fflush(stdout);
  }
}

// --- overlap ------------------------------------------------------------------------------

// Times of one overlap run. The loaders' process start-up (exec, dynamic linking, reading the
// dataset: tens of ms, more on a loaded machine) is not part of the pipeline the experiment
// measures, so it is taken out: startup = (spawn -> batch 0 readable) - L, the time batch 0 took
// to make. total and stall both start after it.
struct OverlapRun {
  double total_s = 0;
  double stall_s = 0;
  double startup_s = 0;
};

OverlapRun RunOverlap(const ScratchDir& scratch, int loader_ms, int consumer_ms, uint32_t loaders,
                      uint32_t slots, int64_t count, int batch_size) {
  const std::string job = scratch.File(absl::StrCat("overlap-", loader_ms, ".pb"));
  WriteJob(job, scratch.File("overlap-images"), scratch.File("overlap-labels"), batch_size,
           loader_ms);
  stoker::RingGeometry g;
  g.slot_count = slots;
  g.batch_size = batch_size;
  g.sample_bytes = 784;
  g.loader_count = loaders;
  g.total_batches = stoker::BatchesPerEpoch(count, batch_size);
  auto region = MakeRegion(g);
  OverlapRun run;
  const Clock::time_point start = Clock::now();
  const std::vector<pid_t> pids = SpawnLoaders(*region, job);
  Clock::duration stall{};
  for (uint64_t b = 0; b < g.total_batches; ++b) {
    const Clock::time_point wait = Clock::now();
    MustRead(*region, b);
    stall += Clock::now() - wait;
    if (b == 0) {
      run.startup_s = std::max(0.0, Seconds(Clock::now() - start) - loader_ms / 1000.0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(consumer_ms));  // the "training step"
    region->Release(b);
  }
  run.total_s = Seconds(Clock::now() - start) - run.startup_s;
  run.stall_s = Seconds(stall) - run.startup_s;
  ReapLoaders(pids);
  return run;
}

void Overlap(const ScratchDir& scratch) {
  // A small raw IDX set (no gunzip at loader start): n batches of 256 samples.
  const int batch_size = 256;
  const int64_t n = absl::GetFlag(FLAGS_overlap_batches);
  const int64_t count = n * batch_size;
  {
    std::vector<uint8_t> header = {0, 0, 8, 3}, labels_header = {0, 0, 8, 1};
    for (uint32_t d : {static_cast<uint32_t>(count), 28u, 28u}) {
      for (int s = 24; s >= 0; s -= 8) header.push_back(static_cast<uint8_t>(d >> s));
    }
    for (int s = 24; s >= 0; s -= 8) labels_header.push_back(static_cast<uint8_t>(count >> s));
    std::ofstream images(scratch.File("overlap-images"), std::ios::binary);
    images.write(reinterpret_cast<const char*>(header.data()), header.size());
    const std::vector<char> pixels(static_cast<size_t>(count) * 784, 7);
    images.write(pixels.data(), pixels.size());
    std::ofstream labels(scratch.File("overlap-labels"), std::ios::binary);
    labels.write(reinterpret_cast<const char*>(labels_header.data()), labels_header.size());
    const std::vector<char> label_bytes(static_cast<size_t>(count), 3);
    labels.write(label_bytes.data(), label_bytes.size());
  }
  const int consumer_ms = 30;
  for (int loader_ms : {20, 40}) {
    // Serial: with one slot the loader makes batch b+1 only after the consumer released b.
    const OverlapRun serial = RunOverlap(scratch, loader_ms, consumer_ms, 1, 1, count, batch_size);
    for (uint32_t k : {1u, 2u}) {
      const OverlapRun piped = RunOverlap(scratch, loader_ms, consumer_ms, k,
                                          absl::GetFlag(FLAGS_slots), count, batch_size);
      const double per_batch_ms = std::max<double>(consumer_ms, double(loader_ms) / k);
      const double ideal_s = per_batch_ms * n / 1000.0;
      std::printf(
          "overlap L_ms=%d C_ms=%d K=%u batches=%lld serial_s=%.3f serial_expected_s=%.3f "
          "pipelined_s=%.3f ideal_s=%.3f ratio=%.3f startup_s=%.3f stall=%.3f "
          "expected_stall=%.3f\n",
          loader_ms, consumer_ms, k, static_cast<long long>(n), serial.total_s,
          n * (loader_ms + consumer_ms) / 1000.0, piped.total_s, ideal_s, piped.total_s / ideal_s,
          piped.startup_s, piped.stall_s / piped.total_s, 1.0 - consumer_ms / per_batch_ms);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ScratchDir scratch;
  for (const absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_parts), ',')) {
    if (part == "throughput") {
      Throughput(scratch);
    } else if (part == "ring") {
      RingBandwidth();
    } else if (part == "overlap") {
      Overlap(scratch);
    } else {
      Die(absl::StrCat("unknown part '", part, "' (throughput, ring, overlap)"));
    }
  }
  return 0;
}
