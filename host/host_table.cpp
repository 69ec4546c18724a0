#include "host/host_table.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>

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

int HostTable::node_of(std::int64_t r) const noexcept {
  if (ref_.parts == 1) return arena_nodes_.front();
  return arena_nodes_[static_cast<std::size_t>((r >> ref_.block_shift) % ref_.parts)];
}

void HostTable::reset() {
  const RowRef ref = ref_;
  const std::uint64_t tseed = table_seed(spec_.init.seed, table_name_hash(spec_.name));
  const float bound = spec_.init.bound;
  const OptimizerSpec opt = spec_.optimizer;
  const InitializerSpec init = spec_.init;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, spec_.rows, 4096),
                    [&](const tbb::blocked_range<std::int64_t>& r) {
                      for (std::int64_t i = r.begin(); i < r.end(); ++i) {
                        float* rec = ref.row(i);
                        init_row(rec, tseed, init.global_row(i), ref.dim, bound, init.col_offset);
                        init_state(rec + ref.dim, opt, ref.state_dim);
                        for (std::int64_t c = ref.dim + ref.state_dim; c < ref.stride; ++c) rec[c] = 0.0f;
                      }
                    });
}

}  // namespace strata
