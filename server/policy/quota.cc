#include "server/policy/quota.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/scheduler.h"

namespace stoker {
namespace {

struct Row {
  const char* noun;  // "GPUs"
  const std::optional<QuotaLimit>& limit;
  int64_t usage;
  int64_t charge;
};

std::string Amount(const char* noun, int64_t value) {
  if (std::string(noun) == "memory") return FormatBytes(value);
  return absl::StrCat(value);
}

std::string Noun(const char* noun) {
  return std::string(noun) == "memory" ? "" : absl::StrCat(" ", noun);
}

}  // namespace

ResourceAmounts ChargeOf(const v1::Placement& placement) {
  return {placement.gpu_indices_size(), placement.cpus(), placement.memory_bytes()};
}

ResourceAmounts LeastChargeOf(const v1::JobSpec& spec) {
  return LeastChargeOf(spec.resources(), ReplicasOf(spec));
}

ResourceAmounts LeastChargeOf(const v1::ResourceSpec& r, int replicas) {
  const int64_t ranks = replicas;
  return {ranks * r.gpus(), ranks * std::max(1, r.cpus()), ranks * r.memory_mib() * (1 << 20)};
}

std::optional<QuotaLimit>* LimitOf(TeamQuota& quota, const std::string& resource) {
  if (resource == "gpus") return &quota.gpus;
  if (resource == "cpus") return &quota.cpus;
  if (resource == "memory") return &quota.memory_bytes;
  return nullptr;
}

absl::Status QuotaAdmits(const std::string& team, const TeamQuota& quota,
                         const ResourceAmounts& usage, const ResourceAmounts& charge) {
  for (const Row& row :
       {Row{"GPUs", quota.gpus, usage.gpus, charge.gpus},
        Row{"cpus", quota.cpus, usage.cpus, charge.cpus},
        Row{"memory", quota.memory_bytes, usage.memory_bytes, charge.memory_bytes}}) {
    if (!row.limit.has_value() || row.charge == 0) continue;
    const QuotaLimit& limit = *row.limit;
    if (row.usage + row.charge <= limit.nominal + limit.borrow) continue;
    const int64_t borrowed = std::max<int64_t>(0, row.usage - limit.nominal);
    return absl::ResourceExhaustedError(absl::StrCat(
        "quota: team ", team, " uses ", Amount(row.noun, std::min(row.usage, limit.nominal)),
        " of ", Amount(row.noun, limit.nominal), Noun(row.noun), ", borrowing ",
        Amount(row.noun, borrowed), " of ", Amount(row.noun, limit.borrow), "; the job needs ",
        Amount(row.noun, row.charge)));
  }
  return absl::OkStatus();
}

absl::Status QuotaCanHold(const std::string& team, const TeamQuota& quota,
                          const ResourceAmounts& need) {
  const absl::Status fits = QuotaAdmits(team, quota, {}, need);
  if (fits.ok()) return fits;
  return absl::FailedPreconditionError(
      absl::StrCat(fits.message(),
                   ", more than the team's quota and borrowing limit together: it could never "
                   "run (an admin raises it: stoker quota set)"));
}

}  // namespace stoker
