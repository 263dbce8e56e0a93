// The fixture of the Coordinator tests (coordinator_test.cc, coordinator_gang_test.cc): a
// Coordinator on a real SQLite JobStore in a temporary directory, CSV jobs whose files exist under
// a data root, leases of a fraction of a second, and helpers that submit, register, heartbeat and
// complete as a worker would.
#ifndef STOKER_SERVER_COORDINATOR_TEST_FIXTURE_H_
#define STOKER_SERVER_COORDINATOR_TEST_FIXTURE_H_

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/job_store.h"
#include "spec/job_spec.h"

namespace stoker {

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

  std::string Submit(int gpus = 0, int cpus = 0, int64_t memory_mib = 0, int replicas = 0) {
    v1::SubmitJobRequest request;
    v1::JobSpec& spec = *request.mutable_spec() = DefaultJobSpec();
    spec.mutable_resources()->set_replicas(replicas);
    spec.mutable_resources()->set_gpus(gpus);
    spec.mutable_resources()->set_cpus(cpus);
    spec.mutable_resources()->set_memory_mib(memory_mib);
    spec.mutable_dataset()->set_format("csv");
    spec.mutable_dataset()->set_train_images("train.csv");
    spec.mutable_dataset()->set_test_images("test.csv");
    spec.mutable_model()->add_hidden(8);
    absl::StatusOr<v1::SubmitJobResponse> response = coordinator_->Submit(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->job().id() : "";
  }

  absl::Status Register(const std::string& worker_id, const std::string& instance,
                        const std::string& running_job = "", int running_attempt = 0, int cpus = 0,
                        int64_t memory_bytes = 0, int gpus = 0) {
    v1::RegisterWorkerRequest request;
    request.set_worker_id(worker_id);
    request.set_instance(instance);
    request.add_devices()->set_kind("cpu");
    request.set_cpus(cpus);
    request.set_memory_bytes(memory_bytes);
    for (int i = 0; i < gpus; ++i) {
      v1::Device* gpu = request.add_devices();
      gpu->set_kind("cuda");
      gpu->set_index(i);
      gpu->set_uuid(absl::StrCat("GPU-", i));
    }
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

  // A heartbeat reporting `running` (job, attempt, rank each).
  absl::StatusOr<v1::HeartbeatResponse> Beat(const std::string& worker_id, int free_slots,
                                             const std::vector<v1::RunningAttempt>& running = {}) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.set_instance(absl::StrCat(worker_id, "-i"));
    request.set_free_slots(free_slots);
    for (const v1::RunningAttempt& attempt : running) *request.add_running() = attempt;
    return coordinator_->Heartbeat(request);
  }

  static v1::RunningAttempt Rank(const std::string& job_id, int attempt, int rank) {
    v1::RunningAttempt running;
    running.set_job_id(job_id);
    running.set_attempt(attempt);
    running.set_rank(rank);
    return running;
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

}  // namespace stoker

#endif  // STOKER_SERVER_COORDINATOR_TEST_FIXTURE_H_
