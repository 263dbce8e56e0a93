// Ranks of jobs as the coordinator tracks them: the key of a worker's ledger entry (job, attempt,
// rank), what the entry holds, and which worker runs which rank of a job's current attempt.
//
// A job of one rank (resources.replicas 0 or 1) is rank 0 of its attempt, on job.worker_id() with
// job.placement(), as before data-parallel jobs existed. A gang (replicas > 1) keeps every rank's
// placement in job.rank_placements, by rank; job.worker_id() and job.placement() are rank 0's.
//
// A worker's ledger holds an entry per rank placed there. The attempt is part of the key: ranks
// of an attempt that ended keep their entry (and what they hold) until their worker has stopped
// them, while the job's next attempt may already be placed on the same worker. An entry placed
// while another worker heartbeated waits to be delivered in this worker's next heartbeat.
#ifndef STOKER_SERVER_GANG_H_
#define STOKER_SERVER_GANG_H_

#include <compare>
#include <iterator>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "server/policy/quota.h"
#include "stoker.pb.h"

namespace stoker {

struct RankKey {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  friend auto operator<=>(const RankKey&, const RankKey&) = default;
};

struct HeldRank {
  v1::Placement placement;
  // False while the rank waits to be handed to its worker (the next heartbeat's assignments).
  bool delivered = true;
  // When it was handed over; a worker that does not report the rank is given a grace after this
  // before the rank counts as lost.
  absl::Time delivered_at = absl::InfinitePast();
  // When it was placed; a rank not delivered within a lease of this ends its attempt.
  absl::Time placed_at = absl::InfinitePast();
  // The job's team, charged what the placement holds (policy/quota.h).
  std::string team;
};

// One worker's ranks and what each holds, with what they hold by team kept as entries come and
// go (so that the teams' usage is summed over workers, not over every rank). The entries are
// read-only but for their delivery (MarkDelivered).
class Ledger {
 public:
  using Map = std::map<RankKey, HeldRank>;
  using const_iterator = Map::const_iterator;

  // Holds `held` for `key`, replacing what the key held before.
  void Put(const RankKey& key, HeldRank held);
  // Drops an entry; returns the next one (as map::erase).
  const_iterator Erase(const_iterator it);
  // Drops the entry of `key`, if any.
  void Erase(const RankKey& key);
  template <typename Predicate>
  void EraseIf(Predicate drop) {
    for (const_iterator it = entries_.begin(); it != entries_.end();) {
      it = drop(*it) ? Erase(it) : std::next(it);
    }
  }
  // The rank was handed to its worker at `when`.
  void MarkDelivered(const_iterator it, absl::Time when);

  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }
  const_iterator find(const RankKey& key) const { return entries_.find(key); }
  bool contains(const RankKey& key) const { return entries_.contains(key); }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // What the entries hold, by team (teams holding nothing are absent).
  const std::map<std::string, ResourceAmounts>& usage() const { return usage_; }

 private:
  void Uncharge(const HeldRank& held);
  Map entries_;
  std::map<std::string, ResourceAmounts> usage_;
};

// True for a data-parallel job (resources.replicas > 1).
bool IsGang(const v1::JobSpec& spec);

// The worker running `rank` of the job's current attempt; "" when the job has no such rank.
std::string WorkerOfRank(const v1::Job& job, int rank);

// Whether `worker_id` was given `rank` of `attempt`, the job's current attempt.
bool RunsRank(const v1::Job& job, const std::string& worker_id, int attempt, int rank);

// "rank 0 on w1 (1 cpus, 2.0 GiB memory), rank 1 on w2 (...)", for the job's history.
std::string GangPlacementText(const v1::Job& job);

// "GPU 1, 1 cpus, 11.5 GiB memory".
std::string PlacementText(const v1::Placement& placement);

}  // namespace stoker

#endif  // STOKER_SERVER_GANG_H_
