// The shared precondition of SetParameters and SetOptimizerState on every backend: the incoming
// tensors are exactly the model's, by name, shape and size, and in order.
#ifndef STOKER_ENGINE_TENSOR_MATCH_H_
#define STOKER_ENGINE_TENSOR_MATCH_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model.h"

namespace stoker {

// `Ref` has `name`, `shape` and `size` (a model's view of one of its own tensors). Checks every
// tensor before the caller changes anything; INVALID_ARGUMENT names the first mismatch.
template <typename Ref>
absl::Status CheckTensorsMatch(const std::vector<Ref>& tensors,
                               const std::vector<NamedTensor>& values) {
  if (values.size() != tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", tensors.size(), " tensors, got ", values.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (values[i].name != tensors[i].name || values[i].shape != tensors[i].shape ||
        values[i].values.size() != tensors[i].size) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " is '", values[i].name, "' with ", values[i].values.size(),
                       " values; expected '", tensors[i].name, "' with ", tensors[i].size));
    }
  }
  return absl::OkStatus();
}

}  // namespace stoker

#endif  // STOKER_ENGINE_TENSOR_MATCH_H_
