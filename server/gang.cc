#include "server/gang.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/scheduler.h"

namespace stoker {

void Ledger::Put(const RankKey& key, HeldRank held) {
  Erase(key);
  usage_[held.team] += ChargeOf(held.placement);
  entries_.emplace(key, std::move(held));
}

void Ledger::Uncharge(const HeldRank& held) {
  auto it = usage_.find(held.team);
  if (it == usage_.end()) return;
  const ResourceAmounts charge = ChargeOf(held.placement);
  it->second.gpus -= charge.gpus;
  it->second.cpus -= charge.cpus;
  it->second.memory_bytes -= charge.memory_bytes;
  if (it->second.gpus == 0 && it->second.cpus == 0 && it->second.memory_bytes == 0) {
    usage_.erase(it);
  }
}

Ledger::const_iterator Ledger::Erase(const_iterator it) {
  Uncharge(it->second);
  return entries_.erase(it);
}

void Ledger::Erase(const RankKey& key) {
  if (auto it = entries_.find(key); it != entries_.end()) Erase(it);
}

void Ledger::MarkDelivered(const_iterator it, absl::Time when) {
  HeldRank& held = entries_.erase(it, it)->second;  // the same entry, writable
  held.delivered = true;
  held.delivered_at = when;
}

bool IsGang(const v1::JobSpec& spec) { return ReplicasOf(spec) > 1; }

std::string WorkerOfRank(const v1::Job& job, int rank) {
  if (job.rank_placements_size() == 0) return rank == 0 ? job.worker_id() : "";
  if (rank < 0 || rank >= job.rank_placements_size()) return "";
  return job.rank_placements(rank).worker_id();
}

bool RunsRank(const v1::Job& job, const std::string& worker_id, int attempt, int rank) {
  return job.attempt() == attempt && !worker_id.empty() && WorkerOfRank(job, rank) == worker_id;
}

std::string PlacementText(const v1::Placement& placement) {
  std::string gpus;
  if (placement.gpu_indices_size() > 0) {
    gpus = absl::StrCat(placement.gpu_indices_size() == 1 ? "GPU " : "GPUs ",
                        absl::StrJoin(placement.gpu_indices(), ","), ", ");
  }
  return absl::StrCat(gpus, placement.cpus(), " cpus, ", FormatBytes(placement.memory_bytes()),
                      " memory");
}

std::string GangPlacementText(const v1::Job& job) {
  std::vector<std::string> ranks;
  for (const v1::Placement& placement : job.rank_placements()) {
    ranks.push_back(absl::StrCat("rank ", placement.rank(), " on ", placement.worker_id(), " (",
                                 PlacementText(placement), ")"));
  }
  return absl::StrJoin(ranks, ", ");
}

}  // namespace stoker
