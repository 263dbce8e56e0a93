// Fault tolerance with real processes on loopback, checkpoints: the artifact and exact resume, a
// worker's shutdown mid-epoch, uploads at every step, a full server disk, uploads cut short, and
// the server's fencing of worker instances.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/faults_util.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

TEST(FaultsTest, ArtifactIsTheFinalCheckpointAndResumeIsExact) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "2"});
  const pid_t first = cluster.StartWorker("w1");

  // Straight run: 2 epochs.
  absl::StatusOr<v1::Job> straight = cluster.Submit(SlowJob(2));
  ASSERT_TRUE(straight.ok());
  absl::StatusOr<v1::Job> straight_done = cluster.WaitForFinal(straight->id(), absl::Seconds(60));
  ASSERT_TRUE(straight_done.ok());
  ASSERT_EQ(straight_done->state(), v1::JOB_STATE_SUCCEEDED) << straight_done->error();
  const std::string straight_file = cluster.dir() + "/straight.safetensors";
  CommandResult artifact = cluster.Cli("artifact " + straight->id() + " -o " + straight_file);
  ASSERT_EQ(artifact.exit_code, 0) << artifact.output;

  // Interrupted run: the same job, its worker killed after the first epoch's checkpoint.
  absl::StatusOr<v1::Job> interrupted = SubmitUntilCheckpoint(cluster, 2, 1);
  ASSERT_TRUE(interrupted.ok()) << interrupted.status();
  cluster.KillWorker(first, SIGKILL);
  cluster.StartWorker("w2");
  absl::StatusOr<v1::Job> resumed_done = cluster.WaitForFinal(interrupted->id(), absl::Seconds(90));
  ASSERT_TRUE(resumed_done.ok());
  ASSERT_EQ(resumed_done->state(), v1::JOB_STATE_SUCCEEDED) << resumed_done->error();
  EXPECT_EQ(resumed_done->attempt(), 2);
  const std::string resumed_file = cluster.dir() + "/resumed.safetensors";
  artifact = cluster.Cli("artifact " + interrupted->id() + " -o " + resumed_file);
  ASSERT_EQ(artifact.exit_code, 0) << artifact.output;

  absl::StatusOr<Checkpoint> a = ReadCheckpoint(straight_file);
  absl::StatusOr<Checkpoint> b = ReadCheckpoint(resumed_file);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_FALSE(a->tensors.empty());
  EXPECT_EQ(a->tensors[0].name, "layers.0.weight");
  EXPECT_EQ(a->tensors[0].shape, (std::vector<int64_t>{128, 784}));
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    EXPECT_EQ(a->tensors[i].name, b->tensors[i].name);
    EXPECT_TRUE(a->tensors[i].values == b->tensors[i].values)
        << a->tensors[i].name << " differs after resume";
  }
  EXPECT_EQ(a->metadata.at("step"), b->metadata.at("step"));

  // -o naming a directory writes JOB_ID.safetensors in it, the same bytes.
  ASSERT_EQ(cluster.Cli("artifact " + interrupted->id() + " -o " + cluster.dir()).exit_code, 0);
  absl::StatusOr<Checkpoint> in_dir =
      ReadCheckpoint(cluster.dir() + "/" + interrupted->id() + ".safetensors");
  ASSERT_TRUE(in_dir.ok()) << in_dir.status();
  EXPECT_EQ(in_dir->tensors.size(), b->tensors.size());

  CommandResult missing = cluster.Cli("artifact j-999999 -o " + cluster.dir() + "/x");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("no job"), std::string::npos) << missing.output;
}

