#include "common/system_memory.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMiB = int64_t{1} << 20;

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("stoker_cgroup_test_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const fs::path& relative, const std::string& text) {
    const fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  int64_t Available(const std::string& proc_self_cgroup) {
    return CgroupAvailableBytes(proc_self_cgroup, root_.string());
  }

  fs::path root_;
};

TEST_F(CgroupTree, V1LimitLessUsageNotCountingInactiveFileCache) {
  Write("memory/jobs/a/memory.stat",
        "cache 100\nhierarchical_memory_limit 201326592\ntotal_inactive_file 33554432\n");
  Write("memory/jobs/a/memory.usage_in_bytes", "100663296\n");
  // 192 MiB - (96 MiB - 32 MiB reclaimable) = 128 MiB.
  EXPECT_EQ(Available("12:pids:/\n4:memory:/jobs/a\n0::/\n"), 128 * kMiB);
  // The memory controller may share its hierarchy with others.
  EXPECT_EQ(Available("4:cpu,memory:/jobs/a\n"), 128 * kMiB);
}

TEST_F(CgroupTree, V1UnlimitedIsNoLimit) {
  Write("memory/memory.stat", "hierarchical_memory_limit 9223372036854771712\n");
  Write("memory/memory.usage_in_bytes", "1000\n");
  EXPECT_EQ(Available("4:memory:/\n"), -1);
}

TEST_F(CgroupTree, V1OverLimitIsZeroNotNegative) {
  Write("memory/g/memory.stat", "hierarchical_memory_limit 1048576\ntotal_inactive_file 0\n");
  Write("memory/g/memory.usage_in_bytes", "2097152\n");
  EXPECT_EQ(Available("4:memory:/g\n"), 0);
}

TEST_F(CgroupTree, V1GroupInvisibleInContainerReadsTheMountRoot) {
  // Without a cgroup namespace a container's /proc/self/cgroup names the host's path, but its
  // mount shows its own group at the root.
  Write("memory/memory.stat", "hierarchical_memory_limit 536870912\ntotal_inactive_file 0\n");
  Write("memory/memory.usage_in_bytes", "268435456\n");
  EXPECT_EQ(Available("4:memory:/docker/0123abcd\n"), 256 * kMiB);
}

TEST_F(CgroupTree, V2SmallestOfGroupAndAncestors) {
  Write("cgroup.controllers", "cpu memory\n");
  Write("outer/memory.max", "1073741824\n");  // 1 GiB, 900 MiB used: 124 MiB left
  Write("outer/memory.current", "943718400\n");
  Write("outer/inner/memory.max", "max\n");
  Write("outer/inner/memory.current", "104857600\n");
  Write("outer/inner/memory.stat", "anon 1\ninactive_file 0\n");
  EXPECT_EQ(Available("0::/outer/inner\n"), 124 * kMiB);
  Write("outer/inner/memory.max", "157286400\n");  // 150 MiB, 100 MiB used: 50 MiB left
  EXPECT_EQ(Available("0::/outer/inner\n"), 50 * kMiB);
}

TEST_F(CgroupTree, V2UnderHybridUnifiedMountHasNoMemoryLimits) {
  Write("unified/cgroup.controllers", "");
  Write("unified/g/memory.max", "1048576\n");  // not a real hybrid file, but must be read there
  Write("unified/g/memory.current", "0\n");
  EXPECT_EQ(Available("0::/g\n"), 1024 * 1024);
  EXPECT_EQ(Available("0::/elsewhere\n"), -1);
}

TEST_F(CgroupTree, GarbageIsNoLimit) {
  Write("memory/memory.stat", "hierarchical_memory_limit banana\n");
  EXPECT_EQ(Available("not a cgroup line\n::\n4:memory\n"), -1);
  EXPECT_EQ(Available(""), -1);
}

TEST(AvailableSystemMemory, PositiveAndAtMostMemAvailable) {
  absl::StatusOr<int64_t> available = AvailableSystemMemoryBytes();
  ASSERT_TRUE(available.ok()) << available.status();
  EXPECT_GT(*available, 0);
  std::ifstream meminfo("/proc/meminfo");
  std::string name, unit;
  int64_t kib = 0;
  int64_t total = -1;
  while (meminfo >> name >> kib) {
    std::getline(meminfo, unit);
    if (name == "MemTotal:") total = kib * 1024;
  }
  EXPECT_LE(*available, total);
}

}  // namespace
}  // namespace stoker
