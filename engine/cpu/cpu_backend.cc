#include "common/system_memory.h"
#include "engine/backend.h"
#include "engine/cpu/cpu_mlp.h"
#include "engine/cpu/cpu_network.h"

namespace stoker {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string Name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<Model>> CreateMlp(const MlpConfig& config) override {
    return CreateCpuMlp(config);
  }
  absl::StatusOr<std::unique_ptr<Model>> CreateNetwork(const NetworkConfig& config) override {
    return CreateCpuNetwork(config);
  }
  absl::StatusOr<int64_t> AvailableMemoryBytes() const override {
    return AvailableSystemMemoryBytes();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend() {
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
}

}  // namespace stoker
