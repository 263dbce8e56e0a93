// The cpu network's parameters and optimizer state to and from the host (checkpoints).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <numeric>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_network_internal.h"
#include "engine/cpu/cpu_train_kernels.h"
#include "engine/layer_kinds.h"

namespace stoker::cpu_network_internal {

std::vector<NamedTensor> CpuNetwork::Parameters() const {
  std::vector<NamedTensor> result;
  for (const Param& param : params_) {
    result.push_back(
        {param.name, param.shape,
         std::vector<float>(param.value.data(), param.value.data() + param.value.size())});
  }
  return result;
}

namespace {

absl::Status CheckTensor(size_t i, const NamedTensor& actual, const std::string& name,
                         const std::vector<int64_t>& shape, size_t size) {
  if (actual.name != name || actual.shape != shape || actual.values.size() != size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " is '", actual.name, "' with ",
                                                   actual.values.size(), " values; expected '",
                                                   name, "' with ", size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuNetwork::SetParameters(const std::vector<NamedTensor>& parameters) {
  if (parameters.size() != params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", params_.size(), " tensors, got ", parameters.size()));
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    absl::Status s =
        CheckTensor(p, parameters[p], params_[p].name, params_[p].shape, params_[p].value.size());
    if (!s.ok()) return s;
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    std::copy(parameters[p].values.begin(), parameters[p].values.end(), params_[p].value.data());
  }
  try {
    RefreshComputeWeights();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed to reorder the weights: ", e.what()));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::vector<float>>> CpuNetwork::ScalarState() const {
  std::vector<std::pair<std::string, std::vector<float>>> scalars = {
      {"optimizer.step", {static_cast<float>(optimizer_steps_)}},
      {"train_step", {static_cast<float>(train_steps_)}}};
  if (fp16()) scalars.push_back({"loss_scale", {loss_scale_, static_cast<float>(growth_tracker_)}});
  return scalars;
}

std::vector<NamedTensor> CpuNetwork::OptimizerState() const {
  std::vector<NamedTensor> result;
  for (const Param& param : params_) {
    if (!param.trained) continue;
    auto copy = [&](const char* suffix, const AlignedArray<float>& values) {
      result.push_back({param.name + suffix, param.shape,
                        std::vector<float>(values.data(), values.data() + values.size())});
    };
    if (adamw()) {
      copy(".exp_avg", param.state1);
      copy(".exp_avg_sq", param.state2);
    } else {
      copy(".momentum", param.state1);
    }
  }
  for (auto& [name, values] : ScalarState()) {
    result.push_back({name, {static_cast<int64_t>(values.size())}, values});
  }
  return result;
}

absl::Status CpuNetwork::SetOptimizerState(const std::vector<NamedTensor>& state) {
  const std::vector<NamedTensor> expected = OptimizerState();
  if (state.size() != expected.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", expected.size(), " tensors, got ", state.size()));
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    absl::Status s =
        CheckTensor(i, state[i], expected[i].name, expected[i].shape, expected[i].values.size());
    if (!s.ok()) return s;
  }
  const size_t scalar_start = expected.size() - ScalarState().size();
  for (size_t i = scalar_start; i < state.size(); ++i) {
    if (absl::Status s = ValidateScalarState(state[i]); !s.ok()) return s;
  }
  size_t i = 0;
  for (Param& param : params_) {
    if (!param.trained) continue;
    std::copy(state[i].values.begin(), state[i].values.end(), param.state1.data());
    ++i;
    if (adamw()) {
      std::copy(state[i].values.begin(), state[i].values.end(), param.state2.data());
      ++i;
    }
  }
  optimizer_steps_ = static_cast<int64_t>(state[i].values[0]);
  train_steps_ = static_cast<int64_t>(state[i + 1].values[0]);
  if (fp16()) {
    loss_scale_ = state[i + 2].values[0];
    growth_tracker_ = static_cast<int64_t>(state[i + 2].values[1]);
  }
  return absl::OkStatus();
}

}  // namespace stoker::cpu_network_internal
