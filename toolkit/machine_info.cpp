#include "toolkit/machine_info.hpp"

#include <hwloc.h>
#include <oneapi/tbb/version.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <thread>

#include "host/topology.hpp"

namespace strata::bench {

namespace {
// A "Key:  value kB" line of a /proc file, in kB (0 when absent).
std::uint64_t proc_kb(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    try {
      return std::stoull(line.substr(key.size() + 1));
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

std::string os_pretty_name() {
  std::ifstream in("/etc/os-release");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("PRETTY_NAME=", 0) != 0) continue;
    std::string v = line.substr(12);
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    return v;
  }
  return "";
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
  m.memory_total_bytes = proc_kb("/proc/meminfo", "MemTotal") * 1024;
  m.memory_available_bytes = proc_kb("/proc/meminfo", "MemAvailable") * 1024;
  if (auto t = Topology::discover()) {
    m.topology = t->describe();
    m.numa_nodes = t->num_nodes();
    for (const GpuInfo& g : t->gpus()) m.gpus.push_back((g.name.empty() ? "GPU" : g.name) + " (" + g.pci_bus_id + ")");
  }
  m.os = os_pretty_name();
  utsname u{};
  if (uname(&u) == 0) m.kernel = std::string(u.sysname) + " " + u.release;
#if defined(__clang__)
  m.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  m.compiler = "gcc " __VERSION__;
#endif
  m.versions = std::string("oneTBB ") + TBB_VERSION_STRING + ", hwloc " + std::to_string(HWLOC_API_VERSION >> 16) +
               "." + std::to_string((HWLOC_API_VERSION >> 8) & 0xff);
  return m;
}

nlohmann::json to_json(const MachineInfo& m) {
  return {{"cpu_model", m.cpu_model},
          {"cores", m.cores},
          {"memory_total_bytes", m.memory_total_bytes},
          {"memory_available_bytes", m.memory_available_bytes},
          {"numa_nodes", m.numa_nodes},
          {"gpus", m.gpus},
          {"topology", m.topology},
          {"os", m.os},
          {"kernel", m.kernel},
          {"compiler", m.compiler},
          {"versions", m.versions}};
}

std::uint64_t process_rss_bytes() { return proc_kb("/proc/self/status", "VmRSS") * 1024; }

std::uint64_t process_peak_rss_bytes() { return proc_kb("/proc/self/status", "VmHWM") * 1024; }

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

double usable_memory_bytes(const MachineInfo& m) {
  return kUsableMemoryFraction * static_cast<double>(m.memory_available_bytes);
}

std::string usable_memory_note() {
  return "MemAvailable in /proc/meminfo; at most " + std::to_string(std::lround(kUsableMemoryFraction * 100)) +
         "% of it is used";
}

int hardware_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

Status check_thread_count(const std::string& flag, std::int64_t threads, int min) {
  const int hw = hardware_threads();
  const std::int64_t max = std::int64_t{kThreadsPerHardwareThread} * hw;
  const std::string expected = " (expected " + std::to_string(min) + ".." + std::to_string(max) + ")";
  if (threads < min)
    return Status::invalid_argument(flag + " " + std::to_string(threads) + " must be >= " + std::to_string(min) +
                                    expected);
  if (threads > max)
    return Status::invalid_argument(flag + " " + std::to_string(threads) + " is more than " +
                                    std::to_string(kThreadsPerHardwareThread) + " x the " + std::to_string(hw) +
                                    " hardware threads of this machine" + expected);
  return Status::ok();
}

}  // namespace strata::bench
