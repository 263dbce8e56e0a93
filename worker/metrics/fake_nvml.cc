// A stand-in for libnvidia-ml.so.1 so the NVML path is tested on machines without a GPU.
// Two devices: gpu0 answers everything, gpu1 does not support utilization queries.
// FAKE_NVML_INIT_ERROR=<code> makes nvmlInit_v2 fail with that code (a library without a driver).
#include <cstdlib>
#include <cstring>

namespace {
struct FakeDevice {
  const char* name;
  const char* uuid;
  int utilization_percent;  // < 0: NVML_ERROR_NOT_SUPPORTED
  unsigned long long used_bytes;
  unsigned long long total_bytes;
};
const FakeDevice kDevices[] = {
    {"Fake GPU A", "GPU-00000000-0000-0000-0000-000000000000", 75, 1ull << 30, 80ull << 30},
    {"Fake GPU B", "GPU-11111111-1111-1111-1111-111111111111", -1, 2ull << 30, 80ull << 30},
};
constexpr int kNotSupported = 3;
constexpr int kInvalidArgument = 2;
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlUtilization {
  unsigned int gpu, memory;
};
const FakeDevice* FromHandle(void* handle) { return static_cast<const FakeDevice*>(handle); }
}  // namespace

extern "C" {
int nvmlInit_v2() {
  const char* error = std::getenv("FAKE_NVML_INIT_ERROR");
  return error != nullptr ? std::atoi(error) : 0;
}
int nvmlShutdown() { return 0; }
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** handle) {
  if (index >= 2) return kInvalidArgument;
  *handle = const_cast<FakeDevice*>(&kDevices[index]);
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* handle, NvmlUtilization* utilization) {
  const FakeDevice* device = FromHandle(handle);
  if (device->utilization_percent < 0) return kNotSupported;
  utilization->gpu = static_cast<unsigned int>(device->utilization_percent);
  utilization->memory = 10;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* handle, NvmlMemory* memory) {
  const FakeDevice* device = FromHandle(handle);
  memory->total = device->total_bytes;
  memory->used = device->used_bytes;
  memory->free = device->total_bytes - device->used_bytes;
  return 0;
}
int nvmlDeviceGetName(void* handle, char* name, unsigned int length) {
  std::strncpy(name, FromHandle(handle)->name, length - 1);
  name[length - 1] = '\0';
  return 0;
}
int nvmlDeviceGetUUID(void* handle, char* uuid, unsigned int length) {
  std::strncpy(uuid, FromHandle(handle)->uuid, length - 1);
  uuid[length - 1] = '\0';
  return 0;
}
}
