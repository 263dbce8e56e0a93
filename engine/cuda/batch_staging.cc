#include "engine/cuda/batch_staging.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/mlp_kernels.h"

namespace stoker::cuda {

BatchStaging::~BatchStaging() {
  for (int slot = 0; slot < 2; ++slot) {
    if (copy_done_[slot] != nullptr) cudaEventDestroy(copy_done_[slot]);
    if (staging_free_[slot] != nullptr) cudaEventDestroy(staging_free_[slot]);
  }
}

absl::Status BatchStaging::Init(int max_batch, const InputFormat& format) {
  format_ = format;
  const ChannelNormalization& norm = format.normalization;
  const size_t channels = static_cast<size_t>(norm.channels);
  if (norm.channels < 1 || norm.scale.size() != channels || norm.shift.size() != channels ||
      norm.plane * norm.channels != format.values_per_sample) {
    return absl::InvalidArgumentError(
        absl::StrCat("input normalisation of ", norm.channels, " channels x ", norm.plane,
                     " values (", norm.scale.size(), " scales, ", norm.shift.size(),
                     " shifts) does not fit samples of ", format.values_per_sample, " values"));
  }
  per_channel_ = !std::equal(norm.scale.begin() + 1, norm.scale.end(), norm.scale.begin()) ||
                 !std::equal(norm.shift.begin() + 1, norm.shift.end(), norm.shift.begin());
  if (per_channel_) {
    std::vector<float> values = norm.scale;
    values.insert(values.end(), norm.shift.begin(), norm.shift.end());
    STOKER_ASSIGN_BUFFER(channel_values_, values.size() * sizeof(float));
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpy(channel_values_.get(), values.data(),
                                           values.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  const size_t rows = static_cast<size_t>(max_batch);
  for (int slot = 0; slot < 2; ++slot) {
    STOKER_ASSIGN_BUFFER(samples_[slot], rows * format.values_per_sample * sizeof(float));
    STOKER_ASSIGN_BUFFER(labels_[slot], rows);
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&copy_done_[slot], cudaEventDisableTiming));
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&staging_free_[slot], cudaEventDisableTiming));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> BatchStaging::Stage(const BatchView& batch, cudaStream_t copy_stream,
                                        cudaStream_t compute_stream) {
  const int slot = next_slot_;
  next_slot_ ^= 1;
  const int64_t n = static_cast<int64_t>(batch.count) * format_.values_per_sample;
  const bool features = batch.features != nullptr;
  const void* source = features ? static_cast<const void*>(batch.features) : batch.samples;
  const size_t bytes = n * (features ? sizeof(float) : sizeof(uint8_t));

  // The compute stream must be done reading this slot (two batches ago) before it is overwritten.
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream, staging_free_[slot], 0));
  STOKER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(samples_[slot].get(), source, bytes, cudaMemcpyHostToDevice, copy_stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(labels_[slot].get(), batch.labels, batch.count,
                                              cudaMemcpyHostToDevice, copy_stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaEventRecord(copy_done_[slot], copy_stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_stream, copy_done_[slot], 0));
  return slot;
}

absl::Status BatchStaging::Normalize(int slot, int rows, bool features, void* out,
                                     cudaStream_t stream) const {
  const int64_t n = static_cast<int64_t>(rows) * format_.values_per_sample;
  if (features) {
    STOKER_CUDA_RETURN_IF_ERROR(
        LaunchConvertFloat(samples_[slot].as<float>(), n, format_.type, out, stream));
  } else if (per_channel_) {
    const ChannelNormalization& norm = format_.normalization;
    const float* scale = channel_values_.as<float>();
    STOKER_CUDA_RETURN_IF_ERROR(LaunchNormalizeInputPerChannel(
        samples_[slot].as<uint8_t>(), static_cast<int64_t>(rows) * norm.channels, norm.plane,
        norm.channels, scale, scale + norm.channels, format_.type, out, stream));
  } else {
    STOKER_CUDA_RETURN_IF_ERROR(
        LaunchNormalizeInput(samples_[slot].as<uint8_t>(), n, format_.normalization.scale[0],
                             format_.normalization.shift[0], format_.type, out, stream));
  }
  return absl::OkStatus();
}

absl::Status BatchStaging::Release(int slot, cudaStream_t compute_stream) {
  STOKER_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_free_[slot], compute_stream));
  return absl::OkStatus();
}

}  // namespace stoker::cuda