TEST(FaultsTest, ACheckpointEveryStepUploadsOnlyWholeNewerSnapshots) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1");
  // The trainer replaces its checkpoint file at every step, faster than uploads go: each upload
  // must send one whole file under its own step, and skip what the server already has.
  v1::JobSpec spec = SmallFashionMnistJob(2, 2000, 500);  // 16 steps per epoch
  spec.mutable_checkpoint()->set_every_steps(1);
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok());
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->checkpoint_step(), 32);
  EXPECT_EQ(done->checkpoint_epoch(), 2);
  int64_t last_stored = 0;
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    if (!absl::StartsWith(event.message(), "checkpoint stored: step ")) continue;
    int64_t step = 0;
    ASSERT_TRUE(absl::SimpleAtoi(event.message().substr(24, event.message().find(',') - 24), &step))
        << event.message();
    EXPECT_GT(step, last_stored) << "stored steps only move forward";
    last_stored = step;
  }
  EXPECT_EQ(last_stored, 32);
  std::ifstream log(cluster.dir() + "/w1.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("upload"), std::string::npos) << text;
  absl::StatusOr<Checkpoint> artifact =
      ReadCheckpoint(cluster.dir() + "/w1/" + job->id() + "-a1/checkpoint.safetensors");
  EXPECT_FALSE(artifact.ok()) << "the local copy goes once the server holds it";
}

TEST(FaultsTest, AWorkerShutdownCheckpointsMidEpochGivesTheJobBackAndResumeIsExact) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "2"});
  const pid_t first = cluster.StartWorker("w1");
  // No retries: a shutdown that counted as a failed attempt would fail the job.
  v1::JobSpec spec = SlowJob(2);
  spec.set_max_retries(0);
  spec.mutable_loader()->set_delay_ms(40);  // ~1.9 s per epoch: time to stop it mid-epoch

  absl::StatusOr<v1::Job> straight = cluster.Submit(spec);
  ASSERT_TRUE(straight.ok());
  absl::StatusOr<v1::Job> straight_done = cluster.WaitForFinal(straight->id(), absl::Seconds(60));
  ASSERT_TRUE(straight_done.ok());
  ASSERT_EQ(straight_done->state(), v1::JOB_STATE_SUCCEEDED) << straight_done->error();
  const std::string straight_file = cluster.dir() + "/straight.safetensors";
  ASSERT_EQ(cluster.Cli("artifact " + straight->id() + " -o " + straight_file).exit_code, 0);

  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok());
  absl::StatusOr<v1::Job> running = cluster.WaitForStep(job->id(), 10);
  ASSERT_TRUE(running.ok()) << running.status();
  cluster.KillWorker(first, SIGTERM);  // returns once w1 has exited

  // Given back, not failed: queued again with its attempt not counted, and a checkpoint at the
  // step the trainer had reached (past the last epoch-end one).
  absl::StatusOr<v1::Job> released = cluster.WaitFor(
      job->id(), [](const v1::Job& j) { return j.state() != v1::JOB_STATE_RUNNING; },
      absl::Seconds(10));
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->state(), v1::JOB_STATE_QUEUED) << released->error();
  EXPECT_EQ(released->released_attempts(), 1);
  EXPECT_NE(released->error().find("worker w1 shut down (not counted against max_retries)"),
            std::string::npos)
      << released->error();
  EXPECT_GE(released->checkpoint_step(), running->progress().step());
  bool saw_stop = false;
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    saw_stop =
        saw_stop || absl::StrContains(event.message(),
                                      absl::StrCat("stopped at step ", released->checkpoint_step(),
                                                   " for the worker's shutdown"));
  }
  EXPECT_TRUE(saw_stop);

  cluster.StartWorker("w2");
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(90));
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 2);
  bool saw_resume = false;
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    saw_resume =
        saw_resume ||
        (event.attempt() == 2 &&
         absl::StrContains(event.message(), absl::StrCat("resumed from the checkpoint at step ",
                                                         released->checkpoint_step())));
  }
  EXPECT_TRUE(saw_resume);

  // Resuming mid-epoch gives the same weights as the straight run.
  const std::string resumed_file = cluster.dir() + "/resumed.safetensors";
  ASSERT_EQ(cluster.Cli("artifact " + job->id() + " -o " + resumed_file).exit_code, 0);
  absl::StatusOr<Checkpoint> a = ReadCheckpoint(straight_file);
  absl::StatusOr<Checkpoint> b = ReadCheckpoint(resumed_file);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  ASSERT_FALSE(a->tensors.empty());
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    EXPECT_TRUE(a->tensors[i].values == b->tensors[i].values)
        << a->tensors[i].name << " differs after a mid-epoch resume";
  }
}

