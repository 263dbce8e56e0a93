#include "worker/omp_wait.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "data/test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

TEST(OmpWaitTest, SpinsOnlyWhenTheThreadsFitOnIdleCores) {
  // A quiet 2-core machine: two threads spin.
  OmpWaitChoice quiet = ChooseOmpWait(0.2, 2, 2, 0);
  EXPECT_EQ(quiet.env_entry, "");
  EXPECT_EQ(quiet.reason, "spinning (0.2 of 2 cores busy when it started)");
  // One core taken by something else: two threads would share it.
  OmpWaitChoice busy = ChooseOmpWait(1.0, 2, 2, 0);
  EXPECT_EQ(busy.env_entry, "OMP_WAIT_POLICY=passive");
  EXPECT_EQ(busy.reason,
            "passive (1.0 of 2 cores busy when it started: the 2 thread(s) would share cores)");
  // ... but one thread still fits.
  EXPECT_EQ(ChooseOmpWait(1.0, 2, 1, 0).env_entry, "");
  // Decoding loaders of the job itself count as busy cores.
  OmpWaitChoice decoding = ChooseOmpWait(0.0, 2, 2, 1);
  EXPECT_EQ(decoding.env_entry, "OMP_WAIT_POLICY=passive");
  EXPECT_NE(decoding.reason.find("1 decoding loader(s)"), std::string::npos) << decoding.reason;
  EXPECT_EQ(ChooseOmpWait(0.0, 8, 4, 2).env_entry, "");
  EXPECT_EQ(ChooseOmpWait(3.0, 8, 4, 2).env_entry, "OMP_WAIT_POLICY=passive");
}

TEST(OmpWaitTest, ReadsTheMachinesCpuTimeAndSeesAThreadSpin) {
  absl::StatusOr<CpuTicks> before = ReadCpuTicks();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->total, before->busy);
  // One thread spinning for 300 ms keeps about one core busy.
  std::atomic<bool> stop{false};
  std::thread spin([&] {
    volatile uint64_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) n = n + 1;
  });
  usleep(300000);
  stop = true;
  spin.join();
  absl::StatusOr<CpuTicks> after = ReadCpuTicks();
  ASSERT_TRUE(after.ok()) << after.status();
  const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const double busy = BusyCores(*before, *after, cores);
  EXPECT_GE(busy, 0.5) << "a spinning thread was not seen";
  EXPECT_LE(busy, cores + 1e-9);
  EXPECT_EQ(BusyCores(*after, *before, cores), 0) << "time going backwards counts as nothing";
}

TEST(OmpWaitTest, NamesAFileThatIsNotProcStat) {
  testing::TempDir dir;
  const std::string path = dir.File("stat");
  std::ofstream(path) << "intr 1 2 3\n";
  absl::StatusOr<CpuTicks> ticks = ReadCpuTicks(path);
  ASSERT_FALSE(ticks.ok());
  EXPECT_NE(ticks.status().message().find(path), std::string::npos) << ticks.status();
  EXPECT_FALSE(ReadCpuTicks(dir.File("missing")).ok());
}

TEST(OmpWaitTest, TheWorkersEnvironmentDecides) {
  setenv("GOMP_SPINCOUNT", "1000", 1);
  OmpWaitChoice spincount = ChooseTrainerOmpWait(2, 0, absl::Milliseconds(10));
  EXPECT_EQ(spincount.env_entry, "");
  EXPECT_EQ(spincount.reason, "as the worker's environment says (GOMP_SPINCOUNT=1000)");
  unsetenv("GOMP_SPINCOUNT");
  setenv("OMP_WAIT_POLICY", "active", 1);
  OmpWaitChoice policy = ChooseTrainerOmpWait(2, 0, absl::Milliseconds(10));
  EXPECT_EQ(policy.env_entry, "");
  EXPECT_EQ(policy.reason, "as the worker's environment says (OMP_WAIT_POLICY=active)");
  unsetenv("OMP_WAIT_POLICY");
  OmpWaitChoice measured = ChooseTrainerOmpWait(1, 0, absl::Milliseconds(50));
  EXPECT_TRUE(measured.env_entry.empty() || measured.env_entry == "OMP_WAIT_POLICY=passive");
  EXPECT_NE(measured.reason.find("cores busy when it started"), std::string::npos);
}

}  // namespace
}  // namespace stoker
