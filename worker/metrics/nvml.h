// GPU readings from NVIDIA's management library, loaded at run time.
//
// The worker agent links no CUDA (README.md, "Architecture"), and a machine without a driver has no
// libnvidia-ml.so.1 at all, so the library is opened with dlopen() and the few entry points used
// are declared here. A missing library, missing symbols or a failing nvmlInit all mean the same
// thing to the caller: no GPUs to report. None of them is an error.
#ifndef STOKER_WORKER_METRICS_NVML_H_
#define STOKER_WORKER_METRICS_NVML_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace stoker {

// One reading of one GPU. A field is empty when NVML could not answer that query for the device
// (e.g. utilization on some MIG or vGPU configurations).
struct GpuReading {
  int index = 0;     // NVML index, the same order as CUDA_DEVICE_ORDER=PCI_BUS_ID
  std::string name;  // "NVIDIA H200"
  std::string uuid;  // "GPU-xxxxxxxx-..."; joins with dcgm-exporter's UUID label
  std::optional<double> utilization_ratio;  // 0..1, share of the last sample period a kernel ran
  std::optional<uint64_t> memory_used_bytes;
  std::optional<uint64_t> memory_total_bytes;
};

class Nvml {
 public:
  static constexpr const char* kDefaultLibrary = "libnvidia-ml.so.1";

  // Opens `library` and initialises NVML. Never fails: when the library, one of its symbols or
  // the driver is missing, the object reports no devices and UnavailableReason() says why.
  static std::unique_ptr<Nvml> Load(const std::string& library = kDefaultLibrary);

  ~Nvml();  // nvmlShutdown() and dlclose() when Load() got that far
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool Available() const;
  // Empty when Available(); otherwise one line for a log ("libnvidia-ml.so.1: cannot open ...").
  const std::string& UnavailableReason() const;
  // Devices found at Load(); 0 when unavailable.
  int DeviceCount() const;

  // Reads every device now (a few NVML calls each; NVML is thread-safe). Empty when unavailable.
  std::vector<GpuReading> Read() const;

 private:
  Nvml() = default;
  struct Api;
  std::unique_ptr<Api> api_;  // null when unavailable
  std::string unavailable_reason_;
  int device_count_ = 0;
};

}  // namespace stoker

#endif  // STOKER_WORKER_METRICS_NVML_H_