// Issue 12.3: with the checkpoint directory on a full file system the job used to end SUCCEEDED
// without its final weights (the artifact was an early checkpoint, or missing), and nothing said
// so. Now it waits, says why, and succeeds once the space is back and the worker's retry stores
// them.
TEST(FaultsTest, AFullServerDiskHoldsTheJobUntilItsFinalWeightsAreStored) {
  TestCluster cluster;
  const std::string checkpoints = cluster.dir() + "/server/checkpoints";
  std::filesystem::create_directories(checkpoints);
  // 256 KiB: smaller than one checkpoint of this job (~0.8 MB), so no upload fits.
  CommandResult mounted = RunCommand("mount -t tmpfs -o size=256k tmpfs " + checkpoints);
  const bool full_disk = mounted.exit_code == 0;
  if (!full_disk && geteuid() == 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs to fill the server's disk (root without "
                 << "CAP_SYS_ADMIN?): " << mounted.output;
  }
  // Without root: a checkpoint directory the server may not write into fails the same writes
  // (EACCES instead of ENOSPC), through the same path.
  if (!full_disk) std::filesystem::permissions(checkpoints, std::filesystem::perms(0555));
  const std::string write_error = full_disk ? "No space left on device" : "Permission denied";
  struct Unmount {
    std::string dir;
    bool mounted;
    ~Unmount() {
      if (mounted) RunCommand("umount -l " + dir);
    }
  } unmount{checkpoints, full_disk};
  cluster.StartServer({"--metrics-listen", "127.0.0.1:0"});
  cluster.StartWorker("w1");
  absl::StatusOr<v1::Job> job = cluster.Submit(SmallFashionMnistJob(2, 2000, 500));  // 32 steps
  ASSERT_TRUE(job.ok()) << job.status();

  // Trained to the end, it cannot finish: the server has no room for the final weights.
  absl::StatusOr<v1::Job> waiting = WaitForFinalWeightsOrEnd(cluster, job->id());
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  ASSERT_EQ(waiting->state(), v1::JOB_STATE_RUNNING)
      << "ended without its final weights stored (checkpoint step " << waiting->checkpoint_step()
      << ")";
  EXPECT_NE(waiting->waiting_reason().find(write_error), std::string::npos)
      << waiting->waiting_reason();
  EXPECT_NE(waiting->waiting_reason().find("the worker keeps the file and retries"),
            std::string::npos)
      << waiting->waiting_reason();
  absl::SleepFor(absl::Seconds(3));  // a retry or two later, still waiting
  absl::StatusOr<v1::Job> still = cluster.WaitFor(
      job->id(), [](const v1::Job&) { return true; }, absl::Seconds(5));
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(still->attempt(), 1);
  // Said in its history, in the server's log, and in its metrics.
  bool event_says_so = false;
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    event_says_so = event_says_so || absl::StrContains(event.message(),
                                                       "not stored: the server "
                                                       "cannot write checkpoints");
  }
  EXPECT_TRUE(event_says_so);
  const std::string server_log = ReadAll(cluster.dir() + "/server.log");
  EXPECT_NE(server_log.find("not stored: the server cannot write checkpoints to " + checkpoints +
                            ": " + write_error),
            std::string::npos)
      << server_log;
  EXPECT_GE(ServerMetric(cluster, "stoker_server_checkpoint_write_failures_total").value_or(0), 2);
  if (full_disk) {
    EXPECT_LT(ServerMetric(cluster, "stoker_server_checkpoint_dir_free_bytes").value_or(1e12),
              256 * 1024 + 1);
  }
  CommandResult status = cluster.Cli("--output json status " + job->id());
  EXPECT_NE(status.output.find("final weights (step 32) not stored"), std::string::npos)
      << status.output;

  // Room again: the worker's next retry stores the final weights and the job succeeds.
  if (full_disk) {
    CommandResult grown = RunCommand("mount -o remount,size=64m " + checkpoints);
    ASSERT_EQ(grown.exit_code, 0) << grown.output;
  } else {
    std::filesystem::permissions(checkpoints, std::filesystem::perms(0755));
  }
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 1);
  EXPECT_EQ(done->checkpoint_step(), 32);
  EXPECT_EQ(done->waiting_reason(), "");
  const std::string artifact_file = cluster.dir() + "/final.safetensors";
  CommandResult artifact = cluster.Cli("artifact " + job->id() + " -o " + artifact_file);
  ASSERT_EQ(artifact.exit_code, 0) << artifact.output;
  absl::StatusOr<Checkpoint> weights = ReadCheckpoint(artifact_file);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->metadata.at("step"), "32");
}

