#include "worker/metrics/worker_metrics.h"

#include <deque>
#include <map>
#include <set>
#include <span>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics_exposer.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "worker/metrics/buckets.h"
#include "worker/metrics/nvml.h"

namespace stoker {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

namespace {

// `job` is the label Prometheus itself attaches to every scraped series (the scrape job's name);
// an exported `job` label would be renamed to `exported_job` on ingestion. See deploy/README.md.
constexpr char kJobLabel[] = "job_id";
constexpr char kDeviceLabel[] = "device";
constexpr char kRankLabel[] = "rank";
// Ended attempts remembered so that a late snapshot cannot resurrect their series.
constexpr size_t kEndedJobsRemembered = 1024;

// The increment that takes a monotone total from *last to `current`. A total that went down
// was restarted from zero (a new process), so all of it is new.
template <typename T>
T Advance(T current, T* last) {
  T delta = current >= *last ? current - *last : current;
  *last = current;
  return delta;
}

// Feeds one job's histogram from totals that grow between Update calls.
class HistogramFeeder {
 public:
  explicit HistogramFeeder(std::span<const double> bounds) : bounds_(bounds) {}

  void Reset() {
    last_buckets_.clear();
    last_sum_ = 0;
    last_count_ = 0;
    last_mean_sum_ = 0;
  }

  // Uses the exact bucket counts when they have the right shape, otherwise approximates from
  // (count_total, sum_total): the new observations are all put in their mean's bucket.
  void Feed(const HistogramTotals& totals, uint64_t count_total, double sum_total,
            Histogram& histogram) {
    if (totals.bucket_counts.size() == bounds_.size() + 1) {
      FeedBuckets(totals, histogram);
    } else {
      FeedMeans(count_total, sum_total, histogram);
    }
  }

 private:
  void FeedBuckets(const HistogramTotals& totals, Histogram& histogram) {
    bool restarted =
        last_buckets_.size() != totals.bucket_counts.size() || totals.sum_seconds < last_sum_;
    for (size_t i = 0; !restarted && i < totals.bucket_counts.size(); ++i) {
      restarted = totals.bucket_counts[i] < last_buckets_[i];
    }
    if (restarted) {
      last_buckets_.assign(totals.bucket_counts.size(), 0);
      last_sum_ = 0;
    }
    std::vector<double> increments(totals.bucket_counts.size());
    bool any = false;
    for (size_t i = 0; i < increments.size(); ++i) {
      increments[i] = static_cast<double>(totals.bucket_counts[i] - last_buckets_[i]);
      any = any || increments[i] > 0;
    }
    if (any) histogram.ObserveMultiple(increments, totals.sum_seconds - last_sum_);
    last_buckets_ = totals.bucket_counts;
    last_sum_ = totals.sum_seconds;
  }

  void FeedMeans(uint64_t count_total, double sum_total, Histogram& histogram) {
    if (count_total < last_count_ || sum_total < last_mean_sum_) {
      last_count_ = 0;
      last_mean_sum_ = 0;
    }
    uint64_t count = count_total - last_count_;
    // Time measured while no observation completed stays in the baseline until one does, so
    // that _sum and _count always describe the same observations.
    if (count == 0) return;
    double sum = sum_total - last_mean_sum_;
    std::vector<double> increments(bounds_.size() + 1, 0.0);
    increments[BucketIndex(bounds_, sum / static_cast<double>(count))] = static_cast<double>(count);
    histogram.ObserveMultiple(increments, sum);
    last_count_ = count_total;
    last_mean_sum_ = sum_total;
  }

  std::span<const double> bounds_;
  std::vector<uint64_t> last_buckets_;
  double last_sum_ = 0;
  uint64_t last_count_ = 0;
  double last_mean_sum_ = 0;
};

Histogram::BucketBoundaries ToBoundaries(std::span<const double> bounds) {
  return Histogram::BucketBoundaries(bounds.begin(), bounds.end());
}

}  // namespace

struct WorkerMetrics::Impl {
  std::string worker_id;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  std::unique_ptr<Nvml> nvml;

