#pragma once
// What the kernel files of the `cuda` backend (kernels.cu, kernels_half.cu) share: the block size,
// the warp-per-item loop of a grid, and launch(). nvcc only.

#include <cstdint>
#include <utility>

#include "gpu/cuda/cuda_try.hpp"
#include "gpu/cuda/kernels.cuh"
#include "gpu/kernels/simt.hpp"

namespace strata::gpu::cuda_detail {

using kernels::DeviceWarp;
using kernels::kWarp;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarp;
// Resident blocks the register-heavy warp kernels ask of ptxas (__launch_bounds__'s second
// argument): 65536 / (3 * 256) = 85 registers a thread at most.
constexpr int kHeavyMinBlocks = 3;

inline int grid_for(std::int64_t items, int per_block, const KernelGrids& grids, Kernel k) {
  const std::int64_t blocks = (items + per_block - 1) / per_block;
  const std::int64_t cap = grids.max_blocks(k);
  return static_cast<int>(blocks < cap ? blocks : cap);
}
inline int warp_grid(std::int64_t items, const KernelGrids& grids, Kernel k) {
  return grid_for(items, kWarpsPerBlock, grids, k);
}

__device__ __forceinline__ DeviceWarp this_warp() { return DeviceWarp{static_cast<int>(threadIdx.x) % kWarp}; }
__device__ __forceinline__ std::int64_t first_item() {
  return std::int64_t{blockIdx.x} * kWarpsPerBlock + static_cast<std::int64_t>(threadIdx.x) / kWarp;
}
__device__ __forceinline__ std::int64_t item_step() { return std::int64_t{gridDim.x} * kWarpsPerBlock; }
/// body(warp, item) for this warp's work items of `total`, a warp per item, the grid looping over them.
template <class Body>
__device__ __forceinline__ void for_warp_items(std::int64_t total, Body body) {
  const DeviceWarp w = this_warp();
  for (std::int64_t item = first_item(); item < total; item += item_step()) body(w, item);
}

// Launches `kernel` over `grid` blocks of `block` threads on `stream` and returns that launch's own
// error (cudaLaunchKernelEx returns it, where `<<<>>>` needs cudaGetLastError, which would also
// take an error a trainer left pending on the thread: call_quietly keeps that one).
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), int grid, int block, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(static_cast<unsigned>(block));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  return call_quietly([&] { return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...); });
}

}  // namespace strata::gpu::cuda_detail
