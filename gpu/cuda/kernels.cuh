#pragma once
// Launchers of the `cuda` backend's kernels (gpu/cuda/kernels.cu: the shared kernel source of
// gpu/kernels/bodies.hpp compiled for the GPU). Unlike most .cuh files this header compiles with
// the host compiler: cuda_device.cpp (g++) includes it, and only kernels.cu holds device code.
//
// Each launcher runs one launch built by gpu/kernels/launch_args.hpp and returns the error of its
// launch (cudaSuccess when there was nothing to launch); the kernels themselves report nothing,
// so faults surface at the next synchronizing call. `sm_count` sizes the grids (the kernels loop
// over their work items).

#include <cuda_runtime_api.h>

#include "gpu/kernels/launch_args.hpp"

namespace strata::gpu::cuda_detail {

/// Gather-pool from a slot pool, or zero-copy from a pinned host table (args.source holds
/// device-visible addresses of its parts). Asynchronous on `stream`.
cudaError_t launch_gather(const kernels::GatherArgs& args, cudaStream_t stream, int sm_count);

/// Fused backward: per unique slot, the gradient in segment order, then the optimizer step in
/// place; a warp per row, then a block per hot row. Asynchronous on `stream`.
cudaError_t launch_update(const kernels::UpdateArgs& args, cudaStream_t stream, int sm_count);
cudaError_t launch_reduce(const kernels::UpdateArgs& args, cudaStream_t stream, int sm_count);

/// Packs (pool -> args.packed) or, with `unpack`, unpacks the records of args.slots, bit for bit.
/// Asynchronous on `stream`.
cudaError_t launch_records(const kernels::RecordArgs& args, bool unpack, cudaStream_t stream, int sm_count);

/// Moves args.n records between slots and host records, zero-copy (to_host: slot -> host).
/// Asynchronous on `stream`.
cudaError_t launch_host_records(const kernels::HostRecordArgs& args, bool to_host, cudaStream_t stream, int sm_count);

/// Initializes args.n records of a pool on the device. Asynchronous on `stream`.
cudaError_t launch_init(const kernels::InitArgs& args, cudaStream_t stream, int sm_count);

/// Counts the NaN and Inf values of each range into args.totals (chunk counts, then a sum per
/// range). Asynchronous on `stream`.
cudaError_t launch_nonfinite(const kernels::FiniteArgs& args, cudaStream_t stream, int sm_count);

}  // namespace strata::gpu::cuda_detail
