// How much memory this process may still take: the trainer sizes models by it, the agent the data
// pipeline (ring and loader copies of the dataset).
#ifndef STOKER_COMMON_SYSTEM_MEMORY_H_
#define STOKER_COMMON_SYSTEM_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace stoker {

// /proc/meminfo's MemAvailable, lowered to what this process's memory cgroup still allows
// (CgroupAvailableBytes), as a container's or a test's memory limit would. UNAVAILABLE without
// /proc/meminfo.
absl::StatusOr<int64_t> AvailableSystemMemoryBytes();

// What the memory cgroups of a process leave it, or -1 when no limit applies, from
// `proc_self_cgroup` (the text of /proc/<pid>/cgroup) and the cgroup file systems mounted under
// `cgroup_root` (normally /sys/fs/cgroup):
// - cgroup v1 (a "N:...memory...:/path" line): memory.stat's hierarchical_memory_limit (the
//   smallest limit on the path to the root) less the group's usage_in_bytes, of which the
//   reclaimable total_inactive_file does not count;
// - cgroup v2 (the "0::/path" line, the controllers at cgroup_root or cgroup_root/unified): for
//   the group and each ancestor with a memory.max, that limit less memory.current (less the
//   group's inactive_file); the smallest of them.
// A limit at or above 2^62 counts as none. When the group's directory is absent (a container
// that sees its own group as the root of the mount, without a cgroup namespace), the mount's root
// directory is read instead. Never below 0.
int64_t CgroupAvailableBytes(const std::string& proc_self_cgroup, const std::string& cgroup_root);

}  // namespace stoker

#endif  // STOKER_COMMON_SYSTEM_MEMORY_H_
