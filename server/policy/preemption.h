// Preemption (issue 29): which running jobs a queued job that cannot start may take resources
// back from. Pure functions over a snapshot (the running jobs, the workers' free resources, the
// teams' quotas and usage) with the clock passed in; the coordinator asks, then drains the
// victims exactly as a stopping worker drains (checkpoint at the step reached, upload, back to
// the queue with their submit time, no retry charged), and stops any victim that has not given
// back within its grace time.
//
// The rules, for a preemptor P of team A and a running job V of team B (docs/decisions.md):
//   E  V is a candidate at all only if it has run at least min_runtime in this attempt, has been
//      preempted fewer than max_preemptions times, is not already giving back, and did not
//      preempt P itself (P.preempted_by).
//   R1 same team, priority:    B = A  and prio(V) < prio(P)
//   R2 reclaim borrowed:       B != A and borrowing(B) and within_nominal(A, P)
//   R3 priority across teams:  B != A and prio(V) < prio(P) and (A has no quota or
//                              within_nominal(A, P))
// where borrowing(B) means B has a quota and uses more than its nominal quota of some resource,
// and within_nominal(A, P) means A has a quota and usage_A,r + need_r(P) <= nominal_A,r for every
// resource r A has a quota on. P must also fit its own team's quota (nominal + borrowing) once the
// resources of its own team's victims are freed.
// Why no job is preempted back and forth: V preempted by P under R1 or R3 has prio(V) < prio(P),
// so it can take P's resources back only under R2, which needs A borrowing while P runs within
// A's nominal quota; under R2, P runs within nominal (not borrowing), and V's team is over
// nominal, so V has neither R2 (A is not borrowing) nor R3 (B would borrow past nominal). E's
// preempted_by check and max_preemptions bound what quota changes between passes could undo.
//
// Victims are chosen greedily in a documented order: borrowed first (V's team is borrowing),
// then the lowest priority, then the most recently started, then the job id; each candidate is
// added until P fits (one worker for a single job, PlaceGang for a data-parallel one), then any
// victim P still fits without is dropped again (latest added first), so the set is minimal in
// that sense. A data-parallel victim is taken whole (every rank's placement is freed).
#ifndef STOKER_SERVER_POLICY_PREEMPTION_H_
#define STOKER_SERVER_POLICY_PREEMPTION_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/policy/quota.h"
#include "server/scheduler.h"
#include "stoker.pb.h"

namespace stoker {

struct PreemptionOptions {
  // A job runs at least this long in an attempt before it can be preempted.
  absl::Duration min_runtime = absl::Minutes(5);
  // A job preempted this many times is not preempted again.
  int max_preemptions = 3;
};

// A running job as preemption sees it.
struct RunningJob {
  std::string job_id;
  std::string team;
  int priority = 0;
  absl::Time started;  // this attempt's start
  int preemptions = 0;
  bool giving_back = false;               // already asked to (a preemption in flight)
  std::vector<v1::Placement> placements;  // every rank's
};

// The queued job that cannot start.
struct Preemptor {
  std::string job_id;
  std::string team;
  int priority = 0;
  v1::ResourceSpec request;
  int replicas = 1;
  std::set<std::string> preempted_by;  // jobs that preempted it: never its victims
};

struct VictimChoice {
  std::vector<std::string> victims;  // job ids, in the order chosen
  // Per victim, why it may be preempted ("priority 5 over 0", "team vision borrows past its
  // nominal quota; team nlp reclaims its own"), for its events.
  std::map<std::string, std::string> reasons;
};

// Whether `team` uses more than its nominal quota of some resource.
bool Borrowing(const std::string& team, const Quotas& quotas,
               const std::map<std::string, ResourceAmounts>& usage);
// Whether `team` has a quota and stays within its nominal quota with `extra` more.
bool WithinNominal(const std::string& team, const Quotas& quotas,
                   const std::map<std::string, ResourceAmounts>& usage,
                   const ResourceAmounts& extra);

// Why `victim` may be preempted for `p` (rules E, R1-R3 above), or nullopt.
std::optional<std::string> PreemptionReason(const Preemptor& p, const RunningJob& victim,
                                            const Quotas& quotas,
                                            const std::map<std::string, ResourceAmounts>& usage,
                                            const PreemptionOptions& options, absl::Time now);

// The victims that would let `p` start, or nullopt when none would (or it fits already: then
// nothing needs to be preempted). `workers`: the live workers with their free resources now.
std::optional<VictimChoice> ChooseVictims(const Preemptor& p,
                                          const std::vector<RunningJob>& running,
                                          const std::vector<WorkerView>& workers,
                                          const Quotas& quotas,
                                          const std::map<std::string, ResourceAmounts>& usage,
                                          const PreemptionOptions& options, absl::Time now);

// Whether `p` can be placed on `workers` (their free resources) now.
bool Fits(const Preemptor& p, const std::vector<WorkerView>& workers);

}  // namespace stoker

#endif  // STOKER_SERVER_POLICY_PREEMPTION_H_
