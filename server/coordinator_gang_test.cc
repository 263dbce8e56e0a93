// Data-parallel jobs in the Coordinator (issue 16), on the real store: a gang is placed whole and
// delivered to each of its workers, every report is fenced on its rank, one rank's failure or
// lost worker stops the whole gang, rank 0 decides success and alone uploads checkpoints, and the
// attempt's ranks meet through the rendezvous store.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checkpoint.h"
#include "gtest/gtest.h"
#include "server/coordinator_test_fixture.h"

namespace stoker {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

class CoordinatorGangTest : public CoordinatorTest {
 protected:
  // Registers a worker with `cpus` cores and 1 GiB per core (instance "<id>-i").
  void AddWorker(const std::string& worker_id, int cpus) {
    v1::RegisterWorkerRequest request;
    request.set_worker_id(worker_id);
    request.set_instance(absl::StrCat(worker_id, "-i"));
    request.add_devices()->set_kind("cpu");
    request.set_cpus(cpus);
    request.set_memory_bytes(cpus * kGiB);
    ASSERT_TRUE(coordinator_->RegisterWorker(request).ok());
  }

  // A gang of two 1-core ranks on one-core workers w1 (rank 0) and w2 (rank 1), both delivered.
  std::string RunningGang() {
    const std::string job_id = Submit(0, 1, 0, 2);
    AddWorker("w1", 1);
    AddWorker("w2", 1);
    EXPECT_TRUE(Beat("w1", 4).ok());
    absl::StatusOr<v1::HeartbeatResponse> second = Beat("w2", 4);
    EXPECT_TRUE(second.ok() && second->assignments_size() == 1);
    absl::StatusOr<v1::HeartbeatResponse> first = Beat("w1", 4);
    EXPECT_TRUE(first.ok() && first->assignments_size() == 1);
    return job_id;
  }

  v1::ReportProgressRequest Report(const std::string& worker_id, const std::string& job_id,
                                   int attempt, int rank) {
    v1::ReportProgressRequest report;
    report.set_worker_id(worker_id);
    report.set_job_id(job_id);
    report.set_attempt(attempt);
    report.set_rank(rank);
    return report;
  }

  v1::CompleteJobRequest End(const std::string& worker_id, const std::string& job_id, int rank,
                             v1::JobState state, int attempt = 1) {
    v1::CompleteJobRequest request;
    request.set_worker_id(worker_id);
    request.set_job_id(job_id);
    request.set_attempt(attempt);
    request.set_rank(rank);
    request.set_state(state);
    request.set_error("boom");
    request.mutable_progress()->set_step(10);
    request.mutable_progress()->set_total_steps(10);
    return request;
  }

  int CpusUsed(const std::string& worker_id) {
    const v1::ListWorkersResponse workers = coordinator_->ListWorkers();
    for (const v1::WorkerStatus& worker : workers.workers()) {
      if (worker.worker_id() == worker_id) return worker.cpus_used();
    }
    return -1;
  }
};

TEST_F(CoordinatorGangTest, AGangIsPlacedWholeAndDeliveredToEachWorkerAtItsHeartbeat) {
  const std::string job_id = Submit(0, 1, 0, 2);
  AddWorker("w1", 1);
  AddWorker("w2", 1);
  // w2 has not said yet how many jobs it takes: nothing is placed, and nothing is held.
  absl::StatusOr<v1::HeartbeatResponse> beat = Beat("w1", 4);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(beat->assignments_size(), 0);
  EXPECT_EQ(CpusUsed("w1"), 0);
  EXPECT_EQ(Get(job_id).waiting_reason(), "starting at the next heartbeat of a worker");

  // w2's heartbeat places both ranks: w2 gets its own now, w1's waits for w1's heartbeat.
  beat = Beat("w2", 4);
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_EQ(beat->assignments_size(), 1);
  const v1::Assignment& rank1 = beat->assignments(0);
  EXPECT_EQ(rank1.job_id(), job_id);
  EXPECT_EQ(rank1.rank(), 1);
  EXPECT_EQ(rank1.replicas(), 2);
  EXPECT_EQ(rank1.placement().worker_id(), "w2");
  EXPECT_EQ(rank1.placement().rank(), 1);
  v1::Job job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.worker_id(), "w1");  // rank 0's
  ASSERT_EQ(job.rank_placements_size(), 2);
  EXPECT_EQ(job.rank_placements(0).worker_id(), "w1");
  EXPECT_EQ(job.rank_placements(1).worker_id(), "w2");
  EXPECT_EQ(observer_.assigned, 1);
  EXPECT_EQ(CpusUsed("w1"), 1);  // held for rank 0 before w1 knows of it
  const v1::ListWorkersResponse workers = coordinator_->ListWorkers();
  ASSERT_EQ(workers.workers(1).placements_size(), 1);
  EXPECT_EQ(workers.workers(1).placements(0).rank(), 1);
  EXPECT_EQ(workers.workers(1).placements(0).job_id(), job_id);

