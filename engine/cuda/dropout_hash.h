// The dropout mask, as a pure function shared by host and device code, so that the cuda network
// draws the cpu network's masks bit for bit (cpu_train_kernels.cc: element i of a layer's
// activation is kept when the top 32 bits of Mix(key + i) are >= rate * 2^32, with
// key = Mix(seed ^ Mix(stream)) and stream = train_steps * 4096 + layer index).
//
// The index i is the cpu's memory order: NHWC for [C, H, W] activations (the cpu network keeps
// images NHWC, also through a Flatten and the elementwise layers after it), NCHW for the network's
// input, [N, features] otherwise; DropoutCpuIndex maps an NCHW index to it, with the arguments
// that DropoutHashLayout (cuda_network_internal.h) chooses per layer.
#ifndef STOKER_ENGINE_CUDA_DROPOUT_HASH_H_
#define STOKER_ENGINE_CUDA_DROPOUT_HASH_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define STOKER_HOST_DEVICE __host__ __device__
#else
#define STOKER_HOST_DEVICE
#endif

namespace stoker::cuda {

// splitmix64's finaliser (the cpu's Mix).
STOKER_HOST_DEVICE inline uint64_t DropoutMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The mask stream of layer `layer_index` in the TrainStep that follows `train_steps` earlier ones.
inline uint64_t DropoutStream(int64_t train_steps, size_t layer_index) {
  return static_cast<uint64_t>(train_steps) * 4096 + layer_index;
}

STOKER_HOST_DEVICE inline uint64_t DropoutKey(uint64_t seed, uint64_t stream) {
  return DropoutMix(seed ^ DropoutMix(stream));
}

// Hash values (top 32 bits) below this are dropped.
inline uint64_t DropoutThreshold(float rate) {
  return static_cast<uint64_t>(static_cast<double>(rate) * 4294967296.0);
}

STOKER_HOST_DEVICE inline bool DropoutKeep(uint64_t key, uint64_t index, uint64_t threshold) {
  return (DropoutMix(key + index) >> 32) >= threshold;
}

// The cpu's index of NCHW element `nchw_index` of a [N, channels, spatial] activation (NHWC
// there). Flat activations pass channels = features, spatial = 1 (the identity).
STOKER_HOST_DEVICE inline uint64_t DropoutCpuIndex(uint64_t nchw_index, uint64_t channels,
                                                   uint64_t spatial) {
  const uint64_t per_sample = channels * spatial;
  const uint64_t n = nchw_index / per_sample;
  const uint64_t within = nchw_index - n * per_sample;
  const uint64_t c = within / spatial;
  const uint64_t s = within - c * spatial;
  return (n * spatial + s) * channels + c;
}

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_DROPOUT_HASH_H_
