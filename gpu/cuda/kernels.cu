// Kernels of the `cuda` backend. Results must equal the CPU kernels of host/kernels.cpp bit for
// bit (the emu backend runs those), so every sum runs in the host's order: one lane owns a column
// and walks the bag's keys (or the slot's gradient positions) sequentially, in ascending order,
// starting from 0.0f. The per-element math is core/row_math.hpp's; the build passes -fmad=false
// and keeps IEEE division and square root, as the host build uses -ffp-contract=off.
//
// Layout: a warp per work item (bag, key, unique slot or record), lanes over columns. A lane keeps
// kColsPerLane columns of a kChunk-column chunk in registers; columns cb + k*32 + lane make each
// row read coalesced. Grids are sized to the GPU and loop over work items.

#include <cstdint>

#include "core/row_math.hpp"
#include "gpu/cuda/kernels.cuh"

namespace strata::gpu::cuda_detail {
namespace {

constexpr int kWarp = 32;
constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarp;
constexpr int kColsPerLane = 4;
constexpr int kChunk = kWarp * kColsPerLane;
// 8 blocks of 256 threads fill an SM (2048 threads on sm_80 and sm_90).
constexpr int kBlocksPerSm = 8;
constexpr unsigned kFullMask = 0xffffffffu;

int grid_for(std::int64_t items, int sm_count) {
  const std::int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const std::int64_t cap = std::int64_t{sm_count > 0 ? sm_count : 1} * kBlocksPerSm;
  return static_cast<int>(blocks < cap ? blocks : cap);
}

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) % kWarp; }
__device__ __forceinline__ std::int64_t first_item() {
  return std::int64_t{blockIdx.x} * kWarpsPerBlock + static_cast<std::int64_t>(threadIdx.x) / kWarp;
}
__device__ __forceinline__ std::int64_t item_step() { return std::int64_t{gridDim.x} * kWarpsPerBlock; }

// Feature owning work item `item` (begin[0] == 0, begin ascending; count <= 16, so a scan is cheap).
template <class Args>
__device__ __forceinline__ int feature_of(const Args& a, std::int64_t item) {
  int f = 0;
  while (f + 1 < a.count && item >= a.begin[f + 1]) ++f;
  return f;
}

// Record of row r: RowRef::row with the bases held in the kernel parameters.
template <bool kInterleaved>
__device__ __forceinline__ const float* source_row(const RowSource& s, Key r) {
  if (!kInterleaved || s.parts == 1) return s.bases[0] + r * s.stride;
  const std::int64_t block = r >> s.block_shift;
  const std::int64_t local = ((block / s.parts) << s.block_shift) + (r & ((std::int64_t{1} << s.block_shift) - 1));
  return s.bases[block % s.parts] + local * s.stride;
}

// gather_pool (pooled bags) and gather_rows (Pooling::kNone) of host/kernels.cpp.
template <bool kInterleaved>
__global__ void __launch_bounds__(kBlock) gather_pool_kernel(const GatherArgs a) {
  const int lane = lane_id();
  const std::int32_t dim = a.dim;
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step()) {
    const int fi = feature_of(a, item);
    const GatherFeatureArgs& f = a.features[fi];
    const std::int64_t i = item - a.begin[fi];
    float* o = f.out + i * dim;
    if (f.pooling == Pooling::kNone) {
      // gather_rows: o = w * row (a product, not 0 + w * row: the sign of zero must match).
      const float* row = source_row<kInterleaved>(a.source, f.rows[i]);
      if (f.weights) {
        const float w = f.weights[i];
        for (std::int32_t c = lane; c < dim; c += kWarp) o[c] = w * row[c];
      } else {
        for (std::int32_t c = lane; c < dim; c += kWarp) o[c] = row[c];
      }
      continue;
    }
    const std::int64_t lo = f.offsets[i], hi = f.offsets[i + 1];
    for (std::int32_t cb = 0; cb < dim; cb += kChunk) {
      float acc[kColsPerLane];
#pragma unroll
      for (int k = 0; k < kColsPerLane; ++k) acc[k] = 0.0f;
      for (std::int64_t j = lo; j < hi; ++j) {
        const float* row = source_row<kInterleaved>(a.source, f.rows[j]);
        if (f.weights) {
          const float w = f.weights[j];
#pragma unroll
          for (int k = 0; k < kColsPerLane; ++k) {
            const std::int32_t c = cb + k * kWarp + lane;
            if (c < dim) acc[k] += w * row[c];  // row_axpy
          }
        } else {
#pragma unroll
          for (int k = 0; k < kColsPerLane; ++k) {
            const std::int32_t c = cb + k * kWarp + lane;
            if (c < dim) acc[k] += row[c];  // row_add
          }
        }
      }
      if (f.pooling == Pooling::kMean && hi > lo) {
        const float s = bag_scale(f.pooling, hi - lo);
#pragma unroll
        for (int k = 0; k < kColsPerLane; ++k) acc[k] *= s;  // row_scale, once per bag
      }
#pragma unroll
      for (int k = 0; k < kColsPerLane; ++k) {
        const std::int32_t c = cb + k * kWarp + lane;
        if (c < dim) o[c] = acc[k];
      }
    }
  }
}

