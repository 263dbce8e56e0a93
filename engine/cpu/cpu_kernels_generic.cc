// The element-wise loops for any x86-64.
#define STOKER_KERNEL_ISA generic
#define STOKER_KERNEL_TABLE kGenericKernels
#include "engine/cpu/cpu_kernels_impl.inc"
