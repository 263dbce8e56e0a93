// Loopback all-reduce bandwidth of the Gloo collective (comm/collective.h) with N ranks as threads
// of this process, pinned to one core each (--pin; see its help): (a) one buffer per size
// through Collective::AllReduceSum (Gloo's chunked ring over sync-mode pairs), plus a row that
// alternates 4 KiB, 256 KiB, 16 B and 1 MiB call by call, (b) a training step's gradients of the
// example MLP (784-256-128-10, examples/fashion-mnist-mlp.yaml) through the BucketedReducer, as a
// model hands them over (reverse parameter order), at several bucket caps.
// Prints markdown tables: algorithm bandwidth (bytes summed per second) and bus bandwidth
// (algorithm x 2(n-1)/n, the bytes each rank's link carries in a ring).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_main.h"
#include "comm/collective.h"

ABSL_FLAG(int, ranks, 2, "ranks (threads), each pinned to core rank % cores");
ABSL_FLAG(std::string, sizes, "4096,16384,65536,262144,1048576,4194304,16777216,67108864",
          "buffer sizes in bytes for (a)");
ABSL_FLAG(int64_t, bytes_per_size, 1ll << 30,
          "bytes to sum per size in (a): iterations = this / size, within [5, 5000]");
ABSL_FLAG(int, steps, 300, "MLP gradient steps per bucket cap in (b)");
ABSL_FLAG(std::string, bucket_caps, "26214400,1048576,262144",
          "bucket caps in bytes for (b) (25 MiB is PyTorch DDP's default)");
ABSL_FLAG(std::string, pin, "rank",
          "none; rank: pin rank r's thread to core r % cores, Gloo's event-loop threads free; "
          "all: pin Gloo's threads of rank r there too");

namespace stoker {
namespace {

// The example MLP's trained tensors in the order backward finishes them (reverse parameter order).
const std::vector<int64_t> kMlpGradients = {10, 128 * 10, 128, 256 * 128, 256, 784 * 256};

// Pins this thread to core rank % cores when --pin asks for it at `stage` ("rank" when measuring,
// "all" also while connecting: Gloo's event-loop thread, started then, inherits the mask).
void Pin(int rank, absl::string_view stage) {
  const std::string pin = absl::GetFlag(FLAGS_pin);
  if (pin == "none" || (stage == "all" && pin != "all")) return;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<int>(rank % std::max(1l, cores)), &set);
  sched_setaffinity(0, sizeof(set), &set);  // this thread; threads it starts inherit it
}

template <typename F>
void OnRanks(int size, F body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) threads.emplace_back([&body, rank] { body(rank); });
  for (std::thread& thread : threads) thread.join();
}

void Die(const absl::Status& status) {
  std::fprintf(stderr, "allreduce_bench: %s\n", status.ToString().c_str());
  std::exit(1);
}

std::string Human(double bytes) {
  if (bytes >= (1 << 20)) return absl::StrCat(bytes / (1 << 20), " MiB");
  if (bytes >= (1 << 10)) return absl::StrCat(bytes / (1 << 10), " KiB");
  return absl::StrCat(bytes, " B");
}

}  // namespace