// The summed gradient of this lane's columns of chunk `cb` of one unique slot: positions
// [p_lo, p_hi) in ascending order, each scaled by grad_scale, as backward_update on the host.
__device__ __forceinline__ void gradient_chunk(const UpdateFeatureArgs& f, std::int32_t dim, std::int64_t p_lo,
                                               std::int64_t p_hi, std::int32_t cb, int lane, float (&g)[kColsPerLane]) {
#pragma unroll
  for (int k = 0; k < kColsPerLane; ++k) g[k] = 0.0f;
  for (std::int64_t p = p_lo; p < p_hi; ++p) {
    const std::int64_t j = f.positions[p];
    const float* grow;
    float s;
    if (f.pooling == Pooling::kNone) {
      s = grad_scale(f.pooling, 1, f.weights, j);
      grow = f.grads + j * dim;
    } else {
      const std::int64_t b = f.bag_of[j];
      s = grad_scale(f.pooling, f.offsets[b + 1] - f.offsets[b], f.weights, j);
      grow = f.grads + b * dim;
    }
#pragma unroll
    for (int k = 0; k < kColsPerLane; ++k) {
      const std::int32_t c = cb + k * kWarp + lane;
      if (c < dim) g[k] += s * grow[c];  // row_axpy
    }
  }
}

// One column of an element-wise optimizer (sgd, adagrad, adam): apply_optimizer itself on a
// one-column view, with the column's state gathered into registers (adam keeps m at state[c] and
// v at state[dim + c]), so the arithmetic is literally the host's.
__device__ __forceinline__ void update_column(const OptimizerStep& st, float* w, float* state, std::int32_t dim,
                                              std::int32_t c, float g) {
  const OptimizerKind kind = st.spec.kind;
  float wc = w[c];
  float sc[2] = {0.0f, 0.0f};
  if (kind == OptimizerKind::kAdagrad) {
    sc[0] = state[c];
  } else if (kind == OptimizerKind::kAdam) {
    sc[0] = state[c];
    sc[1] = state[dim + c];
  }
  apply_optimizer(st, &wc, sc, &g, 1);
  w[c] = wc;
  if (kind == OptimizerKind::kAdagrad) {
    state[c] = sc[0];
  } else if (kind == OptimizerKind::kAdam) {
    state[c] = sc[0];
    state[dim + c] = sc[1];
  }
}

// Weight decay folded into the gradient, as apply_optimizer does first (skipped when zero, as there).
__device__ __forceinline__ void decay_chunk(const OptimizerSpec& o, const float* w, std::int32_t dim, std::int32_t cb,
                                            int lane, float (&g)[kColsPerLane]) {
  if (o.weight_decay == 0.0f) return;
#pragma unroll
  for (int k = 0; k < kColsPerLane; ++k) {
    const std::int32_t c = cb + k * kWarp + lane;
    if (c < dim) g[k] += o.weight_decay * w[c];
  }
}

// backward_update of host/kernels.cpp: a warp per unique slot.
__global__ void __launch_bounds__(kBlock) backward_update_kernel(const UpdateArgs a) {
  const int lane = lane_id();
  const std::int32_t dim = a.dim;
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step()) {
    const int fi = feature_of(a, item);
    const UpdateFeatureArgs& f = a.features[fi];
    const std::int64_t u = item - a.begin[fi];
    float* w = a.base + f.unique_slots[u] * a.stride;
    float* state = w + dim;
    const std::int64_t p_lo = f.unique_offsets[u], p_hi = f.unique_offsets[u + 1];
    float g[kColsPerLane];

    if (f.step.spec.kind != OptimizerKind::kRowwiseAdagrad) {
      for (std::int32_t cb = 0; cb < dim; cb += kChunk) {
        gradient_chunk(f, dim, p_lo, p_hi, cb, lane, g);
#pragma unroll
        for (int k = 0; k < kColsPerLane; ++k) {
          const std::int32_t c = cb + k * kWarp + lane;
          if (c < dim) update_column(f.step, w, state, dim, c, g[k]);
        }
      }
      continue;
    }

    // Row-wise adagrad needs sum_c g[c]^2 over the whole row, in column order, before any weight
    // changes. Pass 1 computes it (the lanes' squares are visited in column order through
    // shuffles, every lane keeping the same running sum); pass 2 applies the step. Rows wider than
    // one chunk recompute their gradient in pass 2 (same order, so the same bits) instead of
    // holding it.
    const OptimizerSpec& o = f.step.spec;
    float sq = 0.0f;
    for (std::int32_t cb = 0; cb < dim; cb += kChunk) {
      gradient_chunk(f, dim, p_lo, p_hi, cb, lane, g);
      decay_chunk(o, w, dim, cb, lane, g);
#pragma unroll
      for (int k = 0; k < kColsPerLane; ++k) {
        for (int l = 0; l < kWarp; ++l) {
          const float v = __shfl_sync(kFullMask, g[k], l);
          if (cb + k * kWarp + l < dim) sq += v * v;
        }
      }
    }
    // state[0] += sq / dim, read and written by lane 0 only (lanes may run apart on sm_70+).
    float s0 = 0.0f;
    if (lane == 0) {
      s0 = state[0];
      s0 += sq / static_cast<float>(dim);
      state[0] = s0;
    }
    s0 = __shfl_sync(kFullMask, s0, 0);
    const float m = o.learning_rate / (std::sqrt(s0) + o.eps);
    for (std::int32_t cb = 0; cb < dim; cb += kChunk) {
      if (dim > kChunk) {
        gradient_chunk(f, dim, p_lo, p_hi, cb, lane, g);
        decay_chunk(o, w, dim, cb, lane, g);
      }
#pragma unroll
      for (int k = 0; k < kColsPerLane; ++k) {
        const std::int32_t c = cb + k * kWarp + lane;
        if (c < dim) w[c] -= m * g[k];
      }
    }
  }
}

