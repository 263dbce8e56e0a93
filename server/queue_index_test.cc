#include "server/queue_index.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "server/policy/fair_share.h"

namespace stoker {
namespace {

v1::Job Queued(int64_t seq, const std::string& team, int priority, int64_t submit_ms, int gpus = 1,
               int replicas = 0) {
  v1::Job job;
  job.set_id(absl::StrFormat("j-%06d", seq));
  job.set_state(v1::JOB_STATE_QUEUED);
  job.mutable_spec()->set_team(team);
  job.mutable_spec()->set_priority(priority);
  job.mutable_spec()->mutable_resources()->set_gpus(gpus);
  job.mutable_spec()->mutable_resources()->set_replicas(replicas);
  job.set_submit_time_unix_ms(submit_ms);
  return job;
}

std::vector<std::string> Ids(const std::vector<const QueueEntry*>& entries) {
  std::vector<std::string> ids;
  for (const QueueEntry* entry : entries) ids.push_back(entry->job_id);
  return ids;
}

TEST(QueueIndexTest, SeqComesFromTheStoresIds) {
  EXPECT_EQ(SeqOfJobId("j-000042"), 42);
  EXPECT_EQ(SeqOfJobId("j-1234567"), 1234567);
  EXPECT_EQ(SeqOfJobId("job-1"), -1);
  EXPECT_EQ(SeqOfJobId("j-"), -1);
  EXPECT_EQ(SeqOfJobId("j--4"), -1);
}

TEST(QueueIndexTest, StoreOrderPositionsAndCounts) {
  QueueIndex index;
  index.Reset({Queued(1, "a", 0, 100), Queued(2, "b", 5, 200), Queued(3, "a", 0, 300),
               Queued(4, "b", 0, 400, 2, 3)});
  EXPECT_EQ(index.size(), 4u);
  EXPECT_EQ(index.gangs(), 1);
  // Priority first, then the sequence number (j-1000000 after j-999999, unlike their text).
  EXPECT_EQ(Ids(index.InStoreOrder()),
            (std::vector<std::string>{"j-000002", "j-000001", "j-000003", "j-000004"}));
  EXPECT_EQ(index.StorePosition("j-000002"), 0);
  EXPECT_EQ(index.StorePosition("j-000001"), 1);
  EXPECT_EQ(index.StorePosition("j-000004"), 3);
  EXPECT_EQ(index.StorePosition("j-000009"), -1);
  EXPECT_EQ(index.OldestSubmitMs(), 100);
  EXPECT_EQ(index.by_team().at("a").size(), 2u);
  EXPECT_EQ(index.by_team().at("b").size(), 2u);
  QueueIndex long_running;
  long_running.Reset({Queued(1000000, "a", 0, 100), Queued(999999, "a", 0, 100)});
  EXPECT_EQ(Ids(long_running.InStoreOrder()), (std::vector<std::string>{"j-999999", "j-1000000"}));

  // A job that starts leaves; one that is requeued comes back in its old place.
  v1::Job started = Queued(1, "a", 0, 100);
  started.set_state(v1::JOB_STATE_RUNNING);
  index.Update(started);
  EXPECT_EQ(index.Find("j-000001"), nullptr);
  EXPECT_EQ(index.StorePosition("j-000003"), 1);
  EXPECT_EQ(index.OldestSubmitMs(), 200);
  index.Update(Queued(1, "a", 0, 100));
  EXPECT_EQ(index.StorePosition("j-000003"), 2);
  EXPECT_EQ(index.OldestSubmitMs(), 100);

  // The gang finishes: the gang count follows; the team with nothing queued is gone.
  v1::Job done = Queued(4, "b", 0, 400, 2, 3);
  done.set_state(v1::JOB_STATE_SUCCEEDED);
  index.Update(done);
  EXPECT_EQ(index.gangs(), 0);
  v1::Job gone = Queued(2, "b", 5, 200);
  gone.set_state(v1::JOB_STATE_CANCELLED);
  index.Update(gone);
  EXPECT_FALSE(index.by_team().contains("b"));
  EXPECT_EQ(index.size(), 2u);
}

TEST(QueueIndexTest, AQueuedJobSavedAgainKeepsAWalksCursors) {
  QueueIndex index;
  index.Reset({Queued(1, "a", 0, 100)});
  FairShareWalk walk(index, {});
  v1::Job noted = Queued(1, "a", 0, 100, 2);
  noted.set_error("note");
  index.Update(noted);  // in place: team "a"'s queue is the walk's
  const QueueEntry* entry = walk.Next();
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->job_id, "j-000001");
  EXPECT_EQ(entry->resources.gpus(), 2);
  EXPECT_EQ(walk.Next(), nullptr);
}

// The walk gives exactly OrderByFairShare's order, for random queues and shares, and follows a
// share raised during the walk.
TEST(QueueIndexTest, WalkIsTheFairShareOrder) {
  std::mt19937 random(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<v1::Job> jobs;
    const int n = 1 + static_cast<int>(random() % 60);
    std::vector<std::string> teams = {"", "a", "b", "c"};
    for (int i = 1; i <= n; ++i) {
      jobs.push_back(Queued(i * 3 + static_cast<int>(random() % 3), teams[random() % 4],
                            static_cast<int>(random() % 3) * 5, 1000 + random() % 20));
    }
    std::map<std::string, double> shares;
    for (const std::string& team : teams) shares[team] = (random() % 5) / 4.0;
    QueueIndex index;
    index.Reset(jobs);
    std::vector<QueuedJob> expected;
    for (const QueueEntry* entry : index.InStoreOrder()) {
      expected.push_back(QueueIndex::AsQueuedJob(*entry));
    }
    OrderByFairShare(expected, shares);
    FairShareWalk walk(index, shares);
    for (const QueuedJob& want : expected) {
      const QueueEntry* got = walk.Next();
      ASSERT_NE(got, nullptr);
      ASSERT_EQ(got->job_id, want.job_id) << "round " << round;
    }
    EXPECT_EQ(walk.Next(), nullptr);

    // Raise the share of the first job's team after it: the rest follow the new shares.
    FairShareWalk raised(index, shares);
    const QueueEntry* first = raised.Next();
    ASSERT_NE(first, nullptr);
    shares[first->team] += 0.6;
    raised.SetShare(first->team, shares[first->team]);
    std::vector<QueuedJob> rest;
    for (const QueueEntry* entry : index.InStoreOrder()) {
      if (entry != first) rest.push_back(QueueIndex::AsQueuedJob(*entry));
    }
    OrderByFairShare(rest, shares);
    for (const QueuedJob& want : rest) {
      const QueueEntry* got = raised.Next();
      ASSERT_NE(got, nullptr);
      ASSERT_EQ(got->job_id, want.job_id) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace stoker
