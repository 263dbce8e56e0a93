#include "worker/training_loop.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective.h"
#include "data/dataset.h"
#include "data/job_region.h"
#include "data/loader.h"
#include "engine/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/job_runner.h"

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

std::unique_ptr<Model> TinyModel(int max_batch = kBatchSize) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  EXPECT_TRUE(backend.ok()) << backend.status();
  MlpConfig config;
  config.input_features = kFeatures;
  config.hidden = {8};
  config.classes = 2;
  config.max_batch = max_batch;
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

TEST_F(TrainingLoopTest, APreemptedAttemptSaysSoWhenItStops) {
  TrainingLoop loop(pipeline_.region(), *model_, View(data_), Options(), recorder_.Sink(),
                    recorder_.Writer());
  pipeline_.region().RequestCheckpointAndStop(JobRegion::StopReason::kPreempted);
  pipeline_.StartLoader();
  EXPECT_TRUE(absl::IsCancelled(loop.Run()));
  EXPECT_THAT(recorder_.checkpoints, ElementsAre(Pair(1, 1)));
  const std::vector<v1::JobEvent> logs = recorder_.OfType(v1::EVENT_TYPE_LOG);
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_EQ(logs[0].message(), "stopped at step 1 to give the devices back (preempted)");
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

// Runs a fresh model resumed at `first_batch` from a checkpoint whose test accuracy was
// `checkpoint_accuracy`, recording into `recorder`; the loop's status and the steps it took.
struct ResumedRun {
  absl::Status status;
  uint64_t steps = 0;
};
ResumedRun RunResumed(uint64_t first_batch, double checkpoint_accuracy,
                      absl::Duration report_interval, Recorder& recorder) {
  const LabeledSamples data = TinyData();
  Pipeline pipeline(data, first_batch);
  std::unique_ptr<Model> model = TinyModel();
  if (model == nullptr) return {absl::InternalError("no model"), 0};
  TrainingLoopOptions options = Options();
  options.first_batch = first_batch;
  options.test_accuracy = checkpoint_accuracy;
  options.report_interval = report_interval;
  TrainingLoop loop(pipeline.region(), *model, View(data), options, recorder.Sink(),
                    recorder.Writer());
  pipeline.StartLoader();
  const absl::Status status = loop.Run();
  return {status, pipeline.region().stats().steps_total.load()};
}

TEST_F(TrainingLoopTest, AResumedRunTrainsFromItsStep) {
  Recorder recorder;
  const ResumedRun run = RunResumed(4, 0.5, absl::ZeroDuration(), recorder);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.steps, 4u);
  EXPECT_THAT(recorder.checkpoints, ElementsAre(Pair(8, 2)));
  const std::vector<v1::JobEvent> progress = recorder.OfType(v1::EVENT_TYPE_PROGRESS);
  ASSERT_EQ(progress.size(), 3u);
  EXPECT_EQ(progress[0].progress().step(), 5);
  EXPECT_EQ(progress[0].progress().epoch(), 2);
  EXPECT_EQ(progress[0].progress().test_accuracy(), 0.5) << "the checkpoint's, until evaluated";
  ASSERT_EQ(recorder.OfType(v1::EVENT_TYPE_EPOCH).size(), 1u);
}

// A trainer killed after its last checkpoint but before it reported success resumes at the
// last step: nothing is left to train, and the attempt ends as one that finished.
TEST_F(TrainingLoopTest, AResumeAtTheLastStepFinishesWithoutTraining) {
  Recorder recorder;
  const ResumedRun run = RunResumed(8, 0.123, Options().report_interval, recorder);
  EXPECT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.steps, 0u);
  // The last epoch's end again: evaluated, reported and checkpointed at the last step.
  const std::vector<v1::JobEvent> epochs = recorder.OfType(v1::EVENT_TYPE_EPOCH);
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_EQ(epochs[0].progress().step(), 8);
  EXPECT_EQ(epochs[0].progress().epoch(), kEpochs);
  EXPECT_GE(epochs[0].progress().test_accuracy(), 0);
  EXPECT_NE(epochs[0].progress().test_accuracy(), 0.123) << "evaluated, not the checkpoint's";
  EXPECT_THAT(recorder.checkpoints, ElementsAre(Pair(8, kEpochs)));
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

// ---------------------------------------------------------------------------------------------
// Data-parallel ranks: threads of this process, each with its own region, real loader, model,
// Gloo collective over loopback (through an in-process store) and bucketed reducer.

