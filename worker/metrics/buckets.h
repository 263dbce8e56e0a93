// Histogram bucket bounds shared by the processes that time things (trainer, loaders) and the
// agent that exports them. A timing process keeps one atomic count per bucket in the job's shared
// memory (bounds.size() + 1 cells, the last for +Inf) and adds each observation to
// cell[BucketIndex(bounds, seconds)]; the agent passes the counts to WorkerMetrics::Update.
#ifndef STOKER_WORKER_METRICS_BUCKETS_H_
#define STOKER_WORKER_METRICS_BUCKETS_H_

#include <array>
#include <cstddef>
#include <span>

namespace stoker {

// Upper bounds in seconds. A training step spans ~50 us (a small MLP in a CUDA graph on a big GPU)
// to seconds (a CNN on the cpu backend).
inline constexpr std::array<double, 16> kStepSecondsBounds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};

// Time a loader spends making one batch (read, decode, shuffle-gather, write into the slot).
inline constexpr std::array<double, 14> kLoaderBatchSecondsBounds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5};

// The bucket `seconds` belongs to: the first bound >= seconds (Prometheus `le` semantics), or
// bounds.size() (+Inf) when it exceeds them all (NaN lands there too).
constexpr size_t BucketIndex(std::span<const double> bounds, double seconds) {
  size_t i = 0;
  while (i < bounds.size() && !(seconds <= bounds[i])) ++i;
  return i;
}

}  // namespace stoker

#endif  // STOKER_WORKER_METRICS_BUCKETS_H_
