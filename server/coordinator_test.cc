// The Coordinator on a real SQLite JobStore in a temporary directory, without gRPC: the job
// lifecycle, assignment, fencing, lease expiry, cancel, the final-checkpoint rule and the grace
// period after a restart. Leases are a fraction of a second so the whole suite stays quick.
#include "server/coordinator.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checkpoint.h"
#include "gtest/gtest.h"
#include "server/coordinator_test_fixture.h"

namespace stoker {
namespace {

TEST_F(CoordinatorTest, ASubmittedJobIsQueuedAndSaysWhyItWaits) {
  const std::string job_id = Submit();
  const v1::Job job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.queue_position(), 0);  // jobs ahead of it
  EXPECT_FALSE(job.waiting_reason().empty());
  EXPECT_EQ(job.attempt(), 0);
  EXPECT_EQ(Get(Submit()).queue_position(), 1);
}

// ListJobs pages by key: each page ends where the next starts, none twice, none lost.
TEST_F(CoordinatorTest, ListJobsPagesNewestFirstByKey) {
  std::vector<std::string> ids;
  for (int i = 0; i < 7; ++i) ids.push_back(Submit());
  std::vector<std::string> seen;
  v1::ListJobsRequest request;
  request.set_limit(3);
  int pages = 0;
  while (true) {
    absl::StatusOr<v1::ListJobsResponse> page = coordinator_->ListJobs(request);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    for (const v1::Job& job : page->jobs()) seen.push_back(job.id());
    if (page->next_before_id().empty()) break;
    EXPECT_EQ(page->next_before_id(), page->jobs().rbegin()->id());
    request.set_before_id(page->next_before_id());
  }
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, std::vector<std::string>(ids.rbegin(), ids.rend()));
  // A full last page says there is no more.
  request.clear_before_id();
  request.set_limit(7);
  EXPECT_TRUE(coordinator_->ListJobs(request)->next_before_id().empty());
  request.set_before_id("j-999999");
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->ListJobs(request).status()));
}

TEST_F(CoordinatorTest, AHeartbeatWithAFreeSlotGetsTheQueuedJob) {
  const std::string job_id = Submit();
  ASSERT_TRUE(Register("w1", "i1").ok());
  absl::StatusOr<v1::HeartbeatResponse> none = Heartbeat("w1", "i1", 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->assignments_size(), 0);

  absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("w1", "i1", 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_EQ(beat->assignments_size(), 1);
  EXPECT_EQ(beat->assignments(0).job_id(), job_id);
  EXPECT_EQ(beat->assignments(0).attempt(), 1);
  EXPECT_EQ(observer_.assigned, 1);
  const v1::Job job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.worker_id(), "w1");
  EXPECT_EQ(job.attempt(), 1);

  // Another instance under the same id is refused while w1's lease is live.
  absl::Status twin = Register("w1", "i2");
  EXPECT_EQ(twin.code(), absl::StatusCode::kAlreadyExists) << twin;
}