  // Families; owned by the registry.
  Family<Gauge>* gpu_utilization = nullptr;
  Family<Gauge>* gpu_memory_used = nullptr;
  Family<Gauge>* gpu_memory_total = nullptr;
  Family<Gauge>* gpu_info = nullptr;
  Family<Counter>* device_busy = nullptr;
  Family<Counter>* data_stall = nullptr;
  Family<Gauge>* ring_filled = nullptr;
  Family<Gauge>* loader_processes = nullptr;
  Family<Counter>* loader_batches = nullptr;
  Family<Histogram>* loader_batch_seconds = nullptr;
  Family<Counter>* loader_restarts = nullptr;
  Family<Counter>* loader_bad_samples = nullptr;
  Family<Counter>* h2d_bytes = nullptr;
  Family<Counter>* samples = nullptr;
  Family<Histogram>* step_seconds = nullptr;
  Family<Gauge>* loss = nullptr;
  Family<Gauge>* eval_accuracy = nullptr;
  Family<Gauge>* loss_scale = nullptr;
  Family<Counter>* skipped_steps = nullptr;
  Family<Gauge>* epoch = nullptr;
  Family<Counter>* allreduce_seconds = nullptr;
  Family<Counter>* allreduce_exposed_seconds = nullptr;
  Family<Counter>* allreduce_bytes = nullptr;
  Family<Counter>* allreduce_calls = nullptr;
  Gauge* last_heartbeat = nullptr;  // stoker_worker_last_heartbeat_timestamp_seconds{worker}

  // One running job's series and the totals its counters were last advanced to.
  struct JobSeries {
    Labels labels;
    uint32_t attempt = 0;
    JobCounters last;
    HistogramFeeder step_feeder{kStepSecondsBounds};
    HistogramFeeder loader_feeder{kLoaderBatchSecondsBounds};
    Counter* device_busy = nullptr;
    Counter* data_stall = nullptr;
    Gauge* ring_filled = nullptr;
    Gauge* loader_processes = nullptr;
    Counter* loader_batches = nullptr;
    Histogram* loader_batch_seconds = nullptr;
    Counter* loader_restarts = nullptr;
    Counter* loader_bad_samples = nullptr;
    Counter* h2d_bytes = nullptr;
    Counter* samples = nullptr;
    Histogram* step_seconds = nullptr;
    Gauge* loss = nullptr;  // these three appear with their first value
    Gauge* eval_accuracy = nullptr;
    Gauge* loss_scale = nullptr;
    Counter* skipped_steps = nullptr;
    Gauge* epoch = nullptr;
    // Data-parallel jobs only.
    Counter* allreduce_seconds = nullptr;
    Counter* allreduce_exposed_seconds = nullptr;
    Counter* allreduce_bytes = nullptr;
    Counter* allreduce_calls = nullptr;
  };

  // One GPU's series; `labels` carries the job running on it, if any.
  struct GpuSeries {
    Labels labels;
    Gauge* utilization = nullptr;
    Gauge* memory_used = nullptr;
    Gauge* memory_total = nullptr;
  };

  absl::Mutex mu;
  // By (job id, rank).
  std::map<std::pair<std::string, int>, JobSeries> jobs ABSL_GUARDED_BY(mu);
  std::map<int, GpuSeries> gpus ABSL_GUARDED_BY(mu);
  std::set<int> gpus_with_info ABSL_GUARDED_BY(mu);
  // (job id, rank, attempt) of ended attempts, oldest first.
  using EndedAttempt = std::tuple<std::string, int, uint32_t>;
  std::set<EndedAttempt> ended ABSL_GUARDED_BY(mu);
  std::deque<EndedAttempt> ended_order ABSL_GUARDED_BY(mu);

