// Fault tolerance with real processes on loopback, processes killed, paused and restarted: a
// worker or the server killed (SIGKILL) mid-job, a second worker under a live id, a worker or the
// server paused past the lease, random kills through a whole job.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/faults_util.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

TEST(FaultsTest, KilledWorkerJobResumesFromItsCheckpointOnAnotherWorker) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "2"});
  const pid_t first = cluster.StartWorker("w1");
  absl::StatusOr<v1::Job> checkpointed = SubmitUntilCheckpoint(cluster, 4, 2);
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();

  cluster.KillWorker(first, SIGKILL);
  // The agent's trainer and loaders die with it; nothing of w1 is left running.
  EXPECT_TRUE(WaitUntilNoProcessMentions(cluster.dir() + "/w1/", absl::Seconds(5)))
      << FindProcesses({cluster.dir() + "/w1/"}).size() << " process(es) of w1 left";
  cluster.StartWorker("w2");

  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(checkpointed->id(), absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->worker_id(), "w2");
  EXPECT_EQ(done->attempt(), 2);
  EXPECT_GT(done->progress().test_accuracy(), 0.7);

  // The second attempt started where the checkpoint was, not at epoch 1.
  const int64_t resumed_step = checkpointed->checkpoint_step();
  bool saw_resume = false;
  int first_epoch_of_attempt2 = 0;
  for (const v1::JobEvent& event : cluster.History(checkpointed->id())) {
    if (event.attempt() != 2) continue;
    if (absl::StrContains(event.message(), "resumed from the checkpoint at step"))
      saw_resume = true;
    if ((event.type() == v1::EVENT_TYPE_PROGRESS || event.type() == v1::EVENT_TYPE_EPOCH) &&
        first_epoch_of_attempt2 == 0) {
      first_epoch_of_attempt2 = event.progress().epoch();
      EXPECT_GT(event.progress().step(), resumed_step);
    }
  }
  EXPECT_TRUE(saw_resume);
  EXPECT_GE(first_epoch_of_attempt2, checkpointed->checkpoint_epoch() + 1);

  // The metric history is one series: each epoch once, steps increasing, and past the step the
  // second attempt resumed from, only its points (the lost attempt's were replaced).
  auto history = [&]() {
    grpc::ClientContext context;
    v1::GetMetricsRequest request;
    request.set_job_id(checkpointed->id());
    v1::GetMetricsResponse response;
    EXPECT_TRUE(cluster.jobs().GetMetrics(&context, request, &response).ok());
    return response;
  };
  const v1::GetMetricsResponse metrics = history();
  ASSERT_EQ(metrics.epochs_size(), 4);  // (its epochs, under a second, make no step points)
  for (const auto* points : {&metrics.epochs(), &metrics.steps()}) {
    int64_t previous = 0;
    for (const v1::MetricPoint& point : *points) {
      EXPECT_GT(point.step(), previous);
      previous = point.step();
      EXPECT_EQ(point.step() > resumed_step ? 2 : 1, point.attempt())
          << "step " << point.step() << " (resumed from " << resumed_step << ")";
    }
  }
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(metrics.epochs(e).epoch(), e + 1);
    EXPECT_GT(metrics.epochs(e).test_accuracy(), 0);
    EXPECT_GT(metrics.epochs(e).train_loss(), 0);
  }
  EXPECT_DOUBLE_EQ(metrics.epochs(3).test_accuracy(), done->progress().test_accuracy());
  CommandResult csv = cluster.Cli("metrics " + checkpointed->id() + " -o csv");
  EXPECT_EQ(csv.exit_code, 0) << csv.output;
  EXPECT_EQ(std::count(csv.output.begin(), csv.output.end(), '\n'), 5) << csv.output;
  EXPECT_TRUE(absl::StartsWith(csv.output, "step,epoch,attempt,time_unix_ms,train_loss,test_loss,"))
      << csv.output;
  // TensorBoard's event file holds the same points (read back by an independent reader).
  CommandResult tb =
      cluster.Cli("metrics " + checkpointed->id() + " --tensorboard " + cluster.dir() + "/tb");
  ASSERT_EQ(tb.exit_code, 0) << tb.output;
  std::string event_file;
  for (const auto& entry : std::filesystem::directory_iterator(cluster.dir() + "/tb")) {
    event_file = entry.path().string();
  }
  CommandResult read =
      RunCommand("python3 " STOKER_SOURCE_DIR "/tests/tfevents_reader.py " + event_file);
  ASSERT_EQ(read.exit_code, 0) << read.output;
  const std::vector<std::string> events = absl::StrSplit(read.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(events.size(), 1u + metrics.epochs_size() + metrics.steps_size()) << read.output;
  for (int e = 0; e < 4; ++e) {
    const std::string& line = events[1 + metrics.steps_size() + e];
    EXPECT_TRUE(absl::StrContains(line, absl::StrCat("\"step\": ", metrics.epochs(e).step())))
        << line;
    const size_t at = line.find("\"epoch/test_accuracy\": ");
    ASSERT_NE(at, std::string::npos) << line;
    double value = 0;
    ASSERT_TRUE(
        absl::SimpleAtod(line.substr(at + 24, line.find_first_of(",}", at) - at - 24), &value))
        << line;
    EXPECT_FLOAT_EQ(static_cast<float>(value),
                    static_cast<float>(metrics.epochs(e).test_accuracy()));
  }
  // It survives a server restart.
  cluster.KillServer(SIGKILL);
  cluster.StartServer({"--lease-seconds", "2"});
  EXPECT_EQ(history().SerializeAsString(), metrics.SerializeAsString());
}

