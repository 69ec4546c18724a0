#pragma once
// STRATA_HD marks a function compiled for the host and, under nvcc, for the device too: the one
// definition of the per-row math (core/row_math.hpp) and of the half-size element conversions
// (core/half.hpp) that the CPU kernels, the reference and the CUDA kernels all call.

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif
