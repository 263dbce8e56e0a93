#include "worker/metrics/nvml.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace stoker {
namespace {

TEST(NvmlTest, MissingLibraryMeansNoDevices) {
  auto nvml = Nvml::Load("libnvidia-ml-does-not-exist.so.1");
  EXPECT_FALSE(nvml->Available());
  EXPECT_NE(nvml->UnavailableReason().find("libnvidia-ml-does-not-exist.so.1"), std::string::npos)
      << nvml->UnavailableReason();
  EXPECT_EQ(nvml->DeviceCount(), 0);
  EXPECT_TRUE(nvml->Read().empty());
}

TEST(NvmlTest, LibraryWithoutNvmlSymbolsMeansNoDevices) {
  auto nvml = Nvml::Load("libm.so.6");
  EXPECT_FALSE(nvml->Available());
  EXPECT_NE(nvml->UnavailableReason().find("nvmlInit_v2 not found"), std::string::npos)
      << nvml->UnavailableReason();
  EXPECT_TRUE(nvml->Read().empty());
}

// On a machine without a driver (CI) this checks the clean degradation; on a GPU machine it reads
// the real devices.
TEST(NvmlTest, SystemLibraryDegradesOrReads) {
  auto nvml = Nvml::Load();
  if (!nvml->Available()) {
    EXPECT_FALSE(nvml->UnavailableReason().empty());
    EXPECT_TRUE(nvml->Read().empty());
    GTEST_SKIP() << "no NVML here: " << nvml->UnavailableReason();
  }
  std::vector<GpuReading> readings = nvml->Read();
  ASSERT_EQ(static_cast<int>(readings.size()), nvml->DeviceCount());
  for (const GpuReading& reading : readings) {
    EXPECT_FALSE(reading.name.empty());
    EXPECT_EQ(reading.uuid.rfind("GPU-", 0), 0u) << reading.uuid;
    ASSERT_TRUE(reading.memory_used_bytes.has_value());
    EXPECT_LE(*reading.memory_used_bytes, *reading.memory_total_bytes);
    if (reading.utilization_ratio.has_value()) {
      EXPECT_GE(*reading.utilization_ratio, 0.0);
      EXPECT_LE(*reading.utilization_ratio, 1.0);
    }
    std::cout << "gpu" << reading.index << ": " << reading.name << " " << reading.uuid << " used "
              << *reading.memory_used_bytes << " of " << *reading.memory_total_bytes << "\n";
  }
}

TEST(NvmlTest, ReadsEveryDeviceOfALibrary) {
  auto nvml = Nvml::Load(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml->Available()) << nvml->UnavailableReason();
  ASSERT_EQ(nvml->DeviceCount(), 2);
  std::vector<GpuReading> readings = nvml->Read();
  ASSERT_EQ(readings.size(), 2u);
  EXPECT_EQ(readings[0].index, 0);
  EXPECT_EQ(readings[0].name, "Fake GPU A");
  EXPECT_EQ(readings[0].uuid, "GPU-00000000-0000-0000-0000-000000000000");
  EXPECT_DOUBLE_EQ(readings[0].utilization_ratio.value_or(-1), 0.75);
  EXPECT_EQ(readings[0].memory_used_bytes.value_or(0), 1ull << 30);
  EXPECT_EQ(readings[0].memory_total_bytes.value_or(0), 80ull << 30);
  // gpu1 does not support utilization queries: that reading is empty, the rest is there.
  EXPECT_FALSE(readings[1].utilization_ratio.has_value());
  EXPECT_EQ(readings[1].memory_used_bytes.value_or(0), 2ull << 30);
}

TEST(NvmlTest, LibraryWithoutDriverMeansNoDevices) {
  setenv("FAKE_NVML_INIT_ERROR", "9", 1);  // NVML_ERROR_DRIVER_NOT_LOADED
  auto nvml = Nvml::Load(FAKE_NVML_PATH);
  unsetenv("FAKE_NVML_INIT_ERROR");
  EXPECT_FALSE(nvml->Available());
  EXPECT_NE(nvml->UnavailableReason().find("nvmlInit_v2 returned 9"), std::string::npos)
      << nvml->UnavailableReason();
  EXPECT_TRUE(nvml->Read().empty());
}

}  // namespace
}  // namespace stoker
