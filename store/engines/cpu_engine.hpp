#pragma once
// The `cpu` placement: rows in NUMA host arenas, oneTBB kernels from host/. The host-side pieces
// (forward into host buffers, backward with the optimizer on the CPU, row copies) are also what
// `offload` tables run on their pinned host tables.

#include <memory>
#include <vector>

#include "host/host_table.hpp"
#include "host/kernels.hpp"
#include "host/repeats.hpp"
#include "store/engines/engine.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// BagsView of a feature.
BagsView bags_of(const JaggedKeys& f);

/// Host-side lookups and updates of one HostTable, with reusable scratch.
class HostTableOps {
 public:
  explicit HostTableOps(HostTable table) : table_(std::move(table)) {}
  HostTable& table() noexcept { return table_; }
  /// out: host (output_rows(f), dim).
  void forward(const JaggedKeys& f, float* out) const;
  /// grads: host, the shape forward produced. Dedups, reduces per row, applies the optimizer.
  void backward(const JaggedKeys& f, const float* grads, const OptimizerStep& step);
  void read_rows(std::int64_t row0, std::int64_t n, float* weights, float* state) const;
  void write_rows(std::int64_t row0, std::int64_t n, const float* weights, const float* state);

 private:
  HostTable table_;
  Repeats repeats_;
  RepeatsScratch scratch_;
  std::vector<std::int32_t> bag_of_;
};

/// Creates the engine of the `cpu` tables `tables` (global indexes; allocates their HostTables).
Result<std::unique_ptr<Engine>> make_cpu_engine(const Topology& topo, const StoreConfig& config,
                                                const std::vector<int>& tables, const HostTableOptions& options);

}  // namespace strata::detail
