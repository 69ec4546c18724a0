#include "bench/machine_info.hpp"

#include <hwloc.h>
#include <oneapi/tbb/version.h>

#include <fstream>
#include <thread>

#include "host/topology.hpp"

namespace strata::bench {

namespace {
std::uint64_t meminfo_kb(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string k;
  std::uint64_t v = 0;
  std::string unit;
  while (in >> k >> v >> unit)
    if (k == key + ":") return v;
  return 0;
}
}  // namespace

MachineInfo describe_machine() {
  MachineInfo m;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      m.cpu_model = line.substr(line.find(':') + 2);
      break;
    }
  }
  m.cores = static_cast<int>(std::thread::hardware_concurrency());
  m.memory_total_bytes = meminfo_kb("MemTotal") * 1024;
  m.memory_available_bytes = meminfo_kb("MemAvailable") * 1024;
  if (auto t = Topology::discover()) m.topology = t->describe();
#if defined(__clang__)
  m.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  m.compiler = "gcc " __VERSION__;
#endif
  m.versions = std::string("oneTBB ") + TBB_VERSION_STRING + ", hwloc " + std::to_string(HWLOC_API_VERSION >> 16) + "." +
               std::to_string((HWLOC_API_VERSION >> 8) & 0xff);
  return m;
}

nlohmann::json to_json(const MachineInfo& m) {
  return {{"cpu_model", m.cpu_model},
          {"cores", m.cores},
          {"memory_total_bytes", m.memory_total_bytes},
          {"memory_available_bytes", m.memory_available_bytes},
          {"topology", m.topology},
          {"compiler", m.compiler},
          {"versions", m.versions},
          {"gpu", "none visible to this build"}};
}

}  // namespace strata::bench