  template <typename T>
  Family<T>& Build(prometheus::detail::Builder<T> builder, const char* name, const char* help) {
    return builder.Name(name).Help(help).Labels({{"worker", worker_id}}).Register(*registry);
  }

  void RegisterFamilies() {
    gpu_utilization = &Build(prometheus::BuildGauge(), "stoker_gpu_utilization_ratio",
                             "Share of the last NVML sample period in which a kernel ran (0..1).");
    gpu_memory_used = &Build(prometheus::BuildGauge(), "stoker_gpu_memory_used_bytes",
                             "Device memory in use, from NVML.");
    gpu_memory_total = &Build(prometheus::BuildGauge(), "stoker_gpu_memory_total_bytes",
                              "Device memory installed, from NVML.");
    gpu_info = &Build(prometheus::BuildGauge(), "stoker_gpu_info",
                      "Always 1; name and uuid of each GPU (uuid joins dcgm-exporter's UUID).");
    device_busy = &Build(prometheus::BuildCounter(), "stoker_device_busy_seconds_total",
                         "Time the device computed training steps.");
    data_stall = &Build(prometheus::BuildCounter(), "stoker_data_stall_seconds_total",
                        "Time the device sat idle because the next batch was not ready.");
    ring_filled = &Build(prometheus::BuildGauge(), "stoker_ring_filled_slots",
                         "Ring slots holding a batch the trainer has not consumed yet.");
    loader_processes = &Build(prometheus::BuildGauge(), "stoker_loader_processes",
                              "Loader processes making the job's batches now (loader.processes: "
                              "auto grows and shrinks it).");
    loader_batches = &Build(prometheus::BuildCounter(), "stoker_loader_batches_total",
                            "Batches the loaders wrote into the ring.");
    loader_batch_seconds = &Build(prometheus::BuildHistogram(), "stoker_loader_batch_seconds",
                                  "Time a loader took to make one batch.");
    loader_restarts = &Build(prometheus::BuildCounter(), "stoker_loader_restarts_total",
                             "Loader processes respawned after they died.");
    loader_bad_samples =
        &Build(prometheus::BuildCounter(), "stoker_loader_bad_samples_total",
               "Samples the loaders skipped because they could not be decoded (corrupt or "
               "truncated images; each is named in the job's log).");
    h2d_bytes = &Build(prometheus::BuildCounter(), "stoker_h2d_bytes_total",
                       "Bytes copied from the ring to the device.");
    samples =
        &Build(prometheus::BuildCounter(), "stoker_samples_total", "Training samples processed.");
    step_seconds = &Build(prometheus::BuildHistogram(), "stoker_step_seconds",
                          "Device time of one training step.");
    loss = &Build(prometheus::BuildGauge(), "stoker_loss", "Training loss of the last step.");
    eval_accuracy = &Build(prometheus::BuildGauge(), "stoker_eval_accuracy_ratio",
                           "Test accuracy at the last evaluation (0..1).");
    loss_scale =
        &Build(prometheus::BuildGauge(), "stoker_loss_scale", "Current dynamic loss scale (fp16).");
    skipped_steps = &Build(prometheus::BuildCounter(), "stoker_skipped_steps_total",
                           "Steps skipped because gradients overflowed (fp16).");
    epoch = &Build(prometheus::BuildGauge(), "stoker_epoch", "Epoch the job is in (0-based).");
    allreduce_seconds =
        &Build(prometheus::BuildCounter(), "stoker_allreduce_seconds_total",
               "Data-parallel jobs: time this rank spent summing gradients with the other ranks "
               "(overlapped with backward or not).");
    allreduce_exposed_seconds =
        &Build(prometheus::BuildCounter(), "stoker_allreduce_exposed_seconds_total",
               "Data-parallel jobs: the part of the all-reduce time backward did not hide (the "
               "step waited for it).");
    allreduce_bytes = &Build(prometheus::BuildCounter(), "stoker_allreduce_bytes_total",
                             "Data-parallel jobs: gradient bytes this rank summed.");
    allreduce_calls =
        &Build(prometheus::BuildCounter(), "stoker_allreduce_calls_total",
               "Data-parallel jobs: gradient all-reduce calls (buckets) of this rank.");
    last_heartbeat =
        &Build(prometheus::BuildGauge(), "stoker_worker_last_heartbeat_timestamp_seconds",
               "Unix time of the last heartbeat the server answered (0: none yet).")
             .Add({});
  }

