#include "host/host_table.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>

#include "core/record_layout.hpp"

namespace strata {
namespace {

// Node and rows of each part of a table (the layout RowRef reads): one part, or whole row blocks
// dealt round-robin over the nodes.
std::vector<std::pair<int, std::int64_t>> layout_parts(const TableSpec& spec, const HostTableOptions& options,
                                                       int num_nodes) {
  const std::int64_t block_rows = std::int64_t{1} << options.block_rows_log2;
  const std::int64_t blocks = (spec.rows + block_rows - 1) / block_rows;
  const int parts = options.interleave ? static_cast<int>(std::min<std::int64_t>(num_nodes, blocks)) : 1;
  std::vector<std::pair<int, std::int64_t>> out;
  for (int p = 0; p < parts; ++p) {
    std::int64_t part_rows;
    if (parts == 1) {
      part_rows = spec.rows;
    } else {
      const std::int64_t part_blocks = (blocks - p + parts - 1) / parts;
      part_rows = part_blocks * block_rows;  // the last block may be partial; keep whole blocks
    }
    out.emplace_back(options.interleave ? p : options.node, part_rows);
  }
  return out;
}

std::size_t record_bytes_of(const TableSpec& spec) {
  return static_cast<std::size_t>(record_words(record_shape(spec))) * sizeof(float);
}

// Whether a table of `total` record bytes goes into shared arenas. Capped at half an arena: a part
// of an interleaved table (whole row blocks) may take up to twice its share, and must fit one arena.
bool packs(std::size_t total, const HostTableOptions& options, bool have_packer) {
  return have_packer && total < std::min(options.pack_below_bytes, ArenaPacker::kChunkBytes / 2);
}

}  // namespace

Result<HostTable> HostTable::create(const Topology& topo, const TableSpec& spec, const HostTableOptions& options) {
  STRATA_RETURN_IF_ERROR(validate(spec));
  if (options.block_rows_log2 < 0 || options.block_rows_log2 > 40)
    return Status::invalid_argument("table '" + spec.name + "': block_rows_log2 " +
                                    std::to_string(options.block_rows_log2) + " out of range [0, 40]");
  HostTable t;
  t.spec_ = spec;
  t.ref_.dim = spec.dim;
  t.ref_.state_dim = optimizer_state_dim(spec.optimizer.kind, spec.dim);
  t.ref_.dtype = spec.dtype;
  t.ref_.state_dtype = spec.state_dtype;
  t.ref_.stride = record_words(record_shape(spec));
  const std::size_t record_bytes = static_cast<std::size_t>(t.ref_.stride) * sizeof(float);
  const auto parts = layout_parts(spec, options, topo.num_nodes());
  const bool packed = packs(static_cast<std::size_t>(spec.rows) * record_bytes, options, options.packer != nullptr);
  for (const auto& [node, part_rows] : parts) {
    ArenaOptions ao;
    ao.node = node;
    ao.huge_pages = options.huge_pages;
    ao.pinner = options.pinner;
    const std::size_t bytes = static_cast<std::size_t>(part_rows) * record_bytes;
    t.bytes_ += bytes;
    if (packed) {
      auto region = options.packer->allocate(topo, bytes, ao);
      if (!region) return region.status().with_context("table '" + spec.name + "'");
      t.bases_.push_back(static_cast<float*>(region->data()));
      t.regions_.push_back(std::move(region).value());
    } else {
      auto arena = NumaArena::create(topo, bytes, ao);
      if (!arena) return arena.status().with_context("table '" + spec.name + "'");
      t.arenas_.push_back(std::move(arena).value());
      t.bases_.push_back(static_cast<float*>(t.arenas_.back().data()));
    }
    t.arena_nodes_.push_back(node);
  }
  t.ref_.parts = static_cast<std::int32_t>(parts.size());
  t.ref_.block_shift = parts.size() == 1 ? 62 : options.block_rows_log2;
  t.ref_.bases = t.bases_.data();
  t.reset();
  return t;
}

std::size_t HostTable::mapped_bytes() const noexcept {
  std::size_t n = 0;
  for (const auto& a : arenas_) n += a.mapped_bytes();
  for (const auto& r : regions_) n += r.bytes;
  return n;
}

HostFootprint host_footprint(const std::vector<TableSpec>& specs, const HostTableOptions& options, int num_nodes,
                             bool packed) {
  HostFootprint f;
  ArenaPacker::Plan plan;
  for (const TableSpec& spec : specs) {
    const std::size_t record_bytes = record_bytes_of(spec);
    const bool pack = packs(static_cast<std::size_t>(spec.rows) * record_bytes, options, packed);
    if (pack) ++f.packed_tables;
    for (const auto& [node, part_rows] : layout_parts(spec, options, num_nodes)) {
      const std::size_t bytes = static_cast<std::size_t>(part_rows) * record_bytes;
      f.record_bytes += bytes;
      if (pack) {
        plan.place(static_cast<std::uint64_t>(node), bytes);
      } else {
        f.mapped_bytes += (bytes + NumaArena::kGranularity - 1) / NumaArena::kGranularity * NumaArena::kGranularity;
      }
    }
  }
  f.mapped_bytes += plan.mapped_bytes();
  return f;
}

std::vector<std::pair<const void*, std::size_t>> HostTable::memory() const {
  std::vector<std::pair<const void*, std::size_t>> parts;
  for (const auto& a : arenas_) parts.emplace_back(a.data(), a.size());
  for (const auto& r : regions_) parts.emplace_back(r.data(), r.bytes);
  return parts;
}

int HostTable::node_of(std::int64_t r) const noexcept {
  if (ref_.parts == 1) return arena_nodes_.front();
  return arena_nodes_[static_cast<std::size_t>((r >> ref_.block_shift) % ref_.parts)];
}

namespace {

// Stores `n` elements of `dtype` at `dst` from value(c), rounded to nearest even for a half type,
// and the rest of the last word as zeros.
template <class Value>
void store_elements(float* dst, DType dtype, std::int32_t n, const Value& value) {
  if (dtype == DType::kF32) {
    for (std::int32_t c = 0; c < n; ++c) dst[c] = value(c);
    return;
  }
  auto* bytes = reinterpret_cast<unsigned char*>(dst);
  for (std::int32_t c = 0; c < n + (n & 1); ++c) {
    const std::uint16_t h = c < n ? narrow(dtype, value(c), false, 0) : 0;
    std::memcpy(bytes + 2 * static_cast<std::size_t>(c), &h, sizeof h);
  }
}

// Reads `n` elements of `dtype` at `src` into out, widened.
void load_elements(const float* src, DType dtype, std::int32_t n, float* out) {
  if (dtype == DType::kF32) {
    std::memcpy(out, src, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(src);
  for (std::int32_t c = 0; c < n; ++c) {
    std::uint16_t h;
    std::memcpy(&h, bytes + 2 * static_cast<std::size_t>(c), sizeof h);
    out[c] = widen(dtype, h);
  }
}

}  // namespace

void read_record(const float* rec, const RecordShape& shape, float* weights, float* state) {
  load_elements(rec, shape.dtype, shape.dim, weights);
  if (state) load_elements(rec + row_words(shape), shape.state_dtype, shape.state_dim, state);
}

void write_record(float* rec, const RecordShape& shape, const float* weights, const float* state) {
  store_elements(rec, shape.dtype, shape.dim, [&](std::int32_t c) { return weights[c]; });
  if (state)
    store_elements(rec + row_words(shape), shape.state_dtype, shape.state_dim,
                   [&](std::int32_t c) { return state[c]; });
}

void HostTable::read_row(std::int64_t r, float* weights, float* state) const {
  read_record(ref_.row(r), {ref_.dim, ref_.dtype, ref_.state_dim, ref_.state_dtype}, weights, state);
}

void HostTable::write_row(std::int64_t r, const float* weights, const float* state) {
  write_record(ref_.row(r), {ref_.dim, ref_.dtype, ref_.state_dim, ref_.state_dtype}, weights, state);
}

void HostTable::reset() {
  const RowRef ref = ref_;
  const std::uint64_t tseed = table_seed(spec_.init.seed, table_name_hash(spec_.name));
  const float bound = spec_.init.bound;
  const OptimizerSpec opt = spec_.optimizer;
  const InitializerSpec init = spec_.init;
  const float state_value = initial_state_value(opt);
  tbb::parallel_for(
      tbb::blocked_range<std::int64_t>(0, spec_.rows, 4096), [&](const tbb::blocked_range<std::int64_t>& r) {
        for (std::int64_t i = r.begin(); i < r.end(); ++i) {
          float* rec = ref.row(i);
          const std::int64_t g = init.global_row(i);
          if (ref.dtype == DType::kF32) {
            init_row(rec, tseed, g, ref.dim, bound, init.col_offset);
          } else {  // the fp32 initial values rounded to nearest
            store_elements(rec, ref.dtype, ref.dim,
                           [&](std::int32_t c) { return initial_value(tseed, g, init.col_offset + c, bound); });
          }
          store_elements(rec + ref.row_words(), ref.state_dtype, ref.state_dim,
                         [&](std::int32_t) { return state_value; });
          for (std::int64_t c = ref.row_words() + ref.state_words(); c < ref.stride; ++c) rec[c] = 0.0f;
        }
      });
}

}  // namespace strata
