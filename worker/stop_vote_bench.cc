// What the data-parallel stop vote costs (TrainingLoop, DataParallelContext): two ranks on
// threads of this process (real Gloo over loopback, the bucketed reducer, real in-process
// loaders), the Fashion-MNIST MLP 784-256-128-10 on synthetic samples, timed with a vote after
// every step and with the default (about every 0.5 s). Prints samples/s of each, the median of
// --runs runs.
//   build/worker/stop_vote_bench [--samples 16384] [--batch 64] [--runs 3]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "comm/collective.h"
#include "data/dataset.h"
#include "data/job_region.h"
#include "data/loader.h"
#include "engine/backend.h"
#include "worker/job_runner.h"
#include "worker/training_loop.h"

namespace stoker {
namespace {

LabeledSamples Synthetic(int count) {
  LabeledSamples data;
  data.count = count;
  data.features = 784;
  data.sample_bytes = 784;
  data.sample_dims = {784};
  data.classes = 10;
  std::mt19937 random(1);
  data.samples.resize(size_t(count) * 784);
  for (uint8_t& v : data.samples) v = static_cast<uint8_t>(random());
  for (int i = 0; i < count; ++i) data.labels.push_back(static_cast<uint8_t>(random() % 10));
  return data;
}

// Samples/s of two ranks over `data` (both ranks' samples over the slower rank's time).
double TwoRanks(const LabeledSamples& data, int batch, uint64_t vote_every_steps) {
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  std::vector<double> seconds(2, 0);
  std::vector<std::thread> ranks;
  static int round = 0;
  const std::string prefix = "bench/" + std::to_string(round++) + "/";
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      RingGeometry geometry;
      geometry.slot_count = 8;
      geometry.batch_size = batch;
      geometry.sample_bytes = 784;
      geometry.loader_count = 1;
      geometry.total_batches = RankTotalBatches(data.count, batch, 2, 1);
      std::unique_ptr<JobRegion> region = *JobRegion::Create(geometry);
      region->SetConsumerPid(getpid());
      std::thread loader([&] {
        LoaderOptions options{.index = 0, .seed = 7, .delay_ms = 0, .augment = {}};
        options.rank = rank;
        options.replicas = 2;
        (void)RunLoader(*region, data, options);
      });
      std::unique_ptr<Backend> backend = *CreateCpuBackend();
      MlpConfig config;
      config.input_features = 784;
      config.hidden = {256, 128};
      config.classes = 10;
      config.max_batch = batch;
      std::unique_ptr<Model> model = *backend->CreateMlp(config);
      std::unique_ptr<Collective> collective = *ConnectGloo({.rank = rank,
                                                             .size = 2,
                                                             .host = "127.0.0.1",
                                                             .store_prefix = prefix,
                                                             .timeout = absl::Seconds(60)},
                                                            *store);
      std::unique_ptr<BucketedReducer> reducer =
          CreateBucketedReducer(*collective, {.global_batch = 2 * batch});
      TrainingLoopOptions options;
      options.optimizer.set_lr(0.01);
      options.epochs = 1;
      options.eval_batch_size = batch;
      options.report_interval = absl::InfiniteDuration();
      options.data_parallel = DataParallelContext{.reducer = reducer.get(),
                                                  .collective = collective.get(),
                                                  .train_samples = data.count,
                                                  .stop_vote_every_steps = vote_every_steps};
      SamplesView no_test = View(data);
      no_test.count = 0;  // time training only
      TrainingLoop loop(
          *region, *model, no_test, options, [](const v1::JobEvent&) {}, nullptr);
      const absl::Time start = absl::Now();
      const absl::Status status = loop.Run();
      seconds[rank] = absl::ToDoubleSeconds(absl::Now() - start);
      if (!status.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
      region->RequestStop();
      loader.join();
    });
  }
  for (std::thread& t : ranks) t.join();
  return data.count / std::max(seconds[0], seconds[1]);
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) {
  CLI::App app{"stop_vote_bench: what the data-parallel stop vote costs"};
  int samples = 16384, batch = 64, runs = 3;
  app.add_option("--samples", samples)->check(CLI::Range(256, 1 << 22));
  app.add_option("--batch", batch)->check(CLI::Range(1, 4096));
  app.add_option("--runs", runs)->check(CLI::Range(1, 50));
  CLI11_PARSE(app, argc, argv);
  const stoker::LabeledSamples data = stoker::Synthetic(samples);
  // Interleaved, so that the machine's other load falls on both alike.
  std::vector<double> rates_of[2];
  for (int r = 0; r < runs; ++r) {
    for (uint64_t every : {uint64_t{0}, uint64_t{1}}) {
      rates_of[every].push_back(stoker::TwoRanks(data, batch, every));
    }
  }
  for (uint64_t every : {uint64_t{0}, uint64_t{1}}) {
    std::vector<double>& rates = rates_of[every];
    std::sort(rates.begin(), rates.end());
    std::printf("vote %-22s %8.0f samples/s (median of %d; %d samples, batch %d per rank)\n",
                every == 0 ? "about every 0.5 s:" : "after every step:", rates[rates.size() / 2],
                runs, samples, batch);
  }
}