TEST(FaultsTest, KilledServerRestartsWithEveryJobAndTheRunningJobFinishes) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1");
  absl::StatusOr<v1::Job> running = cluster.Submit(SlowJob(3));
  ASSERT_TRUE(running.ok());
  std::vector<std::string> queued;
  for (int i = 0; i < 3; ++i) {
    v1::JobSpec spec = SmallFashionMnistJob(1, 1000, 200);
    spec.set_name(absl::StrCat("queued-", i));
    absl::StatusOr<v1::Job> job = cluster.Submit(spec);
    ASSERT_TRUE(job.ok());
    queued.push_back(job->id());
  }
  ASSERT_TRUE(cluster
                  .WaitFor(
                      running->id(), [](const v1::Job& j) { return j.progress().step() > 0; },
                      absl::Seconds(30))
                  .ok());
  cluster.KillServer(SIGKILL);
  absl::SleepFor(absl::Milliseconds(500));
  cluster.StartServer();  // same port, same state directory

  // Every job is still there, and the history of the running one replays.
  absl::StatusOr<v1::Job> after = cluster.WaitFor(
      running->id(), [](const v1::Job&) { return true; }, absl::Seconds(5));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::JOB_STATE_RUNNING);
  for (const std::string& id : queued) {
    absl::StatusOr<v1::Job> job = cluster.WaitFor(
        id, [](const v1::Job&) { return true; }, absl::Seconds(5));
    ASSERT_TRUE(job.ok()) << id;
  }
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(running->id(), absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 1) << "the worker re-attached; the job was not restarted";
  for (const std::string& id : queued) {
    absl::StatusOr<v1::Job> job = cluster.WaitForFinal(id, absl::Seconds(60));
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error();
  }
  CommandResult logs = cluster.Cli("logs " + running->id());
  EXPECT_NE(logs.output.find("epoch 3/3"), std::string::npos) << logs.output;
  EXPECT_NE(logs.output.find("submitted"), std::string::npos) << logs.output;
}

// Issue 12.4: a second worker under a live worker's id used to be accepted; each one's heartbeats
// then requeued the other's jobs until they all failed.
TEST(FaultsTest, ASecondWorkerWithALiveWorkersIdIsRefused) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1");
  ASSERT_TRUE(WaitUntilRegistered(cluster, "w1", absl::Seconds(10)));

  // Elsewhere (another work directory, as on another machine): the server refuses it.
  const pid_t elsewhere =
      cluster.StartWorker("w1", {"--work-dir", cluster.dir() + "/w1-elsewhere"});
  std::optional<int> code = cluster.WaitWorkerExit(elsewhere, absl::Seconds(10));
  ASSERT_TRUE(code.has_value()) << "the second w1 was accepted and runs";
  EXPECT_EQ(*code, 1);
  const std::string log = ReadAll(cluster.dir() + "/w1.log");
  EXPECT_NE(log.find("registration refused: worker id w1 is in use by a live worker"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("its lease expires in"), std::string::npos) << log;

  // On the same machine and work directory: refused before it calls the server.
  const pid_t same_dir = cluster.StartWorker("w1");
  code = cluster.WaitWorkerExit(same_dir, absl::Seconds(10));
  ASSERT_TRUE(code.has_value()) << "the third w1 runs";
  EXPECT_EQ(*code, 1);
  EXPECT_NE(ReadAll(cluster.dir() + "/w1.log")
                .find("worker id w1 is already running from work "
                      "directory"),
            std::string::npos);

  // The first one works on undisturbed.
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::Job> job = cluster.Submit(SmallFashionMnistJob(1, 1000, 200));
    ASSERT_TRUE(job.ok());
    ids.push_back(job->id());
  }
  for (const std::string& id : ids) {
    absl::StatusOr<v1::Job> done = cluster.WaitForFinal(id, absl::Seconds(60));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
    EXPECT_EQ(done->attempt(), 1);
  }
}

