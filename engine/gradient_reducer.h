// The one thing data-parallel training needs from a model's side: a place to hand gradients to
// between backward and the optimizer update. comm/ implements it (Gloo, NCCL); engine/ calls it.
#ifndef STOKER_ENGINE_GRADIENT_REDUCER_H_
#define STOKER_ENGINE_GRADIENT_REDUCER_H_

#include <cstdint>

#include "absl/status/status.h"

namespace stoker {

// Data-parallel training: a model given a reducer (Model::SetGradientReducer) hands it its
// gradients between backward and the optimizer update, and updates with what comes back, so every
// rank takes the same step. Per step, the model
//   1. scales its batch-mean loss gradient by LocalShare() before backward (this rank's samples
//      over the global batch's: the ranks' gradients then sum to the global batch's mean),
//   2. calls GradientReady(i, ...) for each trained tensor once its gradient is final, in the
//      order backward finishes them (the same order, pointers and counts every step; i counts
//      0, 1, ... in that order), so a reducer may start summing early gradients while backward
//      still computes later ones,
//   3. calls Finish(): afterwards every buffer holds the sum over the ranks; the model then checks
//      finiteness (fp16), unscales, clips and updates as it would alone.
// Buffers are fp32 master gradients (fp16: still multiplied by the loss scale, which every rank
// keeps equal); a cuda model's are device pointers on its device whose final values the work it
// enqueued on its compute stream before the call writes: the reducer orders its reads after that
// stream, and when Finish returns its sums must be in place or ordered before that stream's later
// work (cuda_mlp.h and cuda_network.h expose the stream).
// From GradientReady until Finish returns the model neither reads nor writes a buffer it handed
// over. A step that fails before its first GradientReady (a bad batch, a
// LocalShare outside (0, 1]) leaves the reducer untouched; one that fails after it (a backend
// error) returns without calling Finish, leaving the reducer mid-step: the caller gives up the
// attempt, as after a collective's error. A reducer serves one model.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual float LocalShare() const = 0;
  virtual void GradientReady(int index, float* gradient, int64_t count) = 0;
  // An error (a peer gone, a timeout) fails the step: the model must not update.
  virtual absl::Status Finish() = 0;
};

}  // namespace stoker

#endif  // STOKER_ENGINE_GRADIENT_REDUCER_H_