TEST_F(CoordinatorTest, ReportsOfAStaleAttemptOrAnotherWorkerAreRefused) {
  const std::string job_id = RunningJob();
  ASSERT_TRUE(Register("w2", "i2").ok());
  for (auto [worker, attempt] : {std::pair{"w1", 2}, std::pair{"w2", 1}}) {
    v1::ReportProgressRequest report;
    report.set_worker_id(worker);
    report.set_job_id(job_id);
    report.set_attempt(attempt);
    absl::Status status = coordinator_->ReportProgress(report).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "stale report")) << status;
  }
  v1::CompleteJobRequest stale = Success(job_id, 1, 1);
  stale.set_worker_id("w2");
  EXPECT_EQ(coordinator_->CompleteJob(stale).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator_->StartCheckpointUpload("w1", job_id, 2).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The heartbeat tells the worker to stop an attempt that is not the current one.
  absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("w2", "i2", 0, job_id, 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_EQ(beat->stop_size(), 1);
  EXPECT_EQ(beat->stop(0).job_id(), job_id);

  // The current attempt's report is taken.
  v1::ReportProgressRequest report;
  report.set_worker_id("w1");
  report.set_job_id(job_id);
  report.set_attempt(1);
  report.add_events()->mutable_progress()->set_step(3);
  ASSERT_TRUE(coordinator_->ReportProgress(report).ok());
  EXPECT_EQ(Get(job_id).progress().step(), 3);
}

TEST_F(CoordinatorTest, AnExpiredLeaseRequeuesTheJobAndTheWorkerMustRegisterAgain) {
  const std::string job_id = RunningJob();
  coordinator_->ExpireLeases();
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_RUNNING);  // the lease is still live
  absl::SleepFor(options_.lease + absl::Milliseconds(100));
  coordinator_->ExpireLeases();
  const v1::Job job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(absl::StrContains(job.error(), "worker w1 lost (no heartbeat for")) << job.error();
  EXPECT_EQ(observer_.requeued, 1);
  EXPECT_EQ(Heartbeat("w1", "i1", 1).status().code(), absl::StatusCode::kNotFound);

  // Registered again, the worker gets the job back as attempt 2.
  ASSERT_TRUE(Register("w1", "i1").ok());
  absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("w1", "i1", 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_EQ(beat->assignments_size(), 1);
  EXPECT_EQ(beat->assignments(0).attempt(), 2);
}

// Lost workers are listed for a while, then forgotten (every restart under the default id
// HOSTNAME-PID is a new worker); one registering again is back at once.
TEST_F(CoordinatorTest, ALostWorkerIsForgottenAfterAWhile) {
  options_.forget_lost_worker = absl::Milliseconds(300);
  Start();
  ASSERT_TRUE(Register("w1", "i1").ok());
  ASSERT_TRUE(Register("w2", "i2").ok());
  absl::SleepFor(options_.lease + absl::Milliseconds(100));
  coordinator_->ExpireLeases();  // both lost; w2 registers again below
  v1::ListWorkersResponse listed = coordinator_->ListWorkers();
  ASSERT_EQ(listed.workers_size(), 2);
  EXPECT_EQ(listed.workers(0).state(), "lost");
  EXPECT_EQ(listed.workers(1).state(), "lost");
  ASSERT_TRUE(Register("w2", "i3").ok());
  for (int i = 0; i < 4; ++i) {  // w2 keeps its lease
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(Heartbeat("w2", "i3", 0).ok());
    coordinator_->ExpireLeases();
  }
  listed = coordinator_->ListWorkers();
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_EQ(listed.workers(0).worker_id(), "w2");
  EXPECT_EQ(listed.workers(0).state(), "alive");
  ASSERT_TRUE(Register("w1", "i4").ok()) << "a forgotten worker registers as new";
  EXPECT_EQ(coordinator_->ListWorkers().workers_size(), 2);
}

TEST_F(CoordinatorTest, AWorkerIdWithASpaceOrControlCharacterIsRefused) {
  for (const std::string& id : std::vector<std::string>{"a b", std::string("a\0b", 3), "tab\tid"}) {
    absl::Status refused = Register(id, "i1");
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), "space or a control character")) << refused;
  }
  EXPECT_TRUE(Register("host.example-1:2@x_y", "i1").ok());
}

