#include "worker/training_loop.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/job_region.h"
#include "data/loader.h"
#include "engine/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;

constexpr int kFeatures = 4;
constexpr int kBatchSize = 8;
constexpr int kSamples = 32;  // 4 batches per epoch
constexpr int kEpochs = 2;

// Two separable classes of 4 uint8 features: label 1 has bright samples.
LabeledSamples TinyData(uint8_t label_offset = 0) {
  LabeledSamples data;
  data.count = kSamples;
  data.features = kFeatures;
  data.sample_bytes = kFeatures;
  data.sample_dims = {kFeatures};
  for (int i = 0; i < kSamples; ++i) {
    const uint8_t label = i % 2;
    for (int f = 0; f < kFeatures; ++f) data.samples.push_back(label ? 200 + f : 20 + f);
    data.labels.push_back(label + label_offset);
  }
  data.classes = 2;
  return data;
}

// A job's region and one real loader (RunLoader on a thread of this process) filling its ring.
class Pipeline {
 public:
  explicit Pipeline(const LabeledSamples& data, uint64_t first_batch = 0) : data_(data) {
    RingGeometry geometry;
    geometry.slot_count = 4;
    geometry.batch_size = kBatchSize;
    geometry.sample_bytes = kFeatures;
    geometry.loader_count = 1;
    geometry.total_batches = kEpochs * kSamples / kBatchSize;
    absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(geometry);
    EXPECT_TRUE(region.ok()) << region.status();
    region_ = std::move(*region);
    if (first_batch > 0) region_->StartAt(first_batch);
    region_->SetConsumerPid(getpid());
  }
  ~Pipeline() {
    region_->RequestStop();
    if (loader_.joinable()) loader_.join();
  }
  void StartLoader() {
    loader_ = std::thread([this] {
      const absl::Status status = RunLoader(
          *region_, data_, LoaderOptions{.index = 0, .seed = 7, .delay_ms = 0, .augment = {}});
      EXPECT_TRUE(status.ok() || absl::IsCancelled(status)) << status;
    });
  }
  JobRegion& region() { return *region_; }

 private:
  const LabeledSamples& data_;
  std::unique_ptr<JobRegion> region_;
  std::thread loader_;
};

std::unique_ptr<Model> TinyModel() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  EXPECT_TRUE(backend.ok()) << backend.status();
  MlpConfig config;
  config.input_features = kFeatures;
  config.hidden = {8};
  config.classes = 2;
  config.max_batch = kBatchSize;
  absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateMlp(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

TrainingLoopOptions Options() {
  TrainingLoopOptions options;
  options.optimizer.set_lr(0.05);
  options.epochs = kEpochs;
  options.eval_batch_size = kBatchSize;
  return options;
}

// What the loop said and which checkpoints it asked for.
struct Recorder {
  std::vector<v1::JobEvent> events;
  std::vector<std::pair<uint64_t, int>> checkpoints;  // (step, epoch)
  absl::Status checkpoint_status;

  TrainingLoop::EventSink Sink() {
    return [this](const v1::JobEvent& event) { events.push_back(event); };
  }
  TrainingLoop::CheckpointWriter Writer() {
    return [this](uint64_t step, int epoch, double) {
      checkpoints.emplace_back(step, epoch);
      return checkpoint_status;
    };
  }
  std::vector<v1::JobEvent> OfType(v1::EventType type) const {
    std::vector<v1::JobEvent> found;
    for (const v1::JobEvent& event : events) {
      if (event.type() == type) found.push_back(event);
    }
    return found;
  }
};

// Most tests: the tiny data set, its pipeline (loader not started yet), a model and a recorder.
class TrainingLoopTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(model_, nullptr); }

  const LabeledSamples data_ = TinyData();
  Pipeline pipeline_{data_};
  std::unique_ptr<Model> model_ = TinyModel();
  Recorder recorder_;
};

