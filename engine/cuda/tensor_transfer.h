// A cuda model's named fp32 tensors (parameters, optimizer state) to and from the host, as
// Model::Parameters, OptimizerState and their setters exchange them.
#ifndef STOKER_ENGINE_CUDA_TENSOR_TRANSFER_H_
#define STOKER_ENGINE_CUDA_TENSOR_TRANSFER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/cuda_context.h"
#include "engine/model.h"

namespace stoker::cuda {

// A model's view of one of its own fp32 tensors: `size` floats at `data` in device memory, or,
// with `data` null, a value the model keeps on the host (a scalar it fills in itself).
struct DeviceTensorRef {
  std::string name;
  std::vector<int64_t> shape;
  float* data = nullptr;
  size_t size = 0;
};

// Copies every tensor to the host on the context's compute stream (after making its device
// current) and waits. A tensor without `data` comes back as `size` zeros.
absl::StatusOr<std::vector<NamedTensor>> DownloadTensors(const DeviceContext& context,
                                                         const std::vector<DeviceTensorRef>& refs);

// INVALID_ARGUMENT, and nothing copied, unless `values` are exactly `refs` by name, shape and
// size, in order (CheckTensorsMatch). Then copies each value into its tensor on the context's
// compute stream and waits; tensors without `data` are skipped.
absl::Status UploadTensors(const DeviceContext& context, const std::vector<DeviceTensorRef>& refs,
                           const std::vector<NamedTensor>& values);

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_TENSOR_TRANSFER_H_
