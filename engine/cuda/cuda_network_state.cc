// The cuda network's parameters (BatchNorm's running statistics included) and optimizer state to
// and from the host, named and ordered as the cpu network's (checkpoints move between the two
// backends).
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_network_internal.h"
#include "engine/cuda/tensor_transfer.h"
#include "engine/tensor_match.h"

namespace stoker::cuda::network_internal {

std::vector<DeviceTensorRef> CudaNetwork::ParameterRefs() const {
  std::vector<DeviceTensorRef> refs;
  for (const Param& param : params_) {
    refs.push_back(
        {param.name, param.shape, param.value.as<float>(), static_cast<size_t>(param.size)});
  }
  return refs;
}

std::vector<std::pair<std::string, std::vector<float>>> CudaNetwork::ScalarState() const {
  // Counters are exact in float up to 2^24, as on the cpu.
  std::vector<std::pair<std::string, std::vector<float>>> scalars = {
      {"optimizer.step", {static_cast<float>(optimizer_steps_)}},
      {"train_step", {static_cast<float>(train_steps_)}}};
  if (loss_scaling_) {
    scalars.push_back(
        {"loss_scale",
         {state_.host().loss_scale, static_cast<float>(state_.host().growth_tracker)}});
  }
  return scalars;
}

std::vector<DeviceTensorRef> CudaNetwork::StateRefs() const {
  std::vector<DeviceTensorRef> refs;
  for (const Param& param : params_) {
    if (!param.trained) continue;  // BatchNorm's buffers have no optimizer state
    const size_t size = static_cast<size_t>(param.size);
    if (adamw()) {
      refs.push_back({param.name + ".exp_avg", param.shape, param.state1.as<float>(), size});
      refs.push_back({param.name + ".exp_avg_sq", param.shape, param.state2.as<float>(), size});
    } else {
      refs.push_back({param.name + ".momentum", param.shape, param.state1.as<float>(), size});
    }
  }
  for (const auto& [name, values] : ScalarState()) {
    refs.push_back({name, {static_cast<int64_t>(values.size())}, nullptr, values.size()});
  }
  return refs;
}

std::vector<NamedTensor> CudaNetwork::Parameters() const {
  absl::StatusOr<std::vector<NamedTensor>> copies = DownloadTensors(*context_, ParameterRefs());
  return copies.ok() ? *std::move(copies) : std::vector<NamedTensor>{};
}

absl::Status CudaNetwork::SetParameters(const std::vector<NamedTensor>& parameters) {
  STOKER_RETURN_IF_ERROR(UploadTensors(*context_, ParameterRefs(), parameters));
  return RefreshLowWeights();
}

absl::Status CudaNetwork::RefreshLowWeights() {
  if (type_ == DType::kF32) return absl::OkStatus();
  const cudaStream_t stream = context_->compute_stream();
  for (const Param& param : params_) {
    if (param.low.get() == nullptr) continue;
    STOKER_CUDA_RETURN_IF_ERROR(cuda::LaunchConvertFromF32(param.value.as<float>(), param.size,
                                                           type_, param.low.get(), stream));
  }
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

std::vector<NamedTensor> CudaNetwork::OptimizerState() const {
  const std::vector<DeviceTensorRef> refs = StateRefs();
  absl::StatusOr<std::vector<NamedTensor>> copies = DownloadTensors(*context_, refs);
  if (!copies.ok()) return {};
  const auto scalars = ScalarState();
  const size_t first_scalar = refs.size() - scalars.size();
  for (size_t i = 0; i < scalars.size(); ++i)
    (*copies)[first_scalar + i].values = scalars[i].second;
  return *std::move(copies);
}

absl::Status CudaNetwork::SetOptimizerState(const std::vector<NamedTensor>& state) {
  const std::vector<DeviceTensorRef> refs = StateRefs();
  // Checked before UploadTensors checks again: the scalars' values are read below.
  if (absl::Status s = CheckTensorsMatch(refs, state); !s.ok()) return s;
  const size_t first_scalar = refs.size() - ScalarState().size();
  for (size_t i = first_scalar; i < state.size(); ++i) {
    if (absl::Status s = ValidateScalarState(state[i]); !s.ok()) return s;
  }
  STOKER_RETURN_IF_ERROR(UploadTensors(*context_, refs, state));
  optimizer_steps_ = static_cast<int64_t>(state[first_scalar].values[0]);
  train_steps_ = static_cast<int64_t>(state[first_scalar + 1].values[0]);
  if (loss_scaling_) {
    STOKER_RETURN_IF_ERROR(state_.SetLossScale(state[first_scalar + 2].values[0],
                                               static_cast<int>(state[first_scalar + 2].values[1]),
                                               context_->compute_stream()));
  }
  return absl::OkStatus();
}

}  // namespace stoker::cuda::network_internal
