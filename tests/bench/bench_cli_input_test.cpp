// Runs the built strata-bench (STRATA_BENCH_BIN) on hostile or mistaken input (issue 16): deeply
// nested or huge JSON, devices instead of files, counts far beyond the machine, out-of-range
// numbers, unwritable or failing output files. Each must be refused before any long work with a
// message on stderr naming the flag and the value, and exit code 2 for a usage error; a failed
// write must leave no partial file under the final name. Cases that used to eat all memory run
// under `ulimit -v`, so that they fail quickly instead of hanging the machine if they regress.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "tests/bench/run_program.hpp"

namespace {

using nlohmann::json;
using strata::testing::read_file;
using strata::testing::RunOutput;

const std::string kBin = STRATA_BENCH_BIN;

// A small run that would otherwise succeed in about a second.
const std::string kSmall =
    " --tables a=300x4 --batch 8 --pooling 1 --read-probe-mib 1 --modes cpu --backend emu --no-progress";

// Virtual memory limit (KiB) for cases that used to allocate without bound.
const std::string kMemoryLimit = "ulimit -v 4000000; ";

RunOutput run_bench(const std::string& args, const std::string& shell_prefix = "") {
  return strata::testing::run_program(shell_prefix + kBin + " --no-progress " + args);
}

// Runs strata-bench with only its stderr captured (stdout discarded).
RunOutput run_bench_stderr(const std::string& args) {
  return strata::testing::run_program("{ " + kBin + " " + args + " 2>&1 1>/dev/null; }");
}

std::string temp_dir() {
  static const std::string dir = strata::testing::scratch_dir("strata_bench_input");
  return dir;
}

std::string write_temp(const std::string& name, const std::string& contents) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string nested(const std::string& open, const std::string& close, int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

int hardware_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// What a refused run must look like: exit 2 (not a signal), the message, nothing long started.
void expect_refused(const RunOutput& r, const std::string& message) {
  EXPECT_EQ(r.exit_code, 2) << r.output.substr(0, 2000);
  EXPECT_NE(r.output.find(message), std::string::npos) << "expected '" << message << "' in:\n"
                                                       << r.output.substr(0, 2000);
  EXPECT_EQ(r.output.find("measuring sequential read bandwidth"), std::string::npos) << r.output.substr(0, 2000);
}

// ---- one flag or file, refused before anything runs ----

struct Refused {
  const char* name;
  std::string args;
  std::string message;        // a part of the expected message
  std::string prefix = "";    // shell commands before the program (a memory limit)
  std::string workload = "";  // non-empty: written to a file passed as --workload
  std::string profile = "";   // non-empty: written to a file passed as --profile
};

void PrintTo(const Refused& c, std::ostream* os) { *os << c.name; }

class BenchRefuses : public ::testing::TestWithParam<Refused> {};

TEST_P(BenchRefuses, WithExitTwoAndAClearMessage) {
  const Refused& c = GetParam();
  std::string args = kSmall + " --steps 1 --warmup 0 " + c.args;  // the case's flags last: they win
  if (!c.workload.empty()) args += " --workload " + write_temp(std::string(c.name) + ".json", c.workload);
  if (!c.profile.empty()) args += " --profile " + write_temp(std::string(c.name) + ".profile.json", c.profile);
  const RunOutput r = run_bench(args, c.prefix);
  expect_refused(r, c.message);
  // No message quotes a whole user value.
  EXPECT_LT(r.output.size(), 4000u) << r.output.substr(0, 4000);
}

const std::string kDeep = nested("[", "]", 100000);
const std::string kLongArray = [] {
  std::string s = "[1";
  for (int i = 0; i < 20000; ++i) s += ",1";
  return s + "]";
}();

INSTANTIATE_TEST_SUITE_P(
    Issue16, BenchRefuses,
    ::testing::Values(
        // Nesting: refused on parse, not by a recursive dump in the error path.
        Refused{"DeeplyNestedWorkload", "", "nested deeper than 32 levels", "", "{\"tables\": " + kDeep + "}"},
        Refused{"DeeplyNestedWorkloadTable", "", "nested deeper than 32 levels", "", "{\"tables\": [" + kDeep + "]}"},
        Refused{"DeeplyNestedProfileValue", "", "nested deeper than 32 levels", "", "",
                "{\"name\": \"p\", \"hbm_gbs\": {\"value\": " + kDeep + ", \"source\": \"s\"}}"},
        // A long value is quoted by a short prefix.
        Refused{"LongWorkloadValue", "", "workload key 'dist' must be a string (got array [1,1,1,", "",
                "{\"dist\": " + kLongArray + "}"},
        Refused{"LongProfileValue", "", "hbm_gbs.value must be a number (got string \"xxxx", "", "",
                "{\"name\": \"p\", \"hbm_gbs\": {\"value\": \"" + std::string(100000, 'x') + "\", \"source\": \"s\"}}"},
        // Devices are not read.
        Refused{"WorkloadIsDevZero", "--workload /dev/zero",
                "workload file '/dev/zero' is a character device, not a regular file", kMemoryLimit},
        Refused{"ProfileIsDevZero", "--profile /dev/zero",
                "profile file '/dev/zero' is a character device, not a regular file", kMemoryLimit},
        Refused{"WorkloadIsADirectory", "--workload /tmp", "workload file '/tmp' is a directory"},
        // Counts are checked before anything is allocated.
        Refused{"HundredMillionTables", "--tables 100000000",
                "--tables: table set '100000000': 100000000 tables, over the limit of 65536", kMemoryLimit},
        Refused{"HundredMillionTablesInAFile", "", "workload: tables 100000000 is over the limit of 65536",
                kMemoryLimit, R"({"tables": 100000000, "rows": 10, "dim": 4})"},
        Refused{"ThreadsFarAboveTheMachine", "--threads " + std::to_string(4 * hardware_threads() + 1),
                "--threads " + std::to_string(4 * hardware_threads() + 1) + " is more than 4 x the " +
                    std::to_string(hardware_threads()) + " hardware threads"},
        // Numbers out of range: the value as written.
        Refused{"SeedTooLarge", "--seed 99999999999999999999999",
                "--seed: '99999999999999999999999' is not an integer in [0, 18446744073709551615]"},
        Refused{"NegativeSeed", "--seed -1", "--seed: '-1' is not an integer in [0, 18446744073709551615]"},
        Refused{"CacheFractionNan", "--cache-fraction nan", "--cache-fraction: 'nan' is not a fraction in (0, 1]"},
        Refused{"CacheFractionZero", "--cache-fraction 0", "--cache-fraction: '0' is not a fraction in (0, 1]"},
        Refused{"CacheFractionAboveOne", "--cache-fraction 1.5", "--cache-fraction: '1.5' is not a fraction in (0, 1]"},
        Refused{"ZeroPipeline", "--pipeline 0", "--pipeline: Value 0 not in range"},
        Refused{"CommTimeoutZero", "--comm-timeout 0", "--comm-timeout: '0' is not a number of seconds in (0, 86400]"},
        Refused{"CommTimeoutNan", "--comm-timeout nan",
                "--comm-timeout: 'nan' is not a number of seconds in (0, 86400]"},
        // Outputs that cannot be written are found before anything runs.
        Refused{"JsonInAMissingDirectory", "--json /nonexistent-dir/out.json",
                "--json /nonexistent-dir/out.json: cannot write there"},
        Refused{"HtmlInAMissingDirectory", "--html /nonexistent-dir/out.html",
                "--html /nonexistent-dir/out.html: cannot write there"},
        Refused{"JsonIsADirectory", "--json /tmp", "--json /tmp: is a directory"},
        Refused{"JsonIsADevice", "--json /dev/null", "--json /dev/null: is a character device"},
        Refused{"DumpKeysInAMissingDirectory", "--dump-keys /nonexistent-dir/keys.bin",
                "--dump-keys /nonexistent-dir/keys.bin: cannot write there"}),
    [](const ::testing::TestParamInfo<Refused>& info) { return std::string(info.param.name); });

// Issue 29: counts refused as out of range, not saturated to INT64_MAX; an empty list item; a table
// name no store could hold.
const std::string kLongName(5000, 'n');
INSTANTIATE_TEST_SUITE_P(
    Issue29, BenchRefuses,
    ::testing::Values(
        Refused{"DeviceCapacityOutOfRange", "--device-capacity 99999999999999999999",
                "--device-capacity: '99999999999999999999' is not an integer in [0, 9223372036854775807]"},
        Refused{"BatchOutOfRange", "--batch 99999999999999999999",
                "--batch: '99999999999999999999' is not an integer in [1, 9223372036854775807]"},
        Refused{"RowsOutOfRange", "--rows 99999999999999999999",
                "--rows: '99999999999999999999' is not an integer in [1, 9223372036854775807]"},
        Refused{"CriteoRowsOutOfRange", "--criteo-rows 99999999999999999999",
                "--criteo-rows: '99999999999999999999' is not an integer in [1, 9223372036854775807]"},
        Refused{"NegativeDeviceCapacity", "--device-capacity -1", "--device-capacity: '-1' is not an integer in [0, "},
        Refused{"SweepCacheTrailingComma", "--sweep-cache 0.5,", "--sweep-cache: '' is not a cache fraction in (0, 1]"},
        Refused{"SweepCacheLeadingComma", "--sweep-cache ,0.5", "--sweep-cache: '' is not a cache fraction in (0, 1]"},
        Refused{"LongTableNameInAList", "--tables " + kLongName + "=10",
                "name is 5000 bytes long (expected 1 to 128 bytes of letters"},
        Refused{"LongTableNameInAWorkload", "", "name is 5000 bytes long (expected 1 to 128 bytes of letters", "",
                R"({"tables": [{"name": ")" + kLongName + R"(", "rows": 10, "dim": 4}]})"}),
    [](const ::testing::TestParamInfo<Refused>& info) { return std::string(info.param.name); });

// ---- usage errors: exit 2, the message on stderr ----

TEST(BenchUsage, EveryUsageErrorExitsTwoWithTheMessageOnStderr) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--no-such-flag", "--no-such-flag"}, {"--steps abc", "--steps"},
      {"--steps 99999999999", "--steps"},   {"--threads", "--threads"},  // missing value
      {"--preview -1", "--preview"},        {"--tables 1 --rows 5 --tables a=10", "--rows applies to --tables N only"},
  };
  for (const auto& [args, message] : cases) {
    const RunOutput r = run_bench_stderr(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << ": " << r.output;
  }
  // --help is not an error.
  EXPECT_EQ(run_bench("--help").exit_code, 0);
}

// One line, the reason in it: a program that runs strata-bench (strata-tune validate) relays its
// last line, which used to be "Run with --help for more information".
TEST(BenchUsage, AUsageErrorIsOneLineWithTheReason) {
  for (const auto& [args, reason] : std::vector<std::pair<std::string, std::string>>{
           {"--steps 0", "--steps: Value 0 not in range 1 to 1000000"},
           {"--no-such-flag", "--no-such-flag"},
           {"--batch 99999999999999999999", "--batch: '99999999999999999999' is not an integer"}}) {
    const RunOutput r = run_bench_stderr(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("strata-bench: ", 0), 0u) << args << ": " << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << args << ": expected one line:\n" << r.output;
    EXPECT_NE(r.output.find(reason), std::string::npos) << args << ": " << r.output;
  }
}

// ---- step counts are bounded ----

TEST(BenchUsage, StepCountsAreBounded) {
  // --warmup 2147483647 used to overflow the step count: no batches (a wrong message), or with
  // --distinct-batches given, no timed steps and "inf" in every column.
  for (const std::string extra : {"", " --distinct-batches 4"}) {
    const RunOutput r = run_bench("--warmup 2147483647 --steps 1" + kSmall + extra);
    expect_refused(r, "--warmup: Value 2147483647 not in range 0 to 1000000");
    EXPECT_EQ(r.output.find("inf "), std::string::npos) << r.output;
  }
  expect_refused(run_bench("--steps 1000001 --warmup 0" + kSmall), "--steps: Value 1000001 not in range 1 to 1000000");
}

// ---- input files over the size limit ----

TEST(BenchInputFiles, AFileOverTheSizeLimitIsRefusedUnread) {
  const std::string path = temp_dir() + "/huge.json";
  { std::ofstream(path) << "{}"; }
  ASSERT_EQ(::truncate(path.c_str(), (std::int64_t{4} << 20) + 1), 0);
  expect_refused(run_bench("--steps 1 --warmup 0" + kSmall + " --workload " + path),
                 "workload file '" + path + "' has 4194305 bytes, over the limit of 4 MiB for an input file");
  expect_refused(run_bench("--steps 1 --warmup 0" + kSmall + " --profile " + path),
                 "profile file '" + path + "' has 4194305 bytes, over the limit of 4 MiB for an input file");
}

// ---- threads ----

TEST(BenchThreads, AsManyAsFourPerHardwareThreadRunAndTheProbeUsesTheHardwareThreads) {
  const int hw = hardware_threads();
  const std::string out = temp_dir() + "/threads.json";
  const RunOutput r =
      run_bench("--steps 1 --warmup 0" + kSmall + " --threads " + std::to_string(4 * hw) + " --json " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(read_file(out));
  EXPECT_EQ(j.at("threads"), 4 * hw);
  EXPECT_EQ(j.at("read_probe_threads"), hw);
}

// ---- --comm-timeout ----

TEST(BenchCommTimeout, IsDocumentedAndRecorded) {
  const RunOutput help = run_bench("--help");
  EXPECT_NE(help.output.find("--comm-timeout FLOAT:SECONDS in (0, 86400]=120"), std::string::npos) << help.output;
  const std::string out = temp_dir() + "/comm.json";
  const std::string ranks =
      " --tables a=300x4 --batch 8 --pooling 1 --read-probe-mib 1 --backend emu --modes gpu --ranks 2 --steps 1 "
      "--warmup 0 --json " +
      out;
  RunOutput r = run_bench(ranks);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(read_file(out)).at("settings").at("comm_timeout_s"), 120.0);
  r = run_bench(ranks + " --comm-timeout 7.5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(read_file(out)).at("settings").at("comm_timeout_s"), 7.5);
}

// ---- a failed write leaves no partial file under the final name ----

// The run hits the file size limit (`ulimit -f`, SIGXFSZ ignored, so write() fails with EFBIG as
// on a full disk) while it writes its results.
TEST(BenchOutput, AFailedJsonWriteKeepsTheOldFileAndLeavesNoTempFile) {
  const std::string dir = temp_dir() + "/full";
  ::mkdir(dir.c_str(), 0755);
  for (const std::string flag : {"--json", "--html"}) {
    const std::string path = dir + "/out" + (flag == "--json" ? ".json" : ".html");
    { std::ofstream(path) << "old results\n"; }
    const RunOutput r =
        run_bench("--steps 1 --warmup 0" + kSmall + " " + flag + " " + path, "trap '' XFSZ; ulimit -f 2; ");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(path), std::string::npos) << r.output;
    EXPECT_EQ(read_file(path), "old results\n") << flag;
    EXPECT_EQ(files_in(dir), std::vector<std::string>{path.substr(dir.size() + 1)}) << flag;
    ::unlink(path.c_str());
  }
  // Without the limit the same run writes the file.
  const std::string path = dir + "/out.json";
  const RunOutput ok = run_bench("--steps 1 --warmup 0" + kSmall + " --json " + path);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(json::parse(read_file(path)).at("tool"), "strata-bench");
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"out.json"});
}

// Progress bars go to a terminal only: a run whose stderr is a pipe (a log, CI, `| tee`) gets
// none, even without --no-progress.
TEST(BenchProgress, NoProgressBarsWhenStderrIsNotATerminal) {
  const RunOutput r =
      run_bench_stderr(" --tables a=300x4 --batch 8 --pooling 1 --read-probe-mib 1 --modes cpu --steps 3 --warmup 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("measuring"), std::string::npos) << r.output;  // stderr was captured
  EXPECT_EQ(r.output.find("[#"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
}

}  // namespace
