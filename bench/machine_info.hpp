#pragma once
// What machine a benchmark ran on: CPU model, cores, memory, NUMA layout, compiler and library
// versions. Recorded in every result file so numbers can be compared across machines.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace strata::bench {

struct MachineInfo {
  std::string cpu_model;                     ///< /proc/cpuinfo "model name"
  int cores = 0;                             ///< hardware threads visible to this process
  std::uint64_t memory_total_bytes = 0;      ///< MemTotal
  std::uint64_t memory_available_bytes = 0;  ///< MemAvailable
  std::string topology;                      ///< Topology::describe() (NUMA nodes, GPUs)
  std::string compiler;                      ///< compiler and version
  std::string versions;                      ///< oneTBB, hwloc versions
};

/// Reads the machine's description (cheap; no benchmarking).
MachineInfo describe_machine();
nlohmann::json to_json(const MachineInfo& m);

}  // namespace strata::bench
