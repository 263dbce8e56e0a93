#include "server/policy/fair_share.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

namespace stoker {

void DecayedUsage::Advance(absl::Time now, const std::map<std::string, ResourceAmounts>& running) {
  if (last_ == absl::InfinitePast()) {
    last_ = now;
    return;
  }
  if (now <= last_) return;
  const double dt = absl::ToDoubleSeconds(now - last_);
  const double h = absl::ToDoubleSeconds(half_life_);
  const double decay = std::exp2(-dt / h);
  const double gain = h / std::log(2.0) * (1 - decay);  // integral of the kernel over dt
  for (auto& [team, u] : usage_) {
    u.gpus *= decay;
    u.cpus *= decay;
    u.memory_bytes *= decay;
  }
  for (const auto& [team, r] : running) {
    DecayedAmounts& u = usage_[team];
    u.gpus += static_cast<double>(r.gpus) * gain;
    u.cpus += static_cast<double>(r.cpus) * gain;
    u.memory_bytes += static_cast<double>(r.memory_bytes) * gain;
  }
  last_ = now;
}

void DecayedUsage::Restore(absl::Time at, std::map<std::string, DecayedAmounts> usage) {
  last_ = at;
  usage_ = std::move(usage);
}

double DominantShare(const DecayedAmounts& usage, const ResourceAmounts& running,
                     const ResourceAmounts& capacity, absl::Duration half_life, double weight) {
  const double full = absl::ToDoubleSeconds(half_life) / std::log(2.0);
  double dominant = 0;
  auto consider = [&](double used, int64_t now, int64_t cap) {
    if (cap <= 0) return;
    const double c = static_cast<double>(cap);
    dominant = std::max(dominant, (used / (c * full) + static_cast<double>(now) / c) / 2);
  };
  consider(usage.gpus, running.gpus, capacity.gpus);
  consider(usage.cpus, running.cpus, capacity.cpus);
  consider(usage.memory_bytes, running.memory_bytes, capacity.memory_bytes);
  return dominant / (weight > 0 ? weight : 1.0);
}

std::map<std::string, double> Shares(const DecayedUsage& usage,
                                     const std::map<std::string, ResourceAmounts>& running,
                                     const ResourceAmounts& capacity,
                                     const std::map<std::string, double>& weights) {
  std::set<std::string> teams;
  for (const auto& [team, u] : usage.usage()) teams.insert(team);
  for (const auto& [team, r] : running) teams.insert(team);
  std::map<std::string, double> shares;
  for (const std::string& team : teams) {
    const auto u = usage.usage().find(team);
    const auto r = running.find(team);
    const auto w = weights.find(team);
    shares[team] = DominantShare(u == usage.usage().end() ? DecayedAmounts{} : u->second,
                                 r == running.end() ? ResourceAmounts{} : r->second, capacity,
                                 usage.half_life(), w == weights.end() ? 1 : w->second);
  }
  return shares;
}

bool SchedulesBefore(const QueuedJob& a, const QueuedJob& b,
                     const std::map<std::string, double>& shares) {
  auto share = [&](const std::string& team) {
    const auto it = shares.find(team);
    return it == shares.end() ? 0.0 : it->second;
  };
  return std::forward_as_tuple(-a.priority, share(a.team), a.submit_ms, a.seq, a.job_id) <
         std::forward_as_tuple(-b.priority, share(b.team), b.submit_ms, b.seq, b.job_id);
}

void OrderByFairShare(std::vector<QueuedJob>& jobs, const std::map<std::string, double>& shares) {
  std::sort(jobs.begin(), jobs.end(),
            [&](const QueuedJob& a, const QueuedJob& b) { return SchedulesBefore(a, b, shares); });
}

}  // namespace stoker
