#pragma once
// Cost model: a hardware profile (bandwidths, latencies and capacities, each with its source) and
// the bytes one training step moves over each link give a modelled step time, the bottleneck
// link and a one-line explanation ("PCIe H2D-bound: 3.1 GB per step at 55 GB/s ...").
//
// Units: bandwidths in GB/s (1e9 bytes per second), latencies in microseconds, capacities in GB
// (1e9 bytes), byte counts in bytes.
//
// Overlap assumption. The links are independent engines (HBM, the PCIe copy engine of each
// direction, host DRAM, the all-to-all fabric) and a pipelined step keeps them busy at the same
// time: the prefetcher's H2D copy of batch i+k, the gather kernel of batch i and the write-back of
// dirty rows overlap. So the modelled step time is
//
//   step_s   = max over links of link_s  +  launches * kernel_launch_us
//   serial_s = sum over links of link_s  +  launches * kernel_launch_us   (no overlap at all)
//
// where link_s = bytes / bandwidth (+ the PCIe latency once per direction that moves any bytes).
// Kernel launches are serial work on the host that the model does not hide. The real step lies
// between step_s (perfect pipelining) and serial_s (none); both are reported.
//
// Host DRAM, in one of two ways (ModelOptions::host_on_gpu_node; model_options picks it from a
// store's config):
//   spread      (numa interleave or bind, or a store without a device) host_read + host_write
//               bytes are assumed spread evenly over the NUMA nodes and NUMA-local, except
//               `host_remote` bytes (a part of them) that cross the socket interconnect; local bytes
//               run at the sum of the nodes' local bandwidth, remote bytes at the sum of their remote
//               bandwidth, both divided by ModelOptions::ranks_per_host (ranks sharing the host's
//               memory).
//   GPU's node  (numa auto with a device: store/detail/numa_home.hpp puts a rank's host tables and
//               the threads of its host kernels on the NUMA node of its GPU) the ranks_per_host ranks
//               of a host run on GPUs 0 .. ranks_per_host - 1, rank r's GPU on node
//               gpu_numa_node(profile, r). Each rank's host bytes are all local to that node (no
//               host_remote part), at the node's local bandwidth and gather rates divided by the
//               ranks whose GPUs share the node. Every rank moves the bytes given (the model prices
//               one rank), so the host DRAM time is that of the node whose ranks are slowest
//               (ModelledStep::host_node; the lowest such node on a tie).
//
// Random-row gathers. StepBytes::host_gathers lists the part of host_read + host_write that is
// random rows (a gather of `rows` rows of `row_bytes` bytes each; row writes, e.g. an optimizer's
// or a cache's write-back, are listed too and priced as gathers of their size). When the profile
// has gather rates (every NUMA node lists NumaNodeProfile::gather, measured by `strata-tune
// calibrate`), such a gather costs rows / rate(row_bytes) seconds instead of bytes / sequential bandwidth: the rate is
// the sum over the nodes of their local rate (remote for the host_remote share, as for bytes), divided by
// ranks_per_host (on the GPU's node: that node's local rate over the ranks sharing it), and rate(B) is interpolated
// between the measured row sizes (linearly in seconds per row), the smallest size's rate below it, and bandwidth-bound
// above the largest (rate(B) = rate(B_max) * B_max / B). A profile without gather rates prices gathers as bytes at the
// sequential bandwidth, as before, and ModelledStep::gather_model says so.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "dispatch/shard_layout.hpp"
#include "store/store_config.hpp"

