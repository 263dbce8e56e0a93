#include "engine/model_base.h"

#include "engine/backend_helpers.h"

namespace stoker {

absl::Status ModelBase::InjectGradientForTest(float value) {
  if (!gradient_test_hook_) return absl::UnimplementedError("this model has no gradient test hook");
  injected_gradient_ = value;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> ModelBase::TrainStepWithoutSamples(double learning_rate) {
  if (reducer_ == nullptr) {
    return absl::FailedPreconditionError(
        "TrainStepWithoutSamples needs a gradient reducer (SetGradientReducer): a model training "
        "alone has no step without samples");
  }
  if (absl::Status status = ValidateLearningRate(learning_rate); !status.ok()) return status;
  return StepWithoutSamples(learning_rate);
}

}  // namespace stoker
