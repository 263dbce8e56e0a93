#include "spec/search.h"

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/job_file.h"
#include "spec/job_spec.h"

namespace stoker {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = R"(name: tune
dataset:
  format: idx
  train_images: fashion-mnist/train-images-idx3-ubyte.gz
  train_labels: fashion-mnist/train-labels-idx1-ubyte.gz
  test_images: fashion-mnist/t10k-images-idx3-ubyte.gz
  test_labels: fashion-mnist/t10k-labels-idx1-ubyte.gz
model: {type: mlp, hidden: [64]}
train:
  epochs: 9
  batch_size: 64
  optimizer: {type: sgd, lr: 0.1}
)";

absl::StatusOr<JobFile> WithSearch(const std::string& search) {
  return ParseJobYaml(absl::StrCat(kJob, search), "tune.yaml");
}

TEST(SearchTest, ASearchSectionIsReadAfterTheJob) {
  absl::StatusOr<JobFile> file = WithSearch(R"(search:
  method: asha
  seed: 7
  max_trials: 16
  max_concurrent_trials: 4
  metric: test_loss
  asha: {grace_epochs: 1, reduction_factor: 3}
  parameters:
    train.optimizer.lr: {log_uniform: [1e-4, 1e-1]}
    model.hidden: {choice: [[256, 128], [512, 256], []]}
    train.optimizer.type: {choice: [sgd, adamw]}
    train.batch_size: {int: [32, 256]}
    train.optimizer.weight_decay: {uniform: [0, 0.01]}
)");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->spec.train().epochs(), 9) << "the job is the base every trial starts from";
  ASSERT_TRUE(file->search.has_value());
  const v1::SearchSpec& search = *file->search;
  EXPECT_EQ(search.method(), "asha");
  EXPECT_EQ(search.seed(), 7);
  EXPECT_EQ(search.max_trials(), 16);
  EXPECT_EQ(search.max_concurrent_trials(), 4);
  EXPECT_TRUE(MetricIsMinimised(search));
  EXPECT_EQ(search.asha().reduction_factor(), 3);
  ASSERT_EQ(search.parameters_size(), 5);
  EXPECT_EQ(search.parameters(0).path(), "train.optimizer.lr");
  EXPECT_EQ(search.parameters(0).kind(), "log_uniform");
  EXPECT_DOUBLE_EQ(search.parameters(0).low(), 1e-4);
  EXPECT_THAT(search.parameters(1).choices(),
              ::testing::ElementsAre("[256, 128]", "[512, 256]", "[]"));
  EXPECT_THAT(search.parameters(2).choices(), ::testing::ElementsAre("sgd", "adamw"));
  EXPECT_EQ(file->locations.at("search.parameters.model.hidden"), "tune.yaml:22:19");

  // A job file without a search has none.
  absl::StatusOr<JobFile> plain = ParseJobYaml(kJob, "plain.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->search.has_value());
}

TEST(SearchTest, TrialsApplyTheirValuesAsTheJobFileWould) {
  absl::StatusOr<JobFile> file = WithSearch(R"(search:
  method: random
  seed: 3
  max_trials: 50
  parameters:
    train.optimizer.lr: {log_uniform: [1e-4, 1e-1]}
    model.hidden: {choice: [[256, 128], []]}
    train.optimizer.type: {choice: [sgd, adamw]}
    train.batch_size: {int: [32, 40]}
)");
  ASSERT_TRUE(file.ok()) << file.status();
  std::set<std::string> types;
  std::set<int> batches;
  bool saw_no_hidden = false;
  for (int i = 0; i < 50; ++i) {
    const v1::TrialParameters trial = TrialAt(*file->search, i);
    EXPECT_EQ(trial.index(), i);
    // The same trial every time: a pure function of (seed, index).
    const v1::TrialParameters again = TrialAt(*file->search, i);
    using Values = std::map<std::string, std::string>;
    EXPECT_EQ(Values(trial.values().begin(), trial.values().end()),
              Values(again.values().begin(), again.values().end()));
    absl::StatusOr<v1::JobSpec> job = TrialJob(file->spec, trial);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(ValidateJobSpec(*job).ok());
    const double lr = job->train().optimizer().lr();
    EXPECT_GE(lr, 1e-4);
    EXPECT_LE(lr, 1e-1);
    double written = 0;
    ASSERT_TRUE(absl::SimpleAtod(trial.values().at("train.optimizer.lr"), &written));
    EXPECT_DOUBLE_EQ(lr, written);
    types.insert(job->train().optimizer().type());
    batches.insert(job->train().batch_size());
    EXPECT_GE(job->train().batch_size(), 32);
    EXPECT_LE(job->train().batch_size(), 40);
    if (trial.values().at("model.hidden") == "[]") {
      saw_no_hidden = true;
      EXPECT_TRUE(job->model().hidden().empty());
      EXPECT_TRUE(job->model().no_hidden_layers()) << "hidden: [] means no hidden layer";
    } else {
      EXPECT_THAT(job->model().hidden(), ::testing::ElementsAre(256, 128));
      EXPECT_FALSE(job->model().no_hidden_layers());
    }
    EXPECT_EQ(job->train().epochs(), 9) << "what the search does not set stays";
  }
  EXPECT_EQ(types, (std::set<std::string>{"sgd", "adamw"}));
  EXPECT_GE(batches.size(), 6u) << "50 draws of 9 integers";
  EXPECT_TRUE(saw_no_hidden);

  // Another seed, other trials.
  v1::SearchSpec reseeded = *file->search;
  reseeded.set_seed(4);
  EXPECT_NE(TrialAt(reseeded, 0).values().at("train.optimizer.lr"),
            TrialAt(*file->search, 0).values().at("train.optimizer.lr"));
}

TEST(SearchTest, AGridRunsEveryCombinationLastParameterFastest) {
  absl::StatusOr<JobFile> file = WithSearch(R"(search:
  method: grid
  parameters:
    train.optimizer.type: {choice: [sgd, adamw]}
    train.batch_size: {int: [32, 34]}
)");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<int> count = TrialCount(*file->search);
  ASSERT_TRUE(count.ok());
  ASSERT_EQ(*count, 6);
  std::vector<std::string> seen;
  for (int i = 0; i < 6; ++i) seen.push_back(TrialSummary(TrialAt(*file->search, i)));
  EXPECT_THAT(seen, ::testing::ElementsAre("batch_size=32 type=sgd", "batch_size=33 type=sgd",
                                           "batch_size=34 type=sgd", "batch_size=32 type=adamw",
                                           "batch_size=33 type=adamw", "batch_size=34 type=adamw"));
  // max_trials caps a grid at its first points.
  v1::SearchSpec capped = *file->search;
  capped.set_max_trials(4);
  EXPECT_EQ(*TrialCount(capped), 4);
}

// A bad space is refused naming its path and the line it is on.
TEST(SearchTest, BadSpacesAreRefusedNamingThePathAndLine) {
  struct Case {
    std::string search;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"search: {method: random, max_trials: 4, parameters: {train.optimiser.lr: {uniform: [0, "
       "1]}}}",
       "tune.yaml:13:85: train.optimiser.lr: no field 'optimiser' in train"},
      {"search: {method: random, max_trials: 4, parameters: {train.optimizer.lr: {log_uniform: "
       "[0, 1]}}}",
       "tune.yaml:13:88: search.parameters.train.optimizer.lr: log_uniform needs 0 < low < high"},
      {"search: {method: random, max_trials: 4, parameters: {train.batch_size: {uniform: [8, "
       "64]}}}",
       "search.parameters.train.batch_size: train.batch_size takes whole numbers: use {int: "
       "[low, high]}"},
      {"search: {method: random, max_trials: 4, parameters: {train.precision: {choice: [bf16, "
       "fp8]}}}",
       "tune.yaml:13:87: train.precision: unknown value 'fp8'"},
      {"search: {method: grid, parameters: {train.optimizer.lr: {uniform: [0.1, 1]}}}",
       "search.parameters.train.optimizer.lr: a grid takes choice or int values, not uniform"},
      {"search: {method: random, parameters: {train.optimizer.lr: {uniform: [0.1, 1]}}}",
       "search.max_trials: is required for method random"},
      {"search: {method: asha, max_trials: 4, asha: {grace_epochs: 9}, parameters: "
       "{train.optimizer.lr: {uniform: [0.1, 1]}}}",
       "search.asha.grace_epochs: the first rung (9 epochs) must be below train.epochs (9)"},
      {"search: {method: random, max_trials: 4, parameters: {train.optimizer.lr: {normal: [0, "
       "1]}}}",
       "unknown space 'normal'"},
      {"search: {method: hyperband, parameters: {}}",
       "search.method: expected one of: grid, "
       "random, asha; got 'hyperband'"},
      {"search: {method: random, max_trials: 4, parameters: {search.method: {choice: [grid]}}}",
       "no field 'search' in the job"},
      {"search: {method: random, max_trials: 0, parameters: {train.epochs: {int: [1, 2]}}}",
       "search.max_trials: must be between 1 and 10000, not 0"},
      // Each choice maps onto its field, but the trial it makes is still validated whole.
      {"search: {method: grid, parameters: {train.optimizer.type: {choice: [sgd, adamx]}}}",
       "tune.yaml:13:59: search: trial 1 (type=adamx): train.optimizer.type:"},
      {"search: {method: grid, parameters: {model.hidden: {choice: [[64], [0]]}}}",
       "search: trial 1 (hidden=[0]): model.hidden"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<JobFile> file = WithSearch(c.search + "\n");
    ASSERT_FALSE(file.ok()) << c.search;
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(c.error))
        << c.search << "\n  Actual: " << file.status().message();
  }
}