  // w2 reports its rank; w1, which has not heard of rank 0 yet, does not lose it.
  beat = Beat("w2", 3, {Rank(job_id, 1, 1)});
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->stop_size(), 0);
  EXPECT_EQ(beat->assignments_size(), 0);
  beat = Beat("w1", 4);
  ASSERT_TRUE(beat.ok());
  ASSERT_EQ(beat->assignments_size(), 1);
  EXPECT_EQ(beat->assignments(0).rank(), 0);
  EXPECT_EQ(beat->assignments(0).replicas(), 2);
  // Just delivered, it may be missing from the next report: not lost within a lease.
  ASSERT_TRUE(Beat("w1", 3).ok());
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Beat("w1", 3, {Rank(job_id, 1, 0)}).ok());

  // Reports are fenced on the rank: w1 runs rank 0, not rank 1.
  absl::Status wrong = coordinator_->ReportProgress(Report("w1", job_id, 1, 1)).status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition) << wrong;
  EXPECT_TRUE(absl::StrContains(wrong.message(), "its rank 1 on worker w2")) << wrong;
  // Every rank's events are stored; only rank 0's progress is the job's; logs name the rank.
  v1::ReportProgressRequest from1 = Report("w2", job_id, 1, 1);
  from1.add_events()->mutable_progress()->set_step(7);
  v1::JobEvent* log = from1.add_events();
  log->set_type(v1::EVENT_TYPE_LOG);
  log->set_message("gloo connected");
  ASSERT_TRUE(coordinator_->ReportProgress(from1).ok());
  EXPECT_EQ(Get(job_id).progress().step(), 0);
  v1::ReportProgressRequest from0 = Report("w1", job_id, 1, 0);
  from0.add_events()->mutable_progress()->set_step(3);
  ASSERT_TRUE(coordinator_->ReportProgress(from0).ok());
  EXPECT_EQ(Get(job_id).progress().step(), 3);
  bool finished = false;
  absl::StatusOr<std::vector<v1::JobEvent>> events =
      coordinator_->WaitForEvents(job_id, 0, absl::ZeroDuration(), &finished);
  ASSERT_TRUE(events.ok());
  bool found = false;
  for (const v1::JobEvent& event : *events) found |= event.message() == "rank 1: gloo connected";
  EXPECT_TRUE(found);
}

