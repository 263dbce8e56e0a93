#include "server/policy/fair_share.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

TEST(DecayedUsageTest, DecaysByHalfPerHalfLifeAndSettlesAtTheSteadyState) {
  DecayedUsage usage(absl::Hours(1));
  usage.Advance(kStart, {});
  // One GPU for a long time: U -> 1 GPU x 3600 s / ln 2.
  usage.Advance(kStart + absl::Hours(40), {{"a", {1, 4, 0}}});
  const double steady = 3600 / std::log(2.0);
  EXPECT_NEAR(usage.usage().at("a").gpus, steady, steady * 1e-9);
  EXPECT_NEAR(usage.usage().at("a").cpus, 4 * steady, 4 * steady * 1e-9);
  // Then nothing for one half-life: half of it.
  usage.Advance(kStart + absl::Hours(41), {});
  EXPECT_NEAR(usage.usage().at("a").gpus, steady / 2, steady * 1e-9);
  // Advancing in many small steps is the same as one big one (the update is exact).
  DecayedUsage a(absl::Minutes(30)), b(absl::Minutes(30));
  a.Advance(kStart, {});
  b.Advance(kStart, {});
  for (int minute = 1; minute <= 90; ++minute) {
    a.Advance(kStart + absl::Minutes(minute), {{"t", {2, 0, 0}}});
  }
  b.Advance(kStart + absl::Minutes(90), {{"t", {2, 0, 0}}});
  EXPECT_NEAR(a.usage().at("t").gpus, b.usage().at("t").gpus, 1e-6 * b.usage().at("t").gpus);
  // The clock never runs backwards.
  const double before = a.usage().at("t").gpus;
  a.Advance(kStart, {{"t", {100, 0, 0}}});
  EXPECT_EQ(a.usage().at("t").gpus, before);
}

TEST(DominantShareTest, TakesTheLargestResourceShareOverTheWeight) {
  const absl::Duration h = absl::Hours(1);
  const double full = 3600 / std::log(2.0);
  const ResourceAmounts capacity{8, 64, 0};  // memory without capacity is left out
  // Half the GPUs, a quarter of the cores: GPUs dominate.
  // Held for long, usage and allocation agree.
  const DecayedAmounts u{4 * full, 16 * full, 1e18};
  const ResourceAmounts held{4, 16, 1 << 30};
  EXPECT_DOUBLE_EQ(DominantShare(u, held, capacity, h, 1), 0.5);
  EXPECT_DOUBLE_EQ(DominantShare(u, held, capacity, h, 2), 0.25);
  EXPECT_DOUBLE_EQ(DominantShare(u, held, capacity, h, 0), 0.5);  // weight <= 0 counts as 1
  EXPECT_DOUBLE_EQ(DominantShare(u, held, capacity, h, -3), 0.5);
  EXPECT_DOUBLE_EQ(DominantShare({0, 48 * full, 0}, {0, 48, 0}, capacity, h, 1), 0.75);
  EXPECT_DOUBLE_EQ(DominantShare(u, held, {}, h, 1), 0);  // no capacity at all
  // History alone (nothing running now) and a job that just started count half each.
  EXPECT_DOUBLE_EQ(DominantShare(u, {}, capacity, h, 1), 0.25);
  EXPECT_DOUBLE_EQ(DominantShare({}, {8, 0, 0}, capacity, h, 1), 0.5);
}

TEST(FairShareOrderTest, PriorityThenShareThenSubmitTimeThenJobId) {
  const std::map<std::string, double> shares = {{"busy", 0.6}, {"idle", 0.1}};
  std::vector<QueuedJob> jobs = {
      {"j-5", "busy", 0, 100}, {"j-4", "idle", 0, 300}, {"j-3", "idle", 0, 200},
      {"j-2", "idle", 0, 200}, {"j-9", "busy", 5, 900}, {"j-1", "", 0, 400},
  };
  OrderByFairShare(jobs, shares);
  std::vector<std::string> order;
  for (const QueuedJob& j : jobs) order.push_back(j.job_id);
  // Priority 5 first; then no team (share 0); then idle's by submit time and id; busy last.
  EXPECT_EQ(order, (std::vector<std::string>{"j-9", "j-1", "j-2", "j-3", "j-4", "j-5"}));
}

