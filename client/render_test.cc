#include "client/render.h"

#include "gtest/gtest.h"

namespace stoker {
namespace {

TEST(RenderTest, ProgressTextShowsBarRateAndEta) {
  v1::TrainingProgress p;
  p.set_epoch(3);
  p.set_epochs(10);
  p.set_step(1876);
  p.set_total_steps(4690);
  p.set_loss(0.41234);
  p.set_samples_per_second(61234);
  p.set_eta_seconds(62);
  EXPECT_EQ(ProgressText(p, 10),
            "epoch 3/10 [####......]  40% step 1876/4690 loss 0.4123 61.2k samples/s ETA 1:02");
}

TEST(RenderTest, FormatSeconds) {
  EXPECT_EQ(FormatSeconds(5), "0:05");
  EXPECT_EQ(FormatSeconds(3723), "1:02:03");
  EXPECT_EQ(FormatSeconds(-1), "-");
}

TEST(RenderTest, FinalSummaryForSuccessAndFailure) {
  v1::Job job;
  job.set_id("j-000007");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.mutable_progress()->set_test_accuracy(0.8876);
  job.mutable_progress()->set_epoch(10);
  job.set_start_time_unix_ms(1000);
  job.set_end_time_unix_ms(53300);
  EXPECT_EQ(FinalSummary(job), "j-000007 succeeded: test accuracy 0.8876 (10 epochs, 52.3 s)");
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_error("train-images: truncated");
  EXPECT_EQ(FinalSummary(job), "j-000007 failed: train-images: truncated");
}

TEST(RenderTest, JobTableAlignsColumns) {
  v1::ListJobsResponse jobs;
  EXPECT_EQ(JobTable(jobs), "no jobs");
  v1::Job* job = jobs.add_jobs();
  job->set_id("j-000001");
  job->mutable_spec()->set_name("fmnist");
  job->set_state(v1::JOB_STATE_RUNNING);
  job->mutable_progress()->set_test_accuracy(-1);
  const std::string table = JobTable(jobs);
  EXPECT_EQ(table.substr(0, table.find('\n')).find("NAME"),
            table.find("fmnist") - table.find('\n') - 1);
  EXPECT_NE(table.find("running"), std::string::npos);
}

// The value of one "label:  value" row of JobDetails, or "(none)".
std::string Row(const v1::Job& job, const std::string& label) {
  const std::string details = JobDetails(job);
  const size_t at = details.find("\n" + label + " ");
  if (at == std::string::npos) return "(none)";
  const size_t start = details.find_first_not_of(' ', at + label.size() + 2);
  return details.substr(start, details.find('\n', start) - start);
}

TEST(RenderTest, JobDetailsShowTheCheckpointAndAttemptsGivenBack) {
  v1::Job job;
  job.set_id("j-000002");
  job.set_attempt(2);
  EXPECT_EQ(Row(job, "attempt:"), "2");
  EXPECT_EQ(Row(job, "checkpoint:"), "-");
  job.set_checkpoint_step(1059);
  job.set_checkpoint_epoch(3);
  job.set_checkpoint_bytes(6598112);
  EXPECT_EQ(Row(job, "checkpoint:"), "step 1059 (epoch 3), 6.3 MiB");
  // A live job's error is why its last attempt ended; a failed job's is the verdict.
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_error("worker w1 shut down (not counted against max_retries)");
  EXPECT_EQ(Row(job, "last attempt:"), job.error());
  EXPECT_EQ(Row(job, "error:"), "(none)");
  job.set_state(v1::JOB_STATE_FAILED);
  EXPECT_EQ(Row(job, "error:"), job.error());
  EXPECT_EQ(Row(job, "last attempt:"), "(none)");
  job.set_released_attempts(1);
  EXPECT_EQ(Row(job, "attempt:"), "2 (1 given back: worker shutdowns or preemptions, not counted)");
  EXPECT_EQ(Row(job, "preemptions:"), "(none)");
  job.set_preemptions(2);
  job.add_preempted_by("j-000003");
  job.add_preempted_by("j-000009");
  EXPECT_EQ(Row(job, "preemptions:"), "2 (latest by j-000009)");
}

TEST(RenderTest, JobDetailsSayWhyARunningJobWaits) {
  v1::Job job;
  job.set_state(v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Row(job, "waiting:"), "(none)");
  job.set_waiting_reason("final weights (step 32) not stored: the server cannot write checkpoints");
  EXPECT_EQ(Row(job, "waiting:"), job.waiting_reason());
}

TEST(RenderTest, JobDetailsShowTheResourcesAskedForAndHeld) {
  v1::Job job;
  EXPECT_EQ(Row(job, "resources:"), "0 gpus, default cpus, default memory");
  EXPECT_EQ(Row(job, "holds:"), "(none)");
  job.mutable_spec()->mutable_resources()->set_gpus(2);
  job.mutable_spec()->mutable_resources()->set_cpus(4);
  job.mutable_spec()->mutable_resources()->set_memory_mib(2048);
  EXPECT_EQ(Row(job, "resources:"), "2 gpus, 4 cpus, 2048 MiB memory");
  job.set_state(v1::JOB_STATE_RUNNING);
  v1::Placement& placement = *job.mutable_placement();
  placement.add_gpu_indices(1);
  placement.add_gpu_indices(3);
  placement.set_cpus(4);
  placement.set_memory_bytes(int64_t{2} << 30);
  EXPECT_EQ(Row(job, "holds:"), "gpu1, gpu3, 4 cpus, 2.0 GiB memory");
}

TEST(RenderTest, WorkerTableShowsWhatIsUsedAndFree) {
  v1::ListWorkersResponse workers;
  v1::WorkerStatus& worker = *workers.add_workers();
  worker.set_worker_id("w1");
  worker.set_state("alive");
  worker.set_cpus(8);
  worker.set_cpus_used(3);
  worker.set_memory_bytes(int64_t{16} << 30);
  worker.set_memory_used_bytes(int64_t{4} << 30);
  for (int i = 0; i < 2; ++i) {
    v1::Device& gpu = *worker.add_devices();
    gpu.set_kind("cuda");
    gpu.set_index(i);
  }
  v1::Placement& held = *worker.add_placements();
  held.set_job_id("j-000007");
  held.add_gpu_indices(1);
  worker.add_job_ids("j-000007");
  const std::string table = WorkerTable(workers);
  EXPECT_NE(table.find("3 used, 5 free"), std::string::npos) << table;
  EXPECT_NE(table.find("4.0 GiB used, 12.0 GiB free"), std::string::npos) << table;
  EXPECT_NE(table.find("gpu0:free, gpu1:j-000007"), std::string::npos) << table;
}

// Issue 16: a data-parallel job's ranks, where they run and why a gang waits.
TEST(RenderTest, EpochLinesNameTheRankOtherThanZero) {
  v1::JobEvent event;
  event.set_type(v1::EVENT_TYPE_EPOCH);
  event.set_attempt(1);
  event.mutable_progress()->set_epoch(2);
  event.mutable_progress()->set_epochs(3);
  event.mutable_progress()->set_loss(0.5);
  EXPECT_NE(EventLine(event).find("[attempt 1] epoch 2/3: train loss 0.5000"), std::string::npos)
      << EventLine(event);
  event.set_message("rank 1");
  EXPECT_NE(EventLine(event).find("[attempt 1] rank 1: epoch 2/3: train loss 0.5000"),
            std::string::npos)
      << EventLine(event);
}

TEST(RenderTest, DataParallelJobsShowTheirRanks) {
  v1::Job job;
  job.set_id("j-000003");
  job.set_state(v1::JOB_STATE_QUEUED);
  job.mutable_spec()->mutable_resources()->set_cpus(1);
  job.mutable_spec()->mutable_resources()->set_replicas(4);
  job.set_waiting_reason("needs 4 ranks of 1 cpus; the live workers have room for 2");
  EXPECT_EQ(Row(job, "waiting:"), job.waiting_reason());
  EXPECT_EQ(Row(job, "resources:"), "0 gpus, 1 cpus, default memory per rank, 4 ranks");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_worker_id("w1");
  for (int rank = 0; rank < 3; ++rank) {
    v1::Placement& placement = *job.add_rank_placements();
    placement.set_worker_id(rank < 2 ? "w1" : "w2");
    placement.set_rank(rank);
    placement.set_cpus(1);
    placement.set_memory_bytes(int64_t{1} << 30);
  }
  *job.mutable_placement() = job.rank_placements(0);
  EXPECT_EQ(Row(job, "workers:"), "w1,w2");
  EXPECT_EQ(Row(job, "holds:"), "rank 0 on w1: 1 cpus, 1.0 GiB memory");
  EXPECT_NE(JobDetails(job).find("rank 2 on w2: 1 cpus, 1.0 GiB memory"), std::string::npos);
  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = job;
  EXPECT_NE(JobTable(jobs).find("w1,w2"), std::string::npos) << JobTable(jobs);

  v1::ListWorkersResponse workers;
  v1::WorkerStatus& w1 = *workers.add_workers();
  w1.set_worker_id("w1");
  w1.add_job_ids("j-000003");
  w1.add_job_ids("j-000004");
  for (int rank = 0; rank < 2; ++rank) {
    v1::Placement& placement = *w1.add_placements();
    placement.set_job_id("j-000003");
    placement.set_rank(rank);
  }
  w1.add_placements()->set_job_id("j-000004");  // a job of one rank: no rank shown
  v1::Device& gpu = *w1.add_devices();
  gpu.set_kind("cuda");
  w1.mutable_placements(1)->add_gpu_indices(0);
  const std::string table = WorkerTable(workers);
  EXPECT_NE(table.find("j-000003/r0,j-000003/r1,j-000004"), std::string::npos) << table;
  EXPECT_NE(table.find("gpu0:j-000003/r1"), std::string::npos) << table;
}

}  // namespace
}  // namespace stoker
