// Exact resume of a BatchNorm network after kill -9 (issue 15), through a real server and worker:
// a small ResNet (the resnet preset, depth 20 at width 4: BatchNorm everywhere, identity and
// projection shortcuts, global average pooling) on a Fashion-MNIST subset. Its trainer is killed
// with SIGKILL mid-epoch, steps after a mid-epoch checkpoint; the next attempt resumes from that
// checkpoint and its final weights, BatchNorm's running statistics and num_batches_tracked
// included, equal an uninterrupted run's bit for bit. Steps the killed trainer took past the
// checkpoint must leave no trace (their running-statistics updates are redone once, not twice).
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint.h"
#include "gtest/gtest.h"
#include "spec/job_file.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

// 600 samples in batches of 32: 19 steps an epoch (the last of 24 samples), a checkpoint every 4
// steps, ~250 ms a batch from one delayed loader so the test can act between two checkpoints
// (progress reaches the server about once a second: at 60 ms a batch an epoch could end unseen).
const std::string kJob = absl::StrCat("name: bn-resume\n", kFashionMnistDatasetYaml,
                                      R"(  format: idx
  train_limit: 600
  test_limit: 200
  classes: 10
model: {type: resnet, depth: 20, width: 4}
train:
  epochs: 2
  batch_size: 32
  precision: bf16
  seed: 3
  label_smoothing: 0.1
  optimizer: {type: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.0005,
              lr_schedule: cosine, warmup_steps: 5}
loader: {processes: 1, delay_ms: 250, augment: {crop_padding: 2, horizontal_flip: true}}
checkpoint: {every_steps: 4}
max_retries: 2
)");

v1::JobSpec ResnetJob() {
  absl::StatusOr<JobFile> file = ParseJobYaml(kJob, "bn-resume.yaml");
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? file->spec : v1::JobSpec();
}

TEST(BatchNormResumeTest, TrainerKilledMidEpochResumesToTheSameWeightsAndRunningStatistics) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1");

  absl::StatusOr<v1::Job> straight = cluster.Submit(ResnetJob());
  ASSERT_TRUE(straight.ok()) << straight.status();
  absl::StatusOr<v1::Job> straight_done = cluster.WaitForFinal(straight->id(), absl::Seconds(120));
  ASSERT_TRUE(straight_done.ok()) << straight_done.status();
  ASSERT_EQ(straight_done->state(), v1::JOB_STATE_SUCCEEDED) << straight_done->error();
  EXPECT_EQ(straight_done->attempt(), 1);
  const std::string straight_file = cluster.dir() + "/straight.safetensors";
  CommandResult artifact = cluster.Cli("artifact " + straight->id() + " -o " + straight_file);
  ASSERT_EQ(artifact.exit_code, 0) << artifact.output;

  absl::StatusOr<v1::Job> job = cluster.Submit(ResnetJob());
  ASSERT_TRUE(job.ok()) << job.status();
  // A checkpoint inside the first epoch (step 4 or 8 of 19) stored on the server, then two more
  // steps, so the trainer dies with work past the checkpoint.
  absl::StatusOr<v1::Job> checkpointed = cluster.WaitFor(
      job->id(), [](const v1::Job& j) { return j.checkpoint_step() >= 4; }, absl::Seconds(60));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  const int64_t checkpoint_step = checkpointed->checkpoint_step();
  absl::StatusOr<v1::Job> past = cluster.WaitForStep(job->id(), checkpoint_step + 2);
  ASSERT_TRUE(past.ok()) << past.status();
  ASSERT_EQ(past->state(), v1::JOB_STATE_RUNNING);
  ASSERT_LT(past->progress().step(), 19) << "the first epoch ended before the kill";
  ASSERT_LT(checkpoint_step, 19);
  std::vector<pid_t> trainers = FindProcesses({"stoker-trainer", cluster.dir(), job->id()});
  ASSERT_EQ(trainers.size(), 1u);
  ASSERT_EQ(kill(trainers[0], SIGKILL), 0);

  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 2);

  // Attempt 1 failed with the signal; attempt 2 resumed from a mid-epoch checkpoint at or after
  // the one seen stored, before the step the trainer had reached.
  bool saw_kill = false;
  int64_t resumed_step = -1;
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    saw_kill = saw_kill || absl::StrContains(event.message(), "trainer killed by signal 9");
    const std::string kResumed = "resumed from the checkpoint at step ";
    const size_t at = event.message().find(kResumed);
    if (event.attempt() == 2 && at != std::string::npos) {
      resumed_step = std::stoll(event.message().substr(at + kResumed.size()));
    }
  }
  EXPECT_TRUE(saw_kill);
  EXPECT_GE(resumed_step, checkpoint_step);
  EXPECT_LT(resumed_step, 19) << "not a mid-epoch checkpoint";
  EXPECT_NE(resumed_step % 19, 0);

  const std::string resumed_file = cluster.dir() + "/resumed.safetensors";
  artifact = cluster.Cli("artifact " + job->id() + " -o " + resumed_file);
  ASSERT_EQ(artifact.exit_code, 0) << artifact.output;
  absl::StatusOr<Checkpoint> a = ReadCheckpoint(straight_file);
  absl::StatusOr<Checkpoint> b = ReadCheckpoint(resumed_file);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  int running_statistics = 0;
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    ASSERT_EQ(a->tensors[i].name, b->tensors[i].name);
    EXPECT_TRUE(a->tensors[i].values == b->tensors[i].values)
        << a->tensors[i].name << " differs after the resume";
    if (absl::EndsWith(a->tensors[i].name, ".running_var")) ++running_statistics;
    if (absl::EndsWith(a->tensors[i].name, ".num_batches_tracked")) {
      // Every training step counted once: 2 epochs of 19 steps.
      EXPECT_EQ(b->tensors[i].values, std::vector<float>{38.0f}) << a->tensors[i].name;
    }
  }
  EXPECT_EQ(running_statistics, 21);  // 19 in the blocks and stem, 2 in the projections
  EXPECT_EQ(a->metadata.at("step"), b->metadata.at("step"));
}

