// Accuracy check of the cpu backend on Fashion-MNIST: trains the CNN (and, with --model=all, the
// MLP in fp32 and bf16) through the engine's Model interface, in-process (no ring, no loaders),
// with the trainer's cosine schedule, and prints key=value lines per epoch and a summary.
//
//   nice build-engine2/bench/train_fmnist --model=all
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_main.h"
#include "data/dataset.h"
#include "engine/backend.h"
#include "engine/model_shapes.h"

ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "IDX files (gzipped)");
ABSL_FLAG(std::string, model, "cnn", "cnn, mlp (fp32 and bf16) or all");
ABSL_FLAG(std::string, precision, "bf16", "the CNN's precision: fp32, bf16 or fp16");
ABSL_FLAG(int, cnn_epochs, 15, "CNN epochs");
ABSL_FLAG(int, mlp_epochs, 10, "MLP epochs");
ABSL_FLAG(int, batch, 128, "samples per step");
ABSL_FLAG(std::string, optimizer, "sgd",
          "the CNN's optimizer: sgd (momentum 0.9, nesterov) or adamw");
ABSL_FLAG(double, cnn_lr, 0.05, "the CNN's peak learning rate");
ABSL_FLAG(double, mlp_lr, 0.05, "the MLP's peak learning rate (SGD momentum 0.9)");
ABSL_FLAG(double, weight_decay, 5e-4, "the CNN's weight decay");
ABSL_FLAG(int, warmup_steps, 200, "linear warm-up steps before the cosine decay");
ABSL_FLAG(int, channels1, 32, "first conv's channels (3x3, pad 1)");
ABSL_FLAG(int, channels2, 64, "second conv's channels (3x3, pad 1)");
ABSL_FLAG(int, hidden, 256, "the CNN's hidden Linear width");
ABSL_FLAG(double, dropout, 0.3, "dropout before the last Linear");
ABSL_FLAG(int64_t, limit, 0, "use only the first N training samples (0 = all), for quick runs");
ABSL_FLAG(uint64_t, seed, 1, "initialisation, dropout and epoch-order seed");

