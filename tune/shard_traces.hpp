#pragma once
// The keys each rank's shard serves when a table is sharded row-wise over several ranks
// (dispatch/sharding_plan.hpp: key k on rank k % N, local row k / N), for the planner's `hybrid`
// caches and per-rank memory.
//
// As strata-bench --ranks N runs an input, rank q trains on steps q, q + N, q + 2N, ...; so one
// step of the world is N consecutive steps of the input (the last may be shorter), and rank r's
// shard serves, in that world step, every key of those steps with k % N == r, as local rows. Its
// inner engine (a cache for `hybrid`) sees them as one batch. A shard trace is that stream: one
// batch per world step, exact for the keys kept. Counts of a sampled input (TuneInput::sample_rate
// R < 1) are the sampled ones over R (estimates, as the sampled curves are).

#include <vector>

#include "tune/tune_input.hpp"

namespace strata::tune {

/// Rank `rank`'s shard of `table` over `ranks` (>= 1) ranks: spec rows the shard's rows (0 when the
/// rank holds none), keys and the check prefixes as local rows, one batch per world step; bags
/// are the keys (the shard serves unpooled bags); key_count, distinct_count and max_distinct per
/// world step (scaled by 1 / sample_rate when sampled).
TableTrace shard_trace(const TableTrace& table, int ranks, int rank, double sample_rate);

/// The most keys one rank serves in one world step of `table` over `ranks` (>= 1) ranks: each
/// source step's distinct keys of the rank's shard, summed over the world step's steps (a key that
/// several sources look up is served once to each), the largest over ranks and world steps (scaled
/// by 1 / sample_rate when sampled).
std::int64_t max_served(const TableTrace& table, int ranks, double sample_rate);

/// Every table's shards over `ranks` ranks: out[t][r] for input.tables[t] and rank r.
std::vector<std::vector<TableTrace>> shard_traces(const TuneInput& input, int ranks);

}  // namespace strata::tune