constexpr int kRanks = 2;
constexpr int kRankSamples = 40;  // global batches of 16: 16, 16, 8 (rank 1's last slice empty)

// Two classes that brightness mostly decides; every 5th label is flipped, so no model is
// perfect and evaluation's accuracy depends on the weights.
LabeledSamples NoisyData(int count) {
  LabeledSamples data;
  data.count = count;
  data.features = kFeatures;
  data.sample_bytes = kFeatures;
  data.sample_dims = {kFeatures};
  for (int i = 0; i < count; ++i) {
    const uint8_t bright = (i * 7 % 3) != 0;
    for (int f = 0; f < kFeatures; ++f) {
      data.samples.push_back(static_cast<uint8_t>(bright ? 150 + 9 * f + i : 90 - 7 * f + i));
    }
    data.labels.push_back(i % 5 == 4 ? 1 - bright : bright);
  }
  data.classes = 2;
  return data;
}

// One rank's region (its slices of the global batches, batch_size samples a slot) and loader.
class RankPipeline {
 public:
  RankPipeline(const LabeledSamples& data, uint32_t batch_size, uint32_t rank, uint32_t replicas,
               int delay_ms = 0)
      : data_(data), rank_(rank), replicas_(replicas), delay_ms_(delay_ms) {
    RingGeometry geometry;
    geometry.slot_count = 4;
    geometry.batch_size = batch_size;
    geometry.sample_bytes = kFeatures;
    geometry.loader_count = 1;
    geometry.total_batches = RankTotalBatches(data.count, batch_size, replicas, kEpochs);
    absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(geometry);
    EXPECT_TRUE(region.ok()) << region.status();
    region_ = std::move(*region);
    region_->SetConsumerPid(getpid());
    loader_ = std::thread([this] {
      LoaderOptions options{.index = 0, .seed = 7, .delay_ms = delay_ms_, .augment = {}};
      options.rank = rank_;
      options.replicas = replicas_;
      const absl::Status status = RunLoader(*region_, data_, options);
      EXPECT_TRUE(status.ok() || absl::IsCancelled(status)) << status;
    });
  }
  ~RankPipeline() {
    region_->RequestStop();
    if (loader_.joinable()) loader_.join();
  }
  JobRegion& region() { return *region_; }

 private:
  const LabeledSamples& data_;
  const uint32_t rank_, replicas_;
  const int delay_ms_;
  std::unique_ptr<JobRegion> region_;
  std::thread loader_;
};

struct RankRun {
  absl::Status status;
  std::vector<NamedTensor> weights;
  Recorder recorder;
  uint64_t steps = 0, samples = 0, allreduce_calls = 0, allreduce_bytes = 0;
  uint64_t empty_slices = 0;  // batches the loader published empty
};

// Counts the empty batches a region hands out (a rank whose slice of a global batch is empty).
uint64_t EmptyBatches(const LabeledSamples& data, uint32_t batch_size, uint32_t rank,
                      uint32_t replicas) {
  uint64_t empty = 0;
  const int64_t per_epoch = BatchesPerEpoch(data.count, int64_t{batch_size} * replicas);
  for (int64_t b = 0; b < per_epoch; ++b) {
    const RankSlice slice = SliceOfRank(data.count, batch_size, rank, replicas, b);
    empty += slice.first == slice.end ? 1 : 0;
  }
  return empty * kEpochs;
}

