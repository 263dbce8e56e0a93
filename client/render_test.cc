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

TEST(RenderTest, JobDetailsShowTheCheckpointAndAttemptsGivenBack) {
  v1::Job job;
  job.set_id("j-000002");
  job.set_attempt(2);
  EXPECT_NE(JobDetails(job).find("attempt:        2\n"), std::string::npos) << JobDetails(job);
  EXPECT_NE(JobDetails(job).find("checkpoint:     -"), std::string::npos) << JobDetails(job);
  job.set_checkpoint_step(1059);
  job.set_checkpoint_epoch(3);
  job.set_checkpoint_bytes(6598112);
  EXPECT_NE(JobDetails(job).find("checkpoint:     step 1059 (epoch 3), 6.3 MiB"),
            std::string::npos)
      << JobDetails(job);
  job.set_released_attempts(1);
  EXPECT_NE(JobDetails(job).find("attempt:        2 (1 given back by a worker shutdown)\n"),
            std::string::npos)
      << JobDetails(job);
}

}  // namespace
}  // namespace stoker
