// Data-parallel training on the cpu models (Model::SetGradientReducer, TrainStepWithoutSamples):
// real reductions between two models in one process, each on its own thread, summed by
// SumReducer (a shared buffer and a barrier: a genuine sum, in rank order, so every rank gets the
// same bits). The Gloo reducer is tested in comm/.
//
// What it shows: two ranks with batch b, each on its half of a 2b batch, end with the weights of
// one model trained on the 2b batch (fp32 within a tolerance set by summation order, bf16 within a
// looser one), for the MLP fast path and the network (MLP and conv net; SGD with momentum and
// weight decay, AdamW, gradient clipping), and the ranks' weights are bit-identical to each other;
// an uneven split (3 and 5 samples) matches one model on 8; a rank without samples alongside one
// with the whole batch matches one model on that batch exactly; an fp16 overflow on one rank makes
// both skip; a failing Finish() leaves the model untouched; a 1-rank reducer changes nothing.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_mlp.h"
#include "engine/cpu/network_test_util.h"
#include "engine/model.h"
#include "engine/model_shapes.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using testing_util::FeatureBatch;
using testing_util::RandomFeatures;
namespace tl = test_layers;

// What every rank's reducer shares: one slot per rank for its gradients, and a barrier.
class SharedSum {
 public:
  explicit SharedSum(int ranks) : slots_(ranks), barrier_(ranks) {}

  // Called by every rank's Finish() with the gradients it was handed, in order: afterwards each
  // holds the sum over the ranks (rank 0's + rank 1's + ..., the same order on every rank).
  // FAILED_PRECONDITION (on every rank) when the ranks' tensor lists differ.
  absl::Status AllReduce(int rank, const std::vector<std::pair<float*, int64_t>>& gradients) {
    std::vector<std::vector<float>>& slot = slots_[rank];
    slot.clear();
    for (const auto& [data, count] : gradients) slot.emplace_back(data, data + count);
    barrier_.arrive_and_wait();  // every rank's gradients are in its slot
    absl::Status status;
    for (size_t r = 1; r < slots_.size(); ++r) {
      bool same = slots_[r].size() == slots_[0].size();
      for (size_t t = 0; same && t < slots_[0].size(); ++t) {
        same = slots_[r][t].size() == slots_[0][t].size();
      }
      if (!same) status = absl::FailedPreconditionError("the ranks handed over different tensors");
    }
    if (status.ok()) {
      for (size_t t = 0; t < gradients.size(); ++t) {
        float* out = gradients[t].first;
        for (int64_t i = 0; i < gradients[t].second; ++i) {
          float sum = slots_[0][t][i];
          for (size_t r = 1; r < slots_.size(); ++r) sum += slots_[r][t][i];
          out[i] = sum;
        }
      }
    }
    barrier_.arrive_and_wait();  // every rank has read every slot
    return status;
  }

 private:
  std::vector<std::vector<std::vector<float>>> slots_;  // [rank][tensor][value]
  std::barrier<> barrier_;
};

// One rank's reducer. It also checks the contract's promises (Finish() fails otherwise, so the
// step fails): indices 0, 1, ... in order; the same pointers and counts every step; a buffer left
// as it was handed over until Finish. And it counts the steps whose first gradient came early:
// while the last one handed over (from the step before on) still held another value, i.e. before
// backward had finished.
class SumReducer final : public GradientReducer {
 public:
  SumReducer(SharedSum& shared, int rank) : shared_(shared), rank_(rank) {}

  void set_share(float share) { share_ = share; }
  float LocalShare() const override { return share_; }

  void GradientReady(int index, float* gradient, int64_t count) override {
    if (index != static_cast<int>(step_.size())) {
      contract_ = absl::StrCat("GradientReady index ", index, " after ", step_.size(), " tensors");
    }
    step_.push_back({gradient, count});
    snapshots_.emplace_back(gradient, gradient + count);
    if (index == 0 && !first_.empty()) {
      last_at_first_.assign(first_.back().first, first_.back().first + first_.back().second);
    }
  }