TEST_F(TrainingLoopTest, TrainsEveryBatchThenEvaluatesReportsAndCheckpointsEachEpoch) {
  TrainingLoopOptions options = Options();
  options.report_interval = absl::ZeroDuration();  // a progress report after every step
  TrainingLoop loop(pipeline_.region(), *model_, View(data_), options, recorder_.Sink(),
                    recorder_.Writer());
  pipeline_.StartLoader();
  ASSERT_TRUE(loop.Run().ok());

  const JobStats& stats = pipeline_.region().stats();
  EXPECT_EQ(stats.steps_total.load(), 8u);
  EXPECT_EQ(stats.samples_total.load(), 64u);
  EXPECT_EQ(stats.consumer_next_batch.load(), 8u) << "every batch released";
  EXPECT_EQ(stats.epoch.load(), 2u);
  EXPECT_GE(stats.heartbeats_total.load(), 8u);
  EXPECT_THAT(recorder_.checkpoints, ElementsAre(Pair(4, 1), Pair(8, 2)));

  std::vector<v1::EventType> types;
  for (const v1::JobEvent& event : recorder_.events) types.push_back(event.type());
  const v1::EventType P = v1::EVENT_TYPE_PROGRESS, E = v1::EVENT_TYPE_EPOCH,
                      C = v1::EVENT_TYPE_CHECKPOINT;
  EXPECT_THAT(types, ElementsAre(P, P, P, E, C, P, P, P, E, C));
  const std::vector<v1::JobEvent> epochs = recorder_.OfType(E);
  ASSERT_EQ(epochs.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const v1::TrainingProgress& p = epochs[i].progress();
    EXPECT_EQ(p.epoch(), i + 1);
    EXPECT_EQ(p.epochs(), kEpochs);
    EXPECT_EQ(p.step(), 4 * (i + 1));
    EXPECT_EQ(p.total_steps(), 8);
    EXPECT_GT(p.loss(), 0);
    EXPECT_GE(p.test_accuracy(), 0);
    EXPECT_LE(p.test_accuracy(), 1);
    EXPECT_GT(p.test_loss(), 0);
  }
  EXPECT_EQ(epochs[1].progress().test_accuracy(), 1.0) << "two bright/dark classes are learnt";
  const std::vector<v1::JobEvent> progress = recorder_.OfType(P);
  EXPECT_EQ(progress[0].progress().step(), 1);
  EXPECT_EQ(progress[0].progress().test_accuracy(), -1) << "nothing evaluated yet";
  EXPECT_EQ(progress[3].progress().test_accuracy(), epochs[0].progress().test_accuracy());
  const std::vector<v1::JobEvent> checkpoints = recorder_.OfType(C);
  EXPECT_EQ(checkpoints[1].progress().step(), 8);
  EXPECT_EQ(checkpoints[1].progress().epoch(), 2);
}

TEST_F(TrainingLoopTest, CheckpointsEveryNStepsBetweenEpochEnds) {
  TrainingLoopOptions options = Options();
  options.checkpoint_every_steps = 3;
  options.report_interval = absl::InfiniteDuration();
  TrainingLoop loop(pipeline_.region(), *model_, View(data_), options, recorder_.Sink(),
                    recorder_.Writer());
  pipeline_.StartLoader();
  ASSERT_TRUE(loop.Run().ok());
  EXPECT_THAT(recorder_.checkpoints, ElementsAre(Pair(3, 1), Pair(4, 1), Pair(6, 2), Pair(8, 2)));
  EXPECT_EQ(recorder_.OfType(v1::EVENT_TYPE_CHECKPOINT).size(), 4u);
  EXPECT_TRUE(recorder_.OfType(v1::EVENT_TYPE_PROGRESS).empty());
}

TEST_F(TrainingLoopTest, WithoutAWriterCheckpointsAreNeitherWrittenNorReported) {
  TrainingLoop loop(pipeline_.region(), *model_, View(data_), Options(), recorder_.Sink(), nullptr);
  pipeline_.StartLoader();
  ASSERT_TRUE(loop.Run().ok());
  EXPECT_EQ(recorder_.OfType(v1::EVENT_TYPE_EPOCH).size(), 2u);
  EXPECT_TRUE(recorder_.OfType(v1::EVENT_TYPE_CHECKPOINT).empty());
}

TEST_F(TrainingLoopTest, ACheckpointAndStopRequestKeepsTheStepReachedAndStops) {
  TrainingLoop loop(pipeline_.region(), *model_, View(data_), Options(), recorder_.Sink(),
                    recorder_.Writer());
  pipeline_.region().RequestCheckpointAndStop();  // seen after the first step
  pipeline_.StartLoader();
  const absl::Status status = loop.Run();
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  EXPECT_EQ(pipeline_.region().stats().steps_total.load(), 1u);
  EXPECT_THAT(recorder_.checkpoints, ElementsAre(Pair(1, 1)));
  const std::vector<v1::JobEvent> logs = recorder_.OfType(v1::EVENT_TYPE_LOG);
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_EQ(logs[0].message(), "stopped at step 1 for the worker's shutdown");
}

TEST_F(TrainingLoopTest, ACheckpointAndStopRequestWhileWaitingForABatchStopsThere) {
  const LabeledSamples data = TinyData();
  Pipeline pipeline(data);  // no loader: batch 0 never comes
  std::unique_ptr<Model> model = TinyModel();
  ASSERT_NE(model, nullptr);
  Recorder recorder;
  TrainingLoop loop(pipeline.region(), *model, View(data), Options(), recorder.Sink(),
                    recorder.Writer());
  pipeline.region().RequestCheckpointAndStop();
  const absl::Status status = loop.Run();  // looks for the request after a second's wait
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  EXPECT_TRUE(recorder.checkpoints.empty()) << "nothing trained, nothing to keep";
  ASSERT_EQ(recorder.OfType(v1::EVENT_TYPE_LOG).size(), 1u);
  EXPECT_EQ(recorder.OfType(v1::EVENT_TYPE_LOG)[0].message(),
            "stopped at step 0 for the worker's shutdown");
}