// Refusing a live id must not lock out the same worker restarted at once after a SIGKILL: its
// predecessor still has a live lease, but the work directory proves it is gone.
TEST(FaultsTest, AWorkerKilledAndRestartedUnderItsIdIsBackAtOnce) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "30"});
  const pid_t first = cluster.StartWorker("w1");
  absl::StatusOr<v1::Job> job = cluster.Submit(SlowJob(2));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(cluster.WaitForStep(job->id(), 5).ok());
  // The killed attempt never cleans up after itself: its prepared training set stays behind.
  const std::string old_attempt = absl::StrCat(cluster.dir(), "/w1/", job->id(), "-a1");
  ASSERT_TRUE(std::filesystem::exists(old_attempt + "/train.samples"));
  cluster.KillWorker(first, SIGKILL);
  const absl::Time restarted = absl::Now();
  cluster.StartWorker("w1");
  // Its new registration requeues the job it no longer has, and it takes it again.
  absl::StatusOr<v1::Job> again = cluster.WaitFor(
      job->id(), [](const v1::Job& j) { return j.attempt() == 2; }, absl::Seconds(10));
  const std::string worker_log = ReadAll(cluster.dir() + "/w1.log");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << worker_log;
  const absl::Duration back = absl::Now() - restarted;
  std::cerr << "restarted worker took its job again after " << back << "\n";
  EXPECT_LT(back, absl::Seconds(10)) << "it waited for the old lease (30 s)";
  // The restarted worker removed the dead attempt's data, and kept its logs.
  EXPECT_FALSE(std::filesystem::exists(old_attempt + "/train.samples"));
  EXPECT_TRUE(std::filesystem::exists(old_attempt + "/trainer.log"));
  EXPECT_TRUE(absl::StrContains(worker_log, "attempt directory of ")) << worker_log;
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->worker_id(), "w1");
}

// A worker paused past its lease (SIGSTOP: a stalled VM, a debugger) loses its job to the queue;
// back, it registers again, the server stops the old attempt and hands the job straight back to it
// while that attempt's trainer is still ending there. The new attempt waits for it and then runs:
// it used to be dropped, reported lost at the next heartbeat and requeued once more, which cost
// the job a retry it did not have (max_retries 1 here).
TEST(FaultsTest, APausedWorkerTakesItsJobBackWhileTheOldAttemptEnds) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "2"});
  const pid_t worker = cluster.StartWorker("w1");
  v1::JobSpec spec = SlowJob(6);
  spec.mutable_loader()->set_delay_ms(40);  // ~1.9 s per epoch
  spec.set_max_retries(1);
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::Job> checkpointed = cluster.WaitFor(
      job->id(), [](const v1::Job& j) { return j.checkpoint_epoch() >= 1; }, absl::Seconds(60));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  ASSERT_EQ(checkpointed->state(), v1::JOB_STATE_RUNNING);

  absl::StatusOr<v1::Job> lost = PauseWorkerPastItsLease(cluster, worker, job->id());
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->attempt(), 1);

  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  const std::string worker_log = ReadAll(cluster.dir() + "/w1.log");
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error() << "\n" << worker_log;
  EXPECT_EQ(done->attempt(), 2) << worker_log;
  EXPECT_EQ(done->worker_id(), "w1");
  // The new attempt was handed over while the old one ended, waited for it, and resumed from
  // the checkpoint rather than starting over.
  EXPECT_TRUE(absl::StrContains(worker_log, " attempt 2 starts once attempt 1 of it has ended"))
      << worker_log;
  bool resumed = false;
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    EXPECT_FALSE(absl::StrContains(event.message(), "no longer runs the job")) << event.message();
    resumed =
        resumed || (event.attempt() == 2 &&
                    absl::StrContains(event.message(), "resumed from the checkpoint at step"));
  }
  EXPECT_TRUE(resumed);
}

