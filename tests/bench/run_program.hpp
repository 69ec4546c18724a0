#pragma once
// Runs a built program of bench/ as a user would, for the CLI tests.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace strata::testing {

struct RunOutput {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

/// Runs `command` through the shell with stderr merged into stdout, without the GoogleTest shard of
/// this test program (under the sanitizers, tests/CMakeLists.txt) and its report file: a test
/// program run as the child would otherwise run only its cases of that shard, and overwrite the
/// report.
inline RunOutput run_program(const std::string& command) {
  RunOutput r;
  std::FILE* p =
      ::popen(("unset GTEST_TOTAL_SHARDS GTEST_SHARD_INDEX GTEST_OUTPUT; " + command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

#ifdef STRATA_BENCH_BIN
/// Runs the built strata-bench with `args` (and --no-progress).
inline RunOutput run_bench(const std::string& args) {
  return run_program(std::string(STRATA_BENCH_BIN) + " --no-progress " + args);
}
#endif

/// The whole file ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// A scratch directory for this test process: <gtest TempDir>/<name>_<pid>, made if missing.
inline std::string scratch_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid());
  ::mkdir(d.c_str(), 0755);
  return d;
}

}  // namespace strata::testing
