// What every backend's Model shares (the cpu and cuda MLPs and networks): the data-parallel
// reducer it is handed, the gradient test hook, and the checks before a step without samples.
// A backend's model derives from ModelBase and implements StepWithoutSamples instead of
// TrainStepWithoutSamples, and declares the Model calls it implements itself with
// STOKER_MODEL_OVERRIDES.
#ifndef STOKER_ENGINE_MODEL_BASE_H_
#define STOKER_ENGINE_MODEL_BASE_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gradient_reducer.h"
#include "engine/model.h"

// In a backend model's class body (public): the Model calls every backend implements itself,
// a step, an evaluation, and the parameters and optimizer state in and out (model.h).
#define STOKER_MODEL_OVERRIDES                                                                 \
  absl::StatusOr<StepResult> TrainStep(const BatchView& batch, double learning_rate) override; \
  absl::StatusOr<EvalResult> Evaluate(const BatchView& batch) override;                        \
  std::vector<NamedTensor> Parameters() const override;                                        \
  absl::Status SetParameters(const std::vector<NamedTensor>& parameters) override;             \
  std::vector<NamedTensor> OptimizerState() const override;                                    \
  absl::Status SetOptimizerState(const std::vector<NamedTensor>& state) override

namespace stoker {

class ModelBase : public Model {
 public:
  absl::Status SetGradientReducer(GradientReducer* reducer) final {
    reducer_ = reducer;
    return absl::OkStatus();
  }
  // UNIMPLEMENTED unless the model was built with the hook (it applies TakeInjectedGradient()).
  absl::Status InjectGradientForTest(float value) final;
  // FAILED_PRECONDITION without a reducer, INVALID_ARGUMENT for a bad learning rate; else
  // StepWithoutSamples.
  absl::StatusOr<StepResult> TrainStepWithoutSamples(double learning_rate) final;

 protected:
  // `gradient_test_hook`: the model adds InjectGradientForTest's value to one gradient element
  // (TakeInjectedGradient); without it the hook is refused rather than ignored.
  explicit ModelBase(bool gradient_test_hook) : gradient_test_hook_(gradient_test_hook) {}

  // A data-parallel step without samples, once TrainStepWithoutSamples' checks have passed.
  virtual absl::StatusOr<StepResult> StepWithoutSamples(double learning_rate) = 0;

  // The test hook's pending value, once; nothing when none is pending.
  std::optional<float> TakeInjectedGradient() {
    std::optional<float> value = injected_gradient_;
    injected_gradient_.reset();
    return value;
  }
  bool has_injected_gradient() const { return injected_gradient_.has_value(); }

  // Data-parallel training: not owned; null when the model trains alone.
  GradientReducer* reducer_ = nullptr;

 private:
  const bool gradient_test_hook_;
  std::optional<float> injected_gradient_;
};

}  // namespace stoker

#endif  // STOKER_ENGINE_MODEL_BASE_H_
