// CUDA graphs: a step's kernels, GEMMs and copies captured once from a stream and replayed with
// one launch, which removes the per-kernel launch cost (tens of launches per step for an MLP).
#ifndef STOKER_ENGINE_CUDA_CUDA_GRAPH_H_
#define STOKER_ENGINE_CUDA_CUDA_GRAPH_H_

#include <cuda_runtime_api.h>

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stoker::cuda {

// An instantiated graph, destroyed with the object. Move-only.
class GraphExec {
 public:
  GraphExec() = default;
  GraphExec(GraphExec&& other) noexcept;
  GraphExec& operator=(GraphExec&& other) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  ~GraphExec();

  explicit operator bool() const { return exec_ != nullptr; }
  // Enqueues the whole graph on `stream`.
  absl::Status Launch(cudaStream_t stream) const;

  // Captures what `enqueue` puts on `stream` (thread-local capture mode: other threads' CUDA
  // calls are unaffected) and instantiates it. The stream must not be capturing already, and
  // `enqueue` must only enqueue work (no host synchronisation, no allocation, pinned host memory
  // only). If `enqueue` or the capture fails, the stream is left out of capture mode and the
  // error returned; nothing ran.
  static absl::StatusOr<GraphExec> Capture(cudaStream_t stream,
                                           const std::function<absl::Status()>& enqueue);

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_CUDA_GRAPH_H_
