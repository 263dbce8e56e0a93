#include "common/system_memory.h"
#include "engine/backend.h"
#include "engine/cpu/cpu_mlp.h"
#include "engine/cpu/cpu_network.h"

namespace stoker {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string Name() const override { return "cpu"; }
  absl::StatusOr<int64_t> AvailableMemoryBytes() const override {
    return AvailableSystemMemoryBytes();
  }

 protected:
  absl::StatusOr<std::unique_ptr<Model>> CreateMlpFastPath(const MlpConfig& config) override {
    return CreateCpuMlp(config);
  }
  absl::StatusOr<std::unique_ptr<Model>> CreateNetworkModel(const NetworkConfig& config,
                                                            ParameterNaming naming) override {
    return CreateCpuNetwork(config, naming);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend() {
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
}

}  // namespace stoker
