#pragma once
// CPU kernels on oneTBB: gather-pool, unpooled gather, and the fused backward (gradient reduction
// per unique row + optimizer update). `cpu` mode and the host side of `offload` and the sharded
// modes run these on HostTables (the `emu` device runs the device kernel source instead,
// gpu/kernels/). backward_update is the general form (any unique-row list; the device tests hold
// the device kernels to it); the store's `cpu` and `offload` CPU paths call the table-batched forms
// (gather_pool_tables, backward_update_tables: every table of a batch in one parallel loop, as
// FBGEMM's TBE), which give each table what gather_pool / gather_rows and backward_update_by_bag
// give it, bit for bit. All run in the caller's tbb::task_arena, block until done, and are
// thread-safe for distinct outputs.
//
// Rows may be fp32, bf16 or fp16 (RowRef::dtype; the state fp32 or bf16, RowRef::state_dtype): rows
// are widened to fp32 where they are read (exact), pooled and reduced in fp32 in the same order as
// fp32 rows, and the optimizer computes in fp32 with the same operations; each updated element is
// then stored through store_weight (core/row_math.hpp: to nearest even, or stochastically with the
// bits of (global row, step, global column, salt) that OptimizerStep::round gives), as the reference
// store rounds it. Compile-time dims (multiples of 16) with an fp32 state take the vectorised paths,
// half rows widened and narrowed register by register; scalar, one row at a time: a bf16 state,
// half SGD rows in backward_update, half rows' repeated-key ranges in backward_update_by_bag and
// backward_update_tables, and half gather_rows at every dim.
//
// Outputs and gradients are fp32, except in the table-batched forms, whose items may have half
// ones (TableBatchItem::out_dtype, the table's output_dtype): the pooled sums stay fp32 and each
// output row is rounded to nearest even into out_dtype once (sum, mean, or a weighted row for
// pooling none), as the reference store rounds its outputs; gradients of out_dtype are widened
// where they are read (the reduction, a bag's gradient), fp32 from there. The element types are
// template parameters chosen once per table, so an fp32 table runs the float instances.

#include <cstdint>
#include <vector>

#include "core/key_batch.hpp"
#include "core/row_math.hpp"
#include "host/dedup.hpp"
#include "host/repeats.hpp"
#include "host/row_ref.hpp"

namespace strata {

/// The keys of one table in one batch, as raw host pointers (a view of a JaggedKeys): int64 or int32 offsets and keys
/// (offsets32, keys32 instead of offsets, keys), read in place through offset() and key().
struct BagsView {
  const std::int64_t* offsets = nullptr;  ///< (batch + 1)
  std::int64_t batch = 0;
  const Key* keys = nullptr;                ///< (offsets[batch]) row ids, already validated
  const float* weights = nullptr;           ///< (offsets[batch]) or nullptr
  const std::int32_t* offsets32 = nullptr;  ///< set instead of offsets
  const std::int32_t* keys32 = nullptr;     ///< set instead of keys

  std::int64_t offset(std::int64_t b) const { return offsets32 ? offsets32[b] : offsets[b]; }
  Key key(std::int64_t j) const { return keys32 ? keys32[j] : keys[j]; }
};

/// The view of a feature's keys (host memory, already validated).
inline BagsView bags_of(const JaggedKeys& f) {
  BagsView v;
  v.offsets = f.offsets.data();
  v.offsets32 = f.offsets32.empty() ? nullptr : f.offsets32.data();
  v.batch = f.batch_size();
  v.keys = f.keys.data();
  v.keys32 = f.keys32.empty() ? nullptr : f.keys32.data();
  v.weights = f.weights.empty() ? nullptr : f.weights.data();
  return v;
}

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

/// One table's part of a table-batched call (gather_pool_tables, backward_update_tables): the
/// arguments gather_pool / gather_rows and backward_update_by_bag take for that table.
struct TableBatchItem {
  RowRef table;
  BagsView bags;
  Pooling pooling = Pooling::kSum;
  float* out = nullptr;                  ///< forward: (output rows, dim) host, elements of out_dtype
  const float* grads = nullptr;          ///< backward: the shape forward produced, host, of out_dtype
  DType out_dtype = DType::kF32;         ///< out's and grads' element type (at their first element's address)
  const Repeats* repeats = nullptr;      ///< backward: find_repeats of bags.keys
  const std::int32_t* bag_of = nullptr;  ///< backward: bag of each key position (pooled tables)
  OptimizerStep step{};                  ///< backward
};

/// Reusable memory of the table-batched calls (the chunk list; keep it across batches).
struct TableBatchScratch {
  struct Chunk {
    std::int32_t item = 0;
    bool repeated = false;   ///< backward: unique keys [lo, hi) of range `range`, else bags [lo, hi)
    std::int32_t range = 0;  ///< backward, repeated: index in repeats->ranges
    std::int64_t lo = 0, hi = 0;
  };
  std::vector<Chunk> chunks;
};

/// gather_pool (pooled items) or gather_rows (Pooling::kNone) of every item, as one parallel loop
/// over (table, bag range) chunks of all the items, each chunk's rows about an L2's share
/// (kTableChunkBytes): one join for the batch instead of one per table, and small tables' bags in
/// the same tasks as the large ones'. Each output row is computed as by the per-table kernels, in
/// the same order, so the results are bit-identical. Items' outputs must be disjoint.
void gather_pool_tables(const std::vector<TableBatchItem>& items, TableBatchScratch& scratch);

/// backward_update_by_bag of every item, as one parallel loop over the chunks of all the items:
/// bag ranges whose keys used once are updated from their bag's gradient, and the ranges of the
/// repeated unique rows (reduced, then updated), each chunk one of backward_update_by_bag's tasks. The rows of one
/// item's chunks are disjoint (a row is either used once or repeated), so the order between chunks does not matter and
/// every row gets the same arithmetic as in backward_update_by_bag (bit-identical). Items' tables must be distinct.
void backward_update_tables(const std::vector<TableBatchItem>& items, TableBatchScratch& scratch);

/// Row bytes of a chunk of gather_pool_tables: a chunk of bags reads about this many bytes
/// of rows (at least one bag, at most the table's whole batch).
inline constexpr std::int64_t kTableChunkBytes = std::int64_t{128} * 1024;

}  // namespace strata
