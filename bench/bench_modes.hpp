#pragma once
// Running strata-bench's modes: one mode's store (or a world of thread ranks, or this process's
// rank under mpirun) driven through the forward phase and the training phase on the same batches,
// and what it measured.

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_options.hpp"
#include "store/store.hpp"
#include "toolkit/batch_source.hpp"

namespace strata::bench {

/// What one run of a mode measured (rank 0's view with several ranks).
struct ModeResult {
  const ModeDescriptor* mode = nullptr;
  int ranks = 1;                  ///< thread ranks (sharded modes); counters and step bytes are rank 0's
  double duplication_factor = 1;  ///< keys / unique keys (per table and batch) of rank 0's timed training batches
  double cache_fraction = 0;
  std::vector<double> forward_s, train_s;
  std::vector<double> submit_s, lookup_s, backward_s;  // phases of the training step
  double keys_per_step = 0, samples_per_step = 0, bytes_per_lookup = 0;
  // Sums over rank 0's timed training batches (drive), and their count.
  double timed_keys = 0, timed_samples = 0, timed_key_bytes = 0;
  double timed_host_gather_bytes = 0, timed_host_optimizer_bytes = 0;  // rows read by CPU kernels
  int timed_batches = 0;
  double host_gather_bytes_per_step = 0, host_optimizer_bytes_per_step = 0;  // rank 0's, as its counters
  double setup_s = 0;
  StoreStats train_stats;           // counters over the timed training steps only
  std::string trainer_device;       // --trainer device: the trainer's device ("" with --trainer host)
  bool trainer_device_own = false;  // opened by the bench (the store has no device: cpu mode)
  std::string device;
  std::size_t device_peak_bytes = 0;
  std::uint64_t rss_start_bytes = 0;  // process RSS when the mode started
  std::uint64_t peak_rss_bytes = 0;   // process peak RSS while the mode ran
  bool peak_rss_per_mode = false;     // whether the peak was reset at the start of the mode
  double host_table_bytes = 0;
  std::int64_t cache_rows = 0;
  double cache_bytes = 0;
};

/// Runs `mode` at `cache_fraction` on `batches` (`label` on its progress bars): opens its store
/// (one, one per thread rank, or this process's rank under mpirun), runs the forward phase and
/// the training phase, and returns rank 0's measurements.
Result<ModeResult> run_mode(const Options& o, const ModeDescriptor& mode, double cache_fraction,
                            const BatchSource& batches, const std::string& label);

/// The distinct rows each slot pool (cache_pools' order) holds among the batches a run submits:
/// drive reads run batches [0, 2 x (warmup + steps)) of rank 0's cursor (the forward phase, then
/// training). A sweep point whose pools hold that many rows can keep every row the run touches, so
/// its misses are first uses only and a larger cache cannot raise its hit rate.
Result<std::vector<std::int64_t>> touched_rows_per_pool(const Options& o, const StoreConfig& config,
                                                        const BatchSource& source);

}  // namespace strata::bench