  absl::Status Finish() override {
    std::vector<std::pair<float*, int64_t>> step = std::move(step_);
    std::vector<std::vector<float>> snapshots = std::move(snapshots_);
    step_.clear();
    snapshots_.clear();
    if (first_.empty()) first_ = step;
    if (step != first_) contract_ = "the tensors handed over differ from the first step's";
    for (size_t t = 0; t < step.size(); ++t) {
      if (!std::equal(snapshots[t].begin(), snapshots[t].end(), step[t].first)) {
        contract_ = absl::StrCat("gradient ", t, " changed after GradientReady");
      }
    }
    if (!last_at_first_.empty() && step.size() > 1 &&
        !std::equal(last_at_first_.begin(), last_at_first_.end(), step.back().first)) {
      ++early_steps_;
    }
    last_at_first_.clear();
    ++finishes_;
    absl::Status status = shared_.AllReduce(rank_, step);
    if (!contract_.empty()) return absl::InternalError(contract_);
    return status;
  }

  // The (pointer, count) list of the first step.
  const std::vector<std::pair<float*, int64_t>>& first_step() const { return first_; }
  int finishes() const { return finishes_; }
  int early_steps() const { return early_steps_; }

 private:
  SharedSum& shared_;
  const int rank_;
  float share_ = 1;
  std::vector<std::pair<float*, int64_t>> step_;
  std::vector<std::vector<float>> snapshots_;  // each gradient as it was handed over
  std::vector<std::pair<float*, int64_t>> first_;
  std::vector<float> last_at_first_;  // the last tensor's values at GradientReady(0)
  std::string contract_;
  int finishes_ = 0;
  int early_steps_ = 0;
};

// A reducer whose Finish() fails, as when a peer is gone.
class FailingReducer final : public GradientReducer {
 public:
  float LocalShare() const override { return 1; }
  void GradientReady(int index, float* gradient, int64_t count) override {
    (void)index;
    (void)gradient;
    ready += count > 0;
  }
  absl::Status Finish() override { return absl::UnavailableError("rank 1 is gone"); }
  int ready = 0;  // gradients handed over
};

FeatureBatch Slice(const FeatureBatch& batch, int first, int count) {
  const size_t features = batch.features.size() / batch.count;
  FeatureBatch slice;
  slice.count = count;
  slice.features.assign(batch.features.begin() + first * features,
                        batch.features.begin() + (first + count) * features);
  slice.labels.assign(batch.labels.begin() + first, batch.labels.begin() + first + count);
  return slice;
}

// A single model and `ranks` replicas of it (same config, same seed), the replicas joined by
// SumReducers.
struct Replicas {
  std::unique_ptr<Model> single;
  std::vector<std::unique_ptr<Model>> ranks;
  std::unique_ptr<SharedSum> shared;
  std::vector<std::unique_ptr<SumReducer>> reducers;
};

template <typename Make>
Replicas MakeReplicas(int count, Make make) {
  Replicas r;
  r.single = make();
  r.shared = std::make_unique<SharedSum>(count);
  for (int i = 0; i < count; ++i) {
    r.ranks.push_back(make());
    r.reducers.push_back(std::make_unique<SumReducer>(*r.shared, i));
    EXPECT_TRUE(r.ranks.back()->SetGradientReducer(r.reducers.back().get()).ok());
  }
  return r;
}

