#pragma once
// The `offload` placement: rows in pinned host memory, no cache. Lookups either run on the device
// (the distinct rows of a batch are read zero-copy from host memory once, into device staging, then
// one table-batched gather per dim pools them; outputs come back D2H) or on CPU threads (pooled
// outputs go H2D), per StoreConfig::offload_gather. Gradients arrive on the host and the CPU applies the optimizer.

#include <memory>
#include <vector>

#include "gpu/device.hpp"
#include "host/host_table.hpp"
#include "store/detail/engine.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

Result<std::unique_ptr<Engine>> make_offload_engine(const Topology& topo, const StoreConfig& config,
                                                    const std::vector<int>& tables, HostTableOptions options,
                                                    gpu::Device& device);

}  // namespace strata::detail