namespace stoker {
namespace {

using Kind = LayerConfig::Kind;

struct Split {
  LabeledSamples data;
};

// The trainer's schedule (worker/trainer_main.cc LearningRateAt): linear warm-up, then cosine to 0.
double LearningRateAt(double base, uint64_t warmup, uint64_t step, uint64_t total_steps) {
  if (step < warmup) return base * double(step + 1) / double(warmup);
  if (total_steps <= warmup) return base;
  const double progress = double(step - warmup) / double(total_steps - warmup);
  return base * 0.5 * (1.0 + std::cos(M_PI * progress));
}

BatchView View(const LabeledSamples& data, const std::vector<uint8_t>& samples,
               const std::vector<uint8_t>& labels, int count) {
  (void)data;
  BatchView view;
  view.samples = samples.data();
  view.labels = labels.data();
  view.count = count;
  return view;
}

struct RunResult {
  double test_accuracy = 0;
  double train_seconds = 0;
};

// Trains for `epochs`; evaluates on the test set after each epoch (not counted in train time).
absl::StatusOr<RunResult> Train(const std::string& name, Model& model, const LabeledSamples& train,
                                const LabeledSamples& test, int epochs, int batch, double lr,
                                uint64_t seed) {
  const int features = train.features;
  const int64_t batches_per_epoch = BatchesPerEpoch(train.count, batch);
  const uint64_t total_steps = static_cast<uint64_t>(batches_per_epoch) * epochs;
  std::vector<uint8_t> samples(static_cast<size_t>(batch) * features), labels(batch);
  RunResult result;
  uint64_t step = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const std::vector<uint32_t> order = EpochPermutation(train.count, seed, epoch);
    const absl::Time start = absl::Now();
    double loss_sum = 0;
    int64_t skipped = 0;
    for (int64_t b = 0; b < batches_per_epoch; ++b) {
      const int64_t first = b * batch;
      const int count = static_cast<int>(std::min<int64_t>(batch, train.count - first));
      for (int i = 0; i < count; ++i) {
        const uint32_t s = order[first + i];
        std::copy(train.samples.begin() + static_cast<int64_t>(s) * features,
                  train.samples.begin() + static_cast<int64_t>(s + 1) * features,
                  samples.begin() + static_cast<int64_t>(i) * features);
        labels[i] = train.labels[s];
      }
      absl::StatusOr<StepResult> r = model.TrainStep(
          View(train, samples, labels, count),
          LearningRateAt(lr, absl::GetFlag(FLAGS_warmup_steps), step++, total_steps));
      if (!r.ok()) return r.status();
      loss_sum += r->loss;
      skipped += r->skipped;
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    result.train_seconds += seconds;
    int64_t correct = 0;
    double test_loss = 0;
    for (int64_t first = 0; first < test.count; first += batch) {
      const int count = static_cast<int>(std::min<int64_t>(batch, test.count - first));
      BatchView view;
      view.samples = test.samples.data() + first * features;
      view.labels = test.labels.data() + first;
      view.count = count;
      absl::StatusOr<EvalResult> e = model.Evaluate(view);
      if (!e.ok()) return e.status();
      correct += e->correct;
      test_loss += e->loss_sum;
    }
    result.test_accuracy = static_cast<double>(correct) / test.count;
    std::cout << "run=" << name << " epoch=" << epoch + 1
              << " train_loss=" << loss_sum / batches_per_epoch
              << " test_loss=" << test_loss / test.count
              << " test_accuracy=" << result.test_accuracy << " epoch_seconds=" << seconds
              << " samples_per_second=" << train.count / seconds << " skipped_steps=" << skipped
              << std::endl;
  }
  std::cout << "summary run=" << name << " epochs=" << epochs
            << " test_accuracy=" << result.test_accuracy
            << " train_seconds=" << result.train_seconds << std::endl;
  return result;
}

Precision ParsePrecision(const std::string& text) {
  if (text == "fp16") return Precision::kFp16;
  if (text == "fp32") return Precision::kFp32;
  return Precision::kBf16;
}

}  // namespace

int BenchMain() {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  absl::StatusOr<LabeledSamples> train =
      LoadIdxDataset(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz",
                     absl::GetFlag(FLAGS_limit));
  absl::StatusOr<LabeledSamples> test =
      LoadIdxDataset(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz", 0);
  if (!train.ok() || !test.ok()) {
    std::cerr << "train_fmnist: " << (train.ok() ? test.status() : train.status()) << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  if (!backend.ok()) {
    std::cerr << "train_fmnist: " << backend.status() << "\n";
    return 1;
  }
  std::cout << "threads=" << omp_get_max_threads() << " train_samples=" << train->count
            << " test_samples=" << test->count << std::endl;
  const std::string which = absl::GetFlag(FLAGS_model);
  const int batch = absl::GetFlag(FLAGS_batch);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (which == "cnn" || which == "all") {
    NetworkConfig config;
    config.input_shape = {1, 28, 28};
    const int c1 = absl::GetFlag(FLAGS_channels1), c2 = absl::GetFlag(FLAGS_channels2);
    auto layer = [](Kind kind, int out_channels = 0, int kernel = 0, int padding = 0) {
      LayerConfig l;
      l.kind = kind;
      l.out_channels = out_channels;
      l.kernel = kernel;
      l.padding = padding;
      return l;
    };
    LayerConfig dropout = layer(Kind::kDropout);
    dropout.rate = static_cast<float>(absl::GetFlag(FLAGS_dropout));
    LayerConfig hidden = layer(Kind::kLinear), logits = layer(Kind::kLinear);
    hidden.units = absl::GetFlag(FLAGS_hidden);
    logits.units = 10;
    config.layers = {
        layer(Kind::kConv2d, c1, 3, 1),
        layer(Kind::kRelu),
        layer(Kind::kMaxPool2d, 0, 2),
        layer(Kind::kConv2d, c2, 3, 1),
        layer(Kind::kRelu),
        layer(Kind::kMaxPool2d, 0, 2),
        layer(Kind::kFlatten),
        hidden,
        layer(Kind::kRelu),
        dropout,
        logits,
    };
    config.classes = 10;
    config.max_batch = batch;
    config.precision = ParsePrecision(absl::GetFlag(FLAGS_precision));
    config.seed = seed;
    config.optimizer.learning_rate = absl::GetFlag(FLAGS_cnn_lr);
    config.optimizer.weight_decay = absl::GetFlag(FLAGS_weight_decay);
    if (absl::GetFlag(FLAGS_optimizer) == "adamw") {
      config.optimizer.type = OptimizerType::kAdamW;
    } else {
      config.optimizer.momentum = 0.9;
      config.optimizer.nesterov = true;
    }
    absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateNetwork(config);
    if (!model.ok()) {
      std::cerr << "train_fmnist: " << model.status() << "\n";
      return 1;
    }
    std::cout << "cnn forward_mflops_per_sample=" << NetworkForwardFlopsPerSample(config) / 1e6
              << std::endl;
    absl::StatusOr<RunResult> r =
        Train(absl::StrCat("cnn_", PrecisionName(config.precision)), **model, *train, *test,
              absl::GetFlag(FLAGS_cnn_epochs), batch, config.optimizer.learning_rate, seed);
    if (!r.ok()) {
      std::cerr << "train_fmnist: " << r.status() << "\n";
      return 1;
    }
  }
  if (which == "mlp" || which == "all") {
    for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
      MlpConfig config;  // 784-256-128-10
      config.max_batch = batch;
      config.precision = precision;
      config.seed = seed;
      config.optimizer.learning_rate = absl::GetFlag(FLAGS_mlp_lr);
      absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateMlp(config);
      if (!model.ok()) {
        std::cerr << "train_fmnist: " << model.status() << "\n";
        return 1;
      }
      absl::StatusOr<RunResult> r =
          Train(absl::StrCat("mlp_", PrecisionName(precision)), **model, *train, *test,
                absl::GetFlag(FLAGS_mlp_epochs), batch, config.optimizer.learning_rate, seed);
      if (!r.ok()) {
        std::cerr << "train_fmnist: " << r.status() << "\n";
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace stoker
