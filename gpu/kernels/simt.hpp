#pragma once
// The execution model the shared kernels (gpu/kernels/bodies.hpp) are written in, with a device
// and a host implementation, so one kernel source runs on a GPU and on the CPU grid of the `emu`
// backend.
//
// A kernel body is a function of a warp, written warp-synchronously:
//  - Code outside `w.lanes(...)` is warp-uniform: every lane computes the same values from the same
//    inputs. On the GPU all 32 threads run it; on the CPU it runs once.
//  - `w.lanes([&](int lane) { ... })` is the per-lane part: on the GPU each thread runs it once
//    with its own lane; on the CPU it runs for lane 0, 1, ..., 31 in turn. A lane touches only its
//    own elements of a Reg and the memory it owns (no lane reads what another lane of the same
//    `lanes` call writes).
//  - A value that must outlive one `lanes` call per lane is a `Reg<T>`, indexed by the lane: a
//    register of each thread on the GPU, an array of 32 values on the CPU.
//  - Cross-lane operations sit outside `lanes`: `w.read_lane(reg, l)` gives every lane the value
//    lane l holds (__shfl_sync on the GPU; float or 64-bit integers); `w.read_group_lane(reg, u,
//    width)` gives each lane the value that lane u of its group of `width` lanes holds (groups of
//    consecutive lanes, width a power of two: __shfl_sync with a width); `w.max(reg)` gives every
//    lane the largest value, `w.sum(reg)` the sum (integers: any order).
// Lanes of one warp never race on the CPU (they run in turn), and warps only meet through what one
// launch writes and a later launch on the same stream reads (the hot rows' partial sums), so a
// body that is correct here is correct in both.

#include <cstdint>

#include "gpu/kernels/launch_args.hpp"

// STRATA_SIMT marks a kernel body; STRATA_UNROLL asks for a short fixed-count loop to be unrolled.
#if defined(__CUDACC__)
#define STRATA_SIMT __device__ __forceinline__
#define STRATA_UNROLL _Pragma("unroll")
#else
#define STRATA_SIMT inline
#define STRATA_UNROLL _Pragma("GCC unroll 4")
#endif

namespace strata::gpu::kernels {

#if defined(__CUDACC__)
/// One warp of a CUDA launch (the calling thread's lane).
struct DeviceWarp {
  template <class T>
  struct Reg {
    T v;
    __device__ __forceinline__ T& operator[](int) { return v; }
    __device__ __forceinline__ const T& operator[](int) const { return v; }
  };
  int lane;
  template <class F>
  __device__ __forceinline__ void lanes(F&& f) const {
    f(lane);
  }
  template <class T>
  __device__ __forceinline__ T read_lane(const Reg<T>& r, int l) const {
    return __shfl_sync(0xffffffffu, r.v, l);
  }
  template <class T>
  __device__ __forceinline__ Reg<T> read_group_lane(const Reg<T>& r, int u, int width) const {
    return {__shfl_sync(0xffffffffu, r.v, u, width)};
  }
  __device__ __forceinline__ std::int64_t max(const Reg<std::int64_t>& r) const {
    long long m = r.v;
    for (int o = kWarp / 2; o > 0; o /= 2) {
      const long long x = __shfl_xor_sync(0xffffffffu, m, o);
      m = x > m ? x : m;
    }
    return m;
  }
  __device__ __forceinline__ std::int64_t sum(const Reg<std::int64_t>& r) const {
    long long t = r.v;
    for (int o = kWarp / 2; o > 0; o /= 2) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
  }
};
#endif

/// One warp on the CPU: lanes run in turn.
struct HostWarp {
  template <class T>
  struct Reg {
    T v[kWarp];
    T& operator[](int l) { return v[l]; }
    const T& operator[](int l) const { return v[l]; }
  };
  template <class F>
  void lanes(F&& f) const {
    for (int l = 0; l < kWarp; ++l) f(l);
  }
  template <class T>
  T read_lane(const Reg<T>& r, int l) const {
    return r.v[l];
  }
  template <class T>
  Reg<T> read_group_lane(const Reg<T>& r, int u, int width) const {
    Reg<T> out;
    for (int l = 0; l < kWarp; ++l) out.v[l] = r.v[(l & ~(width - 1)) + u];
    return out;
  }
  std::int64_t max(const Reg<std::int64_t>& r) const {
    std::int64_t m = r.v[0];
    for (int l = 1; l < kWarp; ++l) m = r.v[l] > m ? r.v[l] : m;
    return m;
  }
  std::int64_t sum(const Reg<std::int64_t>& r) const {
    std::int64_t t = 0;
    for (int l = 0; l < kWarp; ++l) t += r.v[l];
    return t;
  }
};

}  // namespace strata::gpu::kernels
