#include "bench/bench_memory.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench/bench_probes.hpp"
#include "core/half.hpp"
#include "store/model/cost_model.hpp"
#include "store/model/table_cost.hpp"

namespace strata::bench {

double host_table_bytes(const StoreConfig& c) {
  double b = 0;
  for (const auto& t : c.tables) b += static_cast<double>(t.spec.rows) * row_sizes(t.spec).record;
  return b;
}

namespace {

// The model's options for a store of `c` as strata-bench runs it on `world` ranks (0 or 1: one):
// the batches it keeps in flight (lookahead + pipeline, at most the ring the config allows), the
// trainer's side, the offload gather and the cache transfers of the config; this machine's NUMA
// nodes, as host_table_memory counts the tables (`numa: auto` priced as interleave: an upper bound, a
// store bound to its GPU's node maps at most that).
CostOptions cost_options(const Options& o, const StoreConfig& c, int world) {
  CostOptions co;
  co.max_in_flight = std::max(1, std::min(c.cache.max_in_flight, o.lookahead + o.pipeline));
  co.numa_nodes = 0;
  co.threads = c.threads;
  co.ranks = std::max(1, world);
  co.trainer_on_device = o.trainer == Trainer::kDevice;
  co.offload_cpu_gather = c.offload_gather == OffloadGather::kCpu;
  co.transfer_probe = c.cache.transfer == CacheTransfer::kAuto;
  return co;
}

// Every table's step at its largest (the model's largest_load): the workload's batch of bags,
// each of its most keys.
std::vector<TableLoad> largest_loads(const Options& o, const StoreConfig& c, int world) {
  const double keys_per_bag = o.workload.bag_dist == "uniform" ? 2.0 * o.workload.bag_size : o.workload.bag_size;
  const auto keys = static_cast<std::int64_t>(static_cast<double>(o.workload.batch) * keys_per_bag);
  std::vector<TableLoad> loads;
  for (const TableConfig& t : c.tables) {
    // Each feature of a table brings its keys to the table's step, whose entry has the batch's bags
    // (features merged bag by bag), and its outputs to the store's front.
    const auto features = static_cast<std::int64_t>(std::max<std::size_t>(1, t.features.size()));
    TableLoad l = largest_load(t.spec, features * keys, o.workload.batch, world);
    if (features > 1) {
      l.features = static_cast<int>(features);
      l.max_feature_rows = feature_rows(t, o.workload.batch, std::vector<std::int64_t>(t.features.size(), keys));
      l.feature_rows = static_cast<double>(l.max_feature_rows);
    }
    loads.push_back(l);
  }
  return loads;
}

}  // namespace

Result<ModeMemory> mode_memory(const Options& o, const ModeDescriptor& mode, double cache_fraction) {
  STRATA_ASSIGN_OR_RETURN(const StoreConfig c, make_config(o, mode, cache_fraction));
  ModeMemory mm;
  // Host tables as the store maps them (store/model/cost_model.hpp): padded records, tables of 1 MiB
  // and more in arenas of their own rounded up to 2 MiB, smaller ones packed into shared 2 MiB
  // arenas, and the CPU optimizer's scratch of cpu/offload tables; per rank (thread ranks each
  // open a store in this process; under mpirun this process is one rank). Counting rows x
  // record alone missed 2 MiB of arena and 1 MB of scratch per small table: 1,000 one-row
  // tables reached 3.09 GB of RSS while the estimate said 1.7 MB.
  mm.world = o.mpi ? o.mpi->size() : runs_on_ranks(mode) && o.ranks > 1 ? o.ranks : 0;
  const int first = o.mpi ? o.mpi->rank() : 0;
  const int last = o.mpi ? first + 1 : std::max(1, mm.world);
  for (int r = first; r < last; ++r) {
    STRATA_ASSIGN_OR_RETURN(const HostTableMemory mem, host_table_memory(c, 0, mm.world, r));
    mm.tables_here += mem.mapped_bytes + mem.scratch_bytes;
  }
  STRATA_ASSIGN_OR_RETURN(const HostTableMemory rank0, host_table_memory(c, 0, mm.world, 0));
  mm.host_tables = rank0.mapped_bytes + rank0.scratch_bytes;
  // The store's device memory and pinned staging, by the engine model, for rank 0 (the largest
  // shards).
  if (mode.uses_device) {
    STRATA_ASSIGN_OR_RETURN(const StoreMemory mem,
                            store_memory(c, largest_loads(o, c, mm.world), cost_options(o, c, mm.world)));
    mm.hbm = mem.hbm_bytes;
    mm.host_staging = mem.host_staging_bytes;
  }
  return mm;
}

MemoryEstimate estimate_memory(const Options& o, const std::vector<const ModeDescriptor*>& modes,
                               const std::vector<double>& sweep, bool emu) {
  MemoryEstimate e;
  const auto shapes = workload_tables(o.workload);
  const double keys_per_bag = o.workload.bag_dist == "uniform" ? 2.0 * o.workload.bag_size : o.workload.bag_size;
  double out_floats = 0;
  for (const auto& t : shapes)
    out_floats += static_cast<double>(o.workload.batch) * (o.pooling_mode == "none" ? keys_per_bag : 1.0) * t.dim;
  // Keys and offsets (8 bytes each) of every distinct batch, plus the store's validated and
  // deduplicated copies of the batches in flight (about three more copies of each).
  const double in_flight = std::max(8, o.lookahead + o.pipeline + 1);
  e.batches = max_batch_bytes(o.workload) * (o.workload.distinct_batches + 3.0 * in_flight);
  // One step's outputs and gradients: the loop keeps them in host memory (per rank); with the
  // trainer on the device also in device buffers (the store's device: the model counts them; cpu
  // mode: a device strata-bench opens, emu: host memory) and, in cpu mode, in the pinned buffers
  // the trainer's copies go through.
  const bool device_trainer = o.trainer == Trainer::kDevice;
  const auto output_dtype = parse_dtype(o.output_dtype);
  const double activations = out_floats * (output_dtype ? element_bytes(*output_dtype) : 4) * 2.0;
  e.probe = static_cast<double>(o.read_probe_mib) * 1024.0 * 1024.0;
  if (o.gather_probe)
    for (const GatherProbePlan& p : gather_probe_plans(o))
      e.probe = std::max(e.probe, static_cast<double>(p.rows) * static_cast<double>(p.stride) * 4.0);
  double worst = 0;
  std::vector<const ModeDescriptor*> runs = modes;  // the sweep runs the cached mode too
  if (!sweep.empty()) runs.push_back(find_mode("cached").value());
  for (const ModeDescriptor* m : runs) {
    std::vector<double> fractions = {o.cache_fraction};
    if (m->placement == Placement::kCached && !sweep.empty())
      fractions.push_back(*std::max_element(sweep.begin(), sweep.end()));
    for (const double f : fractions) {
      // A mode the model cannot price fails when it runs, with the store's own message.
      auto mm = mode_memory(o, *m, f);
      if (!mm) continue;
      // Every thread rank opens a store, with its own device, in this process: host memory holds
      // each one's staging (and, emu, device memory), at most rank 0's each.
      const int here = o.mpi ? 1 : std::max(1, mm->world);
      const double device = mm->hbm, staging = mm->host_staging;
      // The store's device holds a device trainer's outputs and gradients (the model counts them);
      // without one (cpu mode) strata-bench opens a device for them and copies through pinned buffers.
      const double trainer_device = m->uses_device ? 0.0 : device_trainer ? activations : 0.0;
      const double buffers = here * (activations + (m->uses_device ? 0.0 : trainer_device));
      const double host = mm->tables_here + here * (staging + (emu ? device + trainer_device : 0.0)) + buffers;
      if (host > worst) {
        worst = host;
        e.tables = mm->tables_here;
        e.buffers = buffers;
        e.device = m->uses_device ? device : trainer_device;
        e.worst_mode = m->name;
      }
    }
  }
  e.total = std::max(worst, e.probe) + e.batches;
  return e;
}

namespace {

// Rows each slot pool must hold at once: the most unique rows of one step of the run (a batch;
// over several ranks a world step, one batch per rank), in the forward phase or in training. That
// is all the store needs: a plan that does not fit beside the rows pinned by the batches in flight
// waits for them to retire (CacheStats::deferred, printed per mode), and the training loop retires
// batch i before it asks for batch i + 1's rows. A cache smaller than one step fails at its first
// such step, so it is refused before the run. Reads the run's batches once through a cursor.
Result<std::vector<std::int64_t>> rows_needed_per_pool(const Options& o, const StoreConfig& c,
                                                       const std::vector<SlotPool>& pools, const BatchSource& source,
                                                       int ranks) {
  // Keys of a world step in pool p on `rank`, as (table index, key) pairs: a pool is a rank's,
  // holding its shards' rows (row sharding: key k on rank k % ranks, local row k / ranks).
  using Row = std::pair<std::size_t, Key>;
  std::vector<Row> rows;
  const auto count_rows = [&](const std::vector<KeyBatch>& step, const SlotPool& pool, int rank) {
    rows.clear();
    for (const KeyBatch& batch : step)
      for (const std::size_t t : pool.tables)
        for (const auto& f : batch.features)
          if (table_of(o, f.table) == c.tables[t].spec.name)
            for (const Key k : f.keys)
              if (ranks == 1 || static_cast<int>(k % static_cast<Key>(ranks)) == rank)
                rows.emplace_back(t, k / static_cast<Key>(ranks));
    std::sort(rows.begin(), rows.end());
    return static_cast<std::int64_t>(std::unique(rows.begin(), rows.end()) - rows.begin());
  };
  std::vector<std::int64_t> need(pools.size(), 0);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BatchCursor> cursor, source.cursor(0, 1));
  // The world steps of both phases: world step i is source batches i ranks .. i ranks + ranks - 1
  // (each rank's batch r, r + ranks, ...), mod the source's batches.
  const int steps = 2 * (o.warmup + o.steps);
  std::vector<KeyBatch> step;
  for (int s = 0; s < steps; ++s) {
    step.clear();
    for (int r = 0; r < ranks; ++r) {
      STRATA_ASSIGN_OR_RETURN(KeyBatch b, cursor->next());
      step.push_back(std::move(b));
    }
    for (int rank = 0; rank < ranks; ++rank)
      for (std::size_t p = 0; p < pools.size(); ++p) need[p] = std::max(need[p], count_rows(step, pools[p], rank));
  }
  return need;
}

}  // namespace

Result<std::string> cache_too_small(const Options& o, const StoreConfig& c, const std::string& what,
                                    const BatchSource& source, int ranks) {
  const auto pools = slot_pools(c);
  if (pools.empty()) return std::string();
  STRATA_ASSIGN_OR_RETURN(const auto need, rows_needed_per_pool(o, c, pools, source, ranks));
  for (std::size_t p = 0; p < pools.size(); ++p) {
    if (pools[p].rows >= need[p]) continue;
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s gives the slot pool %s %lld rows, but one step needs %lld unique rows in it",
                  what.c_str(), pools[p].name.c_str(), static_cast<long long>(pools[p].rows),
                  static_cast<long long>(need[p]));
    return std::string(buf);
  }
  return std::string();
}

// cache_too_small for the cached mode at cache fraction `fraction`.
Result<std::string> cached_too_small(const Options& o, double fraction, const BatchSource& source) {
  auto c = make_config(o, *find_mode("cached").value(), fraction);
  if (!c) return c.status().message();
  char what[64];
  std::snprintf(what, sizeof what, "cache fraction %g", fraction);
  return cache_too_small(o, c.value(), what, source);
}

}  // namespace strata::bench
