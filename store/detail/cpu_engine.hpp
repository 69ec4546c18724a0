#pragma once
// The `cpu` placement: rows in NUMA host arenas, oneTBB kernels from host/.

#include <memory>

#include "host/host_table.hpp"
#include "store/detail/table_engine.hpp"

namespace strata::detail {

/// Creates the engine of a `cpu` table (allocates and initialises its HostTable).
Result<std::unique_ptr<TableEngine>> make_cpu_engine(const Topology& topo, const TableSpec& spec,
                                                     const HostTableOptions& options);

}  // namespace strata::detail