// A worker shutting down while the server cannot store its job's final weights gives the job
// back, uncounted, rather than leaving with them: it runs again once there is room.
TEST(FaultsTest, AWorkerShuttingDownWhileTheServerDiskIsFullGivesTheJobBack) {
  TestCluster cluster;
  const std::string checkpoints = cluster.dir() + "/server/checkpoints";
  std::filesystem::create_directories(checkpoints);
  CommandResult mounted = RunCommand("mount -t tmpfs -o size=256k tmpfs " + checkpoints);
  if (mounted.exit_code != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs to fill the server's disk (needs root): "
                 << mounted.output;
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { RunCommand("umount -l " + dir); }
  } unmount{checkpoints};
  cluster.StartServer();
  const pid_t first = cluster.StartWorker("w1");
  v1::JobSpec spec = SmallFashionMnistJob(2, 2000, 500);
  spec.set_max_retries(0);  // a counted attempt would fail the job
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::Job> waiting = WaitForFinalWeightsOrEnd(cluster, job->id());
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  ASSERT_EQ(waiting->state(), v1::JOB_STATE_RUNNING);

  cluster.KillWorker(first, SIGTERM);
  absl::StatusOr<v1::Job> released = cluster.WaitFor(
      job->id(), [](const v1::Job& j) { return j.state() != v1::JOB_STATE_RUNNING; },
      absl::Seconds(20));
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->state(), v1::JOB_STATE_QUEUED) << released->error();
  EXPECT_EQ(released->released_attempts(), 1);
  EXPECT_NE(released->error().find("shut down before the server could store the final weights"),
            std::string::npos)
      << released->error();
  EXPECT_EQ(released->waiting_reason().find("not stored"), std::string::npos)
      << released->waiting_reason();

  ASSERT_EQ(RunCommand("mount -o remount,size=64m " + checkpoints).exit_code, 0);
  cluster.StartWorker("w2");
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->checkpoint_step(), 32);
}

