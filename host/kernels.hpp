#pragma once
// CPU kernels on oneTBB: gather-pool, unpooled gather, and the fused backward (gradient reduction
// per unique row + optimizer update). `cpu` mode and the host side of `offload` and the sharded
// modes run these on HostTables (the `emu` device runs the device kernel source instead,
// gpu/kernels/). backward_update is the general form (any unique-row list; the device tests hold
// the device kernels to it); the store's `cpu` path calls backward_update_by_bag. All run in the
// caller's tbb::task_arena, block until done, and are thread-safe for distinct outputs.

#include <cstdint>

#include "core/row_math.hpp"
#include "host/dedup.hpp"
#include "host/repeats.hpp"
#include "host/row_ref.hpp"

namespace strata {

/// The keys of one table in one batch, as raw host pointers (a view of a JaggedKeys).
struct BagsView {
  const std::int64_t* offsets = nullptr;  ///< (batch + 1)
  std::int64_t batch = 0;
  const Key* keys = nullptr;       ///< (offsets[batch]) row ids, already validated
  const float* weights = nullptr;  ///< (offsets[batch]) or nullptr
};

/// Pooled lookup: out[b] = scale(b) * sum_j w_j * row(keys[j]) over bag b (empty bags give zeros).
///   out: (batch, dim) host, row-major, fully overwritten.
void gather_pool(RowRef table, const BagsView& bags, Pooling pooling, float* out);

/// Unpooled lookup: out[j] = w_j * row(keys[j]).  out: (n, dim) host.
void gather_rows(RowRef table, const Key* keys, const float* weights, std::int64_t n, float* out);

/// Fused backward for one table: for each unique row, sums the gradients of all its uses (in
/// ascending position order, in segments of kGradSegment uses: core/row_math.hpp) and applies the optimizer in place.
///   grads: (batch, dim) for pooled tables, (num_keys, dim) for pooling none; host.
///   bag_of: (num_keys) bag of each key position (unused for pooling none).
/// Rows not in `unique` are untouched.
void backward_update(RowRef table, const BagsView& bags, Pooling pooling, UniqueView unique, const std::int32_t* bag_of,
                     const float* grads, const OptimizerStep& step);

/// backward_update for callers whose keys are the table's rows (`cpu` mode), with the same result
/// bit for bit, ordered for fewer cache misses: a row used once in the batch (most rows, unless
/// keys are very skewed) is updated while its bag is handled, from the bag's gradient row, which
/// stays in L1 for the bag's keys instead of being read again from L2/L3 for each of them; then
/// the repeated rows are reduced and updated as by backward_update.
///   bags.keys: (offsets[batch]) rows of `table`; repeats: find_repeats of them; others as
///   backward_update.
void backward_update_by_bag(RowRef table, const BagsView& bags, Pooling pooling, const Repeats& repeats,
                            const std::int32_t* bag_of, const float* grads, const OptimizerStep& step);

/// The reduction half of backward_update alone: out[u] = the summed gradient of unique key u
/// (same order, same arithmetic), (unique.size, dim) host. Used where the rows live elsewhere
/// (dispatch sends the sums to the ranks that own the rows).
void reduce_unique_grads(const BagsView& bags, Pooling pooling, UniqueView unique, const std::int32_t* bag_of,
                         const float* grads, std::int32_t dim, float* out);

}  // namespace strata