std::unique_ptr<Model> MakeMlp(const MlpConfig& config) {
  absl::StatusOr<std::unique_ptr<Model>> model = CreateCpuMlp(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// One step of every rank, each on its own thread: rank i trains on `split[i]` samples of `batch`
// (consecutive, in rank order), with LocalShare split[i] / batch.count, or without samples when
// split[i] is 0. Returns each rank's result.
std::vector<absl::StatusOr<StepResult>> StepRanks(Replicas& r, const FeatureBatch& batch,
                                                  const std::vector<int>& split, double lr) {
  std::vector<absl::StatusOr<StepResult>> results(r.ranks.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  int first = 0;
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    threads.emplace_back([&, i, first] {
      if (split[i] == 0) {
        results[i] = r.ranks[i]->TrainStepWithoutSamples(lr);
        return;
      }
      r.reducers[i]->set_share(static_cast<float>(split[i]) / static_cast<float>(batch.count));
      const FeatureBatch slice = Slice(batch, first, split[i]);
      results[i] = r.ranks[i]->TrainStep(slice.View(), lr);
    });
    first += split[i];
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

// Largest |a - b| over every parameter, relative to the largest |b|.
double MaxRelativeDifference(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  double difference = 0, scale = 0;
  for (size_t t = 0; t < a.size() && t < b.size(); ++t) {
    for (size_t i = 0; i < a[t].values.size() && i < b[t].values.size(); ++i) {
      difference = std::max(difference, std::fabs(double(a[t].values[i]) - b[t].values[i]));
      scale = std::max(scale, std::fabs(double(b[t].values[i])));
    }
  }
  return scale > 0 ? difference / scale : difference;
}

void ExpectSameState(const Model& a, const Model& b, const std::string& label) {
  testing_util::ExpectSameParameters(a, b, label);
  const std::vector<NamedTensor> sa = a.OptimizerState(), sb = b.OptimizerState();
  ASSERT_EQ(sa.size(), sb.size()) << label;
  for (size_t t = 0; t < sa.size(); ++t) {
    EXPECT_EQ(sa[t].values, sb[t].values) << label << " " << sa[t].name;
  }
}

// Trains the single model on `steps` random batches of sum(split) samples and the ranks on their
// parts; the ranks must stay bit-identical, and within `tolerance` (max relative difference) of
// the single model. Returns the largest difference seen.
double TrainAndCompare(Replicas& r, const std::vector<int>& split, int features, int classes,
                       int steps, double lr, double tolerance, const std::string& label) {
  int total = 0;
  for (int n : split) total += n;
  const std::vector<NamedTensor> initial = r.single->Parameters();
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    const FeatureBatch batch = RandomFeatures(total, features, classes, 1000 + step);
    absl::StatusOr<StepResult> alone = r.single->TrainStep(batch.View(), lr);
    EXPECT_TRUE(alone.ok()) << alone.status();
    std::vector<absl::StatusOr<StepResult>> results = StepRanks(r, batch, split, lr);
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_TRUE(results[i].ok()) << label << " rank " << i << ": " << results[i].status();
      if (!results[i].ok() || !alone.ok()) return 1;
      EXPECT_EQ(results[i]->skipped, alone->skipped) << label;
    }
    worst =
        std::max(worst, MaxRelativeDifference(r.ranks[0]->Parameters(), r.single->Parameters()));
  }
  for (size_t i = 1; i < r.ranks.size(); ++i) {
    ExpectSameState(*r.ranks[0], *r.ranks[i], label + ": rank 0 vs rank " + std::to_string(i));
  }
  // The weights moved: the comparison is not between untouched models.
  EXPECT_GT(MaxRelativeDifference(r.single->Parameters(), initial), 1e-3) << label;
  EXPECT_LE(worst, tolerance) << label;
  std::printf("%s: largest relative difference from one model %.3g\n", label.c_str(), worst);
  return worst;
}

constexpr int kSteps = 20;
constexpr double kLearningRate = 0.05;
// fp32: the ranks' gradients are the single model's up to summation order: each rank sums its
// rows in oneDNN's order, then the two sums are added (the loss gradient itself is bit-identical
// for an even split: 1 / (2b) = (1 / b) / 2 exactly). That is a few ulps per step; seen: at most
// 2e-7 of the largest weight after 20 steps with momentum (Xeon, AVX-512). 5e-6 leaves room for
// other CPUs' kernels; a wrong share or a missing rank is off by 1e-1 or more.
constexpr double kFp32Tolerance = 5e-6;
// bf16: the same fp32 differences can flip the rounding of a bf16 weight copy (2^-8 relative),
// which then reaches every activation after it. Seen: 1e-7 (no flip mattered); allowed 1e-4.
constexpr double kBf16Tolerance = 1e-4;

MlpConfig SmallMlp(Precision precision) {
  MlpConfig config = tl::TestMlp(24, {16, 12}, 5, 16, /*seed=*/7, precision);
  config.optimizer.momentum = 0.9;
  config.optimizer.weight_decay = 1e-3;
  return config;
}

NetworkConfig ConvNet(Precision precision) {
  NetworkConfig config;
  config.input_shape = {2, 8, 8};
  config.layers = {tl::Conv(6, 3, 1, 1), tl::Of(tl::Kind::kRelu), tl::Pool(2),
                   tl::Conv(8, 3, 1, 1), tl::Of(tl::Kind::kRelu), tl::Of(tl::Kind::kFlatten),
                   tl::Linear(5)};
  config.classes = 5;
  config.max_batch = 16;
  config.precision = precision;
  config.seed = 11;
  config.optimizer.momentum = 0.9;
  config.optimizer.weight_decay = 1e-3;
  return config;
}

std::unique_ptr<Model> MakeMlpNetwork(const MlpConfig& mlp) {
  return testing_util::MakeNetwork(NetworkFromMlp(mlp));
}

TEST(DataParallelTest, MlpFastPathTwoRanksMatchOneModel) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const MlpConfig config = SmallMlp(precision);
    Replicas r = MakeReplicas(2, [&] { return MakeMlp(config); });
    TrainAndCompare(r, {8, 8}, config.input_features, config.classes, kSteps, kLearningRate,
                    precision == Precision::kFp32 ? kFp32Tolerance : kBf16Tolerance,
                    absl::StrCat("MLP fast path ", PrecisionName(precision)));
  }
}

