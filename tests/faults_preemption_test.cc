// Preemption end to end (issue 29) with real processes: a higher-priority job takes a device back
// through the victim's drain (checkpoint at the step reached, upload, back to the queue, no retry
// charged), a victim that ignores the drain is stopped after the grace time and resumes from its
// last stored checkpoint, and a data-parallel gang is preempted whole.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/faults_util.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

v1::JobSpec GpuJob(int epochs, int priority) {
  v1::JobSpec spec = SlowJob(epochs);
  spec.set_max_retries(0);  // a preemption counted as a failed attempt would fail the job
  spec.set_priority(priority);
  spec.mutable_resources()->set_gpus(1);
  spec.mutable_resources()->set_cpus(1);
  return spec;
}

bool HasEvent(TestCluster& cluster, const std::string& job_id, const std::string& text) {
  for (const v1::JobEvent& event : cluster.History(job_id)) {
    if (absl::StrContains(event.message(), text)) return true;
  }
  return false;
}

void ExpectSameWeights(const std::string& a_file, const std::string& b_file) {
  absl::StatusOr<Checkpoint> a = ReadCheckpoint(a_file);
  absl::StatusOr<Checkpoint> b = ReadCheckpoint(b_file);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  ASSERT_FALSE(a->tensors.empty());
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    EXPECT_TRUE(a->tensors[i].values == b->tensors[i].values)
        << a->tensors[i].name << " differs from the uninterrupted run";
  }
}

TEST(PreemptionTest, AHigherPriorityJobTakesTheDeviceThroughTheVictimsDrain) {
  TestCluster cluster;
  cluster.StartServer({"--preemption-min-runtime-seconds", "0.5"});
  cluster.StartWorker("w1", {"--fake-gpus-for-tests", "1", "--cpus", "4"});
  const v1::JobSpec victim_spec = GpuJob(2, 0);
  v1::JobSpec victim_spec_delayed = victim_spec;
  victim_spec_delayed.mutable_loader()->set_delay_ms(40);  // time to preempt it mid-epoch
  // The victim's uninterrupted run (the delay does not change what it computes).
  absl::StatusOr<v1::Job> straight = cluster.RunJob(victim_spec, absl::Seconds(90));
  ASSERT_TRUE(straight.ok()) << straight.status();
  ASSERT_EQ(straight->state(), v1::JOB_STATE_SUCCEEDED) << straight->error();
  const std::string straight_file = cluster.dir() + "/straight.safetensors";
  ASSERT_EQ(cluster.Cli("artifact " + straight->id() + " -o " + straight_file).exit_code, 0);

  absl::StatusOr<v1::Job> victim = cluster.Submit(victim_spec_delayed);
  ASSERT_TRUE(victim.ok());
  absl::StatusOr<v1::Job> running = cluster.WaitForStep(victim->id(), 10);
  ASSERT_TRUE(running.ok()) << running.status();
  absl::StatusOr<v1::Job> urgent = cluster.Submit(GpuJob(1, 5));
  ASSERT_TRUE(urgent.ok());

  // Given back at a checkpoint, queued again, the attempt not counted.
  absl::StatusOr<v1::Job> given_back = cluster.WaitFor(
      victim->id(), [](const v1::Job& j) { return j.state() == v1::JOB_STATE_QUEUED; },
      absl::Seconds(30));
  ASSERT_TRUE(given_back.ok()) << given_back.status();
  const std::string by = absl::StrCat("preempted by ", urgent->id(), " (priority 5 over 0");
  EXPECT_TRUE(absl::StrContains(given_back->error(), by)) << given_back->error();
  EXPECT_TRUE(absl::StrContains(given_back->error(), "not counted against max_retries"))
      << given_back->error();
  EXPECT_EQ(given_back->preemptions(), 1);
  EXPECT_EQ(given_back->released_attempts(), 1);
  ASSERT_EQ(given_back->preempted_by_size(), 1);
  EXPECT_EQ(given_back->preempted_by(0), urgent->id());
  EXPECT_GE(given_back->checkpoint_step(), running->progress().step());
  EXPECT_TRUE(HasEvent(cluster, victim->id(), by + "): giving back at a checkpoint"));
  EXPECT_TRUE(HasEvent(cluster, urgent->id(), "preempting " + victim->id()));
  CommandResult status = cluster.Cli("status " + victim->id());
  EXPECT_TRUE(absl::StrContains(status.output, "preemptions:")) << status.output;
  CommandResult logs = cluster.Cli("logs " + victim->id());
  EXPECT_TRUE(absl::StrContains(logs.output, by)) << logs.output;
  EXPECT_TRUE(absl::StrContains(logs.output, "to give the devices back (preempted)"))
      << logs.output;
  EXPECT_FALSE(absl::StrContains(logs.output, "for the worker's shutdown")) << logs.output;

  // The preemptor runs and finishes; then the victim resumes and ends as the straight run did.
  absl::StatusOr<v1::Job> urgent_done = cluster.WaitForFinal(urgent->id(), absl::Seconds(60));
  ASSERT_TRUE(urgent_done.ok());
  EXPECT_EQ(urgent_done->state(), v1::JOB_STATE_SUCCEEDED) << urgent_done->error();
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(victim->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 2);
  EXPECT_TRUE(HasEvent(
      cluster, victim->id(),
      absl::StrCat("resumed from the checkpoint at step ", given_back->checkpoint_step())));
  const std::string resumed_file = cluster.dir() + "/resumed.safetensors";
  ASSERT_EQ(cluster.Cli("artifact " + victim->id() + " -o " + resumed_file).exit_code, 0);
  ExpectSameWeights(straight_file, resumed_file);
}

