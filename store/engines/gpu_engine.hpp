#pragma once
// The `gpu` placement on one device: every row and its optimizer state live in HBM, no host copy.
// Tables of the same (dim, optimizer state) shape share one slot pool (slot = table base + row),
// so one launch serves all of them. Per batch: dedup and metadata upload on the copy stream at
// submit; forward waits for it, gathers and copies the outputs back; backward uploads gradients
// and runs the fused update. Host sync points: open (the tables' initialization on the device),
// submit (a staging entry is reused only after the batch that last used it retired),
// forward (outputs), read_rows/write_rows, flush.
// Sharded `gpu` tables (several ranks) use this engine for each rank's shards.
// The pools, streams, lookups and updates are the slot-pool core's (slot_pool_engine.hpp), shared
// with `cached`; this engine maps rows to slots and initializes, reads and writes them.

#include <memory>
#include <vector>

#include "gpu/device.hpp"
#include "store/engines/engine.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

Result<std::unique_ptr<Engine>> make_gpu_engine(const StoreConfig& config, const std::vector<int>& tables,
                                                gpu::Device& device);

}  // namespace strata::detail