// Trains `kRanks` ranks on `data`, each on a thread; `before_run(rank, region)` runs before the
// rank's loop starts.
std::vector<RankRun> TrainRanks(const LabeledSamples& data, const LabeledSamples& test,
                                const std::function<void(int, JobRegion&)>& before_run = nullptr,
                                int delay_ms = 0) {
  std::vector<RankRun> runs(kRanks);
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      RankRun& run = runs[rank];
      RankPipeline pipeline(data, kBatchSize, rank, kRanks, delay_ms);
      std::unique_ptr<Model> model = TinyModel();
      ASSERT_NE(model, nullptr);
      absl::StatusOr<std::unique_ptr<Collective>> collective =
          ConnectGloo({.rank = rank,
                       .size = kRanks,
                       .host = "127.0.0.1",
                       .store_prefix = "t/a1/",
                       .timeout = absl::Seconds(30)},
                      *store);
      ASSERT_TRUE(collective.ok()) << collective.status();
      std::unique_ptr<BucketedReducer> reducer = CreateBucketedReducer(
          **collective, {.bucket_bytes = 64, .global_batch = kRanks * kBatchSize});
      ASSERT_TRUE(model->SetGradientReducer(reducer.get()).ok());
      TrainingLoopOptions options = Options();
      options.report_interval = absl::InfiniteDuration();
      options.data_parallel = DataParallelContext{
          .reducer = reducer.get(), .collective = collective->get(), .train_samples = data.count};
      if (before_run) before_run(rank, pipeline.region());
      TrainingLoop loop(pipeline.region(), *model, View(test), options, run.recorder.Sink(),
                        rank == 0 ? run.recorder.Writer() : nullptr);
      run.status = loop.Run();
      run.weights = model->Parameters();
      const JobStats& stats = pipeline.region().stats();
      run.steps = stats.steps_total.load();
      run.samples = stats.samples_total.load();
      run.allreduce_calls = stats.allreduce_calls_total.load();
      run.allreduce_bytes = stats.allreduce_bytes_total.load();
      run.empty_slices = EmptyBatches(data, kBatchSize, rank, kRanks);
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

std::pair<int64_t, int64_t> Share(int64_t first, int64_t end) { return {first, end}; }

TEST(EvaluationShareTest, ContiguousSharesCoverTheTestSetOnce) {
  EXPECT_EQ(EvaluationShare(37, 0, 1), Share(0, 37));
  EXPECT_EQ(EvaluationShare(37, 0, 2), Share(0, 18));
  EXPECT_EQ(EvaluationShare(37, 1, 2), Share(18, 37));
  EXPECT_EQ(EvaluationShare(2, 2, 3), Share(1, 2));
  EXPECT_EQ(EvaluationShare(0, 1, 4), Share(0, 0));
}

TEST(DataParallelTrainingLoopTest, RanksEndWithTheSameWeightsAndTheGlobalAccuracy) {
  const LabeledSamples data = NoisyData(kRankSamples);
  const LabeledSamples test = NoisyData(37);  // shares of 18 and 19 samples
  std::vector<RankRun> runs = TrainRanks(data, test);
  for (const RankRun& run : runs) ASSERT_TRUE(run.status.ok()) << run.status;

  // Every rank took every step of the global batches (3 an epoch), rank 1's empty last slice
  // included (TrainStepWithoutSamples), and summed its gradients each step.
  EXPECT_EQ(runs[1].empty_slices, 2u) << "the test must give rank 1 empty slices";
  for (const RankRun& run : runs) {
    EXPECT_EQ(run.steps, 6u);
    EXPECT_GE(run.allreduce_calls, 6u);
    EXPECT_GT(run.allreduce_bytes, 0u);
  }
  EXPECT_EQ(runs[0].samples + runs[1].samples, 2u * kRankSamples) << "disjoint slices, all data";
  EXPECT_EQ(runs[1].samples, 2u * 16u) << "rank 1 had 8 of each of the first two global batches";

  ASSERT_EQ(runs[0].weights.size(), runs[1].weights.size());
  for (size_t i = 0; i < runs[0].weights.size(); ++i) {
    EXPECT_EQ(runs[0].weights[i].name, runs[1].weights[i].name);
    EXPECT_EQ(runs[0].weights[i].values, runs[1].weights[i].values)
        << runs[0].weights[i].name << " differs between the ranks";
  }

  // Evaluation: each rank's EPOCH events carry the same (global) accuracy...
  const std::vector<v1::JobEvent> e0 = runs[0].recorder.OfType(v1::EVENT_TYPE_EPOCH);
  const std::vector<v1::JobEvent> e1 = runs[1].recorder.OfType(v1::EVENT_TYPE_EPOCH);
  ASSERT_EQ(e0.size(), 2u);
  ASSERT_EQ(e1.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(e0[i].progress().test_accuracy(), e1[i].progress().test_accuracy());
    EXPECT_EQ(e0[i].progress().test_loss(), e1[i].progress().test_loss());
  }
  // ... which is the whole test set's, evaluated by one model alone.
  std::unique_ptr<Model> alone = TinyModel(64);
  ASSERT_NE(alone, nullptr);
  ASSERT_TRUE(alone->SetParameters(runs[0].weights).ok());
  absl::StatusOr<EvalResult> whole =
      alone->Evaluate(MakeBatchView(test.samples.data(), test.labels.data(), 37, test.sample_type));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(e0[1].progress().test_accuracy(), double(whole->correct) / whole->count);
  EXPECT_NEAR(e0[1].progress().test_loss(), whole->loss_sum / whole->count, 1e-6);
  EXPECT_GT(whole->correct, 0);
  EXPECT_LT(whole->correct, 37) << "a noisy test set: the accuracy says something";

  // Only rank 0 writes checkpoints (and reports them).
  EXPECT_THAT(runs[0].recorder.checkpoints, ElementsAre(Pair(3, 1), Pair(6, 2)));
  EXPECT_TRUE(runs[1].recorder.OfType(v1::EVENT_TYPE_CHECKPOINT).empty());
}

TEST(DataParallelTrainingLoopTest, TwoRanksFollowOneRankWithTheGlobalBatch) {
  const LabeledSamples data = NoisyData(kRankSamples);
  const LabeledSamples test = NoisyData(37);
  std::vector<RankRun> runs = TrainRanks(data, test);
  ASSERT_TRUE(runs[0].status.ok()) << runs[0].status;

  // One rank, batch 16: the same global batches in the same order (the loader's stream depends
  // on the seed, not on the ranks).
  RankPipeline pipeline(data, kRanks * kBatchSize, 0, 1);
  std::unique_ptr<Model> model = TinyModel(kRanks * kBatchSize);
  ASSERT_NE(model, nullptr);
  Recorder recorder;
  TrainingLoop loop(pipeline.region(), *model, View(test), Options(), recorder.Sink(), nullptr);
  ASSERT_TRUE(loop.Run().ok());
  const std::vector<NamedTensor> alone = model->Parameters();
  ASSERT_EQ(alone.size(), runs[0].weights.size());
  // Summed per-rank means scaled by their shares equal the global mean up to float rounding.
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(alone[i].values.size(), runs[0].weights[i].values.size());
    for (size_t j = 0; j < alone[i].values.size(); ++j) {
      EXPECT_NEAR(alone[i].values[j], runs[0].weights[i].values[j], 1e-5)
          << alone[i].name << "[" << j << "]";
    }
  }
}

