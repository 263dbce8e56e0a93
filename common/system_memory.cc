#include "common/system_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace stoker {
namespace {

constexpr int64_t kNoLimit = int64_t{1} << 62;

// A "key:  value kB" line of /proc/meminfo, in bytes; -1 if absent.
int64_t MeminfoBytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  int64_t kib = 0;
  std::string unit;
  while (in >> name >> kib) {
    std::getline(in, unit);
    if (name == key + ":") return kib * 1024;
  }
  return -1;
}

// The first whitespace-separated word of `path` as a number; nullopt if absent, "max" or not a
// number.
std::optional<int64_t> ReadNumber(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string text;
  int64_t value = 0;
  if (!(in >> text) || !absl::SimpleAtoi(text, &value)) return std::nullopt;
  return value;
}

// The value of a "key value" line of a memory.stat file; nullopt if absent.
std::optional<int64_t> StatValue(const std::filesystem::path& path, absl::string_view key) {
  std::ifstream in(path);
  std::string name;
  int64_t value = 0;
  while (in >> name >> value) {
    if (name == key) return value;
  }
  return std::nullopt;
}

// `root` + `group`, or `root` itself when that directory does not exist.
std::filesystem::path GroupDirectory(const std::filesystem::path& root, const std::string& group) {
  std::filesystem::path dir = root / std::filesystem::path(group).relative_path();
  std::error_code error;
  return std::filesystem::is_directory(dir, error) ? dir : root;
}

int64_t CgroupV1Available(const std::filesystem::path& mount, const std::string& group) {
  const std::filesystem::path dir = GroupDirectory(mount, group);
  const std::optional<int64_t> limit = StatValue(dir / "memory.stat", "hierarchical_memory_limit");
  if (!limit.has_value() || *limit >= kNoLimit) return -1;
  const int64_t usage = ReadNumber(dir / "memory.usage_in_bytes").value_or(0);
  const int64_t inactive = StatValue(dir / "memory.stat", "total_inactive_file").value_or(0);
  return std::max<int64_t>(0, *limit - std::max<int64_t>(0, usage - inactive));
}

int64_t CgroupV2Available(const std::filesystem::path& mount, const std::string& group) {
  std::filesystem::path dir = GroupDirectory(mount, group);
  const int64_t inactive = StatValue(dir / "memory.stat", "inactive_file").value_or(0);
  int64_t best = -1;
  // The group, then each ancestor up to the mount's root (whose memory.max does not exist).
  for (bool own = true;; own = false) {
    const std::optional<int64_t> limit = ReadNumber(dir / "memory.max");
    const std::optional<int64_t> current = ReadNumber(dir / "memory.current");
    if (limit.has_value() && *limit < kNoLimit && current.has_value()) {
      const int64_t used = std::max<int64_t>(0, *current - (own ? inactive : 0));
      const int64_t left = std::max<int64_t>(0, *limit - used);
      best = best < 0 ? left : std::min(best, left);
    }
    if (dir == mount || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
    if (dir.string().size() < mount.string().size()) break;
  }
  return best;
}

}  // namespace

int64_t CgroupAvailableBytes(const std::string& proc_self_cgroup, const std::string& cgroup_root) {
  const std::filesystem::path root(cgroup_root);
  std::optional<std::string> v1_group, v2_group;
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "hierarchy-ID:controller-list:cgroup-path"; the path may itself hold ':'.
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) {
      v2_group = parts[2];
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
      if (controller == "memory") v1_group = parts[2];
    }
  }
  int64_t best = -1;
  auto take = [&best](int64_t available) {
    if (available >= 0) best = best < 0 ? available : std::min(best, available);
  };
  if (v1_group.has_value()) take(CgroupV1Available(root / "memory", *v1_group));
  if (v2_group.has_value()) {
    // Unified mode mounts v2 at the root; hybrid mode at "unified" (without the memory
    // controller there, so nothing is found, which is right: v1 holds the memory limits).
    std::error_code error;
    const bool unified_at_root = std::filesystem::exists(root / "cgroup.controllers", error);
    take(CgroupV2Available(unified_at_root ? root : root / "unified", *v2_group));
  }
  return best;
}

absl::StatusOr<int64_t> AvailableSystemMemoryBytes() {
  int64_t available = MeminfoBytes("MemAvailable");
  if (available < 0) return absl::UnavailableError("/proc/meminfo has no MemAvailable");
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  const int64_t cgroup = CgroupAvailableBytes(text.str(), "/sys/fs/cgroup");
  if (cgroup >= 0) available = std::min(available, cgroup);
  return available;
}

}  // namespace stoker
