// CudaBackendOptions: the cuda backend's knobs, in a header of their own so that the model
// implementations (cuda_mlp.h, cuda_network.h) take them without including the backend's entry
// point (cuda_backend.h) that is built on top of them. No CUDA headers: a caller that only sets
// options needs none.
#ifndef STOKER_ENGINE_CUDA_CUDA_BACKEND_OPTIONS_H_
#define STOKER_ENGINE_CUDA_CUDA_BACKEND_OPTIONS_H_

#include <cstddef>

namespace stoker {

// Knobs beyond MlpConfig (whose LossScaleConfig drives fp16 loss scaling). The defaults are what a
// trainer wants; tests change them.
struct CudaBackendOptions {
  // Fuse bias, ReLU, ReLU backward and bias gradients into the cuBLASLt GEMMs (epilogues). When
  // false, or when cuBLASLt has no fused algorithm for a shape, plain GEMMs plus small kernels do
  // the same work; both paths give the same results up to rounding.
  bool fused_epilogues = true;
  // cuBLASLt workspace, allocated once per model (32 MiB is what Hopper GEMMs ask for).
  size_t gemm_workspace_bytes = size_t{32} << 20;
  // Capture each TrainStep's device work (everything after the batch copy) in a CUDA graph, one
  // per batch size and staging buffer, and replay it: one launch per step instead of one per
  // kernel. The learning rate travels in device memory, so a graph serves every step. When
  // false, or if a capture fails, the same work is enqueued kernel by kernel; the results are
  // bit-identical either way.
  bool cuda_graphs = true;
};

}  // namespace stoker

#endif  // STOKER_ENGINE_CUDA_CUDA_BACKEND_OPTIONS_H_
