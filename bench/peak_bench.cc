// The machine's limits that the comparing benchmarks put their figures beside (issue 30): the
// peak arithmetic rate of each kind of multiply-add the cpu backend uses, and memory bandwidth.
//   fp32_fma      AVX-512 FMA on 16 independent zmm accumulators (32 FLOP an instruction)
//   bf16_avx512   AVX512_BF16 VDPBF16PS on 16 accumulators (64 FLOP an instruction)
//   bf16_amx      AMX TDPBF16PS on 4 tile accumulators (16 x 16 x 32 x 2 FLOP an instruction)
//   memcpy        large buffers (far beyond the last-level cache share of a core) copied by each
//                 thread; GB/s counts the bytes copied (read once, written once)
// Each figure is the best of --repeats runs of --seconds, with --threads OpenMP threads (one per
// core); a kind the CPU lacks prints `available=0`. Prints key=value lines:
//   peak kind=fp32_fma threads=2 gflops=...   memcpy threads=2 mib=... gb_per_s=...
//   peak_bench [--threads 2] [--seconds 0.5] [--repeats 3] [--memcpy_mib 1024]
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/bench_main.h"

ABSL_FLAG(int, threads, 2, "OpenMP threads (one per core)");
ABSL_FLAG(double, seconds, 0.5, "timed window of each run");
ABSL_FLAG(int, repeats, 3, "runs of each kind (the best is printed)");
ABSL_FLAG(int, memcpy_mib, 1024, "bytes each memcpy run copies in all, MiB (split over threads)");

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

bool CpuHas(int leaf, int subleaf, int reg, int bit) {
  unsigned int r[4] = {0, 0, 0, 0};
  if (!__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1;
}
constexpr int kEbx = 1, kEdx = 3, kEax = 0;
bool HasAvx512f() { return CpuHas(7, 0, kEbx, 16); }
bool HasAvx512Bf16() { return HasAvx512f() && CpuHas(7, 1, kEax, 5); }
bool HasAmxBf16() { return CpuHas(7, 0, kEdx, 22) && CpuHas(7, 0, kEdx, 24); }

// Linux hands AMX tile state to a process only on request (arch_prctl ARCH_REQ_XCOMP_PERM).
bool RequestAmx() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

__attribute__((target("avx512f"))) float Sum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

// Each kernel runs `iterations` rounds and returns FLOPs done; the accumulators are summed into
// `sink` so that the compiler keeps the work.
__attribute__((target("avx512f"))) double Fp32Fma(int64_t iterations, float* sink) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.0001f);
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 total = acc[0];
  for (int i = 1; i < 16; ++i) total = _mm512_add_ps(total, acc[i]);
  *sink += Sum(total);
  return 16.0 * 32.0 * static_cast<double>(iterations);
}

__attribute__((target("avx512f,avx512bf16"))) double Bf16Dot(int64_t iterations, float* sink) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.001f), _mm512_set1_ps(0.002f));
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 total = acc[0];
  for (int i = 1; i < 16; ++i) total = _mm512_add_ps(total, acc[i]);
  *sink += Sum(total);
  return 16.0 * 64.0 * static_cast<double>(iterations);
}

// The tile configuration: palette 1; tiles 0-3 are 16 x 16 fp32 accumulators (64 bytes a row),
// 4-5 the A operands (16 rows of 32 bf16), 6-7 the B operands (16 rows of 16 bf16 pairs).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-bf16"))) double AmxBf16(int64_t iterations, float* sink) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
  alignas(64) static thread_local uint16_t operand[16 * 32];
  alignas(64) static thread_local float result[16 * 16];
  for (int i = 0; i < 16 * 32; ++i) operand[i] = 0x3c00;  // bf16 0.0078125
  std::memset(result, 0, sizeof(result));
  _tile_loadd(0, result, 64);
  _tile_loadd(1, result, 64);
  _tile_loadd(2, result, 64);
  _tile_loadd(3, result, 64);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  for (int64_t n = 0; n < iterations; ++n) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, result, 64);
  _tile_release();
  *sink += result[0];
  return 4.0 * 16 * 16 * 32 * 2 * static_cast<double>(iterations);
}

using Kernel = double (*)(int64_t, float*);

// GFLOP/s of `kernel` on every thread at once: each thread runs batches of iterations until the
// window has passed; the best of the repeats.
double PeakGflops(Kernel kernel, int threads, double seconds, int repeats) {
  double best = 0;
  float sink = 0;
  for (int r = 0; r < repeats; ++r) {
    double flops = 0;
    const Clock::time_point start = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      float local = 0;
      while (Seconds(start) < seconds) flops += kernel(1 << 16, &local);
#pragma omp atomic
      sink += local;
    }
    best = std::max(best, flops / Seconds(start) / 1e9);
  }
  if (sink == 12345.678f) std::printf("#\n");  // keeps `sink` alive
  return best;
}

double MemcpyGbPerS(int threads, int64_t total_bytes, int repeats) {
  const int64_t each = total_bytes / threads;
  std::vector<std::vector<char>> from(threads), to(threads);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();  // first touch on the thread that copies
    from[t].assign(each, static_cast<char>(t + 1));
    to[t].assign(each, 0);
  }
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point start = Clock::now();
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      std::memcpy(to[t].data(), from[t].data(), each);
    }
    best = std::max(best, static_cast<double>(each) * threads / Seconds(start) / 1e9);
  }
  return best;
}

}  // namespace

int BenchMain() {
  const int threads = absl::GetFlag(FLAGS_threads);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int64_t mib = absl::GetFlag(FLAGS_memcpy_mib);
  if (threads < 1 || seconds <= 0 || repeats < 1 || mib < 1) {
    std::fprintf(stderr,
                 "peak_bench: --threads, --seconds, --repeats and --memcpy_mib must be "
                 "positive\n");
    return 2;
  }
  struct Kind {
    const char* name;
    bool available;
    Kernel kernel;
  };
  const bool amx = HasAmxBf16() && RequestAmx();
  const Kind kinds[] = {{"fp32_fma", HasAvx512f(), Fp32Fma},
                        {"bf16_avx512", HasAvx512Bf16(), Bf16Dot},
                        {"bf16_amx", amx, AmxBf16}};
  for (const Kind& kind : kinds) {
    if (!kind.available) {
      std::printf("peak kind=%s threads=%d available=0\n", kind.name, threads);
      continue;
    }
    std::printf("peak kind=%s threads=%d available=1 gflops=%.1f\n", kind.name, threads,
                PeakGflops(kind.kernel, threads, seconds, repeats));
    std::fflush(stdout);
  }
  std::printf("memcpy threads=%d mib=%lld gb_per_s=%.2f\n", threads, static_cast<long long>(mib),
              MemcpyGbPerS(threads, mib << 20, repeats));
  return 0;
}

}  // namespace stoker
