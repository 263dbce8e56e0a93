#include "worker/omp_wait.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace stoker {

absl::StatusOr<CpuTicks> ReadCpuTicks(const std::string& proc_stat) {
  std::ifstream in(proc_stat);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::UnavailableError(absl::StrFormat("cannot read %s", proc_stat));
  }
  std::istringstream fields(line);
  std::string label;
  fields >> label;
  // cpu user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
  uint64_t value[8] = {};
  int read = 0;
  while (read < 8 && fields >> value[read]) ++read;
  if (label != "cpu" || read < 4) {
    return absl::UnavailableError(
        absl::StrFormat("%s: the first line is not the cpu total: \"%s\"", proc_stat, line));
  }
  CpuTicks ticks;
  ticks.busy = value[0] + value[1] + value[2] + value[5] + value[6];
  ticks.total = ticks.busy + value[3] + value[4] + value[7];
  return ticks;
}

double BusyCores(const CpuTicks& before, const CpuTicks& after, int online_cores) {
  if (after.total <= before.total || after.busy < before.busy) return 0;
  return static_cast<double>(after.busy - before.busy) /
         static_cast<double>(after.total - before.total) * online_cores;
}

OmpWaitChoice ChooseOmpWait(double busy_cores, int online_cores, int threads, int busy_loaders) {
  const double wanted = busy_cores + busy_loaders + threads;
  std::string measured =
      absl::StrFormat("%.1f of %d cores busy when it started", busy_cores, online_cores);
  if (busy_loaders > 0) {
    absl::StrAppendFormat(&measured, ", %d decoding loader(s)", busy_loaders);
  }
  if (wanted <= online_cores + 0.5) {
    return {"", absl::StrFormat("spinning (%s)", measured)};
  }
  return {"OMP_WAIT_POLICY=passive",
          absl::StrFormat("passive (%s: the %d thread(s) would share cores)", measured, threads)};
}

OmpWaitChoice ChooseTrainerOmpWait(int threads, int busy_loaders, absl::Duration sample) {
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
    if (const char* value = std::getenv(name); value != nullptr) {
      return {"", absl::StrFormat("as the worker's environment says (%s=%s)", name, value)};
    }
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int cores = online > 0 ? static_cast<int>(online) : 1;
  absl::StatusOr<CpuTicks> before = ReadCpuTicks();
  absl::SleepFor(sample);
  absl::StatusOr<CpuTicks> after = ReadCpuTicks();
  if (!before.ok() || !after.ok()) {
    // Nothing measured: passive is the safe side (slow at worst, never starving a neighbour).
    return OmpWaitChoice{
        "OMP_WAIT_POLICY=passive",
        absl::StrFormat("passive (%s)", (before.ok() ? after : before).status().message())};
  }
  return ChooseOmpWait(BusyCores(*before, *after, cores), cores, threads, busy_loaders);
}

}  // namespace stoker
