// Team quotas (issue 29, first slice): per team and resource (gpus, cpus, memory) a nominal quota
// and a borrowing limit. A job is charged what it is granted (its placements: a `cpus: 0` job is
// charged the cores it gets). A team's running jobs and the next one together stay within nominal
// + borrowing on every resource that has a quota; a resource without one is unlimited. Pure
// functions over the team's usage, no clock and no store: the coordinator sums the usage and asks.
//
// Quotas are caps, not reservations, until preemption lands: a team under its nominal quota waits
// for free resources like any other, whether or not the nominal quotas add up to more than the
// live workers hold (workers leave). Running past nominal is "borrowing"; it is allowed up to the
// borrowing limit whenever the resources are free.
#ifndef STOKER_SERVER_POLICY_QUOTA_H_
#define STOKER_SERVER_POLICY_QUOTA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "stoker.pb.h"

namespace stoker {

// The three resources quotas are set on.
struct ResourceAmounts {
  int64_t gpus = 0;
  int64_t cpus = 0;
  int64_t memory_bytes = 0;
  ResourceAmounts& operator+=(const ResourceAmounts& other) {
    gpus += other.gpus;
    cpus += other.cpus;
    memory_bytes += other.memory_bytes;
    return *this;
  }
};

// What a placement is charged: its GPUs, cores and memory.
ResourceAmounts ChargeOf(const v1::Placement& placement);
// The least a job will be charged, from its request: per rank its GPUs, its cpus (at least 1) and
// its memory, times the ranks.
ResourceAmounts LeastChargeOf(const v1::JobSpec& spec);
ResourceAmounts LeastChargeOf(const v1::ResourceSpec& request, int replicas);

struct QuotaLimit {
  int64_t nominal = 0;
  int64_t borrow = 0;
};
// A team's quotas; a resource without one is unlimited. And its fair-share weight
// (policy/fair_share.h), which limits nothing.
struct TeamQuota {
  std::optional<QuotaLimit> gpus, cpus, memory_bytes;
  double weight = 1;
  bool empty() const { return !gpus && !cpus && !memory_bytes; }
};
using Quotas = std::map<std::string, TeamQuota>;

// "gpus", "cpus", "memory" to the limit's slot in `quota` (nullptr for another name).
std::optional<QuotaLimit>* LimitOf(TeamQuota& quota, const std::string& resource);

// OK when `team`'s `usage` plus `charge` stays within nominal + borrowing on every resource with a
// quota; else RESOURCE_EXHAUSTED saying where it stands: "quota: team vision uses 4 of 4 GPUs,
// borrowing 0 of 4; the job needs 1".
absl::Status QuotaAdmits(const std::string& team, const TeamQuota& quota,
                         const ResourceAmounts& usage, const ResourceAmounts& charge);
// FAILED_PRECONDITION when `need` alone is more than nominal + borrowing on some resource: the job
// can never run under this quota (refused at submit).
absl::Status QuotaCanHold(const std::string& team, const TeamQuota& quota,
                          const ResourceAmounts& need);

}  // namespace stoker

#endif  // STOKER_SERVER_POLICY_QUOTA_H_