TEST(PreemptionTest, AVictimThatIgnoresTheDrainIsStoppedAndResumesFromItsLastCheckpoint) {
  TestCluster cluster;
  cluster.StartServer(
      {"--preemption-min-runtime-seconds", "0.5", "--preemption-grace-seconds", "3"});
  // The worker would wait long for its trainer: the server's grace is what ends it.
  cluster.StartWorker("w1",
                      {"--fake-gpus-for-tests", "1", "--cpus", "4", "--drain-seconds", "120"});
  absl::StatusOr<v1::Job> victim = cluster.Submit(GpuJob(3, 0));
  ASSERT_TRUE(victim.ok());
  absl::StatusOr<v1::Job> checkpointed = cluster.WaitFor(
      victim->id(), [](const v1::Job& j) { return j.checkpoint_epoch() >= 1; }, absl::Seconds(60));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  ASSERT_EQ(checkpointed->state(), v1::JOB_STATE_RUNNING);
  // The trainer stops answering (SIGSTOP): it cannot checkpoint or stop on request.
  const std::vector<pid_t> trainers =
      FindProcesses({"stoker-trainer", cluster.dir(), victim->id()});
  ASSERT_EQ(trainers.size(), 1u);
  ASSERT_EQ(kill(trainers[0], SIGSTOP), 0);
  const int64_t stored = checkpointed->checkpoint_step();
  const absl::Time preempted_at = absl::Now();
  absl::StatusOr<v1::Job> urgent = cluster.Submit(GpuJob(1, 5));
  ASSERT_TRUE(urgent.ok());
  absl::StatusOr<v1::Job> stopped = cluster.WaitFor(
      victim->id(), [](const v1::Job& j) { return j.state() == v1::JOB_STATE_QUEUED; },
      absl::Seconds(30));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_GE(absl::Now() - preempted_at, absl::Seconds(3)) << "stopped before its grace";
  EXPECT_TRUE(absl::StrContains(stopped->error(),
                                "it did not give back within 3s: stopped, "
                                "it resumes from its last stored checkpoint"))
      << stopped->error();
  EXPECT_EQ(stopped->checkpoint_step(), stored) << "nothing newer could be stored";
  EXPECT_EQ(stopped->released_attempts(), 1);
  absl::StatusOr<v1::Job> urgent_done = cluster.WaitForFinal(urgent->id(), absl::Seconds(60));
  ASSERT_TRUE(urgent_done.ok());
  EXPECT_EQ(urgent_done->state(), v1::JOB_STATE_SUCCEEDED) << urgent_done->error();
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(victim->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_TRUE(HasEvent(cluster, victim->id(),
                       absl::StrCat("resumed from the checkpoint at step ", stored)));
}

TEST(PreemptionTest, ADataParallelGangIsPreemptedWhole) {
  TestCluster cluster;
  cluster.StartServer({"--preemption-min-runtime-seconds", "0.5"});
  cluster.StartWorker("w1", {"--fake-gpus-for-tests", "1", "--cpus", "4"});
  cluster.StartWorker("w2", {"--fake-gpus-for-tests", "1", "--cpus", "4"});
  v1::JobSpec gang_spec = GpuJob(2, 0);
  gang_spec.mutable_resources()->set_replicas(2);
  gang_spec.mutable_loader()->set_delay_ms(40);
  absl::StatusOr<v1::Job> gang = cluster.Submit(gang_spec);
  ASSERT_TRUE(gang.ok());
  ASSERT_TRUE(cluster.WaitForStep(gang->id(), 5).ok());
  absl::StatusOr<v1::Job> urgent = cluster.Submit(GpuJob(1, 5));
  ASSERT_TRUE(urgent.ok());
  absl::StatusOr<v1::Job> given_back = cluster.WaitFor(
      gang->id(), [](const v1::Job& j) { return j.state() == v1::JOB_STATE_QUEUED; },
      absl::Seconds(40));
  ASSERT_TRUE(given_back.ok()) << given_back.status();
  EXPECT_TRUE(absl::StrContains(given_back->error(), "preempted by " + urgent->id()))
      << given_back->error();
  EXPECT_EQ(given_back->preemptions(), 1);
  // The urgent job needs one GPU; the gang gave back both (it cannot run with one rank), so the
  // gang waits until the urgent job is done, then resumes and succeeds.
  absl::StatusOr<v1::Job> urgent_done = cluster.WaitForFinal(urgent->id(), absl::Seconds(60));
  ASSERT_TRUE(urgent_done.ok());
  EXPECT_EQ(urgent_done->state(), v1::JOB_STATE_SUCCEEDED) << urgent_done->error();
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(gang->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 2);
}

}  // namespace
}  // namespace stoker::testing
