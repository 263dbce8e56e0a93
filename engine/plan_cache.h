// Per-batch-size execution plans of a model: the full batch's plan is built once at creation; a
// few other sizes (an epoch's partial last batch, an evaluation remainder) are built on first use
// and kept, oldest dropped first. Shared by the cpu and cuda models.
#ifndef STOKER_ENGINE_PLAN_CACHE_H_
#define STOKER_ENGINE_PLAN_CACHE_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace stoker {

// `Plan` has an `int batch` member.
template <typename Plan>
class PartialPlanCache {
 public:
  explicit PartialPlanCache(size_t capacity) : capacity_(capacity) {}

  // `full` when its batch matches, else a cached plan for `batch`, else one made by
  // `build(batch)` (which returns absl::StatusOr<std::unique_ptr<Plan>>) and cached.
  template <typename Build>
  absl::StatusOr<Plan*> Get(Plan* full, int batch, Build&& build) {
    if (full != nullptr && full->batch == batch) return full;
    for (const std::unique_ptr<Plan>& plan : plans_) {
      if (plan->batch == batch) return plan.get();
    }
    absl::StatusOr<std::unique_ptr<Plan>> plan = build(batch);
    if (!plan.ok()) return plan.status();
    if (plans_.size() >= capacity_) plans_.erase(plans_.begin());
    plans_.push_back(*std::move(plan));
    return plans_.back().get();
  }

 private:
  size_t capacity_;
  std::vector<std::unique_ptr<Plan>> plans_;  // oldest first
};

}  // namespace stoker

#endif  // STOKER_ENGINE_PLAN_CACHE_H_
