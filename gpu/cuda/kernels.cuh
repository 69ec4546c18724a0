#pragma once
// Launchers of the `cuda` backend's kernels (gpu/cuda/kernels.cu) and their parameter structs.
// Unlike most .cuh files this header compiles with the host compiler: cuda_device.cpp (g++)
// includes it, and only kernels.cu holds device code.
//
// Every launcher is table-batched: one launch covers up to kMaxFeaturesPerLaunch features, passed
// by value in the kernel parameters (no device-side argument buffer to allocate or keep alive).
// Each returns the error of its launch (cudaSuccess when there was nothing to launch); the kernels
// themselves report nothing, so faults surface at the next synchronizing call.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/row_math.hpp"
#include "core/table_spec.hpp"

namespace strata::gpu::cuda_detail {

/// Features one launch covers; callers loop over chunks of this many.
inline constexpr int kMaxFeaturesPerLaunch = 16;
/// Parts (NUMA nodes) of a host table that gather_pool_host can read: as many as a store allows
/// (StoreConfig::fake_numa_nodes <= 64; real machines have up to 16 with SNC or NPS4).
inline constexpr int kMaxHostParts = 64;

/// Where lookup rows live: RowRef's mapping with the bases copied in (device-visible addresses).
/// A slot pool is one part.
struct RowSource {
  float* bases[kMaxHostParts] = {};  ///< (parts) base of each part's records; device or mapped pinned host
  std::int32_t parts = 1;            ///< number of parts, 1..kMaxHostParts
  std::int32_t block_shift = 62;     ///< log2 rows per interleaving block (as RowRef)
  std::int64_t stride = 0;           ///< floats between consecutive records
};

/// One feature of a gather launch (see LookupFeature; all pointers device).
struct GatherFeatureArgs {
  const std::int64_t* offsets = nullptr;  ///< (bags + 1); unused for Pooling::kNone
  const Key* rows = nullptr;              ///< (num_keys) slots or host row ids
  const float* weights = nullptr;         ///< (num_keys) or nullptr
  float* out = nullptr;                   ///< (bags, dim) or (num_keys, dim) for Pooling::kNone
  Pooling pooling = Pooling::kSum;
};

/// Parameters of one gather launch. Work items are bags (pooled) or keys (kNone), numbered across
/// features: feature i owns items [begin[i], begin[i + 1]).
struct GatherArgs {
  RowSource source;
  std::int32_t dim = 0;    ///< weights per row
  std::int32_t count = 0;  ///< features in this launch, 0..kMaxFeaturesPerLaunch
  std::int64_t begin[kMaxFeaturesPerLaunch + 1] = {};
  GatherFeatureArgs features[kMaxFeaturesPerLaunch];
};

/// One feature of a backward launch (see UpdateFeature; all pointers device).
struct UpdateFeatureArgs {
  const std::int64_t* offsets = nullptr;         ///< (batch + 1)
  const float* weights = nullptr;                ///< (num_keys) or nullptr
  const Key* unique_slots = nullptr;             ///< (num_unique) distinct slots
  const std::int64_t* unique_offsets = nullptr;  ///< (num_unique + 1) CSR into positions
  const std::int32_t* positions = nullptr;       ///< (num_keys) grouped by slot, ascending
  const std::int32_t* bag_of = nullptr;          ///< (num_keys); unused for Pooling::kNone
  const float* grads = nullptr;                  ///< (batch, dim) or (num_keys, dim)
  Pooling pooling = Pooling::kSum;
  OptimizerStep step;
};

/// Parameters of one backward launch. Work items are unique slots, numbered across features.
struct UpdateArgs {
  float* base = nullptr;   ///< (slots, stride) device: the slot pool, updated in place
  std::int64_t stride = 0;
  std::int32_t dim = 0;
  std::int32_t count = 0;
  std::int64_t begin[kMaxFeaturesPerLaunch + 1] = {};
  UpdateFeatureArgs features[kMaxFeaturesPerLaunch];
};

// Stay within the classic 4 KB kernel-parameter limit (CUDA 12.1+ allows 32 KB on Volta and later,
// but larger parameter blocks make every launch slower).
static_assert(sizeof(GatherArgs) <= 4096, "GatherArgs must fit in the kernel parameter space");
static_assert(sizeof(UpdateArgs) <= 4096, "UpdateArgs must fit in the kernel parameter space");

/// Gather-pool from a slot pool (args.source.parts == 1). Asynchronous on `stream`.
/// `sm_count` sizes the grid (the kernels loop over work items).
cudaError_t launch_gather_pool(const GatherArgs& args, cudaStream_t stream, int sm_count);

/// Gather-pool from a pinned host table read zero-copy (args.source holds device-visible
/// addresses of its parts). Asynchronous on `stream`.
cudaError_t launch_gather_pool_host(const GatherArgs& args, cudaStream_t stream, int sm_count);

/// Fused backward: per unique slot, gradient sum in ascending position order, then the optimizer
/// step in place. Asynchronous on `stream`.
cudaError_t launch_backward_update(const UpdateArgs& args, cudaStream_t stream, int sm_count);

/// dst[i] = record slots[i] of the pool, bit for bit.  base (slots, stride), slots (n),
/// dst (n, stride): device. Asynchronous on `stream`.
cudaError_t launch_pack_records(const float* base, std::int64_t stride, const Key* slots, std::int64_t n, float* dst,
                                cudaStream_t stream, int sm_count);

/// record slots[i] of the pool = src[i], bit for bit.  base (slots, stride), slots (n),
/// src (n, stride): device. Asynchronous on `stream`.
cudaError_t launch_unpack_records(float* base, std::int64_t stride, const Key* slots, std::int64_t n, const float* src,
                                  cudaStream_t stream, int sm_count);

}  // namespace strata::gpu::cuda_detail