TEST(FairShareOrderTest, SameInputsGiveTheSameOrderWhateverTheirOrder) {
  std::mt19937 rng(7);
  std::vector<QueuedJob> jobs;
  std::map<std::string, double> shares;
  for (int t = 0; t < 5; ++t) shares[absl::StrCat("t", t)] = (rng() % 4) / 4.0;
  for (int i = 0; i < 300; ++i) {
    jobs.push_back({absl::StrCat("j-", i), absl::StrCat("t", rng() % 5),
                    static_cast<int>(rng() % 3), static_cast<int64_t>(rng() % 20)});
  }
  std::vector<QueuedJob> first = jobs;
  OrderByFairShare(first, shares);
  for (int round = 0; round < 5; ++round) {
    std::shuffle(jobs.begin(), jobs.end(), rng);
    std::vector<QueuedJob> again = jobs;
    OrderByFairShare(again, shares);
    for (size_t i = 0; i < jobs.size(); ++i) ASSERT_EQ(again[i].job_id, first[i].job_id) << i;
  }
}

// Two teams that always have work queued, weights 1:3, on 8 GPUs: a freed GPU goes to the first
// job in fair-share order. Over 400 simulated hours the device-hours split 1:3 within 5 %.
struct SimResult {
  std::map<std::string, double> gpu_hours;
  std::vector<std::string> starts;  // team of each start, in order
};

SimResult Simulate(const std::map<std::string, double>& weights, absl::Duration job_length,
                   absl::Duration half_life, int hours) {
  constexpr int kGpus = 8;
  DecayedUsage usage(half_life);
  usage.Advance(kStart, {});
  struct Running {
    std::string team;
    absl::Time end;
  };
  std::vector<Running> running;
  std::map<std::string, int> submitted;
  SimResult result;
  const ResourceAmounts capacity{kGpus, 0, 0};
  const absl::Duration tick = absl::Minutes(1);
  for (absl::Time now = kStart; now < kStart + absl::Hours(hours); now += tick) {
    std::map<std::string, ResourceAmounts> held;
    for (const Running& r : running) held[r.team].gpus += 1;
    usage.Advance(now, held);
    for (const auto& [team, amounts] : held) {
      result.gpu_hours[team] += amounts.gpus * absl::ToDoubleHours(tick);
    }
    std::erase_if(running, [&](const Running& r) { return r.end <= now; });
    held.clear();
    for (const Running& r : running) held[r.team].gpus += 1;
    while (static_cast<int>(running.size()) < kGpus) {
      // Each team keeps its next job at the head of its own queue (always busy).
      std::vector<QueuedJob> queue;
      for (const auto& [team, weight] : weights) {
        queue.push_back({absl::StrCat(team, "-", submitted[team]), team, 0,
                         absl::ToUnixMillis(kStart) + submitted[team]});
      }
      OrderByFairShare(queue, Shares(usage, held, capacity, weights));
      const std::string team = queue.front().team;
      ++submitted[team];
      held[team].gpus += 1;
      running.push_back({team, now + job_length});
      result.starts.push_back(team);
    }
  }
  return result;
}

TEST(FairShareSimulationTest, WeightsOneToThreeGetOneToThreeOfTheDeviceHours) {
  for (const absl::Duration job_length : {absl::Minutes(30), absl::Hours(2)}) {
    const SimResult result =
        Simulate({{"a", 1}, {"b", 3}}, job_length, absl::Hours(24), /*hours=*/400);
    const double a = result.gpu_hours.at("a"), b = result.gpu_hours.at("b");
    EXPECT_NEAR(a / (a + b), 0.25, 0.25 * 0.05)
        << "jobs of " << job_length << ": a " << a << " GPU-hours, b " << b;
  }
  // Equal weights: equal halves.
  const SimResult even = Simulate({{"a", 1}, {"b", 1}}, absl::Hours(1), absl::Hours(24), 400);
  const double a = even.gpu_hours.at("a"), b = even.gpu_hours.at("b");
  EXPECT_NEAR(a / (a + b), 0.5, 0.5 * 0.05);
}

TEST(FairShareSimulationTest, TheSameInputsGiveTheSameScheduleTwice) {
  const SimResult one =
      Simulate({{"a", 1}, {"b", 3}, {"c", 2}}, absl::Minutes(45), absl::Hours(6), 100);
  const SimResult two =
      Simulate({{"a", 1}, {"b", 3}, {"c", 2}}, absl::Minutes(45), absl::Hours(6), 100);
  EXPECT_EQ(one.starts, two.starts);
  EXPECT_EQ(one.gpu_hours, two.gpu_hours);
}

}  // namespace
}  // namespace stoker