TEST(DataParallelTest, NetworkMlpTwoRanksMatchOneModel) {
  struct Case {
    std::string name;
    OptimizerType type;
    double clip;
    Precision precision;
  };
  for (const Case& c : {Case{"sgd", OptimizerType::kSgd, 0, Precision::kFp32},
                        Case{"adamw", OptimizerType::kAdamW, 0, Precision::kFp32},
                        Case{"sgd clipped", OptimizerType::kSgd, 0.05, Precision::kFp32},
                        Case{"adamw clipped", OptimizerType::kAdamW, 0.05, Precision::kBf16}}) {
    MlpConfig mlp = SmallMlp(c.precision);
    mlp.optimizer.type = c.type;
    mlp.optimizer.clip_grad_norm = c.clip;
    if (c.type == OptimizerType::kAdamW) mlp.optimizer.weight_decay = 0.01;
    const double lr = c.type == OptimizerType::kAdamW ? 0.005 : kLearningRate;
    Replicas r = MakeReplicas(2, [&] { return MakeMlpNetwork(mlp); });
    TrainAndCompare(r, {8, 8}, mlp.input_features, mlp.classes, kSteps, lr,
                    c.precision == Precision::kFp32 ? kFp32Tolerance : kBf16Tolerance,
                    absl::StrCat("network MLP ", c.name, " ", PrecisionName(c.precision)));
  }
}

TEST(DataParallelTest, ConvNetTwoRanksMatchOneModel) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const NetworkConfig config = ConvNet(precision);
    Replicas r = MakeReplicas(2, [&] { return testing_util::MakeNetwork(config); });
    TrainAndCompare(r, {8, 8}, testing_util::Features(config), config.classes, kSteps,
                    kLearningRate, precision == Precision::kFp32 ? kFp32Tolerance : kBf16Tolerance,
                    absl::StrCat("conv net ", PrecisionName(precision)));
  }
}

