#include "server/metrics/server_metrics.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics_exposer.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace stoker {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

constexpr const char* kJobStates[] = {"queued", "running",   "succeeded",
                                      "failed", "cancelled", "stopped"};
constexpr size_t kMaxRpcMethods = 64;

// Seconds: an idle cluster assigns within a heartbeat (~1 s); a busy one queues for hours.
const Histogram::BucketBoundaries kQueueWaitBounds = {
    0.1, 0.5, 1, 2.5, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400};
// Unary RPCs take ~1 ms; WatchJob streams for a job's whole run.
const Histogram::BucketBoundaries kRpcBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                0.05,   0.1,   0.25,   0.5,   1,    2.5,
                                                5,      10,    30,     60,    300,  3600};

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "OK", "NOT_FOUND", ...; gRPC and absl share the numbering.
std::string CodeName(int code) {
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? absl::StrCat(code) : name;
}

// "/stoker.v1.JobService/SubmitJob" -> "JobService/SubmitJob".
std::string ShortMethod(absl::string_view method) {
  if (!method.empty() && method.front() == '/') method.remove_prefix(1);
  size_t slash = method.find('/');
  size_t dot = method.substr(0, slash).rfind('.');
  if (slash != absl::string_view::npos && dot != absl::string_view::npos) {
    method.remove_prefix(dot + 1);
  }
  return std::string(method);
}

}  // namespace

struct ServerMetrics::Impl : public prometheus::Collectable {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  ServerMetrics* owner = nullptr;

  Family<Gauge>* jobs = nullptr;
  Family<Gauge>* oldest_queued = nullptr;
  Family<Histogram>* queue_wait = nullptr;
  Family<Gauge>* workers = nullptr;
  Family<Counter>* requeued = nullptr;
  Family<Gauge>* heartbeat_age = nullptr;
  Family<Counter>* checkpoint_write_failures = nullptr;
  Family<Gauge>* checkpoint_dir_free = nullptr;
  Family<Counter>* rpc_requests = nullptr;
  Family<Histogram>* scheduling_pass = nullptr;
  std::map<std::string, Histogram*> scheduling_pass_by_kind ABSL_GUARDED_BY(mu);
  Family<Gauge>* team_quota = nullptr;
  Family<Gauge>* team_usage = nullptr;
  Family<Gauge>* team_weight = nullptr;
  Family<Gauge>* team_share = nullptr;
  Family<Gauge>* team_waiting = nullptr;
  Family<Counter>* team_preemptions = nullptr;
  // The team series set last (SetTeams), by their labels, to remove those that went.
  std::map<std::map<std::string, std::string>, Gauge*> team_gauges_by_family[5] ABSL_GUARDED_BY(mu);
  std::map<std::string, std::pair<Counter*, int64_t>> team_preemption_counters ABSL_GUARDED_BY(mu);
  Family<Histogram>* rpc_duration = nullptr;

  Gauge* oldest_queued_gauge = nullptr;
  Histogram* queue_wait_histogram = nullptr;
  Counter* requeued_counter = nullptr;
  Counter* checkpoint_write_failures_counter = nullptr;
  Gauge* checkpoint_dir_free_gauge = nullptr;

  mutable absl::Mutex mu;
  std::function<void(ServerMetrics&)> hook ABSL_GUARDED_BY(mu);
  std::map<std::string, Gauge*> jobs_by_state ABSL_GUARDED_BY(mu);
  std::map<std::string, Gauge*> workers_by_state ABSL_GUARDED_BY(mu);
  std::map<std::string, Gauge*> heartbeat_by_worker ABSL_GUARDED_BY(mu);
  std::map<std::string, Histogram*> rpc_duration_by_method ABSL_GUARDED_BY(mu);

