// The `cuda` backend's kernels: grids over the shared kernel bodies of gpu/kernels/bodies.hpp (the
// same source the `emu` backend runs on the CPU grid). Blocks of kBlock threads, a warp per work
// item, grids sized to the GPU and looping over the items; the hot rows of a backward get a
// second kernel with a block of kHotWarps warps per row.

#include <cstdint>

#include "gpu/cuda/kernels.cuh"
#include "gpu/kernels/bodies.hpp"

namespace strata::gpu::cuda_detail {
namespace {

using namespace kernels;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarp;
constexpr int kHotBlock = kHotWarps * kWarp;
// 8 blocks of 256 threads fill an SM (2048 threads on sm_80 and sm_90).
constexpr int kBlocksPerSm = 8;

int grid_for(std::int64_t items, int per_block, int blocks_per_sm, int sm_count) {
  const std::int64_t blocks = (items + per_block - 1) / per_block;
  const std::int64_t cap = std::int64_t{sm_count > 0 ? sm_count : 1} * blocks_per_sm;
  return static_cast<int>(blocks < cap ? blocks : cap);
}
int warp_grid(std::int64_t items, int sm_count) { return grid_for(items, kWarpsPerBlock, kBlocksPerSm, sm_count); }

__device__ __forceinline__ DeviceWarp this_warp() { return DeviceWarp{static_cast<int>(threadIdx.x) % kWarp}; }
__device__ __forceinline__ std::int64_t first_item() {
  return std::int64_t{blockIdx.x} * kWarpsPerBlock + static_cast<std::int64_t>(threadIdx.x) / kWarp;
}
__device__ __forceinline__ std::int64_t item_step() { return std::int64_t{gridDim.x} * kWarpsPerBlock; }

template <bool kInterleaved>
__global__ void __launch_bounds__(kBlock) gather_kernel(const GatherArgs a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step()) gather_item<kInterleaved>(w, a, item);
}

__global__ void __launch_bounds__(kBlock) update_kernel(const UpdateArgs a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step()) update_item(w, a, item);
}

// A block per hot row (update_kernel skipped them): the listed ones, or every unique row, skipping
// those that are not hot.
__global__ void __launch_bounds__(kHotBlock) update_hot_kernel(const UpdateArgs a) {
  __shared__ float partials[kHotWarps * kChunk];
  const DeviceBlock<kHotWarps> b{this_warp(), static_cast<int>(threadIdx.x) / kWarp};
  const std::int64_t total = a.hot_items();
  for (std::int64_t item = blockIdx.x; item < total; item += gridDim.x) update_hot_row(b, a, item, partials);
}

__global__ void __launch_bounds__(kBlock) reduce_kernel(const UpdateArgs a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step()) reduce_item(w, a, item);
}

template <bool kUnpack>
__global__ void __launch_bounds__(kBlock) records_kernel(const RecordArgs a) {
  const DeviceWarp w = this_warp();
  for (std::int64_t i = first_item(); i < a.n; i += item_step()) {
    if (kUnpack) {
      unpack_record(w, a, i);
    } else {
      pack_record(w, a, i);
    }
  }
}

template <bool kToHost>
__global__ void __launch_bounds__(kBlock) host_records_kernel(const HostRecordArgs a) {
  const DeviceWarp w = this_warp();
  for (std::int64_t i = first_item(); i < a.n; i += item_step()) move_host_record(w, a, i, kToHost);
}

__global__ void __launch_bounds__(kBlock) init_kernel(const InitArgs a) {
  const DeviceWarp w = this_warp();
  for (std::int64_t i = first_item(); i < a.n; i += item_step()) init_record(w, a, i);
}

__global__ void __launch_bounds__(kBlock) nonfinite_chunk_kernel(const FiniteArgs a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step()) count_nonfinite_chunk(w, a, item);
}

// A warp per feature (after nonfinite_chunk_kernel, on the same stream).
__global__ void __launch_bounds__(kBlock) nonfinite_sum_kernel(const FiniteArgs a) {
  const DeviceWarp w = this_warp();
  for (std::int64_t f = first_item(); f < a.count; f += item_step()) sum_nonfinite(w, a, static_cast<int>(f));
}

// Drops an error left by an earlier runtime call on this thread (already reported through that
// call's return value), so the check after a launch reports that launch alone.
void clear_stale_error() { (void)cudaGetLastError(); }

}  // namespace

cudaError_t launch_gather(const GatherArgs& args, cudaStream_t stream, int sm_count) {
  const std::int64_t items = args.begin[args.count];
  if (items <= 0) return cudaSuccess;
  clear_stale_error();
  if (args.source.parts == 1) {
    gather_kernel<false><<<warp_grid(items, sm_count), kBlock, 0, stream>>>(args);
  } else {
    gather_kernel<true><<<warp_grid(items, sm_count), kBlock, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t launch_update(const UpdateArgs& args, cudaStream_t stream, int sm_count) {
  const std::int64_t items = args.begin[args.count];
  if (items <= 0) return cudaSuccess;
  clear_stale_error();
  update_kernel<<<warp_grid(items, sm_count), kBlock, 0, stream>>>(args);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  // One block of kHotBlock threads fits an SM (ptxas: 92 registers a thread, 47k of 64k); none
  // when the lists say no row is hot.
  const std::int64_t hot = args.hot_items();
  if (hot <= 0) return cudaSuccess;
  update_hot_kernel<<<grid_for(hot, 1, 1, sm_count), kHotBlock, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_reduce(const UpdateArgs& args, cudaStream_t stream, int sm_count) {
  const std::int64_t items = args.begin[args.count];
  if (items <= 0) return cudaSuccess;
  clear_stale_error();
  reduce_kernel<<<warp_grid(items, sm_count), kBlock, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_records(const RecordArgs& args, bool unpack, cudaStream_t stream, int sm_count) {
  if (args.n <= 0 || args.stride <= 0) return cudaSuccess;
  clear_stale_error();
  if (unpack) {
    records_kernel<true><<<warp_grid(args.n, sm_count), kBlock, 0, stream>>>(args);
  } else {
    records_kernel<false><<<warp_grid(args.n, sm_count), kBlock, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t launch_host_records(const HostRecordArgs& args, bool to_host, cudaStream_t stream, int sm_count) {
  if (args.n <= 0) return cudaSuccess;
  clear_stale_error();
  if (to_host) {
    host_records_kernel<true><<<warp_grid(args.n, sm_count), kBlock, 0, stream>>>(args);
  } else {
    host_records_kernel<false><<<warp_grid(args.n, sm_count), kBlock, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t launch_init(const InitArgs& args, cudaStream_t stream, int sm_count) {
  if (args.n <= 0) return cudaSuccess;
  clear_stale_error();
  init_kernel<<<warp_grid(args.n, sm_count), kBlock, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_nonfinite(const FiniteArgs& args, cudaStream_t stream, int sm_count) {
  if (args.count <= 0) return cudaSuccess;
  clear_stale_error();
  const std::int64_t chunks = args.begin[args.count];
  if (chunks > 0) {
    nonfinite_chunk_kernel<<<warp_grid(chunks, sm_count), kBlock, 0, stream>>>(args);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  nonfinite_sum_kernel<<<warp_grid(args.count, sm_count), kBlock, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace strata::gpu::cuda_detail