// The same, but the worker is asked to shut down while the new attempt waits for the old one: it
// gives the attempt back unstarted (not counted against max_retries), and the job runs on the
// next worker.
TEST(FaultsTest, AWorkerShuttingDownGivesBackTheAttemptItHadNotStarted) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "2"});
  const pid_t worker = cluster.StartWorker("w1");
  v1::JobSpec spec = SlowJob(4);
  spec.set_max_retries(1);
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster.WaitForStep(job->id(), 10).ok());
  absl::StatusOr<v1::Job> lost = PauseWorkerPastItsLease(cluster, worker, job->id());
  ASSERT_TRUE(lost.ok()) << lost.status();
  // Attempt 2 handed back to w1 waits there for attempt 1's end; w1 is told to stop meanwhile.
  const std::string log_path = cluster.dir() + "/w1.log";
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!absl::StrContains(ReadAll(log_path), "attempt 2 starts once attempt 1") &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(absl::StrContains(ReadAll(log_path), "attempt 2 starts once attempt 1"))
      << ReadAll(log_path);
  ASSERT_EQ(kill(worker, SIGTERM), 0);
  EXPECT_TRUE(cluster.WaitWorkerExit(worker, absl::Seconds(30)).has_value());
  EXPECT_TRUE(absl::StrContains(ReadAll(log_path), "giving back " + job->id() + " attempt 2"))
      << ReadAll(log_path);

  cluster.StartWorker("w2");
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->worker_id(), "w2");
  EXPECT_EQ(done->attempt(), 3);
  EXPECT_EQ(done->released_attempts(), 1);
}

// Issue 12.5: a restarted server gave its workers one lease to come back; they needed ~5 s, so
// with --lease-seconds 3 the running job lost an attempt and went back to an old checkpoint.
// The server stopped for longer than the lease (SIGSTOP here; a stalled VM or a starved machine
// alike) heard no heartbeat meanwhile through no fault of its workers. It used to find every
// worker lost the moment it ran again and requeue all their jobs, each losing its progress since
// the last checkpoint and one of its retries.
TEST(FaultsTest, AServerPausedPastTheLeaseLosesNoWorker) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "2"});
  cluster.StartWorker("w1");
  v1::JobSpec spec = SlowJob(3);
  spec.set_max_retries(0);
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster.WaitForStep(job->id(), 5).ok());
  ASSERT_EQ(kill(cluster.server_pid(), SIGSTOP), 0);
  absl::SleepFor(absl::Seconds(5));
  ASSERT_EQ(kill(cluster.server_pid(), SIGCONT), 0);
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  const std::string server_log = ReadAll(cluster.dir() + "/server.log");
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error() << "\n" << server_log;
  EXPECT_EQ(done->attempt(), 1) << done->error();
  EXPECT_TRUE(absl::StrContains(server_log, "did not run for")) << server_log;
}

