// How much memory this process may still take: the trainer sizes models by it, the agent the data
// pipeline (ring and loader copies of the dataset).
#ifndef STOKER_COMMON_SYSTEM_MEMORY_H_
#define STOKER_COMMON_SYSTEM_MEMORY_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace stoker {

// /proc/meminfo's MemAvailable, lowered to what the cgroup v2 limit of this process's group
// (memory.max - memory.current) leaves when there is one. UNAVAILABLE without /proc/meminfo.
absl::StatusOr<int64_t> AvailableSystemMemoryBytes();

}  // namespace stoker

#endif  // STOKER_COMMON_SYSTEM_MEMORY_H_
