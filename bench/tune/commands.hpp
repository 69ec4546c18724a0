#pragma once
// The subcommands of strata-tune, as functions of their parsed arguments (the main program only
// parses the command line). Each returns the process exit code: 0 on success, 2 for bad input (one
// line on stderr, before any long work where the input allows), 1 when the work itself fails.

#include <cstdint>
#include <string>
#include <vector>

namespace strata::tune {

/// Arguments of `strata-tune calibrate`.
struct CalibrateArgs {
  std::string out;                  ///< profile file to write; empty: stdout
  std::string from = "h200-pcie5";  ///< profile (name in bench/profiles or a file) giving the GPU numbers
  std::string name;                 ///< the new profile's name; empty: "calibrated-<from's name>"
  std::vector<std::int64_t> row_bytes{64, 128, 256, 512, 1024};
  int probe_mib = 512;
  std::int64_t lookups = std::int64_t{1} << 20;
  int threads = 0;
  std::string command;  ///< the command line as typed, for the sources
};

/// Arguments of `strata-tune plan`.
struct PlanArgs {
  std::string workload;  ///< workload JSON file, or inline JSON starting with '{'
  std::string trace;     ///< STRTRACE file (exactly one of workload and trace)
  std::string profile = "h200-pcie5";
  std::string hbm_budget;   ///< empty: the profile's HBM capacity
  std::string host_budget;  ///< empty: the profile's host memory
  std::int64_t steps = 0;   ///< workload: steps (0: twice its distinct batches)
  int dim = 64;             ///< trace: dim of every table
  std::string optimizer = "sgd";
  int max_in_flight = 8;
  int threads = 0;
  int points = 16;        ///< curve points per table
  int belady_points = 4;  ///< curve points per table with Belady's optimum (0: none)
  std::string out;        ///< plan.json
  std::string html;       ///< report.html
  bool progress = true;   ///< progress lines on stderr when it is a terminal
};

/// Resolves --profile/--from: an existing file as is, else bench/profiles/NAME.json.
std::string profile_path(const std::string& name_or_path);

int run_calibrate(const CalibrateArgs& args);
int run_plan(const PlanArgs& args);

}  // namespace strata::tune