// A training set whose size leaves one sample in the epoch's last batch (97 = 3 x 32 + 1): that
// batch would give every BatchNorm one value per channel, which TrainStep refuses as PyTorch
// does. The job drops it, says so once, and succeeds; the dropped steps train nothing.
TEST(BatchNormResumeTest, ALastBatchOfOneSampleIsDroppedNotFatal) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1");
  // A BatchNorm1d after a linear layer: one value per channel for a batch of one sample (the
  // ResNet's BatchNorm2d layers see 7x7 planes at least, and take any batch).
  std::string text = kJob;
  text.replace(text.find("model: {type: resnet, depth: 20, width: 4}"),
               std::string("model: {type: resnet, depth: 20, width: 4}").size(),
               "model:\n  type: cnn\n  layers:\n    - {type: flatten}\n"
               "    - {type: linear, units: 32, bias: false}\n    - {type: batchnorm1d}\n"
               "    - {type: relu}\n    - {type: linear, units: 10}");
  absl::StatusOr<JobFile> parsed = ParseJobYaml(text, "bn-last-batch.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  v1::JobSpec spec = parsed->spec;
  spec.set_name("bn-last-batch-of-one");
  spec.mutable_dataset()->set_train_limit(97);
  spec.mutable_loader()->set_delay_ms(0);
  absl::StatusOr<v1::Job> done = cluster.RunJob(spec, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 1);
  int dropped_lines = 0;
  for (const v1::JobEvent& event : cluster.History(done->id())) {
    if (absl::StrContains(event.message(), "a training batch of 1 sample is dropped")) {
      ++dropped_lines;
    }
  }
  EXPECT_EQ(dropped_lines, 1) << "logged once";
  const std::string file = cluster.dir() + "/dropped.safetensors";
  CommandResult artifact = cluster.Cli("artifact " + done->id() + " -o " + file);
  ASSERT_EQ(artifact.exit_code, 0) << artifact.output;
  absl::StatusOr<Checkpoint> weights = ReadCheckpoint(file);
  ASSERT_TRUE(weights.ok()) << weights.status();
  int counted = 0;
  for (const CheckpointTensor& tensor : weights->tensors) {
    if (!absl::EndsWith(tensor.name, ".num_batches_tracked")) continue;
    // 2 epochs of 4 batches, the last of each dropped.
    EXPECT_EQ(tensor.values, std::vector<float>{6.0f}) << tensor.name;
    ++counted;
  }
  EXPECT_EQ(counted, 1);
}

}  // namespace
}  // namespace stoker::testing