TEST_F(CoordinatorTest, CancelEndsTheJobAndTellsItsAttemptToStop) {
  const std::string queued = Submit();
  absl::StatusOr<v1::Job> cancelled = coordinator_->Cancel(queued);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->error(), "cancelled by user");
  absl::Status again = coordinator_->Cancel(queued).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(again.message(), absl::StrCat("job ", queued, " already cancelled"));

  const std::string running = RunningJob();
  ASSERT_TRUE(coordinator_->Cancel(running).ok());
  v1::ReportProgressRequest report;
  report.set_worker_id("w1");
  report.set_job_id(running);
  report.set_attempt(1);
  absl::StatusOr<v1::ReportProgressResponse> answer = coordinator_->ReportProgress(report);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->cancel_requested());
  v1::CompleteJobRequest done = Success(running, 1, 1);
  done.set_state(v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(coordinator_->CompleteJob(done).ok());
  EXPECT_EQ(Get(running).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(coordinator_->GetJob("no-such-job").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, SuccessWaitsForTheFinalCheckpoint) {
  const std::string job_id = RunningJob();
  absl::Status early = coordinator_->CompleteJob(Success(job_id, 1, 10));
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  EXPECT_TRUE(absl::StrContains(early.message(),
                                "cannot succeed before the server stores its "
                                "final weights (step 10); it holds none"))
      << early;
  EXPECT_EQ(coordinator_->ArtifactPath(job_id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->CheckpointForAttempt("w1", job_id, 1).status().code(),
            absl::StatusCode::kNotFound);

  // An upload whose metadata names another step is refused and removed.
  absl::StatusOr<std::string> wrong = coordinator_->StartCheckpointUpload("w1", job_id, 1);
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  ASSERT_TRUE(WriteCheckpoint(*wrong, {{{"w", {1}, {0.5f}}}, {{"step", "9"}}}).ok());
  absl::Status mismatch = coordinator_->CommitCheckpoint(Chunk(job_id, 1, 10), *wrong, 100);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument) << mismatch;
  EXPECT_EQ(mismatch.message(), "checkpoint upload: its metadata step does not match 10");
  EXPECT_FALSE(std::filesystem::exists(*wrong));

  absl::StatusOr<std::string> upload = coordinator_->StartCheckpointUpload("w1", job_id, 1);
  ASSERT_TRUE(upload.ok()) << upload.status();
  EXPECT_EQ(std::filesystem::path(*upload).parent_path(), options_.checkpoint_dir);
  ASSERT_TRUE(WriteCheckpoint(*upload, {{{"w", {1}, {0.5f}}}, {{"step", "10"}}}).ok());
  const int64_t bytes = static_cast<int64_t>(std::filesystem::file_size(*upload));
  ASSERT_TRUE(coordinator_->CommitCheckpoint(Chunk(job_id, 1, 10), *upload, bytes).ok());
  EXPECT_FALSE(std::filesystem::exists(*upload));
  const std::string stored = options_.checkpoint_dir + "/" + job_id + ".safetensors";
  EXPECT_TRUE(std::filesystem::exists(stored));
  EXPECT_EQ(Get(job_id).checkpoint_step(), 10);
  EXPECT_EQ(Get(job_id).checkpoint_bytes(), bytes);
  absl::StatusOr<std::string> resume = coordinator_->CheckpointForAttempt("w1", job_id, 1);
  ASSERT_TRUE(resume.ok()) << resume.status();
  EXPECT_EQ(*resume, stored);

  ASSERT_TRUE(coordinator_->CompleteJob(Success(job_id, 1, 10)).ok());
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_SUCCEEDED);
  absl::StatusOr<std::string> artifact = coordinator_->ArtifactPath(job_id);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_EQ(*artifact, stored);
}

TEST_F(CoordinatorTest, AFullDiskIsResourceExhaustedCountedAndShownOnTheJob) {
  const std::string job_id = RunningJob();
  absl::StatusOr<std::string> upload = coordinator_->StartCheckpointUpload("w1", job_id, 1);
  ASSERT_TRUE(upload.ok()) << upload.status();
  std::ofstream(*upload) << "partial";
  absl::Status full = coordinator_->CheckpointWriteFailed(Chunk(job_id, 1, 4), *upload, ENOSPC);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_TRUE(absl::StartsWith(full.message(),
                               "checkpoint not stored: the server cannot write "
                               "checkpoints to " +
                                   options_.checkpoint_dir))
      << full;
  EXPECT_FALSE(std::filesystem::exists(*upload));
  EXPECT_EQ(observer_.write_failures, 1);
  EXPECT_TRUE(absl::StartsWith(Get(job_id).waiting_reason(), "checkpoint at step 4 not stored"))
      << Get(job_id).waiting_reason();

  absl::Status other = coordinator_->CheckpointWriteFailed(Chunk(job_id, 1, 4), *upload, EIO);
  EXPECT_EQ(other.code(), absl::StatusCode::kInternal) << other;
  EXPECT_EQ(observer_.write_failures, 2);
  EXPECT_GE(coordinator_->Snapshot().checkpoint_dir_free_bytes, 0);
}

// The server was stopped for longer than the lease: its workers' silence then is its own, and
// the lease clocks move on by the pause instead of expiring.
TEST_F(CoordinatorTest, ExtendedLeasesDoNotCountTheServersOwnPause) {
  const std::string job_id = RunningJob();
  absl::SleepFor(options_.lease + absl::Milliseconds(100));
  coordinator_->ExtendLeases(options_.lease + absl::Milliseconds(100));
  coordinator_->ExpireLeases();
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(Heartbeat("w1", "i1", 0, job_id, 1).ok());
  // Only the pause is credited: a worker silent beyond it still loses its job.
  absl::SleepFor(options_.lease + absl::Milliseconds(100));
  coordinator_->ExtendLeases(absl::Milliseconds(10));
  coordinator_->ExpireLeases();
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_QUEUED);
}

