#pragma once
// strata-tune calibrate: measures this machine's host memory and writes a hardware profile in the
// format --profile reads (store/model/cost_model.hpp), every number with its source.
//
// Measured here, per NUMA node (threads bound to the node's cores; memory bound to the node for
// "local", to the next node for "remote" where there are several nodes; hwloc):
//   - sequential read bandwidth (toolkit/workload.hpp's measure_read_bandwidth_gbs),
//   - random-row gather rate for each row size (toolkit/gather_probe.hpp's measure_gather_limit:
//     uniformly random rows of a table far larger than the caches, bags of kCalibrateBagKeys keys),
//   - the host memory (MemTotal).
// Taken from a named profile, each with "from profile 'NAME' (PATH): <its source>": the GPU count,
// HBM bandwidth and capacity, PCIe bandwidths and latency, all-to-all bandwidth and kernel launch
// cost (calibrate does not measure a GPU yet). With one NUMA node there is no remote memory: the
// remote numbers equal the local ones and say so. The node of each GPU (gpu_numa_nodes) comes from
// hwloc when it lists as many GPUs as the named profile has, each on a known node; else the profile
// leaves it out (the cost model then assumes the GPUs spread over the nodes in order).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "host/topology.hpp"
#include "store/model/cost_model.hpp"
#include "tune/tune_input.hpp"

namespace strata::tune {

/// Keys per bag of the gather passes.
inline constexpr int kCalibrateBagKeys = 16;

/// Largest gather row size (4 MiB).
inline constexpr std::int64_t kMaxCalibrateRowBytes = std::int64_t{4} << 20;

/// What calibrate measures and records.
struct CalibrateOptions {
  HardwareProfile base;   ///< the profile the GPU numbers come from (validated)
  std::string base_path;  ///< where `base` was read, for the sources
  std::string name;       ///< the new profile's name (non-empty)
  std::vector<std::int64_t> row_bytes{
      64, 128, 256, 512, 1024};  ///< gather row sizes: multiples of 4, ascending, at most kMaxCalibrateRowBytes
  std::size_t table_bytes = std::size_t{512} << 20;  ///< bytes of each probe buffer and table (>= 1 MiB)
  std::int64_t lookups = std::int64_t{1} << 20;      ///< rows gathered per timed pass (>= kCalibrateBagKeys)
  int threads = 0;      ///< threads per node, in [0, 4 x the hardware threads] (0: the node's cores)
  std::string command;  ///< the command line, recorded in the sources
  std::string date;     ///< the date (UTC, YYYY-MM-DD), recorded in the sources
};

/// Checks the options (the message names the field and the value) without measuring anything.
Status validate(const CalibrateOptions& options);

/// The most bytes calibrate holds at once (valid options): a probe table, and beside it in the
/// gather passes two batches of `lookups` keys and their offsets (8 bytes each) and the pooled
/// output of one batch of the largest rows. A double, so that counts no machine holds still have a
/// value.
double calibrate_peak_bytes(const CalibrateOptions& options);

/// Checks, before anything is allocated, that calibrate_peak_bytes and the threads (4 per hardware
/// thread at most, toolkit/machine_info.hpp) fit this machine. Errors (kInvalidArgument) name
/// --probe-mib and --lookups, or --threads, the value and the limit.
Status check_fits_machine(const CalibrateOptions& options);

/// The node of each of `gpus` GPUs as `topo` (hwloc) places them, in PCI bus id order (the order
/// CUDA numbers identical GPUs in), `source` recorded as their source; empty when `topo` lists
/// another number of GPUs or does not know one's node.
GpuNumaNodes gpu_numa_nodes_of(const Topology& topo, int gpus, const std::string& source);

/// Measures and returns the profile (validated). Blocks for several seconds per node and row
/// size; `progress` hears each step. Errors: invalid options or options that do not fit the
/// machine (check_fits_machine), a probe that cannot allocate.
Result<HardwareProfile> calibrate(const CalibrateOptions& options, const ProgressFn& progress = {});

}  // namespace strata::tune
