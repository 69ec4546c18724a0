#include "host/host_table.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace strata {

std::int64_t record_stride(std::int32_t dim, std::int32_t state_dim) noexcept {
  const std::int64_t n = std::int64_t{dim} + state_dim;
  if (n >= 16) return (n + 15) / 16 * 16;
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

Result<HostTable> HostTable::create(const Topology& topo, const TableSpec& spec, const HostTableOptions& options) {
  STRATA_RETURN_IF_ERROR(validate(spec));
  if (options.block_rows_log2 < 0 || options.block_rows_log2 > 40)
    return Status::invalid_argument("table '" + spec.name + "': block_rows_log2 " +
                                    std::to_string(options.block_rows_log2) + " out of range [0, 40]");
  HostTable t;
  t.spec_ = spec;
  t.ref_.dim = spec.dim;
  t.ref_.state_dim = optimizer_state_dim(spec.optimizer.kind, spec.dim);
  t.ref_.stride = record_stride(spec.dim, t.ref_.state_dim);
  const std::int64_t block_rows = std::int64_t{1} << options.block_rows_log2;
  const std::int64_t blocks = (spec.rows + block_rows - 1) / block_rows;
  const int parts = options.interleave ? static_cast<int>(std::min<std::int64_t>(topo.num_nodes(), blocks)) : 1;
  const std::size_t record_bytes = static_cast<std::size_t>(t.ref_.stride) * sizeof(float);

  for (int p = 0; p < parts; ++p) {
    std::int64_t part_rows;
    if (parts == 1) {
      part_rows = spec.rows;
    } else {
      const std::int64_t part_blocks = (blocks - p + parts - 1) / parts;
      part_rows = part_blocks * block_rows;  // the last block may be partial; keep whole blocks
    }
    ArenaOptions ao;
    ao.node = options.interleave ? p : options.node;
    ao.huge_pages = options.huge_pages;
    ao.pinner = options.pinner;
    auto arena = NumaArena::create(topo, static_cast<std::size_t>(part_rows) * record_bytes, ao);
    if (!arena) return arena.status().with_context("table '" + spec.name + "'");
    t.arena_nodes_.push_back(ao.node);
    t.arenas_.push_back(std::move(arena).value());
  }
  for (auto& a : t.arenas_) t.bases_.push_back(static_cast<float*>(a.data()));
  t.ref_.parts = parts;
  t.ref_.block_shift = parts == 1 ? 62 : options.block_rows_log2;
  t.ref_.bases = t.bases_.data();
  t.reset();
  return t;
}

std::size_t HostTable::bytes() const noexcept {
  std::size_t n = 0;
  for (const auto& a : arenas_) n += a.size();
  return n;
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
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, spec_.rows, 4096), [&](const tbb::blocked_range<std::int64_t>& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i) {
      float* rec = ref.row(i);
      init_row(rec, tseed, init.global_row(i), ref.dim, bound, init.col_offset);
      init_state(rec + ref.dim, opt, ref.state_dim);
      for (std::int64_t c = ref.dim + ref.state_dim; c < ref.stride; ++c) rec[c] = 0.0f;
    }
  });
}

}  // namespace strata
