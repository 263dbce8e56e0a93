// The queued jobs as scheduling needs them, in memory: id, team, priority, submit time and what
// the job asks for. The coordinator keeps it in step with the store (every write of a job goes
// through it), so that a scheduling pass, a queue position or a metrics scrape walks this index
// instead of reading and decoding the whole queue from SQLite; a pass reads from the store only
// the jobs it places or preempts for. Not thread-safe: the coordinator's mutex guards it.
//
// Orders: "store order" is the store's (priority high first, then submit order, i.e. the id's
// sequence number); each team's queue is in (priority high first, submit time, sequence number),
// the order SchedulesBefore (policy/fair_share.h) gives one team's jobs.
#ifndef STOKER_SERVER_QUEUE_INDEX_H_
#define STOKER_SERVER_QUEUE_INDEX_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "server/policy/fair_share.h"
#include "stoker.pb.h"

namespace stoker {

struct QueueEntry {
  std::string job_id;
  int64_t seq = 0;  // the store's sequence number, from the id ("j-000042" is 42)
  std::string team;
  int priority = 0;
  int64_t submit_ms = 0;
  v1::ResourceSpec resources;  // JobSpec.resources, as submitted
  std::string resources_key;   // `resources` serialized: equal requests, equal keys
  int replicas = 1;            // ranks: more than 1 for a data-parallel job
};

// The sequence number in a job id ("j-000042" -> 42); -1 for an id the store did not make.
int64_t SeqOfJobId(const std::string& job_id);

class QueueIndex {
 public:
  // One team's queued jobs, in its order (see the file comment).
  struct TeamOrder {
    bool operator()(const QueueEntry* a, const QueueEntry* b) const {
      return std::make_tuple(-a->priority, a->submit_ms, a->seq) <
             std::make_tuple(-b->priority, b->submit_ms, b->seq);
    }
  };
  using TeamQueue = std::set<const QueueEntry*, TeamOrder>;

  // Replaces the contents with `queued` (the store's queued jobs, read once at start).
  void Reset(const std::vector<v1::Job>& queued);
  // Follows a job just written to the store: a queued job is (re)indexed, any other dropped.
  void Update(const v1::Job& job);

  // As SchedulesBefore (policy/fair_share.h) sees it.
  static QueuedJob AsQueuedJob(const QueueEntry& entry);
  // Null when `job_id` is not queued.
  const QueueEntry* Find(const std::string& job_id) const;
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // How many queued jobs are data-parallel (more than one rank).
  int64_t gangs() const { return gangs_; }
  // Each team's queue ("" for jobs without a team); teams with nothing queued are absent.
  const std::map<std::string, TeamQueue>& by_team() const { return by_team_; }
  // Every queued job in store order.
  std::vector<const QueueEntry*> InStoreOrder() const;
  // Queued jobs ahead of `job_id` in store order (0 = next); -1 when it is not queued. Cheap for
  // the newest jobs of their priority (a submit's answer), linear in that priority's jobs else.
  int64_t StorePosition(const std::string& job_id) const;
  // Submit time of the queued job submitted first (lowest sequence number); 0 when none.
  int64_t OldestSubmitMs() const;

 private:
  void Erase(const std::string& job_id);

  std::unordered_map<std::string, QueueEntry> entries_;  // by id; nodes stay put
  std::map<std::string, TeamQueue> by_team_;
  // Sequence numbers by priority, high priority first: store order.
  std::map<int, std::set<int64_t>, std::greater<int>> by_priority_;
  std::map<int64_t, const QueueEntry*> by_seq_;
  int64_t gangs_ = 0;
  // Sequence numbers for ids the store did not make (none in practice): after every real one.
  int64_t next_foreign_seq_ = int64_t{1} << 62;
};

// The queue in fair-share order (SchedulesBefore), without sorting it: each team's queue is
// already in order, so the next job is the first of the teams' next jobs. A pass that starts a
// job raises its team's share (SetShare) and the walk follows. The index must not lose a team's
// last queued job while a walk is under way (a pass saves what it starts at its end).
class FairShareWalk {
 public:
  FairShareWalk(const QueueIndex& queue, const std::map<std::string, double>& shares);
  // Null when every job has been walked.
  const QueueEntry* Next();
  void SetShare(const std::string& team, double share);

 private:
  struct Cursor {
    const std::string* team;
    double share;
    QueueIndex::TeamQueue::const_iterator next, end;
  };
  std::vector<Cursor> cursors_;
};

}  // namespace stoker

#endif  // STOKER_SERVER_QUEUE_INDEX_H_
