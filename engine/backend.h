// The training engine's factory side: a Backend builds Models (model.h) from configs
// (model_config.h) and picks an MLP's route (fast path or the general network). The headers of
// the engine, by who needs them:
//   model_config.h      the configs, plain data (spec/, the trainer)
//   model_shapes.h      validation, shapes, tensor names, footprints (spec/, server, CLI)
//   gradient_reducer.h  what data-parallel training hands gradients to (comm/)
//   model.h             the Model interface (the training loop, the trainer)
//   backend.h           this file: Backend and the backends' constructors (the trainer)
//   backend_helpers.h, network_graph.h  shared by the backends only
#ifndef STOKER_ENGINE_BACKEND_H_
#define STOKER_ENGINE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/model_config.h"

namespace stoker {

// Host memory pinned by Backend::PinHostMemory while this object lives.
class HostMemoryPin {
 public:
  virtual ~HostMemoryPin() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "cuda".
  virtual std::string Name() const = 0;

  // An MLP model. The one place that picks an MLP's route: the backend's fast path
  // (CreateMlpFastPath), or, when MlpNeedsNetwork(config) and the backend builds networks
  // (BuildsNetworks), its general network for NetworkFromMlp(config) named ParameterNaming::kMlp.
  // INVALID_ARGUMENT for a bad config (ValidateMlpConfig); otherwise what the route returns
  // (UNIMPLEMENTED if the backend cannot run `config.precision`).
  absl::StatusOr<std::unique_ptr<Model>> CreateMlp(const MlpConfig& config);

  // A network of layers (NetworkConfig), its parameters named ParameterNaming::kByLayer.
  // INVALID_ARGUMENT naming the layer for a bad config ("layers[2] (conv2d): kernel 5 larger than
  // input 4x4"), UNIMPLEMENTED where the backend has no such path.
  absl::StatusOr<std::unique_ptr<Model>> CreateNetwork(const NetworkConfig& config) {
    return CreateNetworkModel(config, ParameterNaming::kByLayer);
  }

  // Pins the host memory [base, base + bytes) (the job region's ring) for as long as the returned
  // object lives, so that a device model's copies out of it are asynchronous DMA; null where the
  // backend copies nothing or pinning failed (the copies then still work, staged by the driver).
  // Destroy it before the memory is unmapped and after the models that copy out of it.
  virtual std::unique_ptr<HostMemoryPin> PinHostMemory(void* base, size_t bytes) {
    (void)base;
    (void)bytes;
    return nullptr;
  }

  // Memory a new model could still take, in bytes: the machine's available memory (within this
  // process's cgroup limit) for cpu, the device's free memory for cuda. UNIMPLEMENTED where the
  // backend cannot tell.
  virtual absl::StatusOr<int64_t> AvailableMemoryBytes() const {
    return absl::UnimplementedError(Name() + " backend cannot tell its free memory");
  }

 protected:
  // The two constructors a backend implements; CreateMlp and CreateNetwork choose between them.

  // The MLP fast path, for a config ValidateMlpConfig accepts. It must handle at least every
  // config for which MlpNeedsNetwork is false (and, where BuildsNetworks is false, every config).
  virtual absl::StatusOr<std::unique_ptr<Model>> CreateMlpFastPath(const MlpConfig& config) = 0;

  // The general network, its parameters named by `naming`. UNIMPLEMENTED by default.
  virtual absl::StatusOr<std::unique_ptr<Model>> CreateNetworkModel(const NetworkConfig& config,
                                                                    ParameterNaming naming) {
    (void)config;
    (void)naming;
    return absl::UnimplementedError(Name() + " backend does not build networks");
  }

  // False where CreateNetworkModel is UNIMPLEMENTED (a cuda build without cuDNN): CreateMlp then
  // takes the fast path for every MLP.
  virtual bool BuildsNetworks() const { return true; }
};

// The oneDNN backend. Never fails on a machine oneDNN supports.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend();

// The engine's factory: the backend named `name` ("cpu", or "cuda" on device `device_index`).
// INVALID_ARGUMENT for another name; for "cuda", FAILED_PRECONDITION in a build without the cuda
// backend (backend_factory.cc, with cuda_unavailable.cc or engine/cuda linked in), else as
// CreateCudaBackend (cuda_backend.h).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& name,
                                                       int device_index = 0);
// Whether this build has the cuda backend (CreateBackend("cuda") can succeed on a machine with a
// GPU).
bool CudaBackendBuilt();

// The cuda half of the factory: defined by engine/cuda when it is built, by
// engine/cuda_unavailable.cc otherwise. Use CreateBackend.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendIfBuilt(int device_index);

}  // namespace stoker

#endif  // STOKER_ENGINE_BACKEND_H_