TEST(DataParallelTrainingLoopTest, AStopRequestOnOneRankStopsEveryRankAtTheSameStep) {
  const LabeledSamples data = NoisyData(kRankSamples);
  const LabeledSamples test = NoisyData(37);
  std::vector<RankRun> runs = TrainRanks(data, test, [](int rank, JobRegion& region) {
    if (rank == 1) region.RequestCheckpointAndStop();  // rank 1's worker shuts down
  });
  for (const RankRun& run : runs) {
    EXPECT_TRUE(absl::IsCancelled(run.status)) << run.status;
    EXPECT_EQ(run.steps, 1u) << "both stopped after the first step's vote";
  }
  // Rank 0 keeps the step reached: it writes the checkpoint, though the request was rank 1's.
  EXPECT_THAT(runs[0].recorder.checkpoints, ElementsAre(Pair(1, 1)));
  const std::vector<v1::JobEvent> log0 = runs[0].recorder.OfType(v1::EVENT_TYPE_LOG);
  const std::vector<v1::JobEvent> log1 = runs[1].recorder.OfType(v1::EVENT_TYPE_LOG);
  ASSERT_EQ(log0.size(), 1u);
  ASSERT_EQ(log1.size(), 1u);
  EXPECT_EQ(log0[0].message(),
            "stopped at step 1 with the other ranks: a worker of the job is shutting down");
  EXPECT_EQ(log1[0].message(), "stopped at step 1 for the worker's shutdown");
}

TEST(DataParallelTrainingLoopTest, AStopRequestMidRunStopsEveryRankAtTheSameStep) {
  const LabeledSamples data = NoisyData(kRankSamples);
  const LabeledSamples test = NoisyData(37);
  std::thread requester;
  std::vector<RankRun> runs = TrainRanks(
      data, test,
      [&](int rank, JobRegion& region) {
        if (rank != 1) return;
        requester = std::thread([&region] {
          // After the first steps (each waits ~50 ms for its batch), rank 1's worker shuts down.
          while (region.stats().steps_total.load() < 2) absl::SleepFor(absl::Milliseconds(1));
          region.RequestCheckpointAndStop();
        });
      },
      /*delay_ms=*/50);
  requester.join();
  for (const RankRun& run : runs) EXPECT_TRUE(absl::IsCancelled(run.status)) << run.status;
  EXPECT_EQ(runs[0].steps, runs[1].steps);
  EXPECT_LT(runs[0].steps, 6u);
  ASSERT_FALSE(runs[0].recorder.checkpoints.empty());
  EXPECT_EQ(runs[0].recorder.checkpoints.back().first, runs[0].steps);
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
