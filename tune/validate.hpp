#pragma once
// What `strata-tune validate` predicts for a plan run by strata-bench on the same keys, computed
// from the keys alone (no store): per table the LRU hits of its cache and the bytes it moves per
// step (store/model/table_cost.hpp), and the modelled step.
//
// The run strata-bench makes with `--config plan.json --warmup 0 --steps S` over a source of N
// batches: a forward phase over run batches 0..S-1, then a training phase over run batches
// S..2S-1, run batch i being source batch i mod N. The training phase keeps `pipeline` batches
// submitted ahead (strata-bench --pipeline, 2; --lookahead 0), so the first pipeline - 1 of them
// are submitted, and their cache lookups planned, before its counters start: the counted cache
// lookups are those of run batches S + pipeline - 1 .. 2S - 1. So a cached table's predicted hits
// are those of the exact LRU curve (per batch, distinct: the cache's semantics) of run batches
// 0..2S-1 less those of run batches 0..S+pipeline-2 (LRU is online: earlier hits do not depend on
// what follows), at the table's cache rows (the planner caps each
// cached table at its own rows, so each behaves as an LRU cache of its own).
//
// A plan over several ranks (`strata-tune plan --ranks N`) runs as strata-bench --config plan.json
// --ranks N runs it: N thread ranks, rank r training on source batches r, r + N, ...; strata-bench
// reports rank 0's counters, and the prediction is rank 0's (predict_run).

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "store/model/cost_model.hpp"
#include "store/model/table_cost.hpp"
#include "store/store_config.hpp"
#include "tune/tune_input.hpp"

namespace strata::tune {

/// One table of the run.
struct TablePrediction {
  std::string name;
  Placement placement = Placement::kCpu;
  std::int64_t cache_rows = 0;  ///< cached and hybrid (rows per rank) only
  std::int64_t accesses = 0;    ///< cached, hybrid: distinct (batch, row) pairs of the training phase (rank 0's shard)
  std::int64_t hits = 0;        ///< cached, hybrid: of which LRU hits
  TableLoad load;               ///< per training step (several ranks: rank 0's batches)
  StepBytes bytes;              ///< per training step

  /// hits / accesses; -1 when not cached or hybrid.
  double hit_rate() const noexcept;
};

/// The run.
struct RunPrediction {
  std::int64_t steps = 0;               ///< S, the timed training steps
  int ranks = 1;                        ///< thread ranks of the run (> 1: rank 0's counters)
  std::vector<TablePrediction> tables;  ///< in plan order
  StepBytes bytes;                      ///< per training step, every table
  /// Several ranks: bytes of keys, rows and gradients rank 0 sends to and receives from the other
  /// ranks per training step, as DispatchStats counts them (StepBytes::all_to_all less the counts
  /// exchanged with them, 8 bytes per table and peer, which it does not count).
  double exchange_bytes = 0;
  /// How the steps are modelled (model_options: the plan's ranks and `numa`, so a plan of numa auto
  /// with a device prices each rank's host DRAM on its GPU's node); the measured bytes too.
  ModelOptions model;
  ModelledStep step;  ///< on the profile

  /// Hits over accesses of every cached or hybrid table; -1 without one.
  double hit_rate() const noexcept;
};

/// Checks that `plan` has the tables of the source (`names`, `rows`; `dims` too unless empty, one
/// per table), each looked up by the same features (`features`: table -> its features when other
/// than itself; the plan's features lists): one line naming the first difference ("table 'c' has
/// 500 rows in the plan but 800 in the trace"); `what` names the source.
Status check_plan_tables(const StoreConfig& plan, const std::vector<std::string>& names,
                         const std::vector<std::int64_t>& rows, const std::vector<int>& dims, const std::string& what,
                         const std::map<std::string, std::vector<std::string>>& features = {});

/// The features lists of `plan`'s tables that have one (table, its features), as InputArgs::features takes them.
std::vector<std::pair<std::string, std::vector<std::string>>> plan_features(const StoreConfig& plan);

/// Predicts the run of `plan` (its specs, placements and caches) over `input` (exact keys, its
/// tables those of the plan by name) with `steps` (>= 1) training steps and strata-bench's
/// `pipeline` (>= 1), the trainer's dense model on the device or on the host (strata-bench
/// --trainer), on `ranks` thread ranks (1: every placement but hybrid; > 1: gpu and hybrid tables
/// sharded row-wise, as strata-tune plan --ranks makes them).
///
/// Bytes per link: what the device layer's counters count over the training phase (the engines'
/// work as store/model/table_cost.hpp lists it), divided by S: the forward and backward of run
/// batches S..2S-1, and the submit-time work (metadata uploads, cached fills and write-backs,
/// offload's host reads) of run batches S + pipeline - 1 .. 2S - 1 (the first ones were submitted
/// before the counters started). Each cached table's fills and write-backs come from a simulation
/// of its capped LRU cache over run batches 0..2S-1 with dirty bits (rows used by the forward
/// phase are clean). On emu the prediction equals the counters exactly (the engines stage
/// transfers there; cuda's `transfer: auto` may choose zero-copy, and a plan's cache.flush_every
/// adds flushes that are not predicted). CPU kernels' bytes (StepBytes::host_cpu_read/write) are
/// part of host_read/host_write and have no counter.
///
/// Several ranks: rank 0's bytes (store/model/table_cost.hpp, sharded_submit_bytes and
/// sharded_compute_bytes) from the keys of every rank's batch of each world step: rank 0's own
/// batch, the keys it sends to the other ranks, and the keys it serves (every source's distinct
/// keys of its shard); each hybrid table's fills, write-backs and hits from the same simulation of
/// rank 0's shard cache, fed the rows its inner engine sees (the served keys, deduplicated in the
/// order of their first use). Equal to rank 0's counters on emu, and its all-to-all bytes to
/// exchange_bytes.
Result<RunPrediction> predict_run(const TuneInput& input, const StoreConfig& plan, std::int64_t steps, int pipeline,
                                  const HardwareProfile& profile, bool trainer_on_device = true, int ranks = 1);

/// The bytes of a measured run for the model (store/model/cost_model.hpp), so that the prediction and
/// the measurement are priced by one computation: `counted` holds what strata-bench counted per
/// training step (hbm_read .. host_write with the CPU kernels' host bytes it counts from the keys,
/// host_cpu_read/write those, all_to_all the keys, rows and gradients rank 0 exchanged); what no
/// counter can see comes from `predicted` (the keys): which of the host bytes are random-row
/// gathers (StepBytes::host_gathers; a counter sees bytes, not rows, and the profile's gather rates
/// price rows), the part crossing NUMA nodes, the kernel launches and the counts of keys exchanged
/// before the all-to-all (8 bytes per table and peer; RunPrediction::exchange_bytes leaves them
/// out). Equal counted bytes give an equal modelled step (TuneCli.ValidatePredictsTheBytesPerLinkExactlyOnEmu).
StepBytes measured_step_bytes(const StepBytes& counted, const RunPrediction& predicted);

/// strata-bench's --pipeline as validate runs it.
inline constexpr int kValidatePipeline = 2;

}  // namespace strata::tune
