#include "absl/strings/str_cat.h"
#include "engine/backend.h"

namespace stoker {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& name, int device_index) {
  if (name == "cpu") return CreateCpuBackend();
  if (name == "cuda") return CreateCudaBackendIfBuilt(device_index);
  return absl::InvalidArgumentError(
      absl::StrCat("no backend named '", name, "' (cpu, cuda)"));
}

}  // namespace stoker