  void AddJobSeries(JobSeries& series) {
    const Labels& l = series.labels;
    series.device_busy = &device_busy->Add(l);
    series.data_stall = &data_stall->Add(l);
    series.ring_filled = &ring_filled->Add(l);
    series.loader_processes = &loader_processes->Add(l);
    series.loader_batches = &loader_batches->Add(l);
    series.loader_batch_seconds =
        &loader_batch_seconds->Add(l, ToBoundaries(kLoaderBatchSecondsBounds));
    series.loader_restarts = &loader_restarts->Add(l);
    series.loader_bad_samples = &loader_bad_samples->Add(l);
    series.h2d_bytes = &h2d_bytes->Add(l);
    series.samples = &samples->Add(l);
    series.step_seconds = &step_seconds->Add(l, ToBoundaries(kStepSecondsBounds));
    series.skipped_steps = &skipped_steps->Add(l);
    series.epoch = &epoch->Add(l);
    if (l.contains(kRankLabel)) {
      series.allreduce_seconds = &allreduce_seconds->Add(l);
      series.allreduce_exposed_seconds = &allreduce_exposed_seconds->Add(l);
      series.allreduce_bytes = &allreduce_bytes->Add(l);
      series.allreduce_calls = &allreduce_calls->Add(l);
    }
  }

  void RemoveJobSeries(JobSeries& series) {
    device_busy->Remove(series.device_busy);
    data_stall->Remove(series.data_stall);
    ring_filled->Remove(series.ring_filled);
    loader_processes->Remove(series.loader_processes);
    loader_batches->Remove(series.loader_batches);
    loader_batch_seconds->Remove(series.loader_batch_seconds);
    loader_restarts->Remove(series.loader_restarts);
    loader_bad_samples->Remove(series.loader_bad_samples);
    h2d_bytes->Remove(series.h2d_bytes);
    samples->Remove(series.samples);
    step_seconds->Remove(series.step_seconds);
    skipped_steps->Remove(series.skipped_steps);
    epoch->Remove(series.epoch);
    if (series.allreduce_seconds != nullptr) {
      allreduce_seconds->Remove(series.allreduce_seconds);
      allreduce_exposed_seconds->Remove(series.allreduce_exposed_seconds);
      allreduce_bytes->Remove(series.allreduce_bytes);
      allreduce_calls->Remove(series.allreduce_calls);
    }
    if (series.loss != nullptr) loss->Remove(series.loss);
    if (series.eval_accuracy != nullptr) eval_accuracy->Remove(series.eval_accuracy);
    if (series.loss_scale != nullptr) loss_scale->Remove(series.loss_scale);
  }

  static void SetOptional(Family<Gauge>* family, const Labels& labels,
                          const std::optional<double>& value, Gauge** gauge) {
    if (!value.has_value()) return;
    if (*gauge == nullptr) *gauge = &family->Add(labels);
    (*gauge)->Set(*value);
  }

