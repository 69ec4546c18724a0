#pragma once
// What a strata-bench run will hold, checked before anything large is allocated: the memory
// estimate its guard sets against the machine and the device, and whether each cache can hold a
// step's rows.

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_options.hpp"
#include "toolkit/batch_source.hpp"

namespace strata::bench {

/// Bytes of one table record (weights and optimizer state) on the host.
double record_bytes(const TableSpec& s);

/// Host bytes of the store's tables: rows x (dim + optimizer state) x 4 (every mode keeps them).
double host_table_bytes(const StoreConfig& c);

/// Slot pools of a cached config: rows and bytes per (dim, state) shape, as the store sizes them.
struct PoolSize {
  int dim = 0;
  std::int32_t state = 0;
  std::int64_t rows = 0;
  double bytes = 0;
  std::vector<std::size_t> tables;  // indices into config.tables
};
std::vector<PoolSize> slot_pools(const StoreConfig& c);

/// Calibrated against measured peak RSS on the default workload (it overestimates a little):
/// host(mode) = tables + pinned staging + (emu: device) + output/gradient buffers, and the batches
/// and the read probe beside.
struct MemoryEstimate {
  double tables = 0;       // host tables (all modes)
  double device = 0;       // device allocation of the worst mode (emu: host memory too)
  double batches = 0;      // generated batches plus the store's copies of the batches in flight
  double buffers = 0;      // output and gradient buffers
  double probe = 0;        // the larger of the read-bandwidth and gather probes (freed before the modes run)
  double total = 0;        // peak estimate
  std::string worst_mode;  // the mode with the largest estimate
};

/// The peak memory of a run of `modes` (and the sweep's cached runs at the largest fraction):
/// the worst mode's host memory (emu: its device memory too), and its device memory.
MemoryEstimate estimate_memory(const Options& o, const std::vector<const ModeDescriptor*>& modes,
                               const std::vector<double>& sweep, bool emu);

/// "" when the slot pools of `c` can hold a step's rows, else why not; `what` says where
/// the cache's size came from ("cache fraction 0.1", "the config").
Result<std::string> cache_too_small(const Options& o, const StoreConfig& c, const std::string& what,
                                    const BatchSource& source, int ranks = 1);

/// cache_too_small for the cached mode at cache fraction `fraction`.
Result<std::string> cached_too_small(const Options& o, double fraction, const BatchSource& source);

}  // namespace strata::bench