  // Registered with the exposer before `registry`, so it runs first in every scrape: it exports
  // nothing itself, it only lets the hook refresh the gauges.
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::function<void(ServerMetrics&)> current;
    {
      absl::MutexLock lock(&mu);
      current = hook;
    }
    if (current) current(*owner);
    return {};
  }

  void RegisterFamilies() {
    jobs = &prometheus::BuildGauge()
                .Name("stoker_jobs")
                .Help("Jobs in each state.")
                .Register(*registry);
    oldest_queued = &prometheus::BuildGauge()
                         .Name("stoker_queue_oldest_job_age_seconds")
                         .Help("How long the oldest queued job has waited; 0 with no queue.")
                         .Register(*registry);
    queue_wait = &prometheus::BuildHistogram()
                      .Name("stoker_queue_wait_seconds")
                      .Help("Time from submit (or requeue) to assignment to a worker.")
                      .Register(*registry);
    workers = &prometheus::BuildGauge()
                   .Name("stoker_workers")
                   .Help("Registered workers in each state.")
                   .Register(*registry);
    requeued = &prometheus::BuildCounter()
                    .Name("stoker_jobs_requeued_total")
                    .Help("Running jobs put back in the queue (lease lost, retried failure).")
                    .Register(*registry);
    heartbeat_age = &prometheus::BuildGauge()
                         .Name("stoker_worker_heartbeat_age_seconds")
                         .Help("Seconds since the worker's last heartbeat.")
                         .Register(*registry);
    checkpoint_write_failures =
        &prometheus::BuildCounter()
             .Name("stoker_server_checkpoint_write_failures_total")
             .Help("Checkpoint uploads the server could not write (full disk, quota, I/O error).")
             .Register(*registry);
    checkpoint_dir_free = &prometheus::BuildGauge()
                               .Name("stoker_server_checkpoint_dir_free_bytes")
                               .Help("Free bytes on the checkpoint directory's file system.")
                               .Register(*registry);
    rpc_requests = &prometheus::BuildCounter()
                        .Name("stoker_rpc_requests_total")
                        .Help("RPCs answered, by method and status code.")
                        .Register(*registry);
    rpc_duration = &prometheus::BuildHistogram()
                        .Name("stoker_rpc_duration_seconds")
                        .Help("Time from an RPC's start to its status (whole stream for streams).")
                        .Register(*registry);
    scheduling_pass = &prometheus::BuildHistogram()
                           .Name("stoker_scheduling_pass_seconds")
                           .Help(
                               "Scheduling passes: a heartbeat's (assign) or the sweep's "
                               "victim choice (preemption).")
                           .Register(*registry);
    team_quota = &prometheus::BuildGauge()
                      .Name("stoker_team_quota")
                      .Help(
                          "A team's nominal quota and borrowing limit on a resource (gpus, "
                          "cpus, memory bytes).")
                      .Register(*registry);
    team_usage = &prometheus::BuildGauge()
                      .Name("stoker_team_usage")
                      .Help("What a team's running jobs are granted now, per resource.")
                      .Register(*registry);
    team_weight = &prometheus::BuildGauge()
                       .Name("stoker_team_weight")
                       .Help("A team's fair-share weight.")
                       .Register(*registry);
    team_share = &prometheus::BuildGauge()
                      .Name("stoker_team_share")
                      .Help(
                          "A team's dominant share (decayed usage and current allocation, "
                          "over its weight).")
                      .Register(*registry);
    team_waiting = &prometheus::BuildGauge()
                        .Name("stoker_team_waiting_jobs")
                        .Help("A team's queued jobs.")
                        .Register(*registry);
    team_preemptions = &prometheus::BuildCounter()
                            .Name("stoker_team_preemptions_total")
                            .Help("A team's jobs preempted since the server started.")
                            .Register(*registry);
    oldest_queued_gauge = &oldest_queued->Add({});
    queue_wait_histogram = &queue_wait->Add({}, kQueueWaitBounds);
    requeued_counter = &requeued->Add({});
    checkpoint_write_failures_counter = &checkpoint_write_failures->Add({});
    absl::MutexLock lock(&mu);
    for (const char* state : kJobStates) jobs_by_state[state] = &jobs->Add({{"state", state}});
  }
};

ServerMetrics::ServerMetrics() : impl_(std::make_shared<Impl>()) { impl_->owner = this; }
ServerMetrics::~ServerMetrics() {
  // Stop serving before the hook's captures and the families go away.
  impl_->exposer.reset();
}

absl::StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::Create(
    const std::string& listen_address) {
  std::unique_ptr<ServerMetrics> metrics(new ServerMetrics());
  Impl& impl = *metrics->impl_;
  impl.RegisterFamilies();
  if (!listen_address.empty()) {
    absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer =
        StartMetricsExposer(listen_address);
    if (!exposer.ok()) return exposer.status();
    impl.exposer = *std::move(exposer);
    impl.exposer->RegisterCollectable(metrics->impl_);  // the hook first
    impl.exposer->RegisterCollectable(impl.registry);
  }
  return metrics;
}

int ServerMetrics::Port() const { return MetricsExposerPort(impl_->exposer.get()); }

void ServerMetrics::SetScrapeHook(std::function<void(ServerMetrics&)> hook) {
  absl::MutexLock lock(&impl_->mu);
  impl_->hook = std::move(hook);
}

void ServerMetrics::SetJobCounts(const std::map<std::string, int64_t>& jobs_by_state) {
  absl::MutexLock lock(&impl_->mu);
  for (auto& [state, gauge] : impl_->jobs_by_state) gauge->Set(0);
  for (const auto& [state, count] : jobs_by_state) {
    Gauge*& gauge = impl_->jobs_by_state[state];
    if (gauge == nullptr) gauge = &impl_->jobs->Add({{"state", state}});
    gauge->Set(static_cast<double>(count));
  }
}

void ServerMetrics::SetOldestQueuedJobAge(double seconds) {
  impl_->oldest_queued_gauge->Set(seconds);
}

void ServerMetrics::ObserveQueueWait(double seconds) {
  impl_->queue_wait_histogram->Observe(seconds);
}

void ServerMetrics::SetWorkerCounts(const std::map<std::string, int64_t>& workers_by_state) {
  absl::MutexLock lock(&impl_->mu);
  for (auto& [state, gauge] : impl_->workers_by_state) gauge->Set(0);
  for (const auto& [state, count] : workers_by_state) {
    Gauge*& gauge = impl_->workers_by_state[state];
    if (gauge == nullptr) gauge = &impl_->workers->Add({{"state", state}});
    gauge->Set(static_cast<double>(count));
  }
}

