#include "engine/cuda/cuda_graph.h"

#include <utility>

#include "engine/cuda/cuda_check.h"

namespace stoker::cuda {

GraphExec::GraphExec(GraphExec&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}

GraphExec& GraphExec::operator=(GraphExec&& other) noexcept {
  if (this != &other) {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

GraphExec::~GraphExec() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

absl::Status GraphExec::Launch(cudaStream_t stream) const {
  if (exec_ == nullptr) return absl::FailedPreconditionError("no graph was captured");
  STOKER_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream));
  return absl::OkStatus();
}

absl::StatusOr<GraphExec> GraphExec::Capture(cudaStream_t stream,
                                             const std::function<absl::Status()>& enqueue) {
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = enqueue();
  cudaGraph_t graph = nullptr;
  // Always end the capture, even after a failed enqueue, so the stream works normally again.
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return enqueued;
  }
  STOKER_CUDA_RETURN_IF_ERROR(ended);
  GraphExec exec;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec.exec_, graph, 0);
  cudaGraphDestroy(graph);
  STOKER_CUDA_RETURN_IF_ERROR(instantiated);
  return exec;
}

}  // namespace stoker::cuda