// LocalShare 3/8 and 5/8: the ranks' shares weight their means into the global one.
TEST(DataParallelTest, UnevenSplitMatchesOneModel) {
  const MlpConfig mlp = SmallMlp(Precision::kFp32);
  Replicas fast = MakeReplicas(2, [&] { return MakeMlp(mlp); });
  TrainAndCompare(fast, {3, 5}, mlp.input_features, mlp.classes, kSteps, kLearningRate,
                  kFp32Tolerance, "MLP fast path 3 + 5");
  const NetworkConfig conv = ConvNet(Precision::kFp32);
  Replicas network = MakeReplicas(2, [&] { return testing_util::MakeNetwork(conv); });
  TrainAndCompare(network, {3, 5}, testing_util::Features(conv), conv.classes, kSteps,
                  kLearningRate, kFp32Tolerance, "conv net 3 + 5");
}

// A rank without samples adds zeros: exactly the other rank's (whole batch) step, which is exactly
// one model's step on that batch (its share is 1).
TEST(DataParallelTest, RankWithoutSamplesMatchesOneModelExactly) {
  const MlpConfig mlp = SmallMlp(Precision::kFp32);
  Replicas fast = MakeReplicas(2, [&] { return MakeMlp(mlp); });
  EXPECT_EQ(TrainAndCompare(fast, {0, 8}, mlp.input_features, mlp.classes, 5, kLearningRate, 0,
                            "MLP fast path 0 + 8"),
            0);
  MlpConfig adamw = mlp;
  adamw.optimizer.type = OptimizerType::kAdamW;
  Replicas network = MakeReplicas(2, [&] { return MakeMlpNetwork(adamw); });
  EXPECT_EQ(TrainAndCompare(network, {8, 0}, mlp.input_features, mlp.classes, 5, 0.005, 0,
                            "network AdamW 8 + 0"),
            0);
  // The network's step counters (optimizer.step, train_step) advanced on both ranks alike.
  ExpectSameState(*network.single, *network.ranks[1], "network AdamW one model vs rank 1");
}

TEST(DataParallelTest, WithoutSamplesNeedsAReducer) {
  const MlpConfig mlp = SmallMlp(Precision::kFp32);
  std::vector<std::unique_ptr<Model>> models;
  models.push_back(MakeMlp(mlp));
  models.push_back(MakeMlpNetwork(mlp));
  for (const std::unique_ptr<Model>& model : models) {
    ASSERT_NE(model, nullptr);
    const std::vector<NamedTensor> before = model->Parameters();
    absl::StatusOr<StepResult> result = model->TrainStepWithoutSamples(kLearningRate);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
    const std::vector<NamedTensor> after = model->Parameters();
    for (size_t t = 0; t < before.size(); ++t) EXPECT_EQ(before[t].values, after[t].values);
  }
}

// GradScaler's decision is taken on the sum: an overflow on one rank skips the step on both and
// backs off both loss scales; afterwards they keep training in step.
TEST(DataParallelTest, Fp16OverflowOnOneRankSkipsBoth) {
  MlpConfig mlp = SmallMlp(Precision::kFp16);
  mlp.loss_scale.initial = 1024;
  Replicas r = MakeReplicas(2, [&] { return MakeMlpNetwork(mlp); });
  TrainAndCompare(r, {8, 8}, mlp.input_features, mlp.classes, 3, kLearningRate, kBf16Tolerance,
                  "network MLP fp16");
  const std::vector<NamedTensor> before = r.ranks[0]->Parameters();
  ASSERT_TRUE(r.ranks[0]->InjectGradientForTest(std::numeric_limits<float>::infinity()).ok());
  const FeatureBatch batch = RandomFeatures(16, mlp.input_features, mlp.classes, 99);
  std::vector<absl::StatusOr<StepResult>> results = StepRanks(r, batch, {8, 8}, kLearningRate);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_TRUE(results[i]->skipped) << "rank " << i;
    EXPECT_EQ(results[i]->loss_scale, 512) << "rank " << i;
    const std::vector<NamedTensor> after = r.ranks[i]->Parameters();
    for (size_t t = 0; t < before.size(); ++t) {
      EXPECT_EQ(after[t].values, before[t].values) << "rank " << i << " " << after[t].name;
    }
  }
  ExpectSameState(*r.ranks[0], *r.ranks[1], "fp16 after the skipped step");
  // And on, from the same state.
  results = StepRanks(r, batch, {8, 8}, kLearningRate);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_FALSE(results[i]->skipped);
  }
  ExpectSameState(*r.ranks[0], *r.ranks[1], "fp16 after the next step");
}