TEST_F(CoordinatorTest, AfterARestartTheWorkerHasTheGracePeriodToComeBack) {
  const std::string kept = RunningJob();
  Start();  // the server restarts: the job is RUNNING in the store, its worker unknown
  EXPECT_EQ(Get(kept).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(coordinator_->Snapshot().workers_by_state["reconnecting"], 1);
  // Until it registers again its heartbeats are refused, and a sweep keeps its job.
  EXPECT_EQ(Heartbeat("w1", "i1", 0, kept, 1).status().code(), absl::StatusCode::kNotFound);
  coordinator_->ExpireLeases();
  EXPECT_EQ(Get(kept).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Register("w1", "i1", kept, 1).ok());
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(Heartbeat("w1", "i1", 0, kept, 1).ok());
  coordinator_->ExpireLeases();
  v1::Job job = Get(kept);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);

  // A worker that does not come back within the grace period loses its job to the queue.
  Start();
  absl::SleepFor(std::max(options_.restart_grace, options_.lease) + absl::Milliseconds(100));
  coordinator_->ExpireLeases();
  job = Get(kept);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(absl::StrContains(job.error(), "did not register again within")) << job.error();
}

// Issue 16: several jobs per worker, each GPU to one job, cpus and memory never over-committed.
TEST_F(CoordinatorTest, PacksJobsOntoAWorkerWhileTheyFitAndGivesEachGpuToOneJob) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  const std::string a = Submit(1), b = Submit(1), c = Submit(1);
  ASSERT_TRUE(Register("w1", "i1", "", 0, /*cpus=*/2, /*memory_bytes=*/8 * kGiB, /*gpus=*/2).ok());
  absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("w1", "i1", 8);
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_EQ(beat->assignments_size(), 2);  // two GPUs, two jobs
  std::set<int> gpus;
  for (const v1::Assignment& assignment : beat->assignments()) {
    const v1::Placement& placement = assignment.placement();
    ASSERT_EQ(placement.gpu_indices_size(), 1);
    gpus.insert(placement.gpu_indices(0));
    EXPECT_EQ(placement.gpu_uuids(0), absl::StrCat("GPU-", placement.gpu_indices(0)));
    EXPECT_EQ(placement.cpus(), 1);                 // its GPUs' share of the cores
    EXPECT_EQ(placement.memory_bytes(), 4 * kGiB);  // and of the memory
    EXPECT_EQ(placement.worker_id(), "w1");
    EXPECT_EQ(Get(assignment.job_id()).placement().gpu_indices(0), placement.gpu_indices(0));
  }
  EXPECT_EQ(gpus, (std::set<int>{0, 1}));
  const v1::Job waiting = Get(c);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(waiting.waiting_reason(), "needs 1 GPUs, the most free on one worker is 0");
  // list carries the reason too.
  absl::StatusOr<v1::ListJobsResponse> listed = coordinator_->ListJobs({});
  ASSERT_TRUE(listed.ok());
  for (const v1::Job& job : listed->jobs()) {
    if (job.id() == c) {
      EXPECT_EQ(job.waiting_reason(), waiting.waiting_reason());
    }
  }
  v1::ListWorkersResponse workers = coordinator_->ListWorkers();
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).cpus(), 2);
  EXPECT_EQ(workers.workers(0).cpus_used(), 2);
  EXPECT_EQ(workers.workers(0).memory_used_bytes(), 8 * kGiB);
  EXPECT_EQ(workers.workers(0).placements_size(), 2);

  // Nothing more is placed while both run, however many slots the worker offers.
  v1::HeartbeatRequest both;
  both.set_worker_id("w1");
  both.set_instance("i1");
  both.set_free_slots(8);
  for (const v1::Assignment& assignment : beat->assignments()) {
    v1::RunningAttempt* running = both.add_running();
    running->set_job_id(assignment.job_id());
    running->set_attempt(1);
  }
  absl::StatusOr<v1::HeartbeatResponse> full = coordinator_->Heartbeat(both);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->assignments_size(), 0);

  // The job on GPU 0 ends (its worker no longer reports it): the third job gets that GPU.
  const v1::Assignment& first = beat->assignments(0);
  const int freed = first.placement().gpu_indices(0);
  ASSERT_TRUE(coordinator_->Cancel(first.job_id()).ok());
  // Cancelled but not yet stopped on the worker: its GPU is still held.
  absl::StatusOr<v1::HeartbeatResponse> stopping = coordinator_->Heartbeat(both);
  ASSERT_TRUE(stopping.ok());
  EXPECT_EQ(stopping->assignments_size(), 0);
  EXPECT_EQ(stopping->stop_size(), 1);
  const v1::Assignment& second = beat->assignments(1);
  absl::StatusOr<v1::HeartbeatResponse> after =
      Heartbeat("w1", "i1", 8, second.job_id(), second.attempt());
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->assignments_size(), 1);
  EXPECT_EQ(after->assignments(0).job_id(), c);
  EXPECT_EQ(after->assignments(0).placement().gpu_indices(0), freed);
  (void)a;
  (void)b;
}