// Chaos: the server and the worker are killed (SIGKILL) and started again at random moments
// through a job: mid-step, mid-checkpoint, mid-upload, while preparing. The job still ends, with
// exactly the test accuracy of the same job run without interruption (resume is exact), and
// nothing of the killed attempts is left on the disks of either. (A session's trial of this by
// hand found a checkpoint stored cut short, and the attempts' leftovers.)
// With `preemptions`, the job runs on the worker's only (fake) GPU and short higher-priority jobs
// arrive at random moments too, each preempting it (issue 29).
void RunUnderRandomKills(bool preemptions) {
  TestCluster cluster;
  std::vector<std::string> server_flags = {"--lease-seconds", "2"};
  std::vector<std::string> worker_flags;
  if (preemptions) {
    server_flags.insert(server_flags.end(),
                        {"--preemption-min-runtime-seconds", "0.5", "--max-preemptions", "100"});
    worker_flags = {"--fake-gpus-for-tests", "1", "--cpus", "4"};
  }
  cluster.StartServer(server_flags);
  pid_t worker = cluster.StartWorker("w1", worker_flags);
  v1::JobSpec spec = SlowJob(10);
  spec.mutable_checkpoint()->set_every_steps(10);
  spec.set_max_retries(100);
  v1::JobSpec urgent_spec = SlowJob(1);
  urgent_spec.set_priority(5);
  urgent_spec.mutable_dataset()->set_train_limit(1000);
  urgent_spec.set_max_retries(100);
  if (preemptions) {
    for (v1::JobSpec* s : {&spec, &urgent_spec}) {
      s->mutable_resources()->set_gpus(1);
      s->mutable_resources()->set_cpus(1);
    }
  }
  std::vector<std::string> urgent_ids;
  absl::StatusOr<v1::Job> reference = cluster.RunJob(spec, absl::Seconds(120));
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->state(), v1::JOB_STATE_SUCCEEDED) << reference->error();

  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  std::mt19937 random(20261202);
  int kills = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(240);
  while (absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(300, 2500)(random)));
    absl::StatusOr<v1::Job> now = cluster.WaitFor(
        job->id(), [](const v1::Job&) { return true; }, absl::Seconds(10));
    ASSERT_TRUE(now.ok()) << now.status();
    if (now->state() != v1::JOB_STATE_QUEUED && now->state() != v1::JOB_STATE_RUNNING) break;
    if (kills >= 12) continue;  // enough: let it finish
    if (preemptions && urgent_ids.size() < 4 && random() % 3 == 0) {
      absl::StatusOr<v1::Job> urgent = cluster.Submit(urgent_spec);
      ASSERT_TRUE(urgent.ok()) << urgent.status();
      urgent_ids.push_back(urgent->id());
      continue;
    }
    ++kills;
    if (random() % 2 == 0) {
      cluster.KillServer(SIGKILL);
      cluster.StartServer(server_flags);
    } else {
      cluster.KillWorker(worker, SIGKILL);
      worker = cluster.StartWorker("w1", worker_flags);
    }
  }
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  const std::string worker_log = ReadAll(cluster.dir() + "/w1.log");
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error() << "\n" << worker_log;
  std::cerr << kills << " kills; the job ended in attempt " << done->attempt() << "\n";
  EXPECT_GE(kills, 3) << "the job ended before the kills could test anything";
  EXPECT_EQ(done->progress().test_accuracy(), reference->progress().test_accuracy());
  if (preemptions) {
    std::cerr << done->preemptions() << " preemptions by " << urgent_ids.size() << " urgent jobs\n";
    EXPECT_GE(done->preemptions(), 1) << "no urgent job preempted it";
    for (const std::string& id : urgent_ids) {
      absl::StatusOr<v1::Job> urgent = cluster.WaitForFinal(id, absl::Seconds(120));
      ASSERT_TRUE(urgent.ok()) << urgent.status();
      EXPECT_EQ(urgent->state(), v1::JOB_STATE_SUCCEEDED) << urgent->error();
    }
  }
  absl::StatusOr<Checkpoint> artifact =
      ReadCheckpoint(cluster.dir() + "/server/checkpoints/" + job->id() + ".safetensors");
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_EQ(artifact->metadata.at("step"), absl::StrCat(done->progress().total_steps()));

  // Nothing but logs and job files is left of the attempts, and no partial upload.
  int64_t left = 0;
  std::error_code ignored;
  for (std::filesystem::recursive_directory_iterator it(cluster.dir() + "/w1", ignored), end;
       !ignored && it != end; it.increment(ignored)) {
    const std::string name = it->path().filename().string();
    if (!it->is_regular_file() || absl::EndsWith(name, ".log") || name == "job.pb" ||
        name == ".worker" || absl::StartsWith(name, ".worker-")) {
      continue;
    }
    ++left;
    ADD_FAILURE() << "left in the work directory: " << it->path();
  }
  EXPECT_EQ(left, 0);
  for (const auto& entry :
       std::filesystem::directory_iterator(cluster.dir() + "/server/checkpoints")) {
    EXPECT_FALSE(absl::StrContains(entry.path().filename().string(), ".upload-a")) << entry.path();
  }
}

TEST(FaultsTest, AJobUnderRandomKillsEndsAsAnUninterruptedRunDoes) { RunUnderRandomKills(false); }

TEST(FaultsTest, AJobUnderRandomKillsAndPreemptionsEndsAsAnUninterruptedRunDoes) {
  RunUnderRandomKills(true);
}

TEST(FaultsTest, AServerRestartWithAShortLeaseCostsTheRunningJobNothing) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "3"});
  cluster.StartWorker("w1");
  v1::JobSpec spec = SlowJob(4);
  spec.mutable_loader()->set_delay_ms(40);  // ~1.9 s per epoch
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok());
  absl::StatusOr<v1::Job> checkpointed = cluster.WaitFor(
      job->id(), [](const v1::Job& j) { return j.checkpoint_epoch() >= 1; }, absl::Seconds(60));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  ASSERT_EQ(checkpointed->state(), v1::JOB_STATE_RUNNING);

  cluster.KillServer(SIGKILL);
  absl::SleepFor(absl::Seconds(1));  // down for a while; the worker trains on
  cluster.StartServer({"--lease-seconds", "3"});
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(WaitUntilRegistered(cluster, "w1", absl::Seconds(30)));
  const absl::Duration reregistered = absl::Now() - restarted;
  std::cerr << "w1 registered again " << reregistered << " after the server restarted\n";
  EXPECT_LT(reregistered, absl::Seconds(4)) << "a reconnecting worker retries fast";

  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 1) << done->error();
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    EXPECT_FALSE(absl::StrContains(event.message(), "requeued")) << event.message();
    EXPECT_FALSE(absl::StrContains(event.message(), "resumed from the checkpoint"))
        << event.message();
  }
}

}  // namespace
}  // namespace stoker::testing
