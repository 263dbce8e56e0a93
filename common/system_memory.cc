#include "common/system_memory.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"

namespace stoker {
namespace {

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

// One number in a cgroup v2 file of this process's group; -1 if absent or "max".
int64_t CgroupValue(const std::string& file) {
  std::ifstream self("/proc/self/cgroup");
  std::string line, group;
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) == 0) group = line.substr(3);
  }
  std::ifstream in("/sys/fs/cgroup" + group + "/" + file);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  int64_t value = 0;
  return absl::SimpleAtoi(text, &value) ? value : -1;
}

}  // namespace

absl::StatusOr<int64_t> AvailableSystemMemoryBytes() {
  int64_t available = MeminfoBytes("MemAvailable");
  if (available < 0) return absl::UnavailableError("/proc/meminfo has no MemAvailable");
  const int64_t limit = CgroupValue("memory.max");
  const int64_t used = CgroupValue("memory.current");
  if (limit >= 0 && used >= 0) available = std::min(available, std::max<int64_t>(0, limit - used));
  return available;
}

}  // namespace stoker
