#pragma once
// The `offload` placement: rows in pinned host memory, no cache. Lookups either run on the device
// (the distinct rows of a batch are read zero-copy from host memory once, into device staging, then
// one table-batched gather per dim pools them, into device views in place or, for host views,
// into staging and back D2H) or on CPU threads (pooled outputs go H2D, into device views or
// staging), per StoreConfig::offload_gather. The CPU applies the optimizer to the host rows: host
// gradients are read in place, device ones copied D2H once into the batch's pinned staging by
// prepare_backward, before any engine of the call applies anything.

#include <memory>
#include <vector>

#include "gpu/device.hpp"
#include "host/host_table.hpp"
#include "store/engines/engine.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

Result<std::unique_ptr<Engine>> make_offload_engine(const Topology& topo, const StoreConfig& config,
                                                    const std::vector<int>& tables, HostTableOptions options,
                                                    gpu::Device& device);

}  // namespace strata::detail
