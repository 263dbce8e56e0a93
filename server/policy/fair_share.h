// Fair share among teams (issue 29): usage decayed with a half-life, weighted by team weight and
// measured as dominant-resource share (DRF); the queue ordered by (priority, fair share, submit
// time, job id). Pure functions over a snapshot with the clock passed in: no store, no threads, so
// the same inputs give the same order, and a simulation drives it in tests.
//
// Decayed usage: a team's usage of resource r is U_r(t) = integral over s <= t of
// running_r(s) * 2^(-(t - s) / half_life) ds (resource-seconds). Advancing from t to t + dt with
// the running amounts constant in between is exact: U <- U * d + running * (half_life / ln 2) *
// (1 - d), d = 2^(-dt / half_life). A team that keeps running r forever tends to
// running * half_life / ln 2, so dividing by capacity_r * half_life / ln 2 gives a share in
// [0, 1] of a cluster whose capacity stays the same.
//
// A team's share of resource r is the mean of its decayed share, U_r / (capacity_r * half_life /
// ln 2), and its current one, running_r / capacity_r: history makes a team that used much wait
// behind one that used little, and the current part counts a job from the moment it starts (with
// history alone a team's share rises only as its new jobs run, so a team would be handed more
// devices while its usage catches up: 5 % more than its weight gives in the simulation test).
// Both parts agree for a team that holds the same resources for long. The dominant share is the
// largest of the resources' shares divided by the team's weight (weight 3 gets three times the
// resources of weight 1 at equal standing). Resources with capacity 0 are left out. A team that
// never ran and runs nothing has share 0.
#ifndef STOKER_SERVER_POLICY_FAIR_SHARE_H_
#define STOKER_SERVER_POLICY_FAIR_SHARE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/policy/quota.h"

namespace stoker {

// Decayed resource-seconds, per resource.
struct DecayedAmounts {
  double gpus = 0;
  double cpus = 0;
  double memory_bytes = 0;
};

class DecayedUsage {
 public:
  // `half_life` > 0.
  explicit DecayedUsage(absl::Duration half_life) : half_life_(half_life) {}

  // Decays every team's usage from the last call to `now` and adds what `running` (each team's
  // granted resources, constant since the last call) used meanwhile. The first call only sets the
  // clock; a `now` before the last one changes nothing (the clock never runs backwards here).
  void Advance(absl::Time now, const std::map<std::string, ResourceAmounts>& running);

  const std::map<std::string, DecayedAmounts>& usage() const { return usage_; }
  absl::Duration half_life() const { return half_life_; }
  // Replaces the state (a restarted server's saved usage); `at` is the time it was taken.
  void Restore(absl::Time at, std::map<std::string, DecayedAmounts> usage);
  absl::Time last() const { return last_; }

 private:
  absl::Duration half_life_;
  absl::Time last_ = absl::InfinitePast();
  std::map<std::string, DecayedAmounts> usage_;
};

// The team's dominant share (see above) from its decayed usage and what it runs now; weight <= 0
// counts as 1.
double DominantShare(const DecayedAmounts& usage, const ResourceAmounts& running,
                     const ResourceAmounts& capacity, absl::Duration half_life, double weight);

// Every team's dominant share (teams in neither `usage` nor `running` have 0). A scheduling pass
// that starts a job adds it to `running` and asks again.
std::map<std::string, double> Shares(const DecayedUsage& usage,
                                     const std::map<std::string, ResourceAmounts>& running,
                                     const ResourceAmounts& capacity,
                                     const std::map<std::string, double>& weights);

// A queued job as the ordering sees it.
struct QueuedJob {
  std::string job_id;
  std::string team;  // "" for a job without a team (shares 0)
  int priority = 0;
  int64_t submit_ms = 0;
  int64_t seq = 0;  // the store's sequence number (submit order; server/queue_index.h)
};

// True when `a` goes before `b`: higher priority, then the team with the lower share, then the
// earlier submit, then the lower sequence number, then the lower job id. A strict total order on
// distinct job ids.
bool SchedulesBefore(const QueuedJob& a, const QueuedJob& b,
                     const std::map<std::string, double>& shares);

// Sorts `jobs` by SchedulesBefore.
void OrderByFairShare(std::vector<QueuedJob>& jobs, const std::map<std::string, double>& shares);

}  // namespace stoker

#endif  // STOKER_SERVER_POLICY_FAIR_SHARE_H_