// A failed Finish() fails the step: no update of weights, optimizer state (step counters, loss
// scale) or BatchNorm's running statistics.
TEST(DataParallelTest, FailedFinishLeavesTheModelUntouched) {
  NetworkConfig bn = ConvNet(Precision::kFp16);
  bn.layers.insert(bn.layers.begin() + 1, tl::Of(tl::Kind::kBatchNorm2d));
  const MlpConfig mlp = SmallMlp(Precision::kFp32);
  std::vector<std::unique_ptr<Model>> models;
  models.push_back(MakeMlp(mlp));
  models.push_back(testing_util::MakeNetwork(bn));
  const std::vector<int> features = {mlp.input_features, testing_util::Features(bn)};
  for (size_t m = 0; m < models.size(); ++m) {
    Model& model = *models[m];
    const FeatureBatch batch = RandomFeatures(8, features[m], 5, 3);
    ASSERT_TRUE(model.TrainStep(batch.View(), kLearningRate).ok());  // some optimizer state
    const std::vector<NamedTensor> parameters = model.Parameters();
    const std::vector<NamedTensor> state = model.OptimizerState();
    FailingReducer failing;
    ASSERT_TRUE(model.SetGradientReducer(&failing).ok());
    absl::StatusOr<StepResult> result = model.TrainStep(batch.View(), kLearningRate);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
    EXPECT_GT(failing.ready, 0);
    result = model.TrainStepWithoutSamples(kLearningRate);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
    const std::vector<NamedTensor> parameters_after = model.Parameters();
    const std::vector<NamedTensor> state_after = model.OptimizerState();
    ASSERT_EQ(parameters.size(), parameters_after.size());
    for (size_t t = 0; t < parameters.size(); ++t) {
      EXPECT_EQ(parameters[t].values, parameters_after[t].values) << m << " " << parameters[t].name;
    }
    ASSERT_EQ(state.size(), state_after.size());
    for (size_t t = 0; t < state.size(); ++t) {
      EXPECT_EQ(state[t].values, state_after[t].values) << m << " " << state[t].name;
    }
    // Detached, it trains again.
    ASSERT_TRUE(model.SetGradientReducer(nullptr).ok());
    EXPECT_TRUE(model.TrainStep(batch.View(), kLearningRate).ok());
  }
}