TEST_F(CoordinatorTest, CpuJobsPackByTheirCoresAndTheLedgerSurvivesARestart) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  const std::string one = Submit(0, 1), two = Submit(0, 1), whole = Submit(), small = Submit(0, 1);
  ASSERT_TRUE(Register("w1", "i1", "", 0, 2, 4 * kGiB).ok());
  absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("w1", "i1", 8);
  ASSERT_TRUE(beat.ok()) << beat.status();
  // The two 1-core jobs fill the 2 cores; the default job (the whole worker) and the one behind
  // it wait.
  ASSERT_EQ(beat->assignments_size(), 2);
  EXPECT_EQ(beat->assignments(0).job_id(), one);
  EXPECT_EQ(beat->assignments(1).job_id(), two);
  EXPECT_EQ(beat->assignments(0).placement().memory_bytes(), 2 * kGiB);
  EXPECT_EQ(Get(whole).waiting_reason(), "needs 2 cpus, the most free on one worker is 0");
  EXPECT_EQ(Get(small).waiting_reason(),
            "1 job(s) ahead in the queue; needs 1 cpus, the most free on one worker is 0");
  // A job asking for more cores than any worker has says so.
  const std::string huge = Submit(0, 64);
  EXPECT_EQ(Get(huge).waiting_reason(),
            "2 job(s) ahead in the queue; needs 64 cpus on one worker; the largest worker has 2");

  // The server restarts: the ledger comes back from the jobs' stored placements, so the worker,
  // once registered again with both jobs, gets nothing new.
  Start();
  v1::RegisterWorkerRequest again;
  again.set_worker_id("w1");
  again.set_instance("i1");
  again.add_devices()->set_kind("cpu");
  again.set_cpus(2);
  again.set_memory_bytes(4 * kGiB);
  for (const std::string& id : {one, two}) {
    v1::RunningAttempt* running = again.add_running();
    running->set_job_id(id);
    running->set_attempt(1);
  }
  ASSERT_TRUE(coordinator_->RegisterWorker(again).ok());
  v1::HeartbeatRequest request;
  request.set_worker_id("w1");
  request.set_instance("i1");
  request.set_free_slots(8);
  *request.mutable_running() = again.running();
  absl::StatusOr<v1::HeartbeatResponse> after = coordinator_->Heartbeat(request);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->assignments_size(), 0);
  EXPECT_EQ(coordinator_->ListWorkers().workers(0).cpus_used(), 2);
}

TEST_F(CoordinatorTest, AWorkerMustAdvertiseSaneResources) {
  v1::RegisterWorkerRequest request;
  request.set_worker_id("w1");
  request.set_instance("i1");
  request.add_devices()->set_kind("cpu");
  request.set_cpus(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->RegisterWorker(request).status()));
  request.set_cpus(2);
  request.set_memory_bytes(-5);
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->RegisterWorker(request).status()));
  request.set_memory_bytes(1 << 30);
  for (int i = 0; i < 2; ++i) {
    v1::Device* gpu = request.add_devices();
    gpu->set_kind("cuda");
    gpu->set_index(3);
  }
  absl::Status twice = coordinator_->RegisterWorker(request).status();
  EXPECT_TRUE(absl::IsInvalidArgument(twice)) << twice;
  EXPECT_TRUE(absl::StrContains(twice.message(), "GPU index 3 appears twice")) << twice;
}

}  // namespace
}  // namespace stoker