// Whole records are moved as 32-bit words, so every bit (NaN payloads included) is kept.
__global__ void __launch_bounds__(kBlock) pack_records_kernel(const float* base, std::int64_t stride, const Key* slots,
                                                              std::int64_t n, float* dst) {
  const int lane = lane_id();
  for (std::int64_t i = first_item(); i < n; i += item_step()) {
    const auto* from = reinterpret_cast<const std::uint32_t*>(base + slots[i] * stride);
    auto* to = reinterpret_cast<std::uint32_t*>(dst + i * stride);
    for (std::int64_t c = lane; c < stride; c += kWarp) to[c] = from[c];
  }
}

__global__ void __launch_bounds__(kBlock) unpack_records_kernel(float* base, std::int64_t stride, const Key* slots,
                                                                std::int64_t n, const float* src) {
  const int lane = lane_id();
  for (std::int64_t i = first_item(); i < n; i += item_step()) {
    const auto* from = reinterpret_cast<const std::uint32_t*>(src + i * stride);
    auto* to = reinterpret_cast<std::uint32_t*>(base + slots[i] * stride);
    for (std::int64_t c = lane; c < stride; c += kWarp) to[c] = from[c];
  }
}

// Drops an error left by an earlier runtime call on this thread (already reported through that
// call's return value), so the check after a launch reports that launch alone.
void clear_stale_error() { (void)cudaGetLastError(); }

}  // namespace

cudaError_t launch_gather_pool(const GatherArgs& args, cudaStream_t stream, int sm_count) {
  const std::int64_t items = args.begin[args.count];
  if (items <= 0) return cudaSuccess;
  clear_stale_error();
  gather_pool_kernel<false><<<grid_for(items, sm_count), kBlock, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_gather_pool_host(const GatherArgs& args, cudaStream_t stream, int sm_count) {
  const std::int64_t items = args.begin[args.count];
  if (items <= 0) return cudaSuccess;
  clear_stale_error();
  if (args.source.parts == 1) {
    gather_pool_kernel<false><<<grid_for(items, sm_count), kBlock, 0, stream>>>(args);
  } else {
    gather_pool_kernel<true><<<grid_for(items, sm_count), kBlock, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t launch_backward_update(const UpdateArgs& args, cudaStream_t stream, int sm_count) {
  const std::int64_t items = args.begin[args.count];
  if (items <= 0) return cudaSuccess;
  clear_stale_error();
  backward_update_kernel<<<grid_for(items, sm_count), kBlock, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_pack_records(const float* base, std::int64_t stride, const Key* slots, std::int64_t n, float* dst,
                                cudaStream_t stream, int sm_count) {
  if (n <= 0 || stride <= 0) return cudaSuccess;
  clear_stale_error();
  pack_records_kernel<<<grid_for(n, sm_count), kBlock, 0, stream>>>(base, stride, slots, n, dst);
  return cudaGetLastError();
}

cudaError_t launch_unpack_records(float* base, std::int64_t stride, const Key* slots, std::int64_t n, const float* src,
                                  cudaStream_t stream, int sm_count) {
  if (n <= 0 || stride <= 0) return cudaSuccess;
  clear_stale_error();
  unpack_records_kernel<<<grid_for(n, sm_count), kBlock, 0, stream>>>(base, stride, slots, n, src);
  return cudaGetLastError();
}

}  // namespace strata::gpu::cuda_detail
