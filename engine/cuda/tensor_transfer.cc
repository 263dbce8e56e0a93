#include "engine/cuda/tensor_transfer.h"

#include <cuda_runtime_api.h>

#include "engine/cuda/cuda_check.h"
#include "engine/tensor_match.h"

namespace stoker::cuda {

absl::StatusOr<std::vector<NamedTensor>> DownloadTensors(const DeviceContext& context,
                                                         const std::vector<DeviceTensorRef>& refs) {
  STOKER_RETURN_IF_ERROR(context.Activate());
  const cudaStream_t stream = context.compute_stream();
  std::vector<NamedTensor> copies;
  copies.reserve(refs.size());
  for (const DeviceTensorRef& ref : refs) {
    copies.push_back({ref.name, ref.shape, std::vector<float>(ref.size)});
    if (ref.data == nullptr) continue;
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copies.back().values.data(), ref.data,
                                                ref.size * sizeof(float), cudaMemcpyDeviceToHost,
                                                stream));
  }
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return copies;
}

absl::Status UploadTensors(const DeviceContext& context, const std::vector<DeviceTensorRef>& refs,
                           const std::vector<NamedTensor>& values) {
  if (absl::Status status = CheckTensorsMatch(refs, values); !status.ok()) return status;
  STOKER_RETURN_IF_ERROR(context.Activate());
  const cudaStream_t stream = context.compute_stream();
  for (size_t i = 0; i < refs.size(); ++i) {
    if (refs[i].data == nullptr) continue;
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(refs[i].data, values[i].values.data(),
                                                refs[i].size * sizeof(float),
                                                cudaMemcpyHostToDevice, stream));
  }
  // The host vectors must outlive the copies (pageable copies may return before the DMA ends).
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace stoker::cuda
