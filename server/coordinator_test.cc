// The Coordinator on a real SQLite JobStore in a temporary directory, without gRPC: the job
// lifecycle, assignment, fencing, lease expiry, cancel, the final-checkpoint rule and the grace
// period after a restart. Leases are a fraction of a second so the whole suite stays quick.
#include "server/coordinator.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checkpoint.h"
#include "gtest/gtest.h"
#include "server/job_store.h"
#include "spec/job_spec.h"

namespace stoker {
namespace {

class CountingObserver final : public CoordinatorObserver {
 public:
  void JobAssigned(double) override { ++assigned; }
  void JobRequeued() override { ++requeued; }
  void CheckpointWriteFailed() override { ++write_failures; }
  int assigned = 0;
  int requeued = 0;
  int write_failures = 0;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("stoker_coordinator_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "data");
    // CSV jobs are not probed at submit: the files need only exist under the data root.
    std::ofstream(dir_ / "data/train.csv") << "1,0\n";
    std::ofstream(dir_ / "data/test.csv") << "1,0\n";
    options_.data_root = (dir_ / "data").string();
    options_.checkpoint_dir = (dir_ / "checkpoints").string();
    options_.lease = absl::Milliseconds(200);
    options_.restart_grace = absl::Milliseconds(200);
    Start();
  }
  void TearDown() override {
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }

  // (Re)opens the store and a fresh coordinator over it, as a server start does.
  void Start() {
    coordinator_.reset();
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open((dir_ / "jobs.db").string());
    ASSERT_TRUE(store.ok()) << store.status();
    coordinator_ = std::make_unique<Coordinator>(std::move(*store), options_);
    coordinator_->SetObserver(&observer_);
    ASSERT_TRUE(coordinator_->Recover().ok());
  }

  std::string Submit() {
    v1::SubmitJobRequest request;
    v1::JobSpec& spec = *request.mutable_spec() = DefaultJobSpec();
    spec.mutable_dataset()->set_format("csv");
    spec.mutable_dataset()->set_train_images("train.csv");
    spec.mutable_dataset()->set_test_images("test.csv");
    spec.mutable_model()->add_hidden(8);
    absl::StatusOr<v1::SubmitJobResponse> response = coordinator_->Submit(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->job().id() : "";
  }

  absl::Status Register(const std::string& worker_id, const std::string& instance,
                        const std::string& running_job = "", int running_attempt = 0) {
    v1::RegisterWorkerRequest request;
    request.set_worker_id(worker_id);
    request.set_instance(instance);
    request.add_devices()->set_kind("cpu");
    if (!running_job.empty()) {
      v1::RunningAttempt* running = request.add_running();
      running->set_job_id(running_job);
      running->set_attempt(running_attempt);
    }
    return coordinator_->RegisterWorker(request).status();
  }

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& worker_id,
                                                  const std::string& instance, int free_slots,
                                                  const std::string& running_job = "",
                                                  int running_attempt = 0) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.set_instance(instance);
    request.set_free_slots(free_slots);
    if (!running_job.empty()) {
      v1::RunningAttempt* running = request.add_running();
      running->set_job_id(running_job);
      running->set_attempt(running_attempt);
    }
    return coordinator_->Heartbeat(request);
  }

  // Submits a job and has worker "w1" take it (attempt 1).
  std::string RunningJob() {
    const std::string job_id = Submit();
    EXPECT_TRUE(Register("w1", "i1").ok());
    absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("w1", "i1", 1);
    EXPECT_TRUE(beat.ok()) << beat.status();
    EXPECT_EQ(beat.ok() ? beat->assignments_size() : 0, 1);
    return job_id;
  }

  v1::Job Get(const std::string& job_id) {
    absl::StatusOr<v1::Job> job = coordinator_->GetJob(job_id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  v1::CompleteJobRequest Success(const std::string& job_id, int attempt, int64_t steps) {
    v1::CompleteJobRequest request;
    request.set_worker_id("w1");
    request.set_job_id(job_id);
    request.set_attempt(attempt);
    request.set_state(v1::JOB_STATE_SUCCEEDED);
    request.mutable_progress()->set_step(steps);
    request.mutable_progress()->set_total_steps(steps);
    return request;
  }

  v1::CheckpointChunk Chunk(const std::string& job_id, int attempt, int64_t step) {
    v1::CheckpointChunk chunk;
    chunk.set_worker_id("w1");
    chunk.set_job_id(job_id);
    chunk.set_attempt(attempt);
    chunk.set_step(step);
    chunk.set_epoch(1);
    return chunk;
  }

  std::filesystem::path dir_;
  CoordinatorOptions options_;
  CountingObserver observer_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTest, ASubmittedJobIsQueuedAndSaysWhyItWaits) {
  const std::string job_id = Submit();
  const v1::Job job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.queue_position(), 0);  // jobs ahead of it
  EXPECT_FALSE(job.waiting_reason().empty());
  EXPECT_EQ(job.attempt(), 0);
  EXPECT_EQ(Get(Submit()).queue_position(), 1);
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

}  // namespace
}  // namespace stoker
