#include "absl/flags/parse.h"
#include "bench/bench_main.h"

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return stoker::BenchMain();
}
