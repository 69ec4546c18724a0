#include "gpu/kernels/launch_args.hpp"

#include <algorithm>

namespace strata::gpu::kernels {

std::int32_t gather_lanes_per_row(std::int32_t dim) noexcept {
  if (dim >= kChunk / 2) return kWarp;
  const std::int32_t need = (std::max(dim, 1) + kColsPerLane - 1) / kColsPerLane;
  std::int32_t lanes = 1;
  while (lanes < need) lanes *= 2;
  return lanes;
}

namespace {
// SlotPool::slots when the pool has an overflow region, else kNoOverflow.
std::int64_t first_overflow(const SlotPool& pool) noexcept { return pool.overflow ? pool.slots : kNoOverflow; }
}  // namespace

RowSource pool_source(const SlotPool& pool) noexcept {
  RowSource s;
  s.bases[0] = pool.base;
  s.parts = 1;
  s.stride = pool.stride;
  s.overflow = pool.overflow;
  s.first_overflow = first_overflow(pool);
  s.dtype = pool.dtype;
  return s;
}

InitArgs init_args(const SlotPool& pool, std::int64_t first_slot, std::int64_t n, const RecordInit& init) noexcept {
  return {pool.base, pool.stride, pool.dim, pool.state_dim, first_slot, n, init, pool.dtype, pool.state_dtype};
}

RecordArgs record_args(const SlotPool& pool, const Key* slots, std::int64_t n, float* packed) noexcept {
  RecordArgs a;
  a.base = pool.base;
  a.stride = pool.stride;
  a.slots = slots;
  a.n = n;
  a.packed = packed;
  a.overflow = pool.overflow;
  a.first_overflow = first_overflow(pool);
  return a;
}

HostRecordArgs host_record_args(const SlotPool& pool, const Key* slots, std::int64_t n, float* const* rows) noexcept {
  HostRecordArgs a;
  a.base = pool.base;
  a.stride = pool.stride;
  a.words = pool.row_bytes() / static_cast<std::int64_t>(sizeof(float));
  a.slots = slots;
  a.rows = rows;
  a.n = n;
  a.overflow = pool.overflow;
  a.first_overflow = first_overflow(pool);
  return a;
}

RowSource host_source(const RowRef& table, float* const* bases) noexcept {
  RowSource s;
  s.parts = table.parts;
  s.block_shift = table.block_shift;
  s.stride = table.stride;
  s.dtype = table.dtype;
  for (std::int32_t p = 0; p < table.parts && p < kMaxHostParts; ++p) s.bases[p] = bases[p];
  return s;
}

std::vector<GatherArgs> gather_launches(const RowSource& source, std::int32_t dim,
                                        const std::vector<LookupFeature>& features) {
  std::vector<GatherArgs> out;
  const std::int32_t lanes = gather_lanes_per_row(dim);
  const std::int64_t per_warp = kWarp / lanes;
  for (std::size_t first = 0; first < features.size(); first += kMaxFeaturesPerLaunch) {
    const std::size_t n = std::min<std::size_t>(kMaxFeaturesPerLaunch, features.size() - first);
    GatherArgs a;
    a.source = source;
    a.dim = dim;
    a.lanes_per_row = lanes;
    a.count = static_cast<std::int32_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      const LookupFeature& f = features[first + i];
      const std::int64_t outputs = std::max<std::int64_t>(0, f.pooling == Pooling::kNone ? f.num_keys : f.batch);
      a.features[i] = {f.offsets, f.rows, f.weights, f.out, outputs, f.pooling, f.out_dtype};
      a.begin[i + 1] = a.begin[i] + (outputs + per_warp - 1) / per_warp;
    }
    if (a.begin[a.count] > 0) out.push_back(a);
  }
  return out;
}

namespace {
std::int64_t chunks_of(const FloatRange& r) noexcept {
  return (std::max<std::int64_t>(0, r.n) + kFiniteChunk - 1) / kFiniteChunk;
}
}  // namespace

std::int64_t finite_partials(const std::vector<FloatRange>& ranges) noexcept {
  std::int64_t n = 0;
  for (const FloatRange& r : ranges) n += chunks_of(r);
  return n;
}

std::vector<FiniteArgs> finite_launches(const std::vector<FloatRange>& ranges, std::int64_t* partial,
                                        std::int64_t* totals) {
  std::vector<FiniteArgs> out;
  for (std::size_t first = 0; first < ranges.size(); first += kMaxFeaturesPerLaunch) {
    const std::size_t n = std::min<std::size_t>(kMaxFeaturesPerLaunch, ranges.size() - first);
    FiniteArgs a;
    a.count = static_cast<std::int32_t>(n);
    a.partial = partial;
    a.totals = totals + first;
    for (std::size_t i = 0; i < n; ++i) {
      a.data[i] = ranges[first + i].data;
      a.n[i] = std::max<std::int64_t>(0, ranges[first + i].n);
      a.dtype[i] = ranges[first + i].dtype;
      a.begin[i + 1] = a.begin[i] + chunks_of(ranges[first + i]);
    }
    partial += a.begin[a.count];
    out.push_back(a);  // even without chunks: the sum kernel writes the totals (zero)
  }
  return out;
}

std::vector<UpdateArgs> update_launches(const SlotPool& pool, const std::vector<UpdateFeature>& features) {
  std::vector<UpdateArgs> out;
  for (std::size_t first = 0; first < features.size(); first += kMaxFeaturesPerLaunch) {
    const std::size_t n = std::min<std::size_t>(kMaxFeaturesPerLaunch, features.size() - first);
    UpdateArgs a;
    a.base = pool.base;
    a.stride = pool.stride;
    a.overflow = pool.overflow;
    a.first_overflow = first_overflow(pool);
    a.dim = pool.dim;
    a.count = static_cast<std::int32_t>(n);
    a.dtype = pool.dtype;
    a.state_dtype = pool.state_dtype;
    a.hot_listed = true;
    for (std::size_t i = 0; i < n; ++i) {
      const UpdateFeature& f = features[first + i];
      a.features[i] = {f.offsets, f.weights, f.unique_slots, f.unique_rows, f.unique_offsets, f.positions, f.bag_of,
                       f.grads,   f.pooling, f.step,         f.hot};
      a.begin[i + 1] = a.begin[i] + std::max<std::int64_t>(0, f.num_unique);
      a.hot_begin[i + 1] = a.hot_begin[i] + (f.hot ? std::max<std::int64_t>(0, f.num_hot) : 0);
      a.hot_listed = a.hot_listed && (f.hot != nullptr || f.num_unique <= 0);
    }
    // Partials by key positions, hot rows or not: batches of one size need one scratch size, so
    // a steady run sizes it once (a feature of `keys` positions can have a hot row in any batch).
    for (std::size_t i = 0; i < n; ++i) {
      const UpdateFeature& f = features[first + i];
      a.seg_begin[i + 1] = a.seg_begin[i] + (f.num_unique > 0 ? hot_partials(f.num_keys) : 0);
    }
    if (a.begin[a.count] > 0) out.push_back(a);
  }
  return out;
}

std::int64_t partial_floats(const std::vector<UpdateArgs>& launches) noexcept {
  std::int64_t n = 0;
  for (const UpdateArgs& a : launches) n = std::max(n, a.seg_begin[a.count] * a.dim);
  return n;
}

void with_partials(std::vector<UpdateArgs>& launches, float* scratch) noexcept {
  for (UpdateArgs& a : launches) a.partials = scratch;
}

}  // namespace strata::gpu::kernels
