#pragma once
// The placement planner: for every table, gpu, cached with a size, offload or cpu, maximizing the
// modelled throughput (store/model/cost_model.hpp's step time over the tables' summed bytes,
// store/model/table_cost.hpp) within an HBM and a host memory budget.
//
// Rules, in order:
//  1. Everything fits in HBM (every table gpu, within both budgets): every table is gpu.
//  2. Otherwise tables leave the GPU coldest first: ranked by distinct rows per step per byte of
//     HBM they take as gpu (ties: the larger first, then by name), the fewest leave so that the
//     rest fit in HBM and the ones that left fit in host memory (their records, the least they can
//     take off the GPU). None such: an error naming the smallest feasible budgets.
//  3. Two searches, and the plan of the better: (A) the tables that left start as cpu and only
//     they move; (B) every table starts as cpu (when the host budget holds them all) and every
//     table moves. A move puts one table in another placement or cache size (cached sizes: a
//     log-spaced grid from the smallest cache that holds a step to below the table's rows, and the
//     size where its LRU curve stops rising); step by step the move that lowers the objective most
//     per byte of HBM it adds (moves that add none first) is taken, while one within both budgets
//     lowers it. The objective is the modelled step time plus 1% of the serial sum (so a link
//     that is not the bottleneck still counts a little). Search B buys HBM where it pays most, so
//     the largest cold tables are the last to get it.
//  5. Element types (PlanOptions::dtype, plan --dtype): every table's rows of one type, or each
//     table's configured dtype (the default). With auto_dtype (--dtype auto), bf16 where it changes
//     the outcome, never where fp32 fits. The start: the tables at their configured dtypes, or,
//     where no placement fits so, the fewest fp32 tables at bf16 with which one does (those saving
//     the most memory first: HBM as gpu plus host records off the GPU). Every fp32 table the
//     start's plan (rules 1-4) keeps off the GPU is a candidate; the candidates are planned at bf16,
//     and one whose bf16 plan gives it no more of the GPU than the start's (gpu where it was not, or
//     a cache of more rows; offload and cpu hold none) goes back to fp32, the rest planned again,
//     until none goes back. That plan stands where its objective is no worse than the start's.
//     Each table's why says which dtype and why, with its memory at both sizes (table_cost).
// Several ranks (PlanOptions::cost.ranks = N > 1; store/model/table_cost.hpp has the per-rank costs):
// every table is `gpu` or `hybrid`, sharded row-wise (dispatch/sharding_plan.hpp: row-wise splits
// every table's memory evenly and sends each key to one rank; table-wise would put a whole table on
// one rank's HBM, column-wise sends every key to every rank). The budgets are per rank (each rank
// has the HBM budget of its GPU and its host budget); the rules are the same with hybrid with its
// smallest cache (one world step of its fullest shard) in place of cpu, and hybrid cache sizes
// (rows per rank, the same on every rank) in place of cached. A hybrid cache's hit rate is its worst
// shard's (ShardInputs: each rank's keys, as strata-bench --ranks N runs the input), and every
// table's memory is rank 0's, which holds the largest shards. The modelled step is one rank's, with
// the all-to-all of keys, rows and gradients on the profile's all_to_all_gbs link and host DRAM
// shared by min(N, the profile's gpus) ranks (ModelOptions::ranks_per_host).
// Host DRAM: a plan keeps the store's default `numa: auto`, so wherever it has a table other than
// cpu (a device) each rank's host tier is priced on its GPU's NUMA node (model_options,
// store/model/cost_model.hpp: the node's local bandwidth and gather rates, shared by the ranks on
// it); a plan of cpu tables only is priced spread over the nodes. ModelledStep::host_pricing says
// which node's figures priced each rank's host traffic.
// Identical tables (the same rows, dim, optimizer and keys) are placed alike where that fits and the
// step is no slower; where not (the budget holds the better placement for some of them only: the
// greedy search gives it to the first in input order), each one's why says it is a tie and what
// placing them alike would do.
// Deterministic: the same input gives the same plan. Cached tables are capped at their share
// (cache.cap), so each gets exactly its own LRU hit rate, as planned.

#include <optional>
#include <string>
#include <vector>

#include "store/model/cost_model.hpp"
#include "store/model/table_cost.hpp"
#include "store/store_config.hpp"
#include "tune/curves.hpp"
#include "tune/tune_input.hpp"

