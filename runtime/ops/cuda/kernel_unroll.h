#pragma once
// MIX_UNROLL: #pragma unroll for nvcc, nothing for a host compiler, for kernel
// headers that tests also compile on the CPU (tests/unit/cuda_emulation.h),
// where g++ has no such pragma and warns of it.
#ifdef __CUDACC__
#define MIX_UNROLL _Pragma("unroll")
#else
#define MIX_UNROLL
#endif
