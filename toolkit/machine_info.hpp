#pragma once
// What machine a benchmark ran on: CPU model, cores, memory, NUMA layout, GPUs, OS, compiler and
// library versions. Recorded in every result file so numbers can be compared across machines.
// Also the process's resident memory (current and peak), for per-mode memory reports.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.hpp"

namespace strata::bench {

/// The share of MemAvailable a bench program plans to use at most (strata-bench's memory guard,
/// strata-tune's counts): the rest is left to the OS and the other processes.
inline constexpr double kUsableMemoryFraction = 0.9;

/// A --threads of the bench programs may be at most this many times the machine's hardware threads.
inline constexpr int kThreadsPerHardwareThread = 4;

struct MachineInfo {
  std::string cpu_model;                     ///< /proc/cpuinfo "model name"
  int cores = 0;                             ///< hardware threads visible to this process
  std::uint64_t memory_total_bytes = 0;      ///< MemTotal
  std::uint64_t memory_available_bytes = 0;  ///< MemAvailable
  int numa_nodes = 0;                        ///< NUMA nodes hwloc sees (0 when hwloc failed)
  std::vector<std::string> gpus;             ///< PCI GPUs hwloc sees ("name (bus id)"); empty: none
  std::string topology;                      ///< Topology::describe() (NUMA nodes, GPUs)
  std::string os;                            ///< /etc/os-release PRETTY_NAME
  std::string kernel;                        ///< uname -sr
  std::string compiler;                      ///< compiler and version
  std::string versions;                      ///< oneTBB, hwloc versions
};

/// Reads the machine's description (cheap; no benchmarking).
MachineInfo describe_machine();
/// Bytes a bench program may plan to use: kUsableMemoryFraction x memory_available_bytes (0 when
/// /proc/meminfo gave no MemAvailable: unknown, nothing can be checked).
double usable_memory_bytes(const MachineInfo& m);

/// Where usable_memory_bytes comes from, for messages: "MemAvailable in /proc/meminfo; at most 90%
/// of it is used".
std::string usable_memory_note();

/// Hardware threads of this machine (std::thread::hardware_concurrency, at least 1).
int hardware_threads();

/// Checks a thread count given as `flag`: in [min, kThreadsPerHardwareThread x hardware_threads()]
/// (`min` 0 or 1). Errors (kInvalidArgument): "--threads N must be >= MIN (expected MIN..MAX)", "--threads
/// N is more than 4 x the H hardware threads of this machine (expected MIN..MAX)".
Status check_thread_count(const std::string& flag, std::int64_t threads, int min);

/// The description as a JSON object (keys as the field names; "gpus" an array of strings).
nlohmann::json to_json(const MachineInfo& m);

/// Resident set size of this process now (VmRSS), in bytes; 0 when /proc is unreadable.
std::uint64_t process_rss_bytes();
/// Peak resident set size of this process (VmHWM) since it started or since the last successful
/// reset_peak_rss(), in bytes; 0 when /proc is unreadable.
std::uint64_t process_peak_rss_bytes();
/// Resets the peak (VmHWM) to the current RSS by writing "5" to /proc/self/clear_refs (Linux >=
/// 4.0). Returns false when that is not possible; the peak then covers the whole process.
bool reset_peak_rss();

}  // namespace strata::bench
