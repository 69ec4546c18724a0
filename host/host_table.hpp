#pragma once
// HostTable: the rows and optimizer state of one table (or shard) in NUMA arenas, either
// interleaved across nodes by row blocks or bound to one node. Rows are initialised from the
// table's initializer in parallel by oneTBB.
//
// Small tables are packed. An arena is at least 2 MiB, mapped and pre-faulted, so 1,000 one-row
// tables used to hold 2 GiB. A table whose records take less than `pack_below_bytes` (1 MiB), created
// with an ArenaPacker, instead takes each of its parts from a 2 MiB arena it shares with other small
// tables (64-byte aligned regions). NUMA placement is unchanged: a part still lives on the same node
// (the packer keeps one set of arenas per node), so an interleaved small table is still dealt by row
// blocks over the nodes and a bound one stays on its node. Pinning is unchanged too: the shared arena
// is pinned whole through the same Pinner, which covers every part in it (a device reads a part at
// an offset into a registered range). Large tables keep arenas of their own (huge pages, bind).

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/table_spec.hpp"
#include "host/numa_arena.hpp"
#include "host/row_ref.hpp"
#include "host/topology.hpp"

namespace strata {

/// Where a HostTable's memory lives.
struct HostTableOptions {
  bool interleave = true;             ///< deal row blocks over all nodes (else bind to `node`)
  int node = 0;                       ///< node for bound tables
  std::int32_t block_rows_log2 = 12;  ///< interleaving granularity: 2^k rows per block
  bool huge_pages = true;             ///< see ArenaOptions
  Pinner* pinner = nullptr;           ///< see ArenaOptions
  /// Shared arenas for small tables (nullptr: every table gets arenas of its own). Not owned; used
  /// only during create() (the table keeps the arenas its parts live in alive by itself).
  ArenaPacker* packer = nullptr;
  /// Tables whose records take fewer bytes than this are packed when `packer` is set (at most
  /// ArenaPacker::kChunkBytes / 2, so a shared arena is at least half used before another opens).
  std::size_t pack_below_bytes = std::size_t{1} << 20;
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
  /// Words per record: record_words(record_shape(spec)) (core/record_layout.hpp).
  std::int64_t stride() const noexcept { return ref_.stride; }
  /// Kernel view; valid while this table lives (the bases vector is owned here).
  RowRef ref() const noexcept { return ref_; }
  /// Row r's record (host) and the word its state starts at (RowRef::row / state; elements of
  /// spec().dtype and spec().state_dtype).
  float* row(std::int64_t r) const noexcept { return ref_.row(r); }
  float* state(std::int64_t r) const noexcept { return ref_.state(r); }
  /// Reads row r as fp32: its dim weights into `weights` and, unless null, its state_dim state
  /// elements into `state`, half elements widened (exact).
  void read_row(std::int64_t r, float* weights, float* state) const;
  /// Writes row r from fp32 values (state: unless null), half elements rounded to nearest even.
  void write_row(std::int64_t r, const float* weights, const float* state);
  /// Bytes of records: rows x stride x 4 (when interleaved, whole row blocks per node), before any
  /// rounding to arenas or regions.
  std::size_t bytes() const noexcept { return bytes_; }
  /// Bytes of host memory mapped for this table: its own arenas (each rounded up to 2 MiB), or, when
  /// packed, its regions of shared arenas (each rounded up to 64 bytes; the unused rest of a shared
  /// arena is counted by ArenaPacker::mapped_bytes(), not here).
  std::size_t mapped_bytes() const noexcept;
  /// Whether the table's records live in shared arenas (see the file comment).
  bool packed() const noexcept { return !regions_.empty(); }
  /// NUMA node holding row r.
  int node_of(std::int64_t r) const noexcept;
  /// Its records' host memory: start and bytes of each part (one per node its row blocks are dealt over), for asking
  /// where the pages lie (host/page_nodes.hpp).
  std::vector<std::pair<const void*, std::size_t>> memory() const;

  /// Resets every row and its state to the initial values (parallel).
  void reset();

 private:
  HostTable() = default;
  TableSpec spec_;
  std::vector<NumaArena> arenas_;     // parts in arenas of their own
  std::vector<ArenaRegion> regions_;  // or parts in shared arenas (packed)
  std::vector<int> arena_nodes_;      // node of each part
  std::vector<float*> bases_;
  std::size_t bytes_ = 0;
  RowRef ref_;
};

/// Reads the record at `rec` (host memory, of `shape`) as fp32: its dim weights into `weights` and,
/// unless null, its state_dim state elements into `state`, half elements widened (exact).
void read_record(const float* rec, const RecordShape& shape, float* weights, float* state);
/// Writes the record at `rec` from fp32 values (state: unless null, else left as it is), half
/// elements rounded to nearest even (an odd count's last half word zero).
void write_record(float* rec, const RecordShape& shape, const float* weights, const float* state);

/// Host memory a set of tables will take, computed without allocating.
struct HostFootprint {
  std::size_t record_bytes = 0;   ///< sum of HostTable::bytes() (what the tables' records take)
  std::size_t mapped_bytes = 0;   ///< bytes mapped: own arenas plus the shared arenas of the packer
  std::size_t packed_tables = 0;  ///< tables that go into shared arenas
};

/// Exactly the memory HostTable::create maps for `specs` created in this order under `options`
/// (options.packer is ignored) on a topology of `num_nodes` nodes, all through one ArenaPacker
/// (`packed`, as each store engine does) or each with arenas of its own; equals the growth of
/// NumaArena::live_mapped_bytes() while they are created. Specs must be valid. Pure function.
HostFootprint host_footprint(const std::vector<TableSpec>& specs, const HostTableOptions& options, int num_nodes,
                             bool packed);

}  // namespace strata
