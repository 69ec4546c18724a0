#pragma once
// What a strata-bench run will hold, checked before anything large is allocated: the memory
// estimate its guard sets against the machine and the device, and whether each cache can hold a
// step's rows.

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_options.hpp"
#include "store/model/table_cost.hpp"
#include "toolkit/batch_source.hpp"

namespace strata::bench {

/// Host bytes of the store's tables: rows x record (row and optimizer state; every mode keeps them).
double host_table_bytes(const StoreConfig& c);

/// What one rank of a mode's store takes by the engine model (store/model/table_cost.hpp), for
/// every table's largest step: its host tables as host_table_memory maps them (mapped and CPU
/// optimizer scratch) and store_memory's device memory and host memory beside the tables (pinned
/// staging, cache indexes, communication buffers). Rank 0 holds the largest shards.
struct ModeMemory {
  int world = 0;            ///< ranks of the mode's store (0: one store without a world)
  double hbm = 0;           ///< device memory of rank 0 (0: a mode without a device)
  double host_tables = 0;   ///< rank 0's host tables
  double host_staging = 0;  ///< rank 0's host memory beside its tables (0: a mode without a device)
  double tables_here = 0;   ///< host tables of every rank in this process (thread ranks; under mpirun its own)
  double host() const { return host_tables + host_staging; }  ///< rank 0's host memory
};

/// The memory of `mode` at `cache_fraction` (cached and hybrid tables) by the engine model.
/// Errors: the config's (make_config), a sharding plan that does not resolve, store_memory's.
Result<ModeMemory> mode_memory(const Options& o, const ModeDescriptor& mode, double cache_fraction);

/// The peak memory of a run, before anything large is allocated (it overestimates a little):
/// host(mode) = tables (host_table_memory) + the store's pinned staging + (emu: device) +
/// output/gradient buffers, each of the latter three per thread rank (each opens a store and a
/// device in this process), and the batches and the read probe beside; the store's device memory
/// and pinned staging by the engine model (store/model/table_cost.hpp, store_memory; rank 0's,
/// the largest), for every table's largest step and the staging entries the run can reach.
struct MemoryEstimate {
  double tables = 0;       // host tables (all modes; every rank in this process)
  double device = 0;       // device allocation of the worst mode, per device (emu: host memory too, per rank)
  double batches = 0;      // generated batches plus the store's copies of the batches in flight
  double buffers = 0;      // the worst mode's host output and gradient buffers (cpu mode: and their pinned copies)
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
