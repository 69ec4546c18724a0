// strata-tune calibrate: measure, then write the profile (or print it).

#include <ctime>
#include <iostream>

#include "toolkit/cli_flags.hpp"
#include "toolkit/profiles.hpp"
#include "tune/calibrate.hpp"
#include "tune/command_util.hpp"
#include "tune/commands.hpp"

namespace strata::tune {

int run_calibrate(const CalibrateArgs& a) {
  CalibrateOptions o;
  o.base_path = bench::profile_path(a.from);
  auto base = load_profile_file(o.base_path);
  if (!base) return fail("--from " + a.from + ": " + base.status().message());
  o.base = std::move(base).value();
  o.name = a.name.empty() ? "calibrated-" + o.base.name : a.name;
  auto row_bytes = bench::parse_integer_list(a.row_bytes, 1, kMaxCalibrateRowBytes);
  if (!row_bytes) return fail("--row-bytes " + row_bytes.status().message());
  o.row_bytes = std::move(row_bytes).value();
  o.table_bytes = static_cast<std::size_t>(a.probe_mib < 0 ? 0 : a.probe_mib) << 20;
  o.lookups = a.lookups;
  o.threads = a.threads;
  o.command = a.command;
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(date, sizeof date, "%Y-%m-%d", &utc);
  o.date = date;
  if (Status s = validate(o); !s.is_ok()) return fail(s.message());
  if (Status s = check_fits_machine(o); !s.is_ok()) return fail(s.message());
  if (!a.out.empty())
    if (Status s = check_output(a.out, "--out"); !s.is_ok()) return fail(s.message());
  auto profile = calibrate(o, progress_printer(true));
  if (!profile) return fail(profile.status().message(), 1);
  // Where each number came from, on stderr (the profile itself goes to --out or stdout).
  const auto origin = [](const ProfileNumber& n) {
    return n.source.rfind("measured here", 0) == 0 ? std::string("measured here")
                                                   : n.source.substr(0, n.source.find(':'));
  };
  std::cerr << "strata-tune calibrate: gpus, hbm_gbs, pcie_h2d_gbs, pcie_d2h_gbs, pcie_latency_us, all_to_all_gbs, "
               "kernel_launch_us, hbm_capacity_gb: "
            << origin(profile->hbm_gbs)
            << " (no GPU is measured yet); host_memory_gb: " << origin(profile->host_memory_gb) << "\n";
  for (std::size_t i = 0; i < profile->numa_nodes.size(); ++i) {
    const NumaNodeProfile& n = profile->numa_nodes[i];
    std::cerr << "  numa node " << i << ": sequential read " << n.local_gbs.value << " GB/s local, "
              << n.remote_gbs.value << " GB/s remote (" << origin(n.remote_gbs) << "); gather rows/s local:";
    for (const GatherRate& g : n.gather) std::cerr << " " << g.row_bytes << " B " << g.local_rows_per_s.value;
    std::cerr << " (measured here)\n";
  }
  std::cerr << "  gpu_numa_nodes: "
            << (profile->gpu_numa_nodes.value.empty()
                    ? "not recorded (hwloc lists another number of GPUs than the profile's, or not their nodes: the "
                      "cost model assumes them spread over the nodes in order)"
                    : "measured here (hwloc)")
            << "\n";
  const std::string json = hardware_profile_to_json(*profile) + "\n";
  if (a.out.empty()) {
    std::cout << json;
    return 0;
  }
  if (Status s = write_output(a.out, json); !s.is_ok()) return fail(s.message(), 1);
  std::cerr << "strata-tune: wrote " << a.out << "\n";
  return 0;
}

}  // namespace strata::tune