  void ApplyJob(const JobCounters& now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const std::pair<std::string, int> key(now.job_id, now.data_parallel ? now.rank : 0);
    auto it = jobs.find(key);
    if (it != jobs.end() && (it->second.labels.at(kDeviceLabel) != now.device ||
                             it->second.labels.contains(kRankLabel) != now.data_parallel)) {
      // Moved to another device (a new attempt placed elsewhere): new label set.
      RemoveJobSeries(it->second);
      jobs.erase(it);
      it = jobs.end();
    }
    if (it == jobs.end()) {
      it = jobs.try_emplace(key).first;
      it->second.labels = {{kJobLabel, now.job_id}, {kDeviceLabel, now.device}};
      if (now.data_parallel) it->second.labels[kRankLabel] = absl::StrCat(now.rank);
      it->second.attempt = now.attempt;
      AddJobSeries(it->second);
    }
    JobSeries& series = it->second;
    if (series.attempt != now.attempt) {
      // A new attempt's totals start from zero; counters continue from where they were.
      series.attempt = now.attempt;
      series.last = JobCounters{};
      series.step_feeder.Reset();
      series.loader_feeder.Reset();
    }
    JobCounters& last = series.last;
    series.samples->Increment(static_cast<double>(Advance(now.samples_total, &last.samples_total)));
    series.skipped_steps->Increment(
        static_cast<double>(Advance(now.skipped_steps_total, &last.skipped_steps_total)));
    series.data_stall->Increment(Advance(now.data_stall_seconds, &last.data_stall_seconds));
    series.device_busy->Increment(Advance(now.device_busy_seconds, &last.device_busy_seconds));
    series.loader_batches->Increment(
        static_cast<double>(Advance(now.loader_batches_total, &last.loader_batches_total)));
    series.loader_restarts->Increment(
        static_cast<double>(Advance(now.loader_restarts_total, &last.loader_restarts_total)));
    series.loader_bad_samples->Increment(
        static_cast<double>(Advance(now.loader_bad_samples_total, &last.loader_bad_samples_total)));
    series.h2d_bytes->Increment(
        static_cast<double>(Advance(now.h2d_bytes_total, &last.h2d_bytes_total)));
    series.ring_filled->Set(now.ring_filled_slots);
    series.loader_processes->Set(now.loader_processes);
    series.epoch->Set(static_cast<double>(now.epoch));
    SetOptional(loss, series.labels, now.loss, &series.loss);
    SetOptional(loss_scale, series.labels, now.loss_scale, &series.loss_scale);
    SetOptional(eval_accuracy, series.labels, now.eval_accuracy, &series.eval_accuracy);
    series.step_feeder.Feed(now.step_seconds, now.steps_total, now.device_busy_seconds,
                            *series.step_seconds);
    series.loader_feeder.Feed(now.loader_batch_seconds, now.loader_batches_total,
                              now.loader_busy_seconds, *series.loader_batch_seconds);
    if (series.allreduce_seconds != nullptr) {
      series.allreduce_seconds->Increment(Advance(now.allreduce_seconds, &last.allreduce_seconds));
      series.allreduce_exposed_seconds->Increment(
          Advance(now.allreduce_exposed_seconds, &last.allreduce_exposed_seconds));
      series.allreduce_bytes->Increment(
          static_cast<double>(Advance(now.allreduce_bytes_total, &last.allreduce_bytes_total)));
      series.allreduce_calls->Increment(
          static_cast<double>(Advance(now.allreduce_calls_total, &last.allreduce_calls_total)));
    }
  }

  void ApplyGpus(const std::vector<GpuReading>& readings,
                 const std::map<int, std::string>& job_by_gpu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const GpuReading& reading : readings) {
      std::string device = absl::StrCat("gpu", reading.index);
      if (gpus_with_info.insert(reading.index).second) {
        gpu_info->Add({{kDeviceLabel, device}, {"name", reading.name}, {"uuid", reading.uuid}})
            .Set(1);
      }
      Labels labels = {{kDeviceLabel, device}};
      if (auto job = job_by_gpu.find(reading.index); job != job_by_gpu.end()) {
        labels[kJobLabel] = job->second;
      }
      GpuSeries& series = gpus[reading.index];
      if (series.labels != labels) {
        RemoveGpuSeries(series);
        series.labels = std::move(labels);
      }
      SetOptional(gpu_utilization, series.labels, reading.utilization_ratio, &series.utilization);
      if (reading.memory_used_bytes.has_value()) {
        SetOptional(gpu_memory_used, series.labels, static_cast<double>(*reading.memory_used_bytes),
                    &series.memory_used);
        SetOptional(gpu_memory_total, series.labels,
                    static_cast<double>(*reading.memory_total_bytes), &series.memory_total);
      }
    }
  }