// A share outside (0, 1] is refused before anything runs.
TEST(DataParallelTest, BadLocalShareIsRefused) {
  const MlpConfig mlp = SmallMlp(Precision::kFp32);
  for (const bool network : {false, true}) {
    std::unique_ptr<Model> model = network ? MakeMlpNetwork(mlp) : MakeMlp(mlp);
    SharedSum shared(1);
    SumReducer reducer(shared, 0);
    ASSERT_TRUE(model->SetGradientReducer(&reducer).ok());
    const FeatureBatch batch = RandomFeatures(4, mlp.input_features, mlp.classes, 5);
    for (const float share : {0.0f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
      reducer.set_share(share);
      absl::StatusOr<StepResult> result = model->TrainStep(batch.View(), kLearningRate);
      EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << share;
    }
    EXPECT_EQ(reducer.finishes(), 0);
  }
}

// With a 1-rank reducer (share 1, the sum of one) every model trains exactly as without one, and
// hands over each trained tensor once per step, in reverse Parameters() order, BatchNorm buffers
// never: a residual network with BatchNorm and dropout, fp32 and fp16, and the MLP fast path.
TEST(DataParallelTest, OneRankReducerChangesNothing) {
  NetworkConfig residual;
  residual.input_shape = {3, 6, 6};
  LayerConfig block = tl::Of(tl::Kind::kResidual);
  block.layers = {tl::Conv(4, 3, 1, 1), tl::Of(tl::Kind::kBatchNorm2d), tl::Of(tl::Kind::kRelu),
                  tl::Conv(4, 3, 1, 1)};
  block.shortcut = {tl::Conv(4, 1, 1, 0)};
  residual.layers = {block,         tl::Of(tl::Kind::kFlatten),     tl::Dropout(0.25f),
                     tl::Linear(6), tl::Of(tl::Kind::kBatchNorm1d), tl::Of(tl::Kind::kRelu),
                     tl::Linear(4)};
  residual.classes = 4;
  residual.max_batch = 8;
  residual.seed = 5;
  residual.optimizer.weight_decay = 1e-3;
  NetworkConfig residual_fp16 = residual;
  residual_fp16.precision = Precision::kFp16;
  const MlpConfig mlp = SmallMlp(Precision::kBf16);
  struct Case {
    std::string name;
    std::function<std::unique_ptr<Model>()> make;
    int features, classes;
  };
  const std::vector<Case> cases = {
      {"residual fp32", [&] { return testing_util::MakeNetwork(residual); },
       testing_util::Features(residual), residual.classes},
      {"residual fp16", [&] { return testing_util::MakeNetwork(residual_fp16); },
       testing_util::Features(residual), residual.classes},
      {"MLP fast path bf16", [&] { return MakeMlp(mlp); }, mlp.input_features, mlp.classes},
  };
  for (const Case& c : cases) {
    Replicas r = MakeReplicas(1, c.make);
    for (int step = 0; step < 6; ++step) {
      // A partial batch now and then (another plan, same buffers).
      const FeatureBatch batch =
          RandomFeatures(step % 3 == 2 ? 5 : 8, c.features, c.classes, 200 + step);
      absl::StatusOr<StepResult> alone = r.single->TrainStep(batch.View(), kLearningRate);
      ASSERT_TRUE(alone.ok()) << alone.status();
      std::vector<absl::StatusOr<StepResult>> results =
          StepRanks(r, batch, {batch.count}, kLearningRate);
      ASSERT_TRUE(results[0].ok()) << c.name << ": " << results[0].status();
      EXPECT_EQ(results[0]->loss, alone->loss) << c.name;
      EXPECT_EQ(results[0]->loss_scale, alone->loss_scale) << c.name;
    }
    ExpectSameState(*r.single, *r.ranks[0], c.name);
    EXPECT_EQ(r.reducers[0]->finishes(), 6);
    // Every step after the first handed its first gradient over before backward had computed
    // the last one.
    EXPECT_EQ(r.reducers[0]->early_steps(), 5) << c.name;
    // The order: the trained tensors, last first.
    std::vector<int64_t> expected;
    for (const NamedTensor& t : r.single->Parameters()) {
      if (t.name.ends_with("running_mean") || t.name.ends_with("running_var") ||
          t.name.ends_with("num_batches_tracked")) {
        continue;
      }
      expected.insert(expected.begin(), static_cast<int64_t>(t.values.size()));
    }
    std::vector<int64_t> handed;
    for (const auto& [pointer, count] : r.reducers[0]->first_step()) handed.push_back(count);
    EXPECT_EQ(handed, expected) << c.name;
  }
}

}  // namespace
}  // namespace stoker