namespace strata::tune {

/// Budgets and store settings of a plan.
struct PlanOptions {
  double hbm_budget_bytes = 0;   ///< HBM the plan may use (> 0)
  double host_budget_bytes = 0;  ///< host memory the plan may use (> 0)
  CostOptions cost;              ///< batches in flight, NUMA nodes, threads
  int cache_sizes = 24;          ///< cached sizes tried per table (>= 2)
  std::optional<DType> dtype;    ///< every table's rows of this type; none: each table's configured dtype
  bool auto_dtype = false;       ///< rule 5 (plan --dtype auto): bf16 for a table that fits only at half size
};

/// Sets `options`' dtype from plan --dtype's `text`: "auto" (rule 5), or "fp32", "bf16" or "fp16" for
/// every table. Else an error naming the value and the accepted ones.
Status set_plan_dtype(const std::string& text, PlanOptions& options);

/// Several ranks: every table's shards (tune/shard_traces.hpp) and their curves.
struct ShardInputs {
  std::vector<std::vector<TableTrace>> traces;  ///< [table][rank]: shard_traces(input, ranks)
  std::vector<std::vector<HitCurve>> curves;    ///< [table][rank]: table_curve of each trace (make_plan only)
};

/// One table's placement.
struct TablePlan {
  std::string name;
  Placement placement = Placement::kGpu;
  std::int64_t cache_rows = 0;  ///< cached, and hybrid (rows per rank)
  double hit_rate = -1;         ///< cached: LRU hit rate at cache_rows (hybrid: the worst rank's); -1 otherwise
  double belady = -1;           ///< cached: Belady's optimum at cache_rows when computed; -1 otherwise
  TableLoad load;               ///< per step
  TableCost cost;               ///< bytes and memory in this placement
  std::string why;              ///< one sentence
};

/// The modelled step of one uniform placement (every table the same), for comparison.
struct UniformMode {
  std::string mode;   ///< "gpu", "cached", "offload", "cpu" (several ranks: "gpu", "hybrid")
  bool fits = false;  ///< within both budgets
  std::string note;   ///< why it does not fit, or how caches were sized
  double hbm_bytes = 0;
  double host_bytes = 0;
  ModelledStep step;
};

/// A plan.
struct Plan {
  int ranks = 1;                     ///< ranks planned for (> 1: every number below is per rank)
  std::vector<TablePlan> tables;     ///< in input order
  ModelledStep step;                 ///< the plan's modelled step (of one rank)
  double hbm_bytes = 0;              ///< HBM the plan takes (per rank)
  double host_bytes = 0;             ///< host memory the plan takes (per rank)
  double exchange_bytes = 0;         ///< bytes one rank sends in all-to-all exchanges per step (0: one rank)
  std::vector<UniformMode> uniform;  ///< gpu, cached, offload, cpu (several ranks: gpu, hybrid)
  StoreConfig config;                ///< the plan as a store config (Store::open accepts it)
};

/// The smallest memory every table needs: the HBM of all-gpu, and the host memory of every table
/// off the GPU (one rank: the tables' records, HBM 0; several ranks: hybrid with the smallest cache). Cheap (no
/// curves); used to refuse impossible budgets before the long work.
struct Extremes {
  double all_gpu_hbm = 0;  ///< HBM with every table gpu
  double all_host = 0;     ///< host records with every table off the GPU
};

/// The memory extremes of `input`'s tables (their loads from key counts only).
/// Several ranks need `shards` (traces only).
Result<Extremes> memory_extremes(const TuneInput& input, const PlanOptions& options, const ShardInputs& shards = {});

/// Checks that some placement could fit: fails when neither rule 1 nor rule 2 can (every split of
/// the tables between HBM and host, coldest first, exceeds a budget), naming the smallest feasible
/// HBM budget for the given host budget and the smallest host budget for the given HBM budget.
/// The tables are ranked by key occurrences here (distinct rows need the curves). Several ranks:
/// the budgets are per rank, and `shards` gives the shard traces (their curves are not needed).
Status check_budgets(const TuneInput& input, const PlanOptions& options, const ShardInputs& shards = {});

/// Plans `input` with its tables' curves (`curves[t]` for input.tables[t]) on `profile`; several
/// ranks also with `shards` (traces and curves).
Result<Plan> make_plan(const TuneInput& input, const std::vector<HitCurve>& curves, const HardwareProfile& profile,
                       const PlanOptions& options, const ShardInputs& shards = {});

}  // namespace strata::tune
