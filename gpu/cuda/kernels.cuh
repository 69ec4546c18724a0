#pragma once
// Launchers of the `cuda` backend's kernels (gpu/cuda/kernels.cu: the shared kernel source of
// gpu/kernels/bodies.hpp compiled for the GPU). Unlike most .cuh files this header compiles with
// the host compiler: cuda_device.cpp (g++) includes it, and only kernels.cu holds device code.
//
// Each launcher runs one launch built by gpu/kernels/launch_args.hpp and returns the error of its
// launch (cudaSuccess when there was nothing to launch) without reading or clearing an error the
// caller left pending on the thread (kernels.cu, launch()); the kernels themselves report nothing,
// so faults surface at the next synchronizing call. `grids` caps each grid at what the GPU runs at
// once (the kernels loop over their work items).

#include <cuda_runtime_api.h>

#include "gpu/kernels/launch_args.hpp"

namespace strata::gpu::cuda_detail {

/// The kernels of kernels.cu (the launchers choose among them).
enum class Kernel : int {
  kGather,             ///< gather-pool from a slot pool or a one-part host table
  kGatherInterleaved,  ///< gather-pool from a host table over several NUMA parts
  kUpdate,             ///< fused backward, a warp per row
  kHotSegments,        ///< the hot rows' segment sums of a fused backward or gradient reduction
  kReduce,             ///< gradient sums of the sharded modes
  kPack,               ///< records -> packed
  kUnpack,             ///< packed -> records
  kFromHost,           ///< host records -> slots, zero-copy
  kToHost,             ///< slots -> host records, zero-copy
  kInit,               ///< record initialization
  kNonfiniteChunk,     ///< NaN/Inf counts per chunk
  kNonfiniteSum,       ///< NaN/Inf counts per range
  kGatherOverflow,     ///< kGather from a slot pool with an overflow region (gpu::SlotPool::overflow)
  kUpdateOverflow,     ///< kUpdate in a slot pool with an overflow region
};
inline constexpr int kKernelCount = 14;

/// How many blocks of each kernel one GPU runs at once: its multiprocessors times the blocks of
/// that kernel a multiprocessor holds (cudaOccupancyMaxActiveBlocksPerMultiprocessor at the
/// kernel's block size, which reflects its registers and shared memory). Plain data.
struct KernelGrids {
  int sm_count = 0;
  int blocks_per_sm[kKernelCount] = {};
  /// The most blocks worth launching of `k` (at least 1).
  long long max_blocks(Kernel k) const noexcept {
    const long long n = static_cast<long long>(sm_count) * blocks_per_sm[static_cast<int>(k)];
    return n > 0 ? n : 1;
  }
};

/// Fills `grids` for the current device, which has `sm_count` multiprocessors. A kernel that
/// cannot run there at all gets 0 blocks per multiprocessor (the caller refuses such a device).
cudaError_t query_kernel_grids(int sm_count, KernelGrids* grids);
/// The kernel's name as in kernels.cu and gpu/cuda/kernel_resources_sm90.txt ("update_kernel").
const char* kernel_name(Kernel k);
/// The kernel's block size (threads).
int kernel_block(Kernel k);

/// Gather-pool from a slot pool, or zero-copy from a pinned host table (args.source holds
/// device-visible addresses of its parts). Asynchronous on `stream`.
cudaError_t launch_gather(const kernels::GatherArgs& args, cudaStream_t stream, const KernelGrids& grids);

/// Fused backward: per unique slot, the gradient in segment order, then the optimizer step in
/// place; with args.partials first a warp per segment of each hot row, then a warp per row.
/// Asynchronous on `stream`.
cudaError_t launch_update(const kernels::UpdateArgs& args, cudaStream_t stream, const KernelGrids& grids);
/// launch_gather, and launch_update after its hot rows' segments, of half-size rows or state (the
/// kernels of kernels_half.cu).
cudaError_t launch_gather_half(const kernels::GatherArgs& args, cudaStream_t stream, const KernelGrids& grids);
cudaError_t launch_update_half(const kernels::UpdateArgs& args, cudaStream_t stream, const KernelGrids& grids);
/// Gradient reduction (Device::reduce_grads): launch_update's sums, written instead of applied.
cudaError_t launch_reduce(const kernels::UpdateArgs& args, cudaStream_t stream, const KernelGrids& grids);

/// Packs (pool -> args.packed) or, with `unpack`, unpacks the records of args.slots, bit for bit.
/// Asynchronous on `stream`.
cudaError_t launch_records(const kernels::RecordArgs& args, bool unpack, cudaStream_t stream, const KernelGrids& grids);

/// Moves args.n records between slots and host records, zero-copy (to_host: slot -> host).
/// Asynchronous on `stream`.
cudaError_t launch_host_records(const kernels::HostRecordArgs& args, bool to_host, cudaStream_t stream,
                                const KernelGrids& grids);

/// Initializes args.n records of a pool on the device. Asynchronous on `stream`.
cudaError_t launch_init(const kernels::InitArgs& args, cudaStream_t stream, const KernelGrids& grids);

/// Counts the NaN and Inf values of each range into args.totals (chunk counts, then a sum per
/// range). Asynchronous on `stream`.
cudaError_t launch_nonfinite(const kernels::FiniteArgs& args, cudaStream_t stream, const KernelGrids& grids);

}  // namespace strata::gpu::cuda_detail
