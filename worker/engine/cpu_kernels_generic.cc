// The element-wise loops for any x86-64.
#define STOKER_KERNEL_ISA generic
#define STOKER_KERNEL_TABLE kGenericKernels
#include "worker/engine/cpu_kernels_impl.inc"
