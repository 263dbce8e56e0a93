#include "server/scheduler.h"

#include "gtest/gtest.h"

namespace stoker {
namespace {

v1::Job MakeJob(const std::string& id, int priority, int64_t submit_ms, int gpus = 0) {
  v1::Job job;
  job.set_id(id);
  job.mutable_spec()->set_priority(priority);
  job.mutable_spec()->mutable_resources()->set_gpus(gpus);
  job.set_submit_time_unix_ms(submit_ms);
  return job;
}

std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const v1::Job& job : jobs) ids.push_back(job.id());
  return ids;
}

TEST(SchedulerTest, PriorityThenSubmitOrder) {
  std::vector<v1::Job> jobs = {MakeJob("j-000001", 0, 100), MakeJob("j-000002", 5, 300),
                               MakeJob("j-000003", 0, 50),  MakeJob("j-000004", 5, 200),
                               MakeJob("j-000005", -1, 10), MakeJob("j-000006", 0, 100)};
  SortForScheduling(jobs);
  EXPECT_EQ(Ids(jobs), (std::vector<std::string>{"j-000004", "j-000002", "j-000003", "j-000001",
                                                 "j-000006", "j-000005"}));
}

TEST(SchedulerTest, PlacesWholeJobsAndBackfills) {
  std::vector<v1::Job> queue = {MakeJob("big", 9, 1, 4), MakeJob("two", 5, 2, 2),
                                MakeJob("cpu", 0, 3, 0)};
  EXPECT_EQ(PickJob(queue, {1, 8}), 0);   // room for the 4-GPU job
  EXPECT_EQ(PickJob(queue, {1, 2}), 1);   // the 4-GPU job does not fit; the 2-GPU one does
  EXPECT_EQ(PickJob(queue, {1, 0}), 2);   // a CPU worker takes the CPU job
  EXPECT_EQ(PickJob(queue, {0, 8}), -1);  // no free slot
  EXPECT_EQ(PickJob({}, {1, 8}), -1);
}

TEST(SchedulerTest, WaitingReasonNamesTheObstacle) {
  v1::Job job = MakeJob("j", 0, 1, 4);
  EXPECT_EQ(WaitingReason(job, 0, 0, 0), "no worker is registered");
  EXPECT_EQ(WaitingReason(job, 0, 2, 2), "needs 4 GPUs on one worker; the largest worker has 2");
  EXPECT_EQ(WaitingReason(job, 3, 2, 8), "3 job(s) ahead in the queue");
}

}  // namespace
}  // namespace stoker
