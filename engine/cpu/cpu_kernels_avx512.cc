// The element-wise loops for AVX-512 CPUs; CMakeLists compiles this file with -march=x86-64-v4.
#define STOKER_KERNEL_ISA avx512
#define STOKER_KERNEL_TABLE kAvx512Kernels
#include "engine/cpu/cpu_kernels_impl.inc"