  void RemoveGpuSeries(GpuSeries& series) {
    if (series.utilization != nullptr) gpu_utilization->Remove(series.utilization);
    if (series.memory_used != nullptr) gpu_memory_used->Remove(series.memory_used);
    if (series.memory_total != nullptr) gpu_memory_total->Remove(series.memory_total);
    series = GpuSeries{};
  }
};

WorkerMetrics::WorkerMetrics() : impl_(std::make_unique<Impl>()) {}
WorkerMetrics::~WorkerMetrics() = default;

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(
    const WorkerMetricsOptions& options) {
  std::unique_ptr<WorkerMetrics> metrics(new WorkerMetrics());
  Impl& impl = *metrics->impl_;
  impl.worker_id = options.worker_id;
  impl.RegisterFamilies();
  if (!options.nvml_library.empty()) impl.nvml = Nvml::Load(options.nvml_library);
  if (!options.listen_address.empty()) {
    absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer =
        StartMetricsExposer(options.listen_address);
    if (!exposer.ok()) return exposer.status();
    impl.exposer = *std::move(exposer);
    impl.exposer->RegisterCollectable(impl.registry);
  }
  return metrics;
}

int WorkerMetrics::Port() const { return MetricsExposerPort(impl_->exposer.get()); }

std::string WorkerMetrics::NvmlStatus() const {
  if (impl_->nvml == nullptr) return "NVML disabled";
  if (!impl_->nvml->Available()) {
    return absl::StrCat("NVML unavailable: ", impl_->nvml->UnavailableReason());
  }
  return absl::StrCat("NVML: ", impl_->nvml->DeviceCount(), " GPUs");
}

void WorkerMetrics::Update(const std::vector<JobCounters>& jobs) {
  std::vector<GpuReading> readings;
  if (impl_->nvml != nullptr) readings = impl_->nvml->Read();  // outside the lock: slow-ish
  absl::MutexLock lock(&impl_->mu);
  std::map<int, std::string> job_by_gpu;
  for (const JobCounters& job : jobs) {
    const int rank = job.data_parallel ? job.rank : 0;
    if (impl_->ended.count({job.job_id, rank, job.attempt}) > 0) continue;  // a late snapshot
    impl_->ApplyJob(job);
    for (int index : job.gpu_indices) job_by_gpu[index] = job.job_id;
  }
  impl_->ApplyGpus(readings, job_by_gpu);
}

void WorkerMetrics::HeartbeatAnswered(absl::Time at) {
  impl_->last_heartbeat->Set(absl::ToDoubleSeconds(at - absl::UnixEpoch()));
}

void WorkerMetrics::JobEnded(absl::string_view job_id, int rank) {
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->jobs.find({std::string(job_id), rank});
  if (it == impl_->jobs.end()) return;
  Impl::EndedAttempt key(it->first.first, it->first.second, it->second.attempt);
  if (impl_->ended.insert(key).second) {
    impl_->ended_order.push_back(key);
    if (impl_->ended_order.size() > kEndedJobsRemembered) {
      impl_->ended.erase(impl_->ended_order.front());
      impl_->ended_order.pop_front();
    }
  }
  impl_->RemoveJobSeries(it->second);
  impl_->jobs.erase(it);
  // GPUs the job ran on lose its label now rather than at the next Update.
  for (auto& [index, series] : impl_->gpus) {
    auto label = series.labels.find(kJobLabel);
    if (label != series.labels.end() && label->second == std::get<0>(key)) {
      impl_->RemoveGpuSeries(series);
    }
  }
}

std::string WorkerMetrics::Scrape() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace stoker