void ServerMetrics::JobRequeued() { impl_->requeued_counter->Increment(); }

void ServerMetrics::SetHeartbeatAges(const std::map<std::string, double>& age_seconds_by_worker) {
  absl::MutexLock lock(&impl_->mu);
  auto& gauges = impl_->heartbeat_by_worker;
  for (auto it = gauges.begin(); it != gauges.end();) {
    if (age_seconds_by_worker.count(it->first) == 0) {
      impl_->heartbeat_age->Remove(it->second);
      it = gauges.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [worker, age] : age_seconds_by_worker) {
    Gauge*& gauge = gauges[worker];
    if (gauge == nullptr) gauge = &impl_->heartbeat_age->Add({{"worker", worker}});
    gauge->Set(age);
  }
}

void ServerMetrics::ObserveSchedulingPass(const std::string& pass, double seconds) {
  static const Histogram::BucketBoundaries kBounds = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                                      0.05,   0.1,   0.2,   0.5,   1,    2};
  absl::MutexLock lock(&impl_->mu);
  Histogram*& histogram = impl_->scheduling_pass_by_kind[pass];
  if (histogram == nullptr) histogram = &impl_->scheduling_pass->Add({{"pass", pass}}, kBounds);
  histogram->Observe(seconds);
}

void ServerMetrics::SetTeams(const std::map<std::string, TeamValues>& teams) {
  absl::MutexLock lock(&impl_->mu);
  Family<Gauge>* families[5] = {impl_->team_quota, impl_->team_usage, impl_->team_weight,
                                impl_->team_share, impl_->team_waiting};
  std::map<std::map<std::string, std::string>, double> values[5];
  for (const auto& [name, team] : teams) {
    const std::string label = name.empty() ? "none" : name;
    for (const auto& [resource, limits] : team.quota) {
      values[0][{{"team", label}, {"resource", resource}, {"limit", "nominal"}}] =
          static_cast<double>(limits.first);
      values[0][{{"team", label}, {"resource", resource}, {"limit", "borrow"}}] =
          static_cast<double>(limits.second);
    }
    for (const auto& [resource, used] : team.usage) {
      values[1][{{"team", label}, {"resource", resource}}] = static_cast<double>(used);
    }
    values[2][{{"team", label}}] = team.weight;
    values[3][{{"team", label}}] = team.share;
    values[4][{{"team", label}}] = static_cast<double>(team.waiting_jobs);
    auto& [counter, seen] = impl_->team_preemption_counters[label];
    if (counter == nullptr) counter = &impl_->team_preemptions->Add({{"team", label}});
    if (team.preemptions > seen) {
      counter->Increment(static_cast<double>(team.preemptions - seen));
      seen = team.preemptions;
    }
  }
  for (int f = 0; f < 5; ++f) {
    auto& gauges = impl_->team_gauges_by_family[f];
    for (auto it = gauges.begin(); it != gauges.end();) {
      if (!values[f].contains(it->first)) {
        families[f]->Remove(it->second);
        it = gauges.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [labels, value] : values[f]) {
      Gauge*& gauge = gauges[labels];
      if (gauge == nullptr) gauge = &families[f]->Add(labels);
      gauge->Set(value);
    }
  }
}

void ServerMetrics::CheckpointWriteFailed() {
  impl_->checkpoint_write_failures_counter->Increment();
}

void ServerMetrics::SetCheckpointDirFreeBytes(int64_t bytes) {
  if (bytes < 0) return;
  absl::MutexLock lock(&impl_->mu);
  if (impl_->checkpoint_dir_free_gauge == nullptr) {
    impl_->checkpoint_dir_free_gauge = &impl_->checkpoint_dir_free->Add({});
  }
  impl_->checkpoint_dir_free_gauge->Set(static_cast<double>(bytes));
}

void ServerMetrics::RecordRpc(absl::string_view method, int code, double seconds) {
  std::string name = ShortMethod(method);
  Histogram* duration = nullptr;
  {
    absl::MutexLock lock(&impl_->mu);
    auto& by_method = impl_->rpc_duration_by_method;
    if (by_method.count(name) == 0 && by_method.size() >= kMaxRpcMethods) name = "other";
    Histogram*& histogram = by_method[name];
    if (histogram == nullptr) histogram = &impl_->rpc_duration->Add({{"method", name}}, kRpcBounds);
    duration = histogram;
  }
  // Family::Add returns the existing metric for a known label set.
  impl_->rpc_requests->Add({{"method", name}, {"code", CodeName(code)}}).Increment();
  duration->Observe(seconds);
}

std::string ServerMetrics::Scrape() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

RpcTimer::RpcTimer(ServerMetrics* metrics, std::string method)
    : metrics_(metrics), method_(std::move(method)), start_ns_(NowNanos()) {}

RpcTimer::~RpcTimer() {
  if (metrics_ != nullptr) metrics_->RecordRpc(method_, code_, (NowNanos() - start_ns_) * 1e-9);
}

}  // namespace stoker