// The protocol rules behind issues 12.3 and 12.4, driven through the WorkerService by hand
// against a real server: instances fence a worker id, and success needs the final weights.
TEST(FaultsTest, TheServerFencesWorkerInstancesAndWantsTheFinalWeightsBeforeSuccess) {
  TestCluster cluster;
  cluster.StartServer();
  auto registered = [&](const std::string& instance, const std::string& previous) {
    grpc::ClientContext context;
    v1::RegisterWorkerRequest request;
    request.set_worker_id("hand");
    request.set_instance(instance);
    request.set_previous_instance(previous);
    v1::Device* cpu = request.add_devices();
    cpu->set_kind("cpu");
    cpu->set_name("test cpu");
    v1::RegisterWorkerResponse response;
    return cluster.workers().RegisterWorker(&context, request, &response);
  };
  auto heartbeat = [&](const std::string& instance, v1::HeartbeatResponse* response) {
    grpc::ClientContext context;
    v1::HeartbeatRequest request;
    request.set_worker_id("hand");
    request.set_instance(instance);
    request.set_free_slots(1);
    return cluster.workers().Heartbeat(&context, request, response);
  };
  ASSERT_TRUE(registered("a", "").ok());
  grpc::Status second = registered("b", "");
  EXPECT_EQ(second.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_NE(second.error_message().find("worker id hand is in use by a live worker"),
            std::string::npos)
      << second.error_message();
  EXPECT_NE(second.error_message().find("its lease expires in "), std::string::npos)
      << second.error_message();
  EXPECT_TRUE(registered("a", "").ok()) << "the same instance registers again";
  // Its successor, naming it, takes the id over at once; the old instance is then a stranger.
  ASSERT_TRUE(registered("b", "a").ok());
  v1::HeartbeatResponse beat;
  EXPECT_EQ(heartbeat("a", &beat).error_code(), grpc::StatusCode::NOT_FOUND);

  absl::StatusOr<v1::Job> job = cluster.Submit(SmallFashionMnistJob(1, 1000, 200));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(heartbeat("b", &beat).ok());
  ASSERT_EQ(beat.assignments_size(), 1);
  grpc::ClientContext context;
  v1::CompleteJobRequest complete;
  complete.set_worker_id("hand");
  complete.set_job_id(job->id());
  complete.set_attempt(beat.assignments(0).attempt());
  complete.set_state(v1::JOB_STATE_SUCCEEDED);
  complete.mutable_progress()->set_step(8);
  complete.mutable_progress()->set_total_steps(8);
  v1::CompleteJobResponse completed;
  grpc::Status refused = cluster.workers().CompleteJob(&context, complete, &completed);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("cannot succeed before the server stores its final "
                                         "weights (step 8); it holds none"),
            std::string::npos)
      << refused.error_message();
  absl::StatusOr<v1::Job> still = cluster.WaitFor(
      job->id(), [](const v1::Job&) { return true; }, absl::Seconds(5));
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->state(), v1::JOB_STATE_RUNNING);
}

