#pragma once
// Parameters of one launch of the shared kernels (gpu/kernels/bodies.hpp), and the builders that
// split a device operation's features into launches. Both backends use them: the `cuda` backend
// passes a launch by value as the kernel parameters, the CPU grid (gpu/kernels/host_grid.hpp) runs
// the same launch on oneTBB for the `emu` backend. Host-compilable; no CUDA header.
//
// Every launch is table-batched: it covers up to kMaxFeaturesPerLaunch features, passed by value
// (no device-side argument buffer to allocate or keep alive). Work items are numbered across the
// launch's features: feature i owns items [begin[i], begin[i + 1]).

#include <cstdint>
#include <vector>

#include "core/row_math.hpp"
#include "core/table_spec.hpp"
#include "gpu/types.hpp"
#include "host/row_ref.hpp"

namespace strata::gpu::kernels {

/// Lanes of a warp.
inline constexpr int kWarp = 32;
/// Columns a lane keeps in registers per chunk of a row.
inline constexpr int kColsPerLane = 4;
/// Columns of a row one warp (all lanes) covers per chunk.
inline constexpr int kChunk = kWarp * kColsPerLane;
/// Features one launch covers; the builders split longer feature lists.
inline constexpr int kMaxFeaturesPerLaunch = 16;
/// Parts (NUMA nodes) of a host table that a zero-copy gather can read: as many as a store allows
/// (StoreConfig::fake_numa_nodes <= 64; real machines have up to 16 with SNC or NPS4).
inline constexpr int kMaxHostParts = 64;
/// Rows used more than this many times in a batch are hot: a first launch sums each of their
/// segments (kGradSegment uses, core/row_math.hpp) apart, a warp per segment (hot_segment_item),
/// into a partial sum, and the row's own work item adds the partials in segment order; the order
/// of the sum is the same either way, so the result does not depend on which path ran.
inline constexpr std::int64_t kHotUses = 2 * kGradSegment;

/// Partial sum (of a launch's feature) of segment 0 of a hot row whose uses start at key position
/// `first`; segment k's is that plus k. Distinct segments of distinct hot rows get distinct
/// partials: a hot row of n > kHotUses uses from `first` takes ceil(n / kGradSegment) of them, and
/// the next row starts at first + n or later, whose first partial is at least
/// floor(n / kGradSegment) + 1 further on (the second term grows by one or more per hot row).
/// Needs only the row's first position, so the segment kernel and the row's work item agree
/// without a prefix sum over the hot rows.
STRATA_HD std::int64_t hot_first_partial(std::int64_t first) { return first / kGradSegment + first / (kHotUses + 1); }
/// Partial sums a feature of `keys` key positions may need (0 when no row can be hot): one past
/// the largest hot_first_partial(first) + segments - 1 of any hot row, so the segment kernel's
/// items of the feature.
STRATA_HD std::int64_t hot_partials(std::int64_t keys) {
  return keys > kHotUses ? keys / kGradSegment + keys / (kHotUses + 1) + 1 : 0;
}

/// No overflow region: the first slot number that addresses one (never reached).
inline constexpr std::int64_t kNoOverflow = INT64_MAX;

/// The record of slot `slot` of a pool at `base` whose slots from `first_overflow` on are records
/// of `overflow` (SlotPool's mapping; kNoOverflow when there is none).
STRATA_HD float* slot_record(float* base, float* overflow, std::int64_t first_overflow, std::int64_t stride, Key slot) {
  return slot < first_overflow ? base + slot * stride : overflow + (slot - first_overflow) * stride;
}

/// Where lookup rows live: RowRef's mapping with the bases copied in (device-visible addresses).
/// A slot pool is one part, with its overflow region (SlotPool).
struct RowSource {
  float* bases[kMaxHostParts] = {};           ///< (parts) base of each part's records; device or mapped pinned host
  std::int32_t parts = 1;                     ///< number of parts, 1..kMaxHostParts
  std::int32_t block_shift = 62;              ///< log2 rows per interleaving block (as RowRef)
  std::int64_t stride = 0;                    ///< words between consecutive records
  float* overflow = nullptr;                  ///< one part: records of rows >= first_overflow (SlotPool::overflow)
  std::int64_t first_overflow = kNoOverflow;  ///< SlotPool::slots when there is an overflow region
  DType dtype = DType::kF32;                  ///< the rows' element type (widened to fp32 as read)
};

/// One feature of a gather launch (see LookupFeature; all pointers device).
struct GatherFeatureArgs {
  const std::int64_t* offsets = nullptr;  ///< (bags + 1); unused for Pooling::kNone
  const Key* rows = nullptr;              ///< (num_keys) slots or host row ids
  const float* weights = nullptr;         ///< (num_keys) or nullptr
  float* out = nullptr;                   ///< (bags, dim) or (num_keys, dim) for Pooling::kNone
  std::int64_t outputs = 0;               ///< output rows: bags, or keys for Pooling::kNone
  Pooling pooling = Pooling::kSum;
  DType out_dtype = DType::kF32;  ///< out's element type (store_activation)
};

/// Parameters of one gather launch. A work item is one warp's share: `per_warp` consecutive
/// output rows (several bags per warp at small dims, so no lane idles), lanes_per_row lanes each.
struct GatherArgs {
  RowSource source;
  std::int32_t dim = 0;            ///< weights per row
  std::int32_t count = 0;          ///< features in this launch, 0..kMaxFeaturesPerLaunch
  std::int32_t lanes_per_row = 0;  ///< lanes that share one output row (kWarp, or fewer at small dims)
  std::int64_t begin[kMaxFeaturesPerLaunch + 1] = {};
  GatherFeatureArgs features[kMaxFeaturesPerLaunch];
};

/// One feature of a backward launch (see UpdateFeature; all pointers device).
struct UpdateFeatureArgs {
  const std::int64_t* offsets = nullptr;         ///< (batch + 1)
  const float* weights = nullptr;                ///< (num_keys) or nullptr
  const Key* unique_slots = nullptr;             ///< (num_unique) distinct slots
  const Key* unique_rows = nullptr;              ///< (num_unique) their table rows, or nullptr (UpdateFeature)
  const std::int64_t* unique_offsets = nullptr;  ///< (num_unique + 1) CSR into positions
  const std::int32_t* positions = nullptr;       ///< (num_keys) grouped by slot, ascending
  const std::int32_t* bag_of = nullptr;          ///< (num_keys); unused for Pooling::kNone
  const float* grads = nullptr;                  ///< (batch, dim) or (num_keys, dim)
  Pooling pooling = Pooling::kSum;
  OptimizerStep step;
  const std::int64_t* hot = nullptr;  ///< (num_hot) unique rows used more than kHotUses times
};

/// Parameters of one backward launch (or gradient reduction). Work items are unique slots,
/// numbered across features. With `partials`, a segment launch first sums the hot rows' segments:
/// its items are the features' partial sums (hot_partials of each feature's keys, whether or not a
/// row is hot in this batch), numbered across features (seg_begin), partial `item` at
/// partials + item * dim; each finds its hot row by a binary search of the feature's hot list
/// (hot_begin) when every feature has one (hot_listed), else of its unique rows, and an item of no
/// hot row's segment does nothing. With lists that are all empty there is no segment launch.
/// Without `partials` (no scratch could be had) every row is summed by its own warp: the same bits.
struct UpdateArgs {
  float* base = nullptr;  ///< (slots, stride) device: the slot pool, updated in place
  std::int64_t stride = 0;
  float* overflow = nullptr;                  ///< the pool's overflow region (SlotPool), or nullptr
  std::int64_t first_overflow = kNoOverflow;  ///< SlotPool::slots when there is one
  std::int32_t dim = 0;
  std::int32_t count = 0;
  DType dtype = DType::kF32;        ///< the weights' element type (a backward; sums are fp32)
  DType state_dtype = DType::kF32;  ///< the optimizer state's element type
  bool hot_listed = false;
  std::int64_t begin[kMaxFeaturesPerLaunch + 1] = {};
  std::int64_t hot_begin[kMaxFeaturesPerLaunch + 1] = {};
  std::int64_t seg_begin[kMaxFeaturesPerLaunch + 1] = {};
  float* partials = nullptr;  ///< (seg_begin[count], dim) device scratch, or nullptr
  UpdateFeatureArgs features[kMaxFeaturesPerLaunch];