TEST_F(CoordinatorGangTest, ARankThatFailsRequeuesTheJobAndStopsTheOtherRanks) {
  const std::string job_id = RunningGang();
  ASSERT_TRUE(coordinator_->CompleteJob(End("w2", job_id, 1, v1::JOB_STATE_FAILED)).ok());
  v1::Job job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.error(), "rank 1 on worker w2: boom");
  EXPECT_EQ(observer_.requeued, 1);
  EXPECT_EQ(CpusUsed("w2"), 0);
  // Rank 0 is told to stop and holds its core until it has; its reports are refused.
  EXPECT_EQ(CpusUsed("w1"), 1);
  EXPECT_EQ(coordinator_->ReportProgress(Report("w1", job_id, 1, 0)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<v1::HeartbeatResponse> beat = Beat("w1", 4, {Rank(job_id, 1, 0)});
  ASSERT_TRUE(beat.ok());
  ASSERT_EQ(beat->stop_size(), 1);
  EXPECT_EQ(beat->stop(0).job_id(), job_id);
  EXPECT_EQ(beat->stop(0).rank(), 0);
  EXPECT_EQ(beat->assignments_size(), 0);  // rank 0 still holds w1's core: no room for the gang
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_QUEUED);
  // Its stopped rank's own end is refused too, and frees its core: the gang runs again.
  absl::Status stale = coordinator_->CompleteJob(End("w1", job_id, 0, v1::JOB_STATE_FAILED));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_EQ(CpusUsed("w1"), 0);
  beat = Beat("w1", 4);
  ASSERT_TRUE(beat.ok());
  ASSERT_EQ(beat->assignments_size(), 1);
  EXPECT_EQ(beat->assignments(0).attempt(), 2);
  EXPECT_EQ(Get(job_id).attempt(), 2);
}

TEST_F(CoordinatorGangTest, ARankGivenBackRequeuesWithoutCountingAndAPermanentFailureIsFinal) {
  const std::string job_id = RunningGang();
  v1::CompleteJobRequest released = End("w2", job_id, 1, v1::JOB_STATE_FAILED);
  released.set_released(true);
  released.set_error("worker w2 shut down");
  ASSERT_TRUE(coordinator_->CompleteJob(released).ok());
  // Rank 0 still runs: it writes the checkpoint the job resumes from, so the attempt goes on
  // until rank 0 gives the job back too (requeueing now would refuse that upload as stale).
  v1::Job job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.released_attempts(), 0);
  EXPECT_EQ(CpusUsed("w2"), 0);
  EXPECT_EQ(coordinator_->ReportProgress(Report("w1", job_id, 1, 0)).status().code(),
            absl::StatusCode::kOk);
  v1::CompleteJobRequest rank0 = End("w1", job_id, 0, v1::JOB_STATE_FAILED);
  rank0.set_released(true);
  rank0.set_error("stopped at step 12 for worker w2's shutdown");
  ASSERT_TRUE(coordinator_->CompleteJob(rank0).ok());
  job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.released_attempts(), 1);
  EXPECT_EQ(job.error(),
            "rank 0 on worker w1: stopped at step 12 for worker w2's shutdown (not counted "
            "against max_retries)");
  // Rank 0 stops; the gang runs again as attempt 2, and a permanent failure of any rank ends it.
  ASSERT_TRUE(Beat("w1", 4).ok());
  ASSERT_TRUE(Beat("w2", 4).ok());
  job = Get(job_id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(job.attempt(), 2);
  const std::string rank1_worker = job.rank_placements(1).worker_id();
  v1::CompleteJobRequest bad = End(rank1_worker, job_id, 1, v1::JOB_STATE_FAILED, 2);
  bad.set_permanent(true);
  bad.set_error("train-labels: label 12 >= 10 classes");
  ASSERT_TRUE(coordinator_->CompleteJob(bad).ok());
  job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.error(), absl::StrCat("rank 1 on worker ", rank1_worker,
                                      ": train-labels: label 12 >= 10 classes"));
  absl::StatusOr<v1::HeartbeatResponse> beat =
      Beat(job.rank_placements(0).worker_id(), 3, {Rank(job_id, 2, 0)});
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->stop_size(), 1);
}