// A worker killed (or its call cancelled) in the middle of a checkpoint upload: what reached the
// server is a prefix of the file, and it used to be stored as the job's checkpoint (its header,
// with the step, was intact), so every retry then failed to resume from it and the job failed.
// Now an upload is stored only whole: not when the call was cancelled, not when fewer bytes came
// than it announced, and not when its tensors do not fit the file.
TEST(FaultsTest, AnUploadCutShortIsNeverStored) {
  TestCluster cluster;
  cluster.StartServer();
  grpc::ClientContext register_context;
  v1::RegisterWorkerRequest request;
  request.set_worker_id("hand");
  request.set_instance("a");
  v1::Device* cpu = request.add_devices();
  cpu->set_kind("cpu");
  cpu->set_name("test cpu");
  v1::RegisterWorkerResponse registered;
  ASSERT_TRUE(cluster.workers().RegisterWorker(&register_context, request, &registered).ok());
  absl::StatusOr<v1::Job> job = cluster.Submit(SmallFashionMnistJob(1, 1000, 200));
  ASSERT_TRUE(job.ok()) << job.status();
  grpc::ClientContext beat_context;
  v1::HeartbeatRequest beat;
  beat.set_worker_id("hand");
  beat.set_instance("a");
  beat.set_free_slots(1);
  v1::HeartbeatResponse assigned;
  ASSERT_TRUE(cluster.workers().Heartbeat(&beat_context, beat, &assigned).ok());
  ASSERT_EQ(assigned.assignments_size(), 1);
  const int attempt = assigned.assignments(0).attempt();

  Checkpoint checkpoint{{{"w", {1 << 18}, std::vector<float>(1 << 18, 0.5f)}}, {{"step", "4"}}};
  const std::string file = cluster.dir() + "/upload.safetensors";
  ASSERT_TRUE(WriteCheckpoint(file, checkpoint).ok());
  const std::string bytes = ReadAll(file);
  ASSERT_GT(bytes.size(), 1u << 20);
  // Sends the first `send` bytes in 64 KiB chunks, the first announcing `total`; cancels the call
  // instead of finishing it when `cancel`.
  auto upload = [&](size_t send, int64_t total, bool cancel) {
    grpc::ClientContext context;
    v1::UploadCheckpointResponse response;
    auto writer = cluster.workers().UploadCheckpoint(&context, &response);
    for (size_t at = 0; at < send; at += 64 << 10) {
      v1::CheckpointChunk chunk;
      if (at == 0) {
        chunk.set_worker_id("hand");
        chunk.set_job_id(job->id());
        chunk.set_attempt(attempt);
        chunk.set_step(4);
        chunk.set_epoch(1);
        chunk.set_total_bytes(total);
      }
      chunk.set_data(bytes.substr(at, std::min<size_t>(64 << 10, send - at)));
      if (!writer->Write(chunk)) break;
    }
    if (cancel) {
      // Let the chunks reach the server before the call dies, as with a killed worker.
      absl::SleepFor(absl::Milliseconds(300));
      context.TryCancel();
    } else {
      writer->WritesDone();
    }
    return writer->Finish();
  };
  auto stored_step = [&]() -> int64_t {
    absl::StatusOr<v1::Job> now = cluster.WaitFor(
        job->id(), [](const v1::Job&) { return true; }, absl::Seconds(5));
    return now.ok() ? now->checkpoint_step() : -1;
  };
  auto uploads_left = [&] {
    int count = 0;
    std::error_code ignored;
    for (std::filesystem::directory_iterator it(cluster.dir() + "/server/checkpoints", ignored),
         end;
         !ignored && it != end; it.increment(ignored)) {
      count += absl::StrContains(it->path().filename().string(), ".upload-a") ? 1 : 0;
    }
    return count;
  };
  const size_t half = bytes.size() / 2;

  const std::string stored_path =
      cluster.dir() + "/server/checkpoints/" + job->id() + ".safetensors";
  EXPECT_FALSE(upload(half, static_cast<int64_t>(bytes.size()), /*cancel=*/true).ok());
  // The client's call ends at once; the server's handler sees the end of the stream later.
  for (absl::Time until = absl::Now() + absl::Seconds(10);
       uploads_left() > 0 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(uploads_left(), 0);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(std::filesystem::exists(stored_path)) << "a cancelled upload was stored";
  EXPECT_EQ(stored_step(), 0);

  grpc::Status short_of_total = upload(half, static_cast<int64_t>(bytes.size()), false);
  EXPECT_EQ(short_of_total.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_TRUE(absl::StrContains(short_of_total.error_message(), "incomplete"))
      << short_of_total.error_message();
  EXPECT_EQ(stored_step(), 0);

  // A sender that announces no size (an older worker): the tensors must still fit the file.
  grpc::Status unannounced = upload(half, 0, false);
  EXPECT_FALSE(unannounced.ok());
  EXPECT_TRUE(absl::StrContains(unannounced.error_message(), "do not match its shape or the file"))
      << unannounced.error_message();
  EXPECT_EQ(stored_step(), 0);
  EXPECT_EQ(uploads_left(), 0) << "refused uploads are removed";
  EXPECT_FALSE(std::filesystem::exists(stored_path));

  grpc::Status whole = upload(bytes.size(), static_cast<int64_t>(bytes.size()), false);
  ASSERT_TRUE(whole.ok()) << whole.error_message();
  EXPECT_EQ(stored_step(), 4);
  absl::StatusOr<Checkpoint> stored = ReadCheckpoint(stored_path);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->tensors[0].values, checkpoint.tensors[0].values);
}

}  // namespace
}  // namespace stoker::testing
