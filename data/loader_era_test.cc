// Randomized schedule test of the loader-era protocol (`loader.processes: auto`): loaders (one
// thread each, running RunLoader on its own mapping of the region, as a process would), a
// consumer, and an agent that changes the loader count at random moments and starts and reaps
// loaders the way job_runner.cc does. Slots, loaders, batch counts, paces and start-up delays
// are drawn at random, so era boundaries fall on every residue. Every run must deliver the whole
// batch stream, identical to the one a single BatchMaker makes, with no wait running into the
// deadlock timeout.
//
// Before the fix of issue 12 this schedule (with the agent's part as it was: ChangeLoaderCount at
// consumer_next + slot_count, then start the new era's loaders) deadlocked in the first to third
// run, after well under 0.1 s of schedule, in each of ten tries; with only the loader's old loop
// (a next batch derived from an older era table) it still deadlocked in the first run.
// STOKER_ERA_TEST_SECONDS (default 10) sets how long it runs, STOKER_ERA_TEST_SEED the first
// run's seed.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/job_region.h"
#include "data/loader.h"
#include "data/test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;

// FNV-1a over a batch stream.
class StreamHash {
 public:
  void Add(const void* bytes, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      hash_ = (hash_ ^ static_cast<const uint8_t*>(bytes)[i]) * 0x100000001b3ull;
    }
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

LabeledSamples TinyData(int count) {
  return testing::PatternSamples(count, {2, 2}, [](int i, int j) { return i * 5 + j; });
}

// One loader "process": a thread with its own attachment of the region.
struct LoaderThread {
  std::thread thread;
  std::atomic<bool> finished{false};
  absl::Status status;
};

struct RunResult {
  bool ok = true;
  std::string failure;
  int eras = 0;
  int loader_starts = 0;  // including the first ones
};

// One job: random geometry, a consumer with a random pace, an agent changing the loader count at
// random moments. `rng_seed` reproduces the schedule's choices (not the thread interleaving).
RunResult RunOnce(uint64_t rng_seed, std::set<std::pair<uint32_t, uint32_t>>& residues) {
  std::mt19937_64 rng(rng_seed);
  auto uniform = [&rng](int lo, int hi) {  // [lo, hi]
    return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  const int count = uniform(20, 90);
  const uint32_t batch_size = static_cast<uint32_t>(uniform(1, 9));
  const LabeledSamples data = TinyData(count);
  const uint64_t seed = rng();
  const int64_t per_epoch = BatchesPerEpoch(count, static_cast<int>(batch_size));
  RingGeometry g;
  g.slot_count = static_cast<uint32_t>(uniform(2, 9));
  g.batch_size = batch_size;
  g.sample_bytes = static_cast<uint32_t>(data.sample_bytes);
  g.loader_count = static_cast<uint32_t>(uniform(2, 6));
  g.initial_loaders = static_cast<uint32_t>(uniform(1, static_cast<int>(g.loader_count)));
  g.total_batches =
      static_cast<uint64_t>(per_epoch) * static_cast<uint64_t>(uniform(1, 1 + 400 / per_epoch));
  absl::StatusOr<std::unique_ptr<JobRegion>> created = JobRegion::Create(g);
  if (!created.ok()) return {false, std::string(created.status().message())};
  JobRegion& region = **created;
  region.SetConsumerPid(getpid());

  // Expected stream: what one BatchMaker makes, batch by batch.
  StreamHash expected;
  {
    BatchMaker maker(data, batch_size, seed);
    std::vector<uint8_t> samples(batch_size * data.sample_bytes), labels(batch_size);
    for (uint64_t b = 0; b < g.total_batches; ++b) {
      const uint32_t n = *maker.Make(b, samples.data(), labels.data());
      expected.Add(&b, sizeof(b));
      expected.Add(&n, sizeof(n));
      expected.Add(samples.data(), n * data.sample_bytes);
      expected.Add(labels.data(), n);
    }
  }

  // The loaders: slot k holds loader k's thread while it runs.
  std::vector<std::unique_ptr<LoaderThread>> loaders(g.loader_count);
  std::atomic<int> starts{0};
  // A loader takes `startup_us` to start (a real one loads its data first), during which more
  // eras may begin; then it makes a batch every `delay_ms`.
  auto start_loader = [&](uint32_t index, int delay_ms, int startup_us) {
    auto loader = std::make_unique<LoaderThread>();
    LoaderThread* raw = loader.get();
    raw->thread = std::thread([&region, &data, raw, index, seed, delay_ms, startup_us] {
      std::this_thread::sleep_for(std::chrono::microseconds(startup_us));
      absl::StatusOr<std::unique_ptr<JobRegion>> mine = JobRegion::Attach(region.fd());
      if (!mine.ok()) {
        raw->status = mine.status();
      } else {
        LoaderOptions options;
        options.index = index;
        options.seed = seed;
        options.delay_ms = delay_ms;
        raw->status = RunLoader(**mine, data, options);
      }
      raw->finished.store(true);
    });
    loaders[index] = std::move(loader);
    starts.fetch_add(1);
  };
  // Loaders that are slow now and then (1 ms a batch), so that any of them can be the one the
  // others wait for.
  auto delay = [&] { return uniform(0, 3) == 0 ? 1 : 0; };
  for (uint32_t k = 0; k < region.ActiveLoaderCount(); ++k) start_loader(k, delay(), 0);

  // The agent: changes the count at random moments; starts loaders that are needed.
  std::atomic<bool> done{false};
  std::string agent_error;
  std::mt19937_64 agent_rng(rng());
  const int agent_pause_us = uniform(0, 3) * 300;
  int eras = 0;
  uint64_t last_era_start = 0;
  std::thread agent([&] {
    while (!done.load()) {
      if (agent_pause_us > 0) {
        std::this_thread::sleep_for(
            std::chrono::microseconds(agent_rng() % static_cast<uint64_t>(agent_pause_us)));
      } else {
        std::this_thread::yield();
      }
      // Reap loaders that ended.
      for (uint32_t k = 0; k < g.loader_count; ++k) {
        if (loaders[k] && loaders[k]->finished.load()) {
          loaders[k]->thread.join();
          if (!loaders[k]->status.ok() && !absl::IsCancelled(loaders[k]->status)) {
            agent_error = absl::StrCat("loader ", k, ": ", loaders[k]->status.ToString());
          }
          loaders[k].reset();
        }
      }
      // As job_runner.cc does: ask for a count (the consumer appends the era), and start every
      // loader that owes a batch and is not running.
      if (agent_rng() % 3 == 0) {
        const uint32_t wanted = 1 + static_cast<uint32_t>(agent_rng() % g.loader_count);
        if (!region.RequestLoaderCount(wanted).ok()) agent_error = "RequestLoaderCount refused";
      }
      const uint64_t era_start = region.ActiveEraStart();
      if (era_start != last_era_start) {
        last_era_start = era_start;
        ++eras;
        residues.insert({static_cast<uint32_t>(era_start % g.slot_count),
                         static_cast<uint32_t>(era_start % region.ActiveLoaderCount())});
      }
      for (uint32_t k = 0; k < g.loader_count; ++k) {
        if (!loaders[k] && region.LoaderNeeded(k)) {
          start_loader(k, static_cast<int>(agent_rng() % 4 == 0),
                       agent_rng() % 2 == 0 ? 0 : static_cast<int>(agent_rng() % 3000));
        }
      }
    }
  });

  // The consumer: in order, at a random pace (ahead of the loaders or behind them).
  RunResult result;
  const int consumer_pause_us = uniform(0, 2) * 100;
  StreamHash got;
  // Far longer than any wait of a working pipeline here (batches take microseconds to make).
  const auto deadlock_timeout = absl::Seconds(10);
  for (uint64_t b = 0; b < g.total_batches; ++b) {
    absl::StatusOr<ReadableBatch> batch = region.WaitReadable(b, deadlock_timeout);
    if (!batch.ok()) {
      std::ostringstream out;
      out << "seed " << rng_seed << ": batch " << b << " of " << g.total_batches << ": "
          << batch.status() << " (slots " << g.slot_count << ", loaders at most " << g.loader_count
          << ", active " << region.ActiveLoaderCount() << ")";
      result = {false, out.str()};
      break;
    }
    got.Add(&b, sizeof(b));
    got.Add(&batch->count, sizeof(batch->count));
    got.Add(batch->samples, batch->count * data.sample_bytes);
    got.Add(batch->labels, batch->count);
    if (consumer_pause_us > 0 && rng() % 4 == 0) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(rng() % static_cast<uint64_t>(consumer_pause_us)));
    }
    region.Release(b);
  }
  done.store(true);
  agent.join();
  region.RequestStop();  // frees any loader still waiting (only after a failure)
  for (auto& loader : loaders) {
    if (loader) loader->thread.join();
  }
  if (result.ok && got.value() != expected.value()) {
    result = {false, absl::StrCat("seed ", rng_seed, ": the batch stream differs")};
  }
  if (result.ok && !agent_error.empty()) result = {false, agent_error};
  result.eras = eras;
  result.loader_starts = starts.load();
  return result;
}

