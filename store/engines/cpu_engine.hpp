#pragma once
// The `cpu` placement: rows in NUMA host arenas, oneTBB kernels from host/. The host-side pieces
// (forward into host buffers, backward with the optimizer on the CPU, row copies) are also what
// `offload` tables run on their pinned host tables.

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "host/host_table.hpp"
#include "host/kernels.hpp"
#include "host/repeats.hpp"
#include "store/engines/engine.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// Host-side lookups and updates of one HostTable, with reusable scratch. Lookups and updates go
/// through HostBatch, all the batch's tables at once.
class HostTableOps {
 public:
  explicit HostTableOps(HostTable table) : table_(std::move(table)) {}
  HostTable& table() noexcept { return table_; }
  const HostTable& table() const noexcept { return table_; }
  /// The table's part of a table-batched forward. out: host (output_rows(f), dim).
  TableBatchItem forward_item(const JaggedKeys& f, float* out) const;
  /// Prepares a backward of f: each key's bag and, unless `shared` (HostBatch finds them for
  /// several tables at once, find_repeats_tables), the repeated keys (kept here until the next call).
  void prepare_backward(const JaggedKeys& f, bool shared);
  /// The table's repeated keys (what prepare_backward or find_repeats_tables left).
  Repeats& repeats() noexcept { return repeats_; }
  /// The table's part of a table-batched backward, after prepare_backward. grads: host, the shape
  /// forward produced.
  TableBatchItem backward_item(const JaggedKeys& f, const float* grads, const OptimizerStep& step) const;
  void read_rows(std::int64_t row0, std::int64_t n, float* weights, float* state) const;
  void write_rows(std::int64_t row0, std::int64_t n, const float* weights, const float* state);
  /// read_rows and write_rows of rows[i] into or from row i of `weights` and `state` (Engine::read_rows_at,
  /// Engine::reset_rows).
  void read_rows(const std::vector<std::int64_t>& rows, float* weights, float* state) const;
  void write_rows(const std::vector<std::int64_t>& rows, const float* weights, const float* state);

 private:
  HostTable table_;
  Repeats repeats_;
  RepeatsScratch scratch_;
  std::vector<std::int32_t> bag_of_;
};

/// Adds (table, its host table) of each of `tables` to `out` (Engine::host_tables).
inline void add_host_tables(const std::unordered_map<int, HostTableOps>& tables,
                            std::vector<std::pair<int, const HostTable*>>& out) {
  for (const auto& [t, ops] : tables) out.emplace_back(t, &ops.table());
}

/// One feature of a batch on its table, for HostBatch.
struct HostFeature {
  HostTableOps* ops = nullptr;
  const JaggedKeys* keys = nullptr;
  float* out = nullptr;          ///< forward: host (output_rows, dim)
  const float* grads = nullptr;  ///< backward: host, the shape forward produced
  OptimizerStep step{};          ///< backward
};

/// Table-batched lookups and updates of a batch's features (host/kernels.hpp: gather_pool_tables,
/// backward_update_tables), for `cpu` and `offload`'s CPU gather and optimizer: one parallel loop
/// over all the tables' chunks instead of a loop per table. The features' tables must be distinct.
class HostBatch {
 public:
  /// Pools every feature into its `out`.
  void forward(const std::vector<HostFeature>& f);
  /// Finds the repeated keys: of the tables of up to kSharedRepeatsRows rows and kSharedRepeatsKeys
  /// keys in one pass (find_repeats_tables), of the others table by table, as before (the tables
  /// side by side); then reduces and applies the optimizer to the rows of all tables in one loop.
  void backward(const std::vector<HostFeature>& f);

  /// Rows up to which a table's repeated keys are found in the batch's shared pass.
  static constexpr std::int64_t kSharedRepeatsRows = std::int64_t{1} << 22;
  /// Keys up to which a table's repeated keys are found in the batch's shared pass: a table of
  /// more keys is scanned in parallel on its own (find_repeats' chunks are 16,384 keys), and
  /// copying its keys into the shared key space would only add traffic (the 26 tables of 163,840
  /// keys of `--pooling 20`: 4.3M keys copied, flags and positions split back per table).
  static constexpr std::int64_t kSharedRepeatsKeys = 16384;

 private:
  std::vector<TableBatchItem> items_;
  TableBatchScratch scratch_;
  std::vector<char> shared_;  // per feature: found in the shared pass
  std::vector<TableKeys> shared_keys_;
  std::vector<Repeats*> shared_out_;
  TablesRepeatsScratch repeats_scratch_;
};

/// Creates the engine of the `cpu` tables `tables` (global indexes; allocates their HostTables).
Result<std::unique_ptr<Engine>> make_cpu_engine(const Topology& topo, const StoreConfig& config,
                                                const std::vector<int>& tables, const HostTableOptions& options);

}  // namespace strata::detail
