#include "server/queue_index.h"

#include <iterator>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "server/scheduler.h"

namespace stoker {

int64_t SeqOfJobId(const std::string& job_id) {
  int64_t seq = 0;
  if (!absl::StartsWith(job_id, "j-") || !absl::SimpleAtoi(job_id.substr(2), &seq) || seq < 0) {
    return -1;
  }
  return seq;
}

void QueueIndex::Reset(const std::vector<v1::Job>& queued) {
  entries_.clear();
  by_team_.clear();
  by_priority_.clear();
  by_seq_.clear();
  gangs_ = 0;
  for (const v1::Job& job : queued) Update(job);
}

void QueueIndex::Erase(const std::string& job_id) {
  const auto it = entries_.find(job_id);
  if (it == entries_.end()) return;
  const QueueEntry* entry = &it->second;
  if (auto team = by_team_.find(entry->team); team != by_team_.end()) {
    team->second.erase(entry);
    if (team->second.empty()) by_team_.erase(team);
  }
  if (auto priority = by_priority_.find(entry->priority); priority != by_priority_.end()) {
    priority->second.erase(entry->seq);
    if (priority->second.empty()) by_priority_.erase(priority);
  }
  by_seq_.erase(entry->seq);
  if (entry->replicas > 1) --gangs_;
  entries_.erase(it);
}

void QueueIndex::Update(const v1::Job& job) {
  if (auto it = entries_.find(job.id());
      it != entries_.end() && job.state() == v1::JOB_STATE_QUEUED &&
      it->second.team == job.spec().team() && it->second.priority == job.spec().priority() &&
      it->second.submit_ms == job.submit_time_unix_ms()) {
    // Still queued in the same place (an event, a preemptor's note): updated where it is, so a
    // walk under way keeps its cursors.
    QueueEntry& entry = it->second;
    if (entry.replicas > 1) --gangs_;
    entry.resources = job.spec().resources();
    entry.resources_key = entry.resources.SerializeAsString();
    entry.replicas = ReplicasOf(job.spec());
    if (entry.replicas > 1) ++gangs_;
    return;
  }
  Erase(job.id());
  if (job.state() != v1::JOB_STATE_QUEUED) return;
  QueueEntry entry;
  entry.job_id = job.id();
  entry.seq = SeqOfJobId(job.id());
  if (entry.seq < 0) entry.seq = next_foreign_seq_++;
  entry.team = job.spec().team();
  entry.priority = job.spec().priority();
  entry.submit_ms = job.submit_time_unix_ms();
  entry.resources = job.spec().resources();
  entry.resources_key = entry.resources.SerializeAsString();
  entry.replicas = ReplicasOf(job.spec());
  const QueueEntry* stored = &entries_.emplace(job.id(), std::move(entry)).first->second;
  by_team_[stored->team].insert(stored);
  by_priority_[stored->priority].insert(stored->seq);
  by_seq_[stored->seq] = stored;
  if (stored->replicas > 1) ++gangs_;
}

QueuedJob QueueIndex::AsQueuedJob(const QueueEntry& entry) {
  return {entry.job_id, entry.team, entry.priority, entry.submit_ms, entry.seq};
}

const QueueEntry* QueueIndex::Find(const std::string& job_id) const {
  const auto it = entries_.find(job_id);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<const QueueEntry*> QueueIndex::InStoreOrder() const {
  std::vector<const QueueEntry*> order;
  order.reserve(entries_.size());
  for (const auto& [priority, seqs] : by_priority_) {
    for (int64_t seq : seqs) order.push_back(by_seq_.at(seq));
  }
  return order;
}

int64_t QueueIndex::StorePosition(const std::string& job_id) const {
  const QueueEntry* entry = Find(job_id);
  if (entry == nullptr) return -1;
  int64_t ahead = 0;
  for (const auto& [priority, seqs] : by_priority_) {
    if (priority != entry->priority) {
      ahead += static_cast<int64_t>(seqs.size());
      continue;
    }
    // Counted from the end: a new submit is the last of its priority.
    const auto me = seqs.find(entry->seq);
    ahead += static_cast<int64_t>(seqs.size()) - std::distance(me, seqs.end());
    break;
  }
  return ahead;
}

int64_t QueueIndex::OldestSubmitMs() const {
  return by_seq_.empty() ? 0 : by_seq_.begin()->second->submit_ms;
}

FairShareWalk::FairShareWalk(const QueueIndex& queue, const std::map<std::string, double>& shares) {
  for (const auto& [team, jobs] : queue.by_team()) {
    const auto share = shares.find(team);
    cursors_.push_back(
        {&team, share == shares.end() ? 0.0 : share->second, jobs.begin(), jobs.end()});
  }
}

const QueueEntry* FairShareWalk::Next() {
  Cursor* best = nullptr;
  for (Cursor& c : cursors_) {
    if (c.next == c.end) continue;
    if (best == nullptr) {
      best = &c;
      continue;
    }
    // SchedulesBefore's order, with each team's share at hand.
    const QueueEntry& a = **c.next;
    const QueueEntry& b = **best->next;
    if (std::forward_as_tuple(-a.priority, c.share, a.submit_ms, a.seq, a.job_id) <
        std::forward_as_tuple(-b.priority, best->share, b.submit_ms, b.seq, b.job_id)) {
      best = &c;
    }
  }
  return best == nullptr ? nullptr : *best->next++;
}

void FairShareWalk::SetShare(const std::string& team, double share) {
  for (Cursor& c : cursors_) {
    if (*c.team == team) c.share = share;
  }
}

}  // namespace stoker