namespace strata {

/// One number of a hardware profile and where it comes from.
struct ProfileNumber {
  double value = 0.0;  ///< the number, in the unit its field names
  std::string source;  ///< vendor spec sheet (name, URL), published measurement, or "estimate: why"
};

/// Random-row gather rate of one NUMA node's memory for rows of one size.
struct GatherRate {
  std::int64_t row_bytes = 0;       ///< bytes read per row (> 0)
  ProfileNumber local_rows_per_s;   ///< rows per second that threads on this node gather from this node's memory
  ProfileNumber remote_rows_per_s;  ///< rows per second that threads on another node gather from this node's memory
};

/// Host DRAM bandwidth of one NUMA node.
struct NumaNodeProfile {
  ProfileNumber local_gbs;   ///< sustained read bandwidth of threads on this node from this node's memory
  ProfileNumber remote_gbs;  ///< sustained read bandwidth of threads on another node from this node's memory
  /// Optional: random-row gather rates by row size, row_bytes strictly increasing (empty: not
  /// measured; either every node of a profile has them, for the same row sizes, or none).
  std::vector<GatherRate> gather;
};

/// The NUMA node each GPU of a machine hangs off, and where that comes from.
struct GpuNumaNodes {
  std::vector<int> value;  ///< value[g]: the node (an index into numa_nodes) of GPU g; empty: not recorded
  std::string source;      ///< hwloc's locality (strata-tune calibrate), a vendor's manual, or "estimate: why"
};

/// Bandwidths, latencies and capacities of one machine, per GPU where a link is per GPU. Every
/// number carries its source.
struct HardwareProfile {
  std::string name;                         ///< short id ("h200-pcie5"), used by --profile
  std::string description;                  ///< one or two sentences: which machine, and what "per GPU" means here
  ProfileNumber gpus;                       ///< GPUs in the machine (>= 1, integral)
  ProfileNumber hbm_gbs;                    ///< sustained HBM bandwidth of one GPU (reads and writes share it)
  ProfileNumber pcie_h2d_gbs;               ///< sustained host-to-device copy bandwidth of one GPU (pinned memory)
  ProfileNumber pcie_d2h_gbs;               ///< sustained device-to-host copy bandwidth of one GPU (pinned memory)
  ProfileNumber pcie_latency_us;            ///< fixed cost of one PCIe copy (API call to completion), each direction
  std::vector<NumaNodeProfile> numa_nodes;  ///< host DRAM per NUMA node (at least one)
  ProfileNumber all_to_all_gbs;    ///< sustained all-to-all bandwidth per GPU (NVLink/NVSwitch, PCIe or network)
  ProfileNumber kernel_launch_us;  ///< host cost of one kernel launch
  ProfileNumber hbm_capacity_gb;   ///< HBM of one GPU
  ProfileNumber host_memory_gb;    ///< host memory of the whole machine
  /// Optional: the node of each GPU (one entry per GPU). Not recorded: GPUs spread over the nodes in
  /// order (gpu_numa_node).
  GpuNumaNodes gpu_numa_nodes;
  /// Optional: the L2 cache of one core in bytes (sizes the CPU optimizer's per-thread scratch,
  /// host_table_memory). Not recorded (value 0): the L2 of the machine that runs the model.
  ProfileNumber l2_cache_bytes;
};

/// Parses a profile from JSON text. Format: an object with "name" and "description" (strings),
/// "numa_nodes" (a non-empty array of {"local_gbs": N, "remote_gbs": N, optional "gather": [
/// {"row_bytes": integer, "local_rows_per_s": N, "remote_rows_per_s": N}, ...]}) and one number object
/// {"value": number, "source": "non-empty string"} for each other HardwareProfile field, named as
/// the field, but "gpu_numa_nodes" ({"value": [integer node of each GPU], "source": string}). Every
/// field but gpu_numa_nodes and l2_cache_bytes is required; an unknown field at any level is an error, and so is a key
/// given twice in one object ("profile 'p.json': key 'numa_nodes[0].local_gbs.value' is given
/// twice ..."). `origin` (a file name or "<string>") is named in every message, with the field
/// path and what was expected. The result is validated.
Result<HardwareProfile> parse_hardware_profile(const std::string& json_text, const std::string& origin);

/// Reads and parses the profile file at `path` (parse_hardware_profile with origin = path).
/// Errors: not_found / io_error for the file, invalid_argument for its content.
Result<HardwareProfile> load_hardware_profile(const std::string& path);

/// Checks a profile: name non-empty; every value finite; bandwidths, rates and capacities > 0;
/// latencies >= 0; gpus an integer >= 1; at least one NUMA node; gather row sizes > 0, strictly
/// increasing and the same on every node (or no node has any); gpu_numa_nodes empty or one node in
/// [0, numa_nodes) per GPU; l2_cache_bytes 0 (not recorded) or a positive integer; every source non-empty. The message
/// names the profile, the field and the value.
Status validate(const HardwareProfile& profile);

/// The NUMA node of GPU `gpu` (in [0, gpus)) of `profile` (validated): gpu_numa_nodes[gpu] where the
/// profile records them, else gpu * nodes / gpus (GPUs spread over the nodes in order).
int gpu_numa_node(const HardwareProfile& profile, int gpu);

/// The profile as pretty-printed JSON in the format parse_hardware_profile reads.
std::string hardware_profile_to_json(const HardwareProfile& profile);

/// A random-row gather from host memory: `rows` rows of `row_bytes` bytes each.
struct RowGather {
  double rows = 0;       ///< rows read
  double row_bytes = 0;  ///< bytes of each row (> 0)
};

/// Whether `profile` has gather rates (every NUMA node lists some; validate(profile) OK).
bool has_gather_rates(const HardwareProfile& profile) noexcept;

/// Rows per second the whole host gathers for rows of `row_bytes` bytes (the sum of the nodes'
/// local rates, or of their remote rates when `remote`), interpolated as in the header comment.
/// 0 when the profile has no gather rates.
double host_gather_rows_per_s(const HardwareProfile& profile, double row_bytes, bool remote = false);
/// The same for the memory of one node (`node` in [0, numa_nodes)).
double node_gather_rows_per_s(const HardwareProfile& profile, int node, double row_bytes, bool remote = false);

/// Bytes one training step moves over each link (of one rank), and its kernel launches.
struct StepBytes {
  double hbm_read = 0;     ///< bytes read from HBM
  double hbm_write = 0;    ///< bytes written to HBM
  double h2d = 0;          ///< bytes copied host -> device over PCIe
  double d2h = 0;          ///< bytes copied device -> host over PCIe
  double host_read = 0;    ///< bytes read from host DRAM
  double host_write = 0;   ///< bytes written to host DRAM
  double host_remote = 0;  ///< part of host_read + host_write that crosses NUMA nodes (<= their sum)
  double all_to_all = 0;   ///< bytes this rank sends in all-to-all exchanges
  double launches = 0;     ///< kernel launches
  /// Part of host_read (host_write) that CPU kernels move: the CPU gather of `cpu` tables and of
  /// offload tables pooled on the CPU, and the CPU optimizer of `cpu` and `offload` tables. The
  /// device layer's counters do not see these bytes (no device moves them); the rest of host_read
  /// and host_write is what its counters count.
  double host_cpu_read = 0;
  double host_cpu_write = 0;
  /// Random rows read or written that are part of host_read + host_write (their bytes, rows x
  /// row_bytes, are counted there too); priced by the profile's gather rates where it has them
  /// (header comment).
  std::vector<RowGather> host_gathers;
};

/// The links of the model.
enum class Link : std::uint8_t {
  kHbm = 0,       ///< GPU memory
  kPcieH2d = 1,   ///< PCIe host -> device
  kPcieD2h = 2,   ///< PCIe device -> host
  kHostDram = 3,  ///< host memory (all NUMA nodes)
  kAllToAll = 4,  ///< GPU-to-GPU or rank-to-rank exchange
};
/// Number of Link values.
inline constexpr int kNumLinks = 5;

/// Stable name of a link for JSON and reports: "hbm", "pcie_h2d", "pcie_d2h", "host_dram",
/// "all_to_all".
const char* link_name(Link link) noexcept;
/// Human name of a link for explanations: "HBM", "PCIe H2D", "PCIe D2H", "host DRAM", "all-to-all".
const char* link_label(Link link) noexcept;

/// Time on one link.
struct LinkTime {
  double bytes = 0;    ///< bytes over the link per step
  double gbs = 0;      ///< bandwidth used (effective bandwidth for host DRAM; 0 when unused)
  double seconds = 0;  ///< bytes / bandwidth, plus the fixed latency where one applies
};

/// A modelled step.
struct ModelledStep {
  std::array<LinkTime, kNumLinks> links{};  ///< indexed by static_cast<int>(Link)
  double launch_s = 0;                      ///< launches * kernel_launch_us
  double step_s = 0;                        ///< max over links + launch_s (the overlap assumption above)
  double serial_s = 0;                      ///< sum over links + launch_s (no overlap)
  std::string bottleneck;   ///< link_name() of the slowest link, "launch" when launches take longer than every link,
                            ///< "none" when nothing moves
  std::string explanation;  ///< one line, e.g. "PCIe H2D-bound: 3.1 GB per step at 55 GB/s = 56.4 ms of a 60.1 ms step"
  /// How host_gathers were priced: "" when there were none, else "gather rates" (the profile's
  /// measured random-row rates) or "sequential bandwidth" (the profile has none: the old model,
  /// which overstates the speed of random gathers).
  std::string gather_model;
  /// The NUMA node whose figures priced host DRAM (ModelOptions::host_on_gpu_node: the slowest
  /// ranks' GPU's node), or -1 (spread over every node).
  int host_node = -1;
  /// How host DRAM was priced, one line: spread over the nodes, or each rank's GPU's node with the
  /// ranks on each node and which node's figures priced the step. (On a profile of several nodes,
  /// a host DRAM-bound explanation names the node too.)
  std::string host_pricing;
};

/// Options of model_step.
struct ModelOptions {
  int ranks_per_host = 1;  ///< ranks that share the host's DRAM bandwidth (>= 1; 1 = this rank has all of it)
  /// Each rank's host DRAM on its GPU's NUMA node (numa auto with a device), as the header comment
  /// says; false: spread over every node.
  bool host_on_gpu_node = false;
};

/// The options of modelling one rank of a store of `ranks` ranks (one per GPU, hosts of `profile`)
/// placing its host tier by `numa`: ranks_per_host min(ranks, gpus); host_on_gpu_node where the store
/// has a device (a table other than `cpu`) and `numa` is auto (store/detail/numa_home.hpp).
ModelOptions model_options(const HardwareProfile& profile, int ranks, NumaPolicy numa, bool store_has_device);

/// Host memory a store maps for its tables' records (weights and optimizer state), as it allocates
/// them: records padded to record_words, tables of 1 MiB and more in arenas of their own rounded up
/// to 2 MiB, smaller tables packed into shared 2 MiB arenas (one set per engine and NUMA node; see
/// host/host_table.hpp). mapped_bytes is exact: it equals the growth of
/// NumaArena::live_mapped_bytes() when the store opens. scratch_bytes bounds the per-table scratch
/// the CPU optimizer of `cpu` and `offload` tables keeps once trained (find_repeats' direct-mapped
/// arrays: per thread, one 8-byte entry per row up to the key range width, per table and for each
/// engine's shared pass over its small tables). Slot pools, staging and
/// the other structures of the store are not included.
struct HostTableMemory {
  double record_bytes = 0;   ///< rows x padded record (what the tables hold)
  double mapped_bytes = 0;   ///< bytes mapped, pre-faulted and (device modes) pinned: the resident cost
  double scratch_bytes = 0;  ///< at most this much CPU optimizer scratch once every table was trained
  double tables = 0;         ///< host tables (shards count one each)
  double packed_tables = 0;  ///< of which packed into shared arenas
};

/// The host table memory of one rank of a store opened with `config` (validate(config) OK) on a
/// machine of `numa_nodes` nodes (0: this machine's, as Store::open finds them; config.fake_numa_nodes
/// wins when > 0). `world` = 0: Store::open
/// without a communicator; `world` >= 1: rank `rank` of Store::open(config, communicator) over a
/// world of that size (gpu and hybrid tables sharded by their plan; gpu shards hold no host rows).
/// `l2_bytes` sizes the CPU optimizer's scratch (0: this machine's L2; a profile's l2_cache_bytes
/// when the planned machine is another). Errors: a sharding plan that does not resolve for the world
/// (dispatch::ShardLayout::make).
Result<HostTableMemory> host_table_memory(const StoreConfig& config, int numa_nodes, int world = 0, int rank = 0,
                                          std::uint64_t l2_bytes = 0);

/// Staging the engines upload H2D with each batch (store/engines/, gpu/staging.hpp: every array
/// rounded up to 64 bytes), for a byte-exact cost model.
struct EngineStaging {
  /// `gpu` and `cached` tables, per feature of `bags` bags, `keys` keys, `weights` per-key weights
  /// (0 or keys) and `unique` distinct rows: offsets, slots, weights, unique slots and offsets,
  /// positions, bag of each position and the hot rows (store/engines/device_features.hpp).
  static double gpu_feature(std::int64_t bags, std::int64_t keys, std::int64_t weights, std::int64_t unique);
  /// Sharded `gpu` and `hybrid` tables, per feature of a rank's batch: the metadata the sharded
  /// engine reserves for pooling the returned rows and summing the gradients per unique key
  /// (store/engines/sharded_engine.hpp), in its device scratch and again in its pinned staging.
  static double sharded_feature(std::int64_t bags, std::int64_t keys, std::int64_t weights, std::int64_t unique);
  /// `offload` tables gathered on the device, per feature: offsets, keys and weights.
  static double offload_feature(std::int64_t bags, std::int64_t keys, std::int64_t weights);
  /// A list of `n` 8-byte entries (slots of a slot pool's fills or write-backs, host row
  /// addresses of an offload dim group's distinct rows or of zero-copy transfers).
  static double list(std::int64_t n);
  /// `cached` and `hybrid` tables: the rows a flush's staging holds for a slot pool of `slots`
  /// records of `stride` floats (one flush chunk: the whole pool, or as many rows as 64 MiB of
  /// records hold; store/engines/cached_engine.hpp).
  static std::int64_t flush_rows(std::int64_t slots, std::int64_t stride);
  /// `cached` and `hybrid` tables with cache.transfer auto: the rows that the measurement of staged
  /// against zero-copy transfers moves through a slot pool of `slots` slots when the store opens
  /// (store/engines/cache_transfers.hpp).
  static std::int64_t transfer_probe_rows(std::int64_t slots);
};

/// Models one step of `bytes` on `profile` (see the header comment). Requires validate(profile)
/// OK and non-negative finite byte counts (negative counts are treated as 0). Pure function.
ModelledStep model_step(const HardwareProfile& profile, const StepBytes& bytes, const ModelOptions& options = {});

}  // namespace strata
