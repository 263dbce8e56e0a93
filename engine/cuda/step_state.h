// The device-resident step state (StepState: loss, hits, overflow flag, loss scale) of a cuda
// model and its pinned host copy, read back once at the end of each step.
#ifndef STOKER_ENGINE_CUDA_STEP_STATE_H_
#define STOKER_ENGINE_CUDA_STEP_STATE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/mlp_kernels.h"
#include "engine/model.h"
#include "engine/model_config.h"

namespace stoker::cuda {

class StepStateBuffer {
 public:
  StepStateBuffer() = default;
  StepStateBuffer(const StepStateBuffer&) = delete;
  StepStateBuffer& operator=(const StepStateBuffer&) = delete;
  // Frees the pinned copy. The owner synchronises its streams first.
  ~StepStateBuffer();

  // Allocates both copies and enqueues the initial state on `stream`: loss scale
  // `config.initial` with `loss_scaling` (else 1) and GradScaler's growth settings.
  absl::Status Init(bool loss_scaling, const LossScaleConfig& config, cudaStream_t stream);

  StepState* device() const { return device_.as<StepState>(); }
  // The host copy, as of the last ReadBack.
  const StepState& host() const { return *host_; }

  // Zeroes the per-step fields (kStepStateResetBytes) on `stream`.
  absl::Status EnqueueReset(cudaStream_t stream) const;
  // Copies the device state to the host copy on `stream`; enqueues only (CUDA-graph safe).
  absl::Status EnqueueReadBack(cudaStream_t stream) const;
  // EnqueueReadBack, then waits for `stream`: a step's one host synchronisation.
  absl::Status ReadBack(cudaStream_t stream) const;
  // The last read-back step as the Model contract reports it: mean loss over `rows`, skipped when
  // loss scaling found an overflow, the scale in force.
  StepResult TrainResult(int rows, bool loss_scaling) const;
  // The last read-back evaluation of `rows` samples: summed loss and argmax hits.
  EvalResult EvaluateResult(int rows) const;
  // Sets the persistent loss scale and clean-step count (a resumed run) on both copies and waits.
  absl::Status SetLossScale(float scale, int growth_tracker, cudaStream_t stream);

 private:
  DeviceBuffer device_;
  StepState* host_ = nullptr;  // pinned
};

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_STEP_STATE_H_
