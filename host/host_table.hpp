#pragma once
// HostTable: the rows and optimizer state of one table (or shard) in NUMA arenas, either
// interleaved across nodes by row blocks or bound to one node. Rows are initialised from the
// table's initializer in parallel by oneTBB.

#include <cstdint>
#include <vector>

#include "core/table_spec.hpp"
#include "host/numa_arena.hpp"
#include "host/row_ref.hpp"
#include "host/topology.hpp"

namespace strata {

/// Where a HostTable's memory lives.
struct HostTableOptions {
  bool interleave = true;            ///< deal row blocks over all nodes (else bind to `node`)
  int node = 0;                      ///< node for bound tables
  std::int32_t block_rows_log2 = 12; ///< interleaving granularity: 2^k rows per block
  bool huge_pages = true;            ///< see ArenaOptions
  Pinner* pinner = nullptr;          ///< see ArenaOptions
};

/// Owns one table's records. Move-only. Concurrent reads are safe; writers must own distinct rows.
class HostTable {
 public:
  /// Allocates and initialises `spec.rows` rows (spec must be valid).
  static Result<HostTable> create(const Topology& topo, const TableSpec& spec, const HostTableOptions& options);

  HostTable(HostTable&&) noexcept = default;
  HostTable& operator=(HostTable&&) noexcept = default;

  const TableSpec& spec() const noexcept { return spec_; }
  std::int64_t rows() const noexcept { return spec_.rows; }
  std::int32_t dim() const noexcept { return spec_.dim; }
  std::int32_t state_dim() const noexcept { return ref_.state_dim; }
  /// Floats per record (dim + state_dim, padded for alignment).
  std::int64_t stride() const noexcept { return ref_.stride; }
  /// Kernel view; valid while this table lives (the bases vector is owned here).
  RowRef ref() const noexcept { return ref_; }
  /// Row r's weights (dim floats, host) and state (state_dim floats).
  float* row(std::int64_t r) const noexcept { return ref_.row(r); }
  float* state(std::int64_t r) const noexcept { return ref_.state(r); }
  /// Bytes of host memory held.
  std::size_t bytes() const noexcept;
  /// NUMA node holding row r.
  int node_of(std::int64_t r) const noexcept;

  /// Resets every row and its state to the initial values (parallel).
  void reset();

 private:
  HostTable() = default;
  TableSpec spec_;
  std::vector<NumaArena> arenas_;
  std::vector<int> arena_nodes_;
  std::vector<float*> bases_;
  RowRef ref_;
};

/// Floats per record for a (dim, state_dim): rounded up to a power of two below 16, else to a
/// multiple of 16 (64 bytes), so records never straddle more cache lines than they must.
std::int64_t record_stride(std::int32_t dim, std::int32_t state_dim) noexcept;

}  // namespace strata