TEST_F(TrainingLoopTest, AStopEndsTheWaitWithoutACheckpoint) {
  TrainingLoop loop(pipeline_.region(), *model_, View(data_), Options(), recorder_.Sink(),
                    recorder_.Writer());
  pipeline_.region().RequestStop();
  const absl::Status status = loop.Run();
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  EXPECT_TRUE(recorder_.checkpoints.empty());
  EXPECT_TRUE(recorder_.events.empty());
}

TEST_F(TrainingLoopTest, AResumedRunTrainsFromItsStep) {
  const LabeledSamples data = TinyData();
  Pipeline pipeline(data, /*first_batch=*/4);
  std::unique_ptr<Model> model = TinyModel();
  ASSERT_NE(model, nullptr);
  Recorder recorder;
  TrainingLoopOptions options = Options();
  options.first_batch = 4;
  options.test_accuracy = 0.5;
  options.report_interval = absl::ZeroDuration();
  TrainingLoop loop(pipeline.region(), *model, View(data), options, recorder.Sink(),
                    recorder.Writer());
  pipeline.StartLoader();
  ASSERT_TRUE(loop.Run().ok());
  EXPECT_EQ(pipeline.region().stats().steps_total.load(), 4u);
  EXPECT_THAT(recorder.checkpoints, ElementsAre(Pair(8, 2)));
  const std::vector<v1::JobEvent> progress = recorder.OfType(v1::EVENT_TYPE_PROGRESS);
  ASSERT_EQ(progress.size(), 3u);
  EXPECT_EQ(progress[0].progress().step(), 5);
  EXPECT_EQ(progress[0].progress().epoch(), 2);
  EXPECT_EQ(progress[0].progress().test_accuracy(), 0.5) << "the checkpoint's, until evaluated";
  ASSERT_EQ(recorder.OfType(v1::EVENT_TYPE_EPOCH).size(), 1u);
}

TEST_F(TrainingLoopTest, ACheckpointThatCannotBeWrittenFailsTheAttempt) {
  recorder_.checkpoint_status = absl::ResourceExhaustedError("disk full");
  TrainingLoop loop(pipeline_.region(), *model_, View(data_), Options(), recorder_.Sink(),
                    recorder_.Writer());
  pipeline_.StartLoader();
  const absl::Status status = loop.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << "a retry may help";
  EXPECT_EQ(status.message(), "checkpoint: disk full");
  EXPECT_EQ(pipeline_.region().stats().steps_total.load(), 4u);
  EXPECT_EQ(recorder_.OfType(v1::EVENT_TYPE_EPOCH).size(), 1u);
  EXPECT_TRUE(recorder_.OfType(v1::EVENT_TYPE_CHECKPOINT).empty());
}

TEST_F(TrainingLoopTest, ABatchTheModelRefusesIsBadInput) {
  const LabeledSamples data = TinyData(/*label_offset=*/5);  // labels 5 and 6 of 2 classes
  Pipeline pipeline(data);
  std::unique_ptr<Model> model = TinyModel();
  ASSERT_NE(model, nullptr);
  Recorder recorder;
  TrainingLoop loop(pipeline.region(), *model, View(data), Options(), recorder.Sink(),
                    recorder.Writer());
  pipeline.StartLoader();
  const absl::Status status = loop.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith("batch 0: "));
  EXPECT_TRUE(recorder.checkpoints.empty());
}

TEST_F(TrainingLoopTest, ADivergedLossIsBadInputNamingTheStep) {
  TrainingLoopOptions options = Options();
  options.optimizer.set_lr(1e38);  // the first step's weights overflow the next step's logits
  TrainingLoop loop(pipeline_.region(), *model_, View(data_), options, recorder_.Sink(),
                    recorder_.Writer());
  pipeline_.StartLoader();
  const absl::Status status = loop.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("the loss diverged ("));
  EXPECT_THAT(std::string(status.message()), HasSubstr(") at step 2; lower train.optimizer.lr"));
}

TEST(LearningRateAtTest, WarmsUpLinearlyThenFollowsTheSchedule) {
  v1::OptimizerSpec optimizer;
  optimizer.set_lr(0.1);
  optimizer.set_warmup_steps(4);
  EXPECT_DOUBLE_EQ(LearningRateAt(optimizer, 0, 100), 0.025);
  EXPECT_DOUBLE_EQ(LearningRateAt(optimizer, 3, 100), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(optimizer, 50, 100), 0.1) << "constant without a schedule";
  optimizer.set_lr_schedule("cosine");
  EXPECT_DOUBLE_EQ(LearningRateAt(optimizer, 4, 104), 0.1);
  EXPECT_NEAR(LearningRateAt(optimizer, 54, 104), 0.05, 1e-12);
  EXPECT_NEAR(LearningRateAt(optimizer, 104, 104), 0.0, 1e-12);
}

}  // namespace
}  // namespace stoker
