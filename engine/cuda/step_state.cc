#include "engine/cuda/step_state.h"

#include <algorithm>
#include <cstddef>

#include "engine/cuda/cuda_check.h"

namespace stoker::cuda {

StepStateBuffer::~StepStateBuffer() {
  if (host_ != nullptr) cudaFreeHost(host_);
}

absl::Status StepStateBuffer::Init(bool loss_scaling, const LossScaleConfig& config,
                                   cudaStream_t stream) {
  STOKER_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&host_), sizeof(StepState)));
  STOKER_ASSIGN_BUFFER(device_, sizeof(StepState));
  *host_ = StepState{};
  host_->loss_scale = loss_scaling ? config.initial : 1.0f;
  host_->growth_interval = std::max(1, config.growth_interval);
  host_->growth_factor = config.growth_factor;
  host_->backoff_factor = config.backoff_factor;
  STOKER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_.get(), host_, sizeof(StepState), cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

absl::Status StepStateBuffer::EnqueueReset(cudaStream_t stream) const {
  STOKER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device_.get(), 0, kStepStateResetBytes, stream));
  return absl::OkStatus();
}

absl::Status StepStateBuffer::EnqueueReadBack(cudaStream_t stream) const {
  STOKER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_, device_.get(), sizeof(StepState), cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

absl::Status StepStateBuffer::ReadBack(cudaStream_t stream) const {
  STOKER_RETURN_IF_ERROR(EnqueueReadBack(stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

StepResult StepStateBuffer::TrainResult(int rows, bool loss_scaling) const {
  StepResult result;
  result.loss = static_cast<float>(host_->loss_sum / rows);
  result.skipped = loss_scaling && host_->found_inf != 0;
  result.loss_scale = host_->loss_scale;
  return result;
}

EvalResult StepStateBuffer::EvaluateResult(int rows) const {
  EvalResult result;
  result.loss_sum = host_->loss_sum;
  result.correct = static_cast<int64_t>(host_->correct);
  result.count = rows;
  return result;
}

absl::Status StepStateBuffer::SetLossScale(float scale, int growth_tracker, cudaStream_t stream) {
  host_->loss_scale = scale;
  host_->growth_tracker = growth_tracker;
  // Only the persistent fields; the per-step ones are reset by every step anyway.
  const size_t offset = offsetof(StepState, loss_scale);
  STOKER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_.as<char>() + offset, reinterpret_cast<const char*>(host_) + offset,
                      sizeof(StepState) - offset, cudaMemcpyHostToDevice, stream));
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace stoker::cuda