TEST(SearchTest, RungsAreGraceTimesFactorPowersThenTheJobsEpochs) {
  v1::AshaSpec asha;
  asha.set_grace_epochs(1);
  asha.set_reduction_factor(4);
  EXPECT_THAT(AshaRungEpochs(asha, 16), ::testing::ElementsAre(1, 4, 16));
  EXPECT_THAT(AshaRungEpochs(asha, 20), ::testing::ElementsAre(1, 4, 16, 20));
  asha.set_grace_epochs(2);
  asha.set_reduction_factor(3);
  EXPECT_THAT(AshaRungEpochs(asha, 10), ::testing::ElementsAre(2, 6, 10));
}

// 16 trials, rungs at 1, 4 and 16 epochs, factor 4. The decisions below were worked out by hand
// from the rule: after trial t's record a rung holds n records; t goes on when fewer than
// max(1, floor(n / 4)) earlier records are at least as good as its metric.
TEST(SearchTest, AshaStopsByTheRuleWorkedOutByHand) {
  AshaStopping asha({1, 4, 16}, 4);
  // Rung 0 (1 epoch), trials in order 0..15.
  const double rung0[16] = {0.50, 0.60, 0.40, 0.70, 0.55, 0.80, 0.30, 0.65,
                            0.90, 0.20, 0.75, 0.85, 0.10, 0.95, 0.60, 0.50};
  // n=1 keep 1: t0 rank 0 goes on; n=2 keep 1: t1 (0.60) rank 0 goes on; n=3: t2 (0.40) rank 2
  // stops; n=4: t3 (0.70) rank 0 goes on; n=5: t4 (0.55) rank 2 stops; n=6: t5 (0.80) goes on;
  // n=7: t6 (0.30) rank 6 stops; n=8 keep 2: t7 (0.65) has 0.70, 0.80 above, rank 2, stops;
  // n=9: t8 (0.90) goes on; n=10: t9 stops; n=11 keep 2: t10 (0.75) below 0.80 and 0.90, stops;
  // n=12 keep 3: t11 (0.85) rank 1 goes on; n=13: t12 stops; n=14: t13 (0.95) goes on; n=15:
  // t14 (0.60) has 8 at least as good (0.60 of t1 included) stops; n=16 keep 4: t15 (0.50) has
  // 11, stops.
  const bool goes_on0[16] = {true, true,  false, true, false, true, false, false,
                             true, false, false, true, false, true, false, false};
  for (int t = 0; t < 16; ++t) {
    EXPECT_EQ(asha.Report(t, 1, rung0[t]), goes_on0[t]) << "trial " << t << " at rung 0";
  }
  // Rung 1 (4 epochs), in the order they get there: t1 0.70 (n=1) on; t0 0.72 (n=2, nothing
  // above) on; t3 0.80 (n=3) on; t5 0.78 (n=4, 0.80 above) stops; t8 0.92 (n=5) on; t13 0.90
  // (n=6, 0.92 above) stops; t11 0.80 (n=7, t3's equal 0.80 recorded first and 0.92) stops.
  const std::vector<std::tuple<int, double, bool>> rung1 = {
      {1, 0.70, true}, {0, 0.72, true},   {3, 0.80, true},  {5, 0.78, false},
      {8, 0.92, true}, {13, 0.90, false}, {11, 0.80, false}};
  for (const auto& [t, metric, on] : rung1) {
    EXPECT_EQ(asha.Report(t, 4, metric), on) << "trial " << t << " at rung 1";
  }
  // The last rung is the job's end: every trial that gets there finishes.
  for (int t : {1, 0, 3, 8}) EXPECT_TRUE(asha.Report(t, 16, 0.5)) << "trial " << t;
  ASSERT_EQ(asha.rungs().size(), 3u);
  EXPECT_EQ(asha.rungs()[0].size(), 16u);
  EXPECT_EQ(asha.rungs()[1].size(), 7u);
  EXPECT_EQ(asha.rungs()[2].size(), 4u);
  // A stopped trial stays stopped; one reporting an epoch again changes nothing.
  EXPECT_FALSE(asha.Report(2, 4, 0.99));
  EXPECT_TRUE(asha.Report(8, 9, 0.10));
  EXPECT_EQ(asha.rungs()[1].size(), 7u);
}

TEST(SearchTest, ATrialThatSkipsRungsIsJudgedAtEach) {
  AshaStopping asha({1, 2, 4}, 2);
  EXPECT_TRUE(asha.Report(0, 2, 0.5));   // rung 0: n=1 on; rung 1: n=1 on
  EXPECT_FALSE(asha.Report(1, 2, 0.4));  // rung 0: n=2 keep 1, 0.5 above: stops there
  EXPECT_EQ(asha.rungs()[0].size(), 2u);
  EXPECT_EQ(asha.rungs()[1].size(), 1u) << "not recorded above the rung it stopped at";
  EXPECT_FALSE(asha.Report(1, 4, 0.9));
}

}  // namespace
}  // namespace stoker