TEST_F(CoordinatorGangTest, ALostWorkerStopsTheWholeGang) {
  const std::string job_id = RunningGang();
  // w2 keeps its lease, w1 goes silent.
  const absl::Time until = absl::Now() + options_.lease + absl::Milliseconds(100);
  while (absl::Now() < until) {
    ASSERT_TRUE(Beat("w2", 3, {Rank(job_id, 1, 1)}).ok());
    absl::SleepFor(absl::Milliseconds(40));
  }
  coordinator_->ExpireLeases();
  const v1::Job job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(absl::StrContains(job.error(), "worker w1 lost")) << job.error();
  absl::StatusOr<v1::HeartbeatResponse> beat = Beat("w2", 3, {Rank(job_id, 1, 1)});
  ASSERT_TRUE(beat.ok());
  ASSERT_EQ(beat->stop_size(), 1);
  EXPECT_EQ(beat->stop(0).rank(), 1);
  // Cancelling the requeued job stops nothing more and the job ends.
  ASSERT_TRUE(coordinator_->Cancel(job_id).ok());
}

TEST_F(CoordinatorGangTest, ARankItsWorkerNeverTakesEndsTheAttemptWithoutCounting) {
  const std::string job_id = Submit(0, 1, 0, 2);
  AddWorker("w1", 1);
  AddWorker("w2", 1);
  ASSERT_TRUE(Beat("w1", 4).ok());
  ASSERT_TRUE(Beat("w2", 4).ok());  // placed: rank 1 here, rank 0 waits for w1's heartbeat
  ASSERT_EQ(Get(job_id).state(), v1::JOB_STATE_RUNNING);
  // w1 stops heartbeating (it drains) while its other reports keep its lease.
  const absl::Time until = absl::Now() + options_.lease + absl::Milliseconds(100);
  while (absl::Now() < until) {
    (void)coordinator_->ReportProgress(Report("w1", "j-other", 1, 0));
    ASSERT_TRUE(Beat("w2", 3, {Rank(job_id, 1, 1)}).ok());
    absl::SleepFor(absl::Milliseconds(40));
  }
  coordinator_->ExpireLeases();
  const v1::Job job = Get(job_id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.released_attempts(), 1);
  EXPECT_TRUE(absl::StrContains(job.error(), "worker w1 did not take rank 0 within"))
      << job.error();
  EXPECT_EQ(CpusUsed("w1"), 0);  // the undelivered rank held w1's core until now
  absl::StatusOr<v1::HeartbeatResponse> beat = Beat("w2", 3, {Rank(job_id, 1, 1)});
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->stop_size(), 1);
}