  /// Work items of the segment launch (none without scratch, nor when the hot lists are all empty).
  STRATA_HD std::int64_t segment_items() const noexcept {
    return partials && !(hot_listed && hot_begin[count] == 0) ? seg_begin[count] : 0;
  }
  /// The record of `slot`.
  STRATA_HD float* record(Key slot) const noexcept { return slot_record(base, overflow, first_overflow, stride, slot); }
};

/// Parameters of a record move (pack: pool -> dst; unpack: src -> pool). Work items are records.
struct RecordArgs {
  float* base = nullptr;       ///< (slots, stride) device: the slot pool
  std::int64_t stride = 0;     ///< floats per record
  const Key* slots = nullptr;  ///< (n) device
  std::int64_t n = 0;
  float* packed = nullptr;  ///< (n, width) device: the records in slot-list order
  /// Floats moved per record, and floats per packed row: 0 means `stride` (whole records); a
  /// column slice otherwise (Device::take_columns/put_columns, `base` then points at its first column).
  std::int64_t width = 0;
  float* overflow = nullptr;                  ///< the pool's overflow region (SlotPool), or nullptr
  std::int64_t first_overflow = kNoOverflow;  ///< SlotPool::slots when there is one
  /// The record of `slot`.
  STRATA_HD float* record(Key slot) const noexcept { return slot_record(base, overflow, first_overflow, stride, slot); }
};

/// Parameters of a zero-copy record move between slots and host records (Device::records_from_host,
/// records_to_host). Work items are records.
struct HostRecordArgs {
  float* base = nullptr;         ///< (slots, stride) device: the slot pool
  std::int64_t stride = 0;       ///< words per slot record
  std::int64_t words = 0;        ///< words moved per record: the weights' and the state's (SlotPool::row_bytes)
  const Key* slots = nullptr;    ///< (n) device; nullptr: slot i
  float* const* rows = nullptr;  ///< (n) device: device-visible addresses of host records
  std::int64_t n = 0;
  float* overflow = nullptr;                  ///< the pool's overflow region (SlotPool), or nullptr
  std::int64_t first_overflow = kNoOverflow;  ///< SlotPool::slots when there is one
  /// The record of slot slots[i] (slot i without a list).
  STRATA_HD float* record(std::int64_t i) const noexcept {
    return slot_record(base, overflow, first_overflow, stride, slots ? slots[i] : i);
  }
};

/// Parameters of a record initialization: records first_slot .. first_slot + n of a pool get the
/// initial rows of a table (core/row_math.hpp: init_row, init_state; padding zero). Work items are
/// records.
struct InitArgs {
  float* base = nullptr;  ///< (slots, stride) device: the slot pool
  std::int64_t stride = 0;
  std::int32_t dim = 0;
  std::int32_t state_dim = 0;
  std::int64_t first_slot = 0;
  std::int64_t n = 0;
  RecordInit init;
  DType dtype = DType::kF32;        ///< the weights' element type: half ones get the values rounded to nearest
  DType state_dtype = DType::kF32;  ///< the state's, likewise
};

/// Elements one work item of a finiteness count covers (a warp, strided over its lanes).
inline constexpr std::int64_t kFiniteChunk = 8192;

/// Parameters of one launch pair of a finiteness count (Device::count_nonfinite): the chunk kernel
/// writes partial[item] = NaN and Inf values in chunk `item` (chunks numbered across features,
/// feature i owns [begin[i], begin[i + 1])), then the sum kernel writes totals[i] = the sum of
/// feature i's partials.
struct FiniteArgs {
  std::int32_t count = 0;
  std::int64_t begin[kMaxFeaturesPerLaunch + 1] = {};
  const float* data[kMaxFeaturesPerLaunch] = {};  ///< device
  std::int64_t n[kMaxFeaturesPerLaunch] = {};     ///< elements of dtype
  DType dtype[kMaxFeaturesPerLaunch] = {};
  std::int64_t* partial = nullptr;  ///< (begin[count]) device
  std::int64_t* totals = nullptr;   ///< (count) device
};

// Stay within the classic 4 KB kernel-parameter limit (CUDA 12.1+ allows 32 KB on Volta and later,
// but larger parameter blocks make every launch slower).
static_assert(sizeof(GatherArgs) <= 4096, "GatherArgs must fit in the kernel parameter space");
static_assert(sizeof(UpdateArgs) <= 4096, "UpdateArgs must fit in the kernel parameter space");
static_assert(sizeof(FiniteArgs) <= 4096, "FiniteArgs must fit in the kernel parameter space");

/// Lanes that share one output row of a gather at `dim`: the whole warp from kChunk / 2 columns
/// up, else the smallest power of two whose lanes cover the row with kColsPerLane columns each
/// (dim 16: 4 lanes, 8 rows per warp).
std::int32_t gather_lanes_per_row(std::int32_t dim) noexcept;

/// The row source of a slot pool (with its overflow region).
RowSource pool_source(const SlotPool& pool) noexcept;
/// The initialization of records first_slot .. first_slot + n of `pool`.
InitArgs init_args(const SlotPool& pool, std::int64_t first_slot, std::int64_t n, const RecordInit& init) noexcept;
/// A whole-record move between the slots of `pool` (its overflow region included) and `packed`.
RecordArgs record_args(const SlotPool& pool, const Key* slots, std::int64_t n, float* packed) noexcept;
/// A zero-copy record move between the slots of `pool` (its overflow region included; slots may be
/// null for slots 0..n-1) and the host records at `rows`.
HostRecordArgs host_record_args(const SlotPool& pool, const Key* slots, std::int64_t n, float* const* rows) noexcept;
/// The row source of a host table as RowRef maps it, with `bases` (table.parts of them) as the
/// addresses the kernels read: the table's own, or their device mappings.
RowSource host_source(const RowRef& table, float* const* bases) noexcept;

/// The launches of one gather operation (empty when there is no output row).
std::vector<GatherArgs> gather_launches(const RowSource& source, std::int32_t dim,
                                        const std::vector<LookupFeature>& features);
/// Partial counts (int64) a finiteness count of `ranges` needs as scratch: one per chunk.
std::int64_t finite_partials(const std::vector<FloatRange>& ranges) noexcept;
/// The launches of one finiteness count of `ranges` into totals[0 .. ranges.size()), with
/// `partial` (finite_partials(ranges)) as scratch; empty when there is no range.
std::vector<FiniteArgs> finite_launches(const std::vector<FloatRange>& ranges, std::int64_t* partial,
                                        std::int64_t* totals);
/// The launches of one fused backward or gradient reduction (empty when no feature has a unique
/// row), without scratch: see with_partials.
std::vector<UpdateArgs> update_launches(const SlotPool& pool, const std::vector<UpdateFeature>& features);
/// Floats of scratch the hot rows' partial sums of `launches` take (the launches run one after
/// the other on one stream, so each starts at the same scratch).
std::int64_t partial_floats(const std::vector<UpdateArgs>& launches) noexcept;
/// Gives every launch `scratch` (partial_floats(launches) floats, device) for its partial sums;
/// nullptr leaves them without (each hot row then summed by its own warp).
void with_partials(std::vector<UpdateArgs>& launches, float* scratch) noexcept;

}  // namespace strata::gpu::kernels
