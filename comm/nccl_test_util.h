// Shared by comm's NCCL tests (nccl_collective_test.cc, nccl_reducer_test.cc): the CUDA devices
// this process sees, a skip for a machine with too few of them (a failure instead with
// STOKER_REQUIRE_CUDA=1, as tests/gpu/check.sh sets it), and the options of a rank of a group
// over two devices. Test only.
#ifndef STOKER_COMM_NCCL_TEST_UTIL_H_
#define STOKER_COMM_NCCL_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/nccl_collective.h"
#include "gtest/gtest.h"

namespace stoker::nccl_testing {

inline int VisibleDevices() {
  int devices = 0;  // untouched without a driver (docs/toolchain.md, pitfall 2)
  if (cudaGetDeviceCount(&devices) != cudaSuccess) return 0;
  return devices;
}

// True when the environment variable STOKER_REQUIRE_CUDA is set to anything but "" or "0".
inline bool CudaRequired() {
  const char* value = std::getenv("STOKER_REQUIRE_CUDA");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

// Rank `rank` (0 or 1) of a group of two on devices 0 and 1, rank r on device r.
inline NcclOptions TwoDeviceRank(int rank, const std::string& store_prefix) {
  NcclOptions options;
  options.rank = rank;
  options.size = 2;
  options.device = rank;
  options.store_prefix = store_prefix;
  return options;
}

}  // namespace stoker::nccl_testing

// Skips the test unless `n` CUDA devices are visible; with STOKER_REQUIRE_CUDA=1, a machine
// without any device fails it instead.
#define SKIP_WITHOUT_DEVICES(n)                                                              \
  do {                                                                                       \
    const int stoker_devices_ = ::stoker::nccl_testing::VisibleDevices();                    \
    if (stoker_devices_ < (n)) {                                                             \
      if ((n) == 1 && ::stoker::nccl_testing::CudaRequired()) {                              \
        FAIL() << "STOKER_REQUIRE_CUDA=1 but no device";                                     \
      }                                                                                      \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, " << stoker_devices_ << " visible"; \
    }                                                                                        \
  } while (0)

#endif  // STOKER_COMM_NCCL_TEST_UTIL_H_