// The hang of issue 12, step by step: 4 loaders, 4 slots. The consumer has released batch 0, so
// loader 0 made batch 4 and, with the table of the time, looks for batch 8 next. Then an era of
// 2 loaders starts at batch 5 (the first batch whose slot is not free yet): batch 6 becomes loader
// 0's, which it had passed over, while loader 2, which owned 6 before, drops it and retires.
// Before the fix nobody made batch 6: the consumer waited for it, loaders 0 and 1 for free slots.
TEST(LoaderEraTest, ALoaderAlreadyPastANewErasStartMakesTheBatchesItGains) {
  const LabeledSamples data = TinyData(40);
  RingGeometry g;
  g.slot_count = 4;
  g.batch_size = 2;
  g.sample_bytes = static_cast<uint32_t>(data.sample_bytes);
  g.loader_count = 4;
  g.total_batches = 40;
  absl::StatusOr<std::unique_ptr<JobRegion>> created = JobRegion::Create(g);
  ASSERT_TRUE(created.ok()) << created.status();
  JobRegion& region = **created;
  region.SetConsumerPid(getpid());
  std::vector<std::thread> loaders;
  std::vector<absl::Status> statuses(4);
  std::atomic<int> finished{0};
  for (uint32_t k = 0; k < 4; ++k) {
    loaders.emplace_back([&, k] {
      LoaderOptions options;
      options.index = k;
      options.seed = 3;
      statuses[k] = RunLoader(region, data, options);
      finished.fetch_add(1);
    });
  }
  BatchMaker maker(data, g.batch_size, 3);
  std::vector<uint8_t> samples(g.batch_size * g.sample_bytes), labels(g.batch_size);
  auto consume = [&](uint64_t b) {
    absl::StatusOr<ReadableBatch> batch = region.WaitReadable(b, absl::Seconds(5));
    ASSERT_TRUE(batch.ok()) << "batch " << b << " (loader " << region.LoaderFor(b)
                            << "): " << batch.status();
    const uint32_t count = *maker.Make(b, samples.data(), labels.data());
    ASSERT_EQ(batch->count, count);
    EXPECT_EQ(std::memcmp(batch->samples, samples.data(), count * g.sample_bytes), 0) << b;
    region.Release(b);
  };
  consume(0);
  ASSERT_TRUE(region.WaitReadable(4, absl::Seconds(5)).ok());  // loader 0 made batch 4
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // and looks for its next one
  // From the consumer's thread, so start 5 = consumer_next + slot_count is safe to append.
  ASSERT_TRUE(region.ChangeLoaderCount(5, 2).ok());
  EXPECT_EQ(region.LoaderFor(6), 0u);
  for (uint64_t b = 1; b < g.total_batches && !HasFatalFailure(); ++b) consume(b);
  // Every loader ends by itself once the era table leaves it nothing to make (loader 3, retired
  // at batch 5, may still be waking from its wait for batch 7's slot on a busy machine); the
  // stop only ends one that would not, and fails the test through its CANCELLED status.
  for (int waited_ms = 0; finished.load() < 4 && waited_ms < 10000; waited_ms += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  region.RequestStop();
  for (std::thread& t : loaders) t.join();
  for (uint32_t k = 0; k < 4; ++k) EXPECT_TRUE(statuses[k].ok()) << k << ": " << statuses[k];
  EXPECT_EQ(region.stats().loader_batches_total.load(), g.total_batches);
}

// Runs schedules for STOKER_ERA_TEST_SECONDS (default 10) seconds.
TEST(LoaderEraScheduleTest, RandomGrowAndShrinkNeverDeadlocksAndKeepsTheStream) {
  const char* env = std::getenv("STOKER_ERA_TEST_SECONDS");
  const double seconds = env != nullptr ? std::atof(env) : 10.0;
  const char* seed_env = std::getenv("STOKER_ERA_TEST_SEED");
  uint64_t seed = seed_env != nullptr
                      ? std::strtoull(seed_env, nullptr, 10)
                      : static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  std::cout << "first seed " << seed << "\n";
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::set<std::pair<uint32_t, uint32_t>> residues;
  int runs = 0, eras = 0, loader_starts = 0;
  for (; Clock::now() < deadline; ++runs, ++seed) {
    const RunResult result = RunOnce(seed, residues);
    eras += result.eras;
    loader_starts += result.loader_starts;
    if (!result.ok) {
      FAIL() << "run " << runs + 1 << " after "
             << std::chrono::duration<double>(Clock::now() - start).count()
             << " s: " << result.failure;
    }
  }
  std::cout << runs << " runs in " << std::chrono::duration<double>(Clock::now() - start).count()
            << " s, " << eras << " loader count changes, " << loader_starts << " loader starts, "
            << residues.size() << " distinct (era start % slots, era start % loaders) pairs\n";
  EXPECT_GT(runs, 0);
}

}  // namespace
}  // namespace stoker
