// How the trainer's OpenMP threads wait between parallel regions, chosen per attempt from how busy
// the machine's cores are when the trainer starts.
//
// libgomp's default spins about 300,000 iterations before a waiting thread sleeps. On cores the
// job has to itself that is what a convolutional network needs: ResNet-20 in bf16 on the 2-core
// development machine trained at ~800 samples/s spinning and ~200 passive, every one of its
// hundreds of parallel regions a step paying a sleeping thread's wake-up. On shared cores it is
// the opposite: a spinning thread takes the core from the process its partner waits for (another
// job, a build, the job's own decoding loaders), and the example MLP took 77-80 s spinning against
// 10-11 s passive with two other processes busy. See docs/decisions.md.
#ifndef STOKER_WORKER_OMP_WAIT_H_
#define STOKER_WORKER_OMP_WAIT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stoker {

// The machine's CPU time so far, from the first line of /proc/stat, in clock ticks: `busy` is
// user, nice, system, irq and softirq (what processes and the kernel ran); idle, iowait and steal
// (time the hypervisor gave to other machines) are not busy.
struct CpuTicks {
  uint64_t busy = 0;
  uint64_t total = 0;
};
absl::StatusOr<CpuTicks> ReadCpuTicks(const std::string& proc_stat = "/proc/stat");

// Cores busy on average between two readings on a machine of `online_cores`; 0 when no time
// passed.
double BusyCores(const CpuTicks& before, const CpuTicks& after, int online_cores);

struct OmpWaitChoice {
  // "OMP_WAIT_POLICY=passive", or "" for libgomp's default spin-then-sleep.
  std::string env_entry;
  // For the job's log, e.g. "spinning (0.1 of 2 cores busy when it started)".
  std::string reason;
};

// The trainer's `threads` spin when they fit on the cores that are idle: busy_cores (measured just
// before it starts, the job's own processes not yet running) plus `busy_loaders` (loader processes
// of this job expected to compute all the time: decoding images) plus threads at most
// online_cores + 0.5. Otherwise they wait passively.
OmpWaitChoice ChooseOmpWait(double busy_cores, int online_cores, int threads, int busy_loaders);

// The choice for a trainer about to start. When the worker's environment already says
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT set: the trainer inherits it), no entry and the reason
// "as the worker's environment says (NAME=VALUE)", measuring nothing; else measures the cores for
// `sample` and calls ChooseOmpWait.
OmpWaitChoice ChooseTrainerOmpWait(int threads, int busy_loaders,
                                   absl::Duration sample = absl::Milliseconds(250));

}  // namespace stoker

#endif  // STOKER_WORKER_OMP_WAIT_H_
