#include "server/policy/preemption.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace stoker {
namespace {

ResourceAmounts UsageOf(const std::string& team,
                        const std::map<std::string, ResourceAmounts>& usage) {
  const auto it = usage.find(team);
  return it == usage.end() ? ResourceAmounts{} : it->second;
}

ResourceAmounts ChargeOfAll(const RunningJob& job) {
  ResourceAmounts charge;
  for (const v1::Placement& p : job.placements) charge += ChargeOf(p);
  return charge;
}

// The least `p` will be charged (LeastChargeOf its request and ranks).
ResourceAmounts NeedOf(const Preemptor& p) {
  v1::JobSpec spec;
  *spec.mutable_resources() = p.request;
  spec.mutable_resources()->set_replicas(p.replicas);
  return LeastChargeOf(spec);
}

// `workers` with `job`'s placements given back.
void Free(const RunningJob& job, std::vector<WorkerView>& workers) {
  for (const v1::Placement& p : job.placements) {
    for (WorkerView& w : workers) {
      if (w.worker_id != p.worker_id()) continue;
      w.free.cpus += p.cpus();
      w.free.memory_bytes += p.memory_bytes();
      for (int i = 0; i < p.gpu_indices_size(); ++i) {
        GpuId gpu{p.gpu_indices(i), i < p.gpu_uuids_size() ? p.gpu_uuids(i) : ""};
        auto at =
            std::lower_bound(w.free.gpus.begin(), w.free.gpus.end(), gpu,
                             [](const GpuId& a, const GpuId& b) { return a.index < b.index; });
        if (at == w.free.gpus.end() || at->index != gpu.index) w.free.gpus.insert(at, gpu);
      }
    }
  }
}

}  // namespace

bool Borrowing(const std::string& team, const Quotas& quotas,
               const std::map<std::string, ResourceAmounts>& usage) {
  const auto quota = quotas.find(team);
  if (quota == quotas.end()) return false;
  const ResourceAmounts used = UsageOf(team, usage);
  const TeamQuota& q = quota->second;
  return (q.gpus && used.gpus > q.gpus->nominal) || (q.cpus && used.cpus > q.cpus->nominal) ||
         (q.memory_bytes && used.memory_bytes > q.memory_bytes->nominal);
}

bool WithinNominal(const std::string& team, const Quotas& quotas,
                   const std::map<std::string, ResourceAmounts>& usage,
                   const ResourceAmounts& extra) {
  const auto quota = quotas.find(team);
  if (quota == quotas.end() || quota->second.empty()) return false;
  const ResourceAmounts used = UsageOf(team, usage);
  const TeamQuota& q = quota->second;
  return (!q.gpus || used.gpus + extra.gpus <= q.gpus->nominal) &&
         (!q.cpus || used.cpus + extra.cpus <= q.cpus->nominal) &&
         (!q.memory_bytes || used.memory_bytes + extra.memory_bytes <= q.memory_bytes->nominal);
}

std::optional<std::string> PreemptionReason(const Preemptor& p, const RunningJob& victim,
                                            const Quotas& quotas,
                                            const std::map<std::string, ResourceAmounts>& usage,
                                            const PreemptionOptions& options, absl::Time now) {
  // E
  if (victim.giving_back || now - victim.started < options.min_runtime ||
      victim.preemptions >= options.max_preemptions || p.preempted_by.contains(victim.job_id) ||
      victim.job_id == p.job_id) {
    return std::nullopt;
  }
  const ResourceAmounts need = NeedOf(p);
  const bool has_quota = quotas.contains(p.team) && !quotas.at(p.team).empty();
  const bool within = WithinNominal(p.team, quotas, usage, need);
  if (victim.team == p.team) {
    if (victim.priority < p.priority) {  // R1
      return absl::StrCat("priority ", p.priority, " over ", victim.priority,
                          p.team.empty() ? "" : absl::StrCat(" in team ", p.team));
    }
    return std::nullopt;
  }
  if (Borrowing(victim.team, quotas, usage) && within) {  // R2
    return absl::StrCat("team ", victim.team, " runs past its nominal quota; team ", p.team,
                        " takes back its own");
  }
  if (victim.priority < p.priority && (!has_quota || within)) {  // R3
    return absl::StrCat("priority ", p.priority, " over ", victim.priority);
  }
  return std::nullopt;
}

bool Fits(const Preemptor& p, const std::vector<WorkerView>& workers) {
  if (p.replicas > 1) return PlaceGang(p.request, p.replicas, workers).ok();
  for (const WorkerView& w : workers) {
    if (PlaceOnWorker(p.request, w).ok()) return true;
  }
  return false;
}

std::optional<VictimChoice> ChooseVictims(const Preemptor& p,
                                          const std::vector<RunningJob>& running,
                                          const std::vector<WorkerView>& workers,
                                          const Quotas& quotas,
                                          const std::map<std::string, ResourceAmounts>& usage,
                                          const PreemptionOptions& options, absl::Time now) {
  std::vector<WorkerView> views = workers;
  for (WorkerView& w : views) w.slots = std::numeric_limits<int>::max();  // a victim frees one
  if (Fits(p, views)) return std::nullopt;
  struct Candidate {
    const RunningJob* job;
    std::string reason;
    bool borrowed;
  };
  std::vector<Candidate> candidates;
  for (const RunningJob& job : running) {
    if (std::optional<std::string> why = PreemptionReason(p, job, quotas, usage, options, now)) {
      candidates.push_back({&job, *why, Borrowing(job.team, quotas, usage)});
    }
  }
  // Borrowed first, then the lowest priority, then the most recently started, then the id.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::make_tuple(!a.borrowed, a.job->priority, -absl::ToUnixNanos(a.job->started),
                           a.job->job_id) < std::make_tuple(!b.borrowed, b.job->priority,
                                                            -absl::ToUnixNanos(b.job->started),
                                                            b.job->job_id);
  });
  // P must fit its own team's quota once its own team's victims are freed.
  auto quota_admits = [&](const std::vector<const Candidate*>& chosen) {
    const auto quota = quotas.find(p.team);
    if (quota == quotas.end()) return true;
    ResourceAmounts used = UsageOf(p.team, usage);
    for (const Candidate* c : chosen) {
      if (c->job->team != p.team) continue;
      const ResourceAmounts freed = ChargeOfAll(*c->job);
      used.gpus -= freed.gpus;
      used.cpus -= freed.cpus;
      used.memory_bytes -= freed.memory_bytes;
    }
    return QuotaAdmits(p.team, quota->second, used, NeedOf(p)).ok();
  };
  auto fits_without = [&](const std::vector<const Candidate*>& chosen) {
    std::vector<WorkerView> freed = views;
    for (const Candidate* c : chosen) Free(*c->job, freed);
    return Fits(p, freed) && quota_admits(chosen);
  };
  std::vector<const Candidate*> chosen;
  bool fits = false;
  for (const Candidate& c : candidates) {
    chosen.push_back(&c);
    if (fits_without(chosen)) {
      fits = true;
      break;
    }
  }
  if (!fits) return std::nullopt;
  // Drop what is not needed, the latest added first.
  for (size_t i = chosen.size(); i-- > 0;) {
    std::vector<const Candidate*> fewer = chosen;
    fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(i));
    if (!fewer.empty() && fits_without(fewer)) chosen = std::move(fewer);
  }
  VictimChoice choice;
  for (const Candidate* c : chosen) {
    choice.victims.push_back(c->job->job_id);
    choice.reasons[c->job->job_id] = c->reason;
  }
  return choice;
}

}  // namespace stoker
