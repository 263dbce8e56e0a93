// Double-buffered device staging of the batches a model trains and evaluates on, shared by the
// cuda MLP and network. A batch (uint8 samples or float features, and uint8 labels) is copied as
// it came into one of two staging slots on the copy stream, so that the copy of the next batch
// overlaps the compute stream's work on this one; events order the two streams, never the host:
//   copy stream     wait staging_free[slot], copy samples and labels, record copy_done[slot]
//   compute stream  wait copy_done[slot], ..., record staging_free[slot] (Release) once nothing
//                   reads the slot any more
// Normalize, the conversion of a slot's samples into the model's input, is a separate step so
// that a model may capture it in a CUDA graph; Stage may not be captured (the slot alternates).
#ifndef STOKER_ENGINE_CUDA_BATCH_STAGING_H_
#define STOKER_ENGINE_CUDA_BATCH_STAGING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend_helpers.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/dtype.h"

namespace stoker::cuda {

// What a model's input is made of, and how staged samples become it.
struct InputFormat {
  int64_t values_per_sample = 0;  // features (or pixels) per sample
  // uint8 samples, per channel: pixel * scale[c] + shift[c] (InputNormalization(config); its
  // plane times its channels is values_per_sample).
  ChannelNormalization normalization;
  DType type = DType::kF32;  // the input's element type (the model's compute type)
};

class BatchStaging {
 public:
  BatchStaging() = default;
  BatchStaging(const BatchStaging&) = delete;
  BatchStaging& operator=(const BatchStaging&) = delete;
  // Destroys the events and frees the slots: the owner waits for both streams first.
  ~BatchStaging();

  // Allocates both slots, each with room for `max_batch` samples as float features (the larger
  // of the two input forms) and their labels, creates the slots' events and, when the channels'
  // normalisations differ, copies them to the device (else one scale and shift serve the whole
  // batch, as kernel arguments). Call once, on the model's device. RESOURCE_EXHAUSTED when
  // device memory runs out, INVALID_ARGUMENT for a normalisation that does not fit
  // values_per_sample, INTERNAL for other errors.
  absl::Status Init(int max_batch, const InputFormat& format);

  // Enqueues the copy of `batch` (already validated against the model) into the next slot on
  // `copy_stream`, after `compute_stream` has released that slot (two batches ago), and makes
  // `compute_stream` wait for the copy. Returns the slot. Never capture it in a graph.
  absl::StatusOr<int> Stage(const BatchView& batch, cudaStream_t copy_stream,
                            cudaStream_t compute_stream);

  // Enqueues on `stream` the conversion of the first `rows` samples staged in `slot` into `out`
  // ([rows, values_per_sample] in the format's type): uint8 samples normalised, float features
  // (`features`) converted. Enqueues only, so it may be captured in a CUDA graph.
  absl::Status Normalize(int slot, int rows, bool features, void* out, cudaStream_t stream) const;

  // Records on `compute_stream` that nothing enqueued after this point reads `slot`: the copy
  // stream may refill it.
  absl::Status Release(int slot, cudaStream_t compute_stream);

  // The labels staged in `slot`, one uint8 per sample.
  const uint8_t* labels(int slot) const { return labels_[slot].as<uint8_t>(); }

 private:
  InputFormat format_;
  bool per_channel_ = false;     // the channels' normalisations differ
  DeviceBuffer channel_values_;  // per_channel_: [scale x channels, shift x channels], fp32
  DeviceBuffer samples_[2];
  DeviceBuffer labels_[2];
  cudaEvent_t copy_done_[2] = {nullptr, nullptr};     // recorded on the copy stream
  cudaEvent_t staging_free_[2] = {nullptr, nullptr};  // recorded on the compute stream
  int next_slot_ = 0;
};

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_BATCH_STAGING_H_