int BenchMain() {
  const int size = absl::GetFlag(FLAGS_ranks);
  std::vector<int64_t> sizes;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(text, &bytes) || bytes < 4) Die(absl::InvalidArgumentError("--sizes"));
    sizes.push_back(bytes);
  }
  std::vector<int64_t> caps;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_bucket_caps), ',')) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(text, &bytes) || bytes < 4) {
      Die(absl::InvalidArgumentError("--bucket_caps"));
    }
    caps.push_back(bytes);
  }
  const std::string pin = absl::GetFlag(FLAGS_pin);
  if (pin != "none" && pin != "rank" && pin != "all") {
    Die(absl::InvalidArgumentError("--pin must be none, rank or all"));
  }
  const double bus_factor = 2.0 * (size - 1) / size;

  // Connect; each rank's thread pins itself first, so Gloo's threads inherit its core.
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  std::vector<std::unique_ptr<Collective>> collectives(size);
  std::vector<absl::Status> statuses(size);
  OnRanks(size, [&](int rank) {
    Pin(rank, "all");
    GlooOptions options;
    options.rank = rank;
    options.size = size;
    options.store_prefix = "bench/";
    absl::StatusOr<std::unique_ptr<Collective>> collective = ConnectGloo(options, *store);
    statuses[rank] = collective.status();
    if (collective.ok()) collectives[rank] = std::move(*collective);
  });
  for (const absl::Status& status : statuses) {
    if (!status.ok()) Die(status);
  }

  std::printf(
      "(a) Collective::AllReduceSum (Gloo ring, sync-mode pairs), %d ranks as threads, "
      "--pin=%s\n\n",
      size, absl::GetFlag(FLAGS_pin).c_str());
  std::printf("| size | iterations | time per all-reduce (us) | algbw (GB/s) | busbw (GB/s) |\n");
  std::printf("|---:|---:|---:|---:|---:|\n");
  for (int64_t bytes : sizes) {
    const size_t count = static_cast<size_t>(bytes) / sizeof(float);
    const int iterations =
        static_cast<int>(std::clamp<int64_t>(absl::GetFlag(FLAGS_bytes_per_size) / bytes, 5, 5000));
    std::vector<double> seconds(size);
    OnRanks(size, [&](int rank) {
      Pin(rank, "rank");
      std::vector<float> data(count, 1.0f);
      absl::Status status;
      for (int i = 0; i < 3 && status.ok(); ++i) {
        status = collectives[rank]->AllReduceSum(data.data(), count);
      }
      if (status.ok()) status = collectives[rank]->Barrier();
      const absl::Time start = absl::Now();
      for (int i = 0; i < iterations && status.ok(); ++i) {
        // Keep the values bounded: 1 + 1 + ... would grow to inf over thousands of sums.
        if (i % 64 == 0) std::fill(data.begin(), data.end(), 1.0f);
        status = collectives[rank]->AllReduceSum(data.data(), count);
      }
      seconds[rank] = absl::ToDoubleSeconds(absl::Now() - start);
      if (!status.ok()) Die(status);
    });
    const double per_call = *std::max_element(seconds.begin(), seconds.end()) / iterations;
    const double algbw = static_cast<double>(count * sizeof(float)) / per_call;
    std::printf("| %s | %d | %.1f | %.3f | %.3f |\n", Human(static_cast<double>(bytes)).c_str(),
                iterations, per_call * 1e6, algbw / 1e9, algbw * bus_factor / 1e9);
  }

  {
    // Alternating sizes, one buffer per size (as a reducer's buckets and a loop's small sums).
    const std::vector<size_t> counts = {1024, 65536, 4, 262144};
    size_t round_bytes = 0;
    for (size_t count : counts) round_bytes += count * sizeof(float);
    const int rounds = 500;
    std::vector<double> seconds(size);
    std::vector<double> slowest(size);
    OnRanks(size, [&](int rank) {
      Pin(rank, "rank");
      std::vector<std::vector<float>> buffers;
      for (size_t count : counts) buffers.emplace_back(count, 1.0f);
      absl::Status status;
      for (auto& buffer : buffers) {
        if (status.ok()) status = collectives[rank]->AllReduceSum(buffer.data(), buffer.size());
      }
      if (status.ok()) status = collectives[rank]->Barrier();
      const absl::Time start = absl::Now();
      for (int i = 0; i < rounds && status.ok(); ++i) {
        for (auto& buffer : buffers) {
          if (i % 64 == 0) std::fill(buffer.begin(), buffer.end(), 1.0f);
          const absl::Time call = absl::Now();
          status = collectives[rank]->AllReduceSum(buffer.data(), buffer.size());
          slowest[rank] = std::max(slowest[rank], absl::ToDoubleSeconds(absl::Now() - call));
          if (!status.ok()) break;
        }
      }
      seconds[rank] = absl::ToDoubleSeconds(absl::Now() - start);
      if (!status.ok()) Die(status);
    });
    const int calls = rounds * static_cast<int>(counts.size());
    const double per_call = *std::max_element(seconds.begin(), seconds.end()) / calls;
    const double algbw = static_cast<double>(round_bytes) * rounds /
                         *std::max_element(seconds.begin(), seconds.end());
    std::printf("| 4K,256K,16B,1M alternating (slowest call %.1f ms) | %d | %.1f | %.3f | %.3f |\n",
                *std::max_element(slowest.begin(), slowest.end()) * 1e3, calls, per_call * 1e6,
                algbw / 1e9, algbw * bus_factor / 1e9);
  }

  int64_t mlp_floats = 0;
  for (int64_t count : kMlpGradients) mlp_floats += count;
  const int steps = absl::GetFlag(FLAGS_steps);
  std::printf(
      "\n(b) BucketedReducer, the MLP 784-256-128-10's gradients (%lld floats, %s) per step, "
      "%d steps\n\n",
      static_cast<long long>(mlp_floats), Human(static_cast<double>(mlp_floats * 4)).c_str(),
      steps);
  std::printf(
      "| bucket cap | all-reduces per step | time per step (us) | algbw (GB/s) | busbw (GB/s) | "
      "exposed per step (us) |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t cap : caps) {
    std::vector<double> seconds(size);
    std::vector<ReducerCounters> counters(size);
    OnRanks(size, [&](int rank) {
      Pin(rank, "rank");
      BucketOptions options;
      options.bucket_bytes = cap;
      options.global_batch = 128 * size;
      std::unique_ptr<BucketedReducer> reducer = CreateBucketedReducer(*collectives[rank], options);
      std::vector<std::vector<float>> gradients;
      for (int64_t count : kMlpGradients) gradients.emplace_back(count, 0.5f);
      auto step = [&] {
        reducer->SetLocalSamples(128);
        for (size_t t = 0; t < gradients.size(); ++t) {
          std::fill(gradients[t].begin(), gradients[t].end(), 0.5f);
          reducer->GradientReady(static_cast<int>(t), gradients[t].data(),
                                 static_cast<int64_t>(gradients[t].size()));
        }
        return reducer->Finish();
      };
      absl::Status status;
      for (int i = 0; i < 3 && status.ok(); ++i) status = step();  // learns the layout
      if (status.ok()) status = collectives[rank]->Barrier();
      const ReducerCounters before = reducer->counters();
      const absl::Time start = absl::Now();
      for (int i = 0; i < steps && status.ok(); ++i) status = step();
      seconds[rank] = absl::ToDoubleSeconds(absl::Now() - start);
      if (!status.ok()) Die(status);
      ReducerCounters after = reducer->counters();
      after.allreduce_calls -= before.allreduce_calls;
      after.allreduce_bytes -= before.allreduce_bytes;
      after.exposed_seconds -= before.exposed_seconds;
      after.allreduce_seconds -= before.allreduce_seconds;
      counters[rank] = after;
    });
    const double per_step = *std::max_element(seconds.begin(), seconds.end()) / steps;
    const double algbw = static_cast<double>(mlp_floats * 4) / per_step;
    std::printf("| %s | %.0f | %.1f | %.3f | %.3f | %.1f |\n",
                Human(static_cast<double>(cap)).c_str(),
                static_cast<double>(counters[0].allreduce_calls) / steps, per_step * 1e6,
                algbw / 1e9, algbw * bus_factor / 1e9, counters[0].exposed_seconds / steps * 1e6);
  }
  return 0;
}

}  // namespace stoker
