#include "worker/metrics/nvml.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace stoker {
namespace {

// The subset of nvml.h this file uses, declared from NVIDIA's documented ABI. Every entry point
// returns nvmlReturn_t, an int enum where 0 is NVML_SUCCESS.
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of the sample period a kernel was executing
  unsigned int memory;  // percent of the period device memory was read or written
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
// NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE.
constexpr unsigned int kNameBufferSize = 96;
constexpr unsigned int kUuidBufferSize = 96;

}  // namespace

struct Nvml::Api {
  void* handle = nullptr;
  bool initialised = false;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*get_count)(unsigned int*) = nullptr;
  NvmlReturn (*get_handle)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*get_utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*get_memory)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*get_name)(NvmlDevice, char*, unsigned int) = nullptr;
  NvmlReturn (*get_uuid)(NvmlDevice, char*, unsigned int) = nullptr;

  struct Device {
    NvmlDevice handle;
    std::string name;
    std::string uuid;
  };
  std::vector<Device> devices;

  ~Api() {
    if (initialised) shutdown();
    if (handle != nullptr) dlclose(handle);
  }
};

namespace {

// Resolves `name` into `*fn`; false (and the reason in *why) when the library lacks it.
template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* fn, std::string* why) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) *why = absl::StrCat("NVML symbol ", name, " not found");
  return *fn != nullptr;
}

}  // namespace

std::unique_ptr<Nvml> Nvml::Load(const std::string& library) {
  std::unique_ptr<Nvml> nvml(new Nvml());
  auto api = std::make_unique<Api>();
  // RTLD_LOCAL: NVML's symbols must not leak into the agent's global namespace.
  api->handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api->handle == nullptr) {
    const char* error = dlerror();
    nvml->unavailable_reason_ = error != nullptr ? error : absl::StrCat(library, ": dlopen failed");
    return nvml;
  }
  std::string why;
  if (!Resolve(api->handle, "nvmlInit_v2", &api->init, &why) ||
      !Resolve(api->handle, "nvmlShutdown", &api->shutdown, &why) ||
      !Resolve(api->handle, "nvmlDeviceGetCount_v2", &api->get_count, &why) ||
      !Resolve(api->handle, "nvmlDeviceGetHandleByIndex_v2", &api->get_handle, &why) ||
      !Resolve(api->handle, "nvmlDeviceGetUtilizationRates", &api->get_utilization, &why) ||
      !Resolve(api->handle, "nvmlDeviceGetMemoryInfo", &api->get_memory, &why) ||
      !Resolve(api->handle, "nvmlDeviceGetName", &api->get_name, &why) ||
      !Resolve(api->handle, "nvmlDeviceGetUUID", &api->get_uuid, &why)) {
    nvml->unavailable_reason_ = absl::StrCat(library, ": ", why);
    return nvml;
  }
  // The library is present but the kernel driver may not be (a container started without
  // --gpus, or a driver/library version mismatch): nvmlInit fails then.
  if (NvmlReturn rc = api->init(); rc != kNvmlSuccess) {
    nvml->unavailable_reason_ = absl::StrCat(library, ": nvmlInit_v2 returned ", rc);
    return nvml;
  }
  api->initialised = true;
  unsigned int count = 0;
  if (NvmlReturn rc = api->get_count(&count); rc != kNvmlSuccess) {
    nvml->unavailable_reason_ = absl::StrCat(library, ": nvmlDeviceGetCount_v2 returned ", rc);
    return nvml;
  }
  for (unsigned int i = 0; i < count; ++i) {
    Api::Device device{};
    if (api->get_handle(i, &device.handle) != kNvmlSuccess) {
      // Keep indices aligned with NVML's: a device we cannot open still occupies its index.
      device.handle = nullptr;
    } else {
      char buffer[kNameBufferSize > kUuidBufferSize ? kNameBufferSize : kUuidBufferSize] = {};
      if (api->get_name(device.handle, buffer, kNameBufferSize) == kNvmlSuccess) {
        device.name.assign(buffer);
      }
      buffer[0] = '\0';
      if (api->get_uuid(device.handle, buffer, kUuidBufferSize) == kNvmlSuccess) {
        device.uuid.assign(buffer);
      }
    }
    api->devices.push_back(std::move(device));
  }
  nvml->device_count_ = static_cast<int>(count);
  nvml->api_ = std::move(api);
  return nvml;
}

Nvml::~Nvml() = default;

bool Nvml::Available() const { return api_ != nullptr; }

const std::string& Nvml::UnavailableReason() const { return unavailable_reason_; }

int Nvml::DeviceCount() const { return device_count_; }

std::vector<GpuReading> Nvml::Read() const {
  std::vector<GpuReading> readings;
  if (api_ == nullptr) return readings;
  for (size_t i = 0; i < api_->devices.size(); ++i) {
    const Api::Device& device = api_->devices[i];
    GpuReading reading;
    reading.index = static_cast<int>(i);
    reading.name = device.name;
    reading.uuid = device.uuid;
    if (device.handle != nullptr) {
      NvmlUtilization utilization{};
      if (api_->get_utilization(device.handle, &utilization) == kNvmlSuccess) {
        reading.utilization_ratio = utilization.gpu / 100.0;
      }
      NvmlMemory memory{};
      if (api_->get_memory(device.handle, &memory) == kNvmlSuccess) {
        reading.memory_used_bytes = memory.used;
        reading.memory_total_bytes = memory.total;
      }
    }
    readings.push_back(std::move(reading));
  }
  return readings;
}

}  // namespace stoker