TEST_F(CoordinatorGangTest, RankZeroDecidesSuccessAndAloneUploadsCheckpoints) {
  const std::string job_id = RunningGang();
  // Rank 1 may not upload; it may download what rank 0 stored.
  absl::Status upload1 = coordinator_->StartCheckpointUpload("w2", job_id, 1, 1).status();
  EXPECT_EQ(upload1.code(), absl::StatusCode::kFailedPrecondition) << upload1;
  EXPECT_TRUE(absl::StrContains(upload1.message(), "only rank 0")) << upload1;
  absl::StatusOr<std::string> upload = coordinator_->StartCheckpointUpload("w1", job_id, 1, 0);
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE(WriteCheckpoint(*upload, {{{"w", {1}, {0.5f}}}, {{"step", "10"}}}).ok());
  v1::CheckpointChunk chunk = Chunk(job_id, 1, 10);
  ASSERT_TRUE(coordinator_->CommitCheckpoint(chunk, *upload, 100).ok());
  EXPECT_TRUE(coordinator_->CheckpointForAttempt("w2", job_id, 1, 1).ok());
  EXPECT_EQ(coordinator_->CheckpointForAttempt("w2", job_id, 1, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Rank 1 finishing frees its core; the job runs on.
  ASSERT_TRUE(coordinator_->CompleteJob(End("w2", job_id, 1, v1::JOB_STATE_SUCCEEDED)).ok());
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(CpusUsed("w2"), 0);
  EXPECT_EQ(coordinator_->ReportProgress(Report("w2", job_id, 1, 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Rank 0's success, with the final checkpoint stored, is the job's.
  ASSERT_TRUE(coordinator_->CompleteJob(End("w1", job_id, 0, v1::JOB_STATE_SUCCEEDED)).ok());
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(CpusUsed("w1"), 0);
}

TEST_F(CoordinatorGangTest, CancelStopsEveryRank) {
  const std::string job_id = RunningGang();
  ASSERT_TRUE(coordinator_->Cancel(job_id).ok());
  absl::StatusOr<v1::HeartbeatResponse> beat = Beat("w1", 3, {Rank(job_id, 1, 0)});
  ASSERT_TRUE(beat.ok());
  ASSERT_EQ(beat->stop_size(), 1);
  absl::StatusOr<v1::ReportProgressResponse> told =
      coordinator_->ReportProgress(Report("w2", job_id, 1, 1));
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_TRUE(told->cancel_requested());
  EXPECT_TRUE(coordinator_->CompleteJob(End("w2", job_id, 1, v1::JOB_STATE_CANCELLED)).ok());
  EXPECT_EQ(CpusUsed("w2"), 0);
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(CoordinatorGangTest, TwoGangsThatEachNeedMostOfTheClusterDoNotDeadlock) {
  const std::string first = Submit(0, 1, 0, 3), second = Submit(0, 1, 0, 3);
  AddWorker("w1", 2);
  AddWorker("w2", 2);
  ASSERT_TRUE(Beat("w1", 4).ok());
  absl::StatusOr<v1::HeartbeatResponse> beat = Beat("w2", 4);
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(Get(first).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(first).rank_placements_size(), 3);
  const v1::Job waiting = Get(second);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(waiting.waiting_reason(), "needs 3 ranks of 1 cpus; the live workers have room for 1");
  EXPECT_EQ(CpusUsed("w1") + CpusUsed("w2"), 3);  // the waiting gang holds nothing
}

TEST_F(CoordinatorGangTest, AGangThatWaitedTooLongStopsBackfill) {
  options_.gang_backfill_limit = absl::ZeroDuration();
  Start();
  AddWorker("w1", 2);
  ASSERT_TRUE(Beat("w1", 4).ok());
  const std::string small = Submit(0, 1);
  absl::StatusOr<v1::HeartbeatResponse> beat = Beat("w1", 4);
  ASSERT_TRUE(beat.ok() && beat->assignments_size() == 1);
  const std::string gang = Submit(0, 1, 0, 2), behind = Submit(0, 1);
  // One core is free: `behind` would fit, but the gang ahead of it waits for both.
  beat = Beat("w1", 3, {Rank(small, 1, 0)});
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->assignments_size(), 0);
  const v1::Job held = Get(behind);
  EXPECT_EQ(held.state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(absl::StartsWith(held.waiting_reason(),
                               absl::StrCat("data-parallel job ", gang, " ahead of it has waited")))
      << held.waiting_reason();
  // Once the small job ends, the gang runs first.
  v1::CompleteJobRequest done = End("w1", small, 0, v1::JOB_STATE_FAILED);
  done.set_permanent(true);
  ASSERT_TRUE(coordinator_->CompleteJob(done).ok());
  beat = Beat("w1", 4);
  ASSERT_TRUE(beat.ok());
  ASSERT_EQ(beat->assignments_size(), 2);
  EXPECT_EQ(beat->assignments(0).job_id(), gang);
  EXPECT_EQ(Get(behind).state(), v1::JOB_STATE_QUEUED);
}

TEST_F(CoordinatorGangTest, RanksMeetThroughTheRendezvousOfTheirAttempt) {
  const std::string job_id = RunningGang();
  auto set = [&](const std::string& worker, int rank, const std::string& key,
                 const std::string& value, int attempt = 1) {
    v1::RendezvousSetRequest request;
    request.set_worker_id(worker);
    request.set_job_id(job_id);
    request.set_attempt(attempt);
    request.set_rank(rank);
    request.set_key(key);
    request.set_value(value);
    return coordinator_->RendezvousSet(request);
  };
  auto get = [&](const std::string& worker, int rank, std::vector<std::string> keys,
                 int64_t wait_ms) {
    v1::RendezvousGetRequest request;
    request.set_worker_id(worker);
    request.set_job_id(job_id);
    request.set_attempt(1);
    request.set_rank(rank);
    for (const std::string& key : keys) request.add_keys(key);
    request.set_wait_ms(wait_ms);
    return coordinator_->RendezvousGet(request);
  };
  absl::StatusOr<v1::RendezvousGetResponse> none = get("w1", 0, {"rank/0", "rank/1"}, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->ready());

  // A Get waits for keys set later by the other ranks.
  absl::StatusOr<v1::RendezvousGetResponse> waited;
  std::thread waiter([&] { waited = get("w1", 0, {"rank/0", "rank/1"}, 5000); });
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(set("w1", 0, "rank/0", "127.0.0.1:1000").ok());
  ASSERT_TRUE(set("w2", 1, "rank/1", "127.0.0.1:2000").ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  ASSERT_TRUE(waited->ready());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(waited->values(0), "127.0.0.1:1000");
  EXPECT_EQ(waited->values(1), "127.0.0.1:2000");

  // Fenced like progress reports: another rank's worker, another attempt.
  EXPECT_EQ(set("w1", 1, "x", "y").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(set("w1", 0, "x", "y", 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(set("w1", 0, "x", std::string(RendezvousTable::kMaxValueBytes + 1, 'v')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(get("w1", 0, {"x"}, -1).status().code(), absl::StatusCode::kInvalidArgument);

  // A waiter whose attempt ends (rank 1 fails) is let go at once.
  std::thread stopped([&] { waited = get("w1", 0, {"never"}, 5000); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(coordinator_->CompleteJob(End("w2", job_id, 1, v1::JOB_STATE_FAILED)).ok());
  stopped.join();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kFailedPrecondition) << waited.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST_F(CoordinatorGangTest, AGangKeepsItsRanksAcrossAServerRestart) {
  const std::string job_id = RunningGang();
  Start();  // the ledger comes back from the job's stored rank placements
  for (auto [worker, rank] : {std::pair{"w1", 0}, std::pair{"w2", 1}}) {
    v1::RegisterWorkerRequest again;
    again.set_worker_id(worker);
    again.set_instance(absl::StrCat(worker, "-i"));
    again.add_devices()->set_kind("cpu");
    again.set_cpus(1);
    again.set_memory_bytes(kGiB);
    *again.add_running() = Rank(job_id, 1, rank);
    ASSERT_TRUE(coordinator_->RegisterWorker(again).ok());
    absl::StatusOr<v1::HeartbeatResponse> beat = Beat(worker, 3, {Rank(job_id, 1, rank)});
    ASSERT_TRUE(beat.ok()) << beat.status();
    EXPECT_EQ(beat->stop_size(), 0);
    EXPECT_EQ(CpusUsed(worker), 1);
  }
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(coordinator_->ReportProgress(Report("w2", job_id, 1, 1)).ok());
  // A worker that comes back without its rank has lost it: the gang's attempt ends.
  v1::RegisterWorkerRequest restarted;
  restarted.set_worker_id("w2");
  restarted.set_instance("w2-new");
  restarted.set_previous_instance("w2-i");
  restarted.add_devices()->set_kind("cpu");
  restarted.set_cpus(1);
  ASSERT_TRUE(coordinator_->RegisterWorker(restarted).ok());
  EXPECT_EQ(Get(job_id).state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(absl::StrContains(Get(job_id).error(), "w2 restarted without the job (rank 1)"))
      << Get(job_id).error();
}

TEST_F(CoordinatorGangTest, AJobOfOneRankIsRankZero) {
  const std::string job_id = RunningJob();
  v1::ReportProgressRequest report = Report("w1", job_id, 1, 1);
  EXPECT_EQ(coordinator_->ReportProgress(report).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Get(job_id).rank_placements_size(), 0);
  report.set_rank(0);
  EXPECT_TRUE(coordinator_->ReportProgress(report).ok());
}

}  // namespace
}  // namespace stoker
