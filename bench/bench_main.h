// The entry point the flag-driven benchmarks share (bench_main.cc): absl's flags parsed, then the
// benchmark's BenchMain, whose return value is the exit status.
#ifndef STOKER_BENCH_BENCH_MAIN_H_
#define STOKER_BENCH_BENCH_MAIN_H_

namespace stoker {

// Defined by each benchmark linked with stoker_bench_main.
int BenchMain();

}  // namespace stoker

#endif  // STOKER_BENCH_BENCH_MAIN_H_
