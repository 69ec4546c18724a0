// Checkpoints shared between processes: an evaluator loads the latest checkpoint while a trainer
// keeps saving into the same directory, and two trainers save into one directory. Real processes:
// the test binary spawns itself (posix_spawn of /proc/self/exe, never a bare fork of a process
// whose oneTBB workers may be running) with a filter that selects the saver below and an
// environment variable that tells it what to do.
//
// Every save is distinguishable: the saver writes rows whose values encode (saver, generation),
// so a load either leaves every row of every table from one save, or fails and changes nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/store/store_test_util.hpp"

extern char** environ;

namespace strata {
namespace {

using namespace strata::testing;
namespace fs = std::filesystem;

constexpr char kSaverEnv[] = "STRATA_CHECKPOINT_SAVER";

// Three tables: Adam and Adagrad (with optimizer state) and SGD (none). `mode` is "cpu" or
// "cached" (the emu device backend, a cache of a third of each table). The first tables are the
// large ones: a load that copies them in and then finds the last one gone is the bug this guards.
StoreConfig saver_config(const std::string& mode) {
  StoreConfig c;
  c.threads = 1;
  c.device.backend = BackendChoice::kEmu;
  const struct {
    const char* name;
    std::int64_t rows;
    int dim;
    OptimizerKind opt;
  } tables[] = {{"emb_a", 6000, 16, OptimizerKind::kAdam},
                {"emb_b", 8000, 8, OptimizerKind::kSgd},
                {"emb_c", 300, 4, OptimizerKind::kAdagrad}};
  for (const auto& t : tables) {
    TableConfig tc;
    tc.spec.name = t.name;
    tc.spec.rows = t.rows;
    tc.spec.dim = t.dim;
    tc.spec.optimizer.kind = t.opt;
    if (mode == "cached") {
      tc.placement = Placement::kCached;
      tc.cache.rows = t.rows / 3;
    }
    c.tables.push_back(tc);
  }
  return c;
}

// The value a save tagged `tag` (>= 1) writes at element `i` of table `t`: the tag in the integer
// part, the position in the fraction (exact in fp32 for tags below 2^14); state values negated.
float tagged(std::int64_t tag, int t, std::int64_t i, bool state) {
  const float v = static_cast<float>(tag) + static_cast<float>((t * 131 + i) % 1024) / 1024.0f;
  return state ? -v : v;
}

// Fills every row and state of every table with the values of save `tag`.
Status write_tag(Store& s, std::int64_t tag) {
  for (std::size_t t = 0; t < s.config().tables.size(); ++t) {
    const TableSpec& spec = s.config().tables[t].spec;
    const std::int32_t sd = optimizer_state_dim(spec.optimizer.kind, spec.dim);
    std::vector<float> w(static_cast<std::size_t>(spec.rows * spec.dim)), st(static_cast<std::size_t>(spec.rows * sd));
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = tagged(tag, static_cast<int>(t), static_cast<std::int64_t>(i), false);
    for (std::size_t i = 0; i < st.size(); ++i)
      st[i] = tagged(tag, static_cast<int>(t), static_cast<std::int64_t>(i), true);
    STRATA_RETURN_IF_ERROR(s.write_rows(static_cast<int>(t), 0, spec.rows, w.data(), sd ? st.data() : nullptr));
  }
  return Status::ok();
}

// The tag of the save every value of `snap` comes from, or an error naming the first value that
// belongs to another save (or to none).
Result<std::int64_t> tag_of(const Snapshot& snap) {
  if (snap.weights.empty() || snap.weights[0].empty()) return Status::data_loss("no rows");
  const std::int64_t tag = static_cast<std::int64_t>(std::floor(snap.weights[0][0]));
  if (tag < 1)
    return Status::data_loss("table 0 weight 0 = " + std::to_string(snap.weights[0][0]) + ": not from a save");
  for (std::size_t t = 0; t < snap.weights.size(); ++t) {
    for (const bool state : {false, true}) {
      const std::vector<float>& v = state ? snap.state[t] : snap.weights[t];
      for (std::size_t i = 0; i < v.size(); ++i)
        if (v[i] != tagged(tag, static_cast<int>(t), static_cast<std::int64_t>(i), state))
          return Status::data_loss("table " + std::to_string(t) + (state ? " state " : " weight ") + std::to_string(i) +
                                   " = " + std::to_string(v[i]) + ": not from the save tagged " + std::to_string(tag) +
                                   " like table 0 weight 0");
    }
  }
  return tag;
}

// The saver process: STRATA_CHECKPOINT_SAVER="<dir>;<mode>;<first tag>;<saves>" opens its own
// store and saves `saves` times into <dir>, with tags first, first+1, ... Skipped when the
// variable is not set (an ordinary run of the test binary).
TEST(CheckpointSaverProcess, SavesRepeatedly) {
  const char* env = std::getenv(kSaverEnv);
  if (!env) GTEST_SKIP() << "runs only as the child process of the CheckpointConcurrency tests";
  std::istringstream in(env);
  std::string dir, mode, first, saves;
  ASSERT_TRUE(std::getline(in, dir, ';') && std::getline(in, mode, ';') && std::getline(in, first, ';') &&
              std::getline(in, saves, ';'))
      << env;
  auto s = Store::open(saver_config(mode));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  for (std::int64_t i = 0; i < std::stoll(saves); ++i) {
    const std::int64_t tag = std::stoll(first) + i;
    ASSERT_TRUE(write_tag(**s, tag).is_ok());
    const Status st = (*s)->save(dir);
    ASSERT_TRUE(st.is_ok()) << "save tagged " << tag << ": " << st.to_string();
  }
}

// Starts this test binary as a saver, its output going to `log`; returns its pid. Only the saver
// test runs there, with no GTEST_* variables (a GTEST_OUTPUT of the parent would make the child
// overwrite its report).
pid_t spawn_saver(const std::string& dir, const std::string& mode, std::int64_t first_tag, std::int64_t saves,
                  const std::string& log) {
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind("GTEST_", 0) == 0 || kv.rfind(std::string(kSaverEnv) + "=", 0) == 0) continue;
    env_store.push_back(kv);
  }
  env_store.push_back(std::string(kSaverEnv) + "=" + dir + ";" + mode + ";" + std::to_string(first_tag) + ";" +
                      std::to_string(saves));
  std::vector<char*> envp;
  for (auto& kv : env_store) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::string arg0 = "checkpoint_saver", filter = "--gtest_filter=CheckpointSaverProcess.SavesRepeatedly";
  char* argv[] = {arg0.data(), filter.data(), nullptr};
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
  ::posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(rc, 0) << std::strerror(rc);
  return rc == 0 ? pid : -1;
}

// Whether a saver exited with status 0; its log otherwise.
::testing::AssertionResult saver_ok(int status, const std::string& log) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return ::testing::AssertionSuccess();
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return ::testing::AssertionFailure() << "the saver process failed (wait status " << status << "):\n" << text.str();
}

// Whether `pid` has exited (reaps it and stores its wait status).
bool exited(pid_t pid, int* status) {
  const pid_t r = ::waitpid(pid, status, WNOHANG);
  return r == pid;
}

struct LoadCounts {
  int ok = 0, failed = 0, bad = 0;  // bad: the store changed without holding one whole save
  std::int64_t last_tag = 0;
  std::string first_bad, first_error;
};

// The tag the evaluator fills its store with before each load, used by no save: a load that
// fails must leave exactly these rows, one that succeeds must replace all of them.
constexpr std::int64_t kBeforeLoad = 9999;

// One load into `s`, checked: success leaves one whole save, failure leaves the store unchanged.
// The store is refilled first, so that a load of the save it already holds still shows every row
// it overwrote.
void checked_load(Store& s, const fs::path& dir, LoadCounts& n) {
  ASSERT_TRUE(write_tag(s, kBeforeLoad).is_ok());
  const std::int64_t step_before = s.step();
  const Status st = s.load(dir.string());
  const Result<std::int64_t> tag = tag_of(snapshot(s));
  if (st.is_ok()) {
    ++n.ok;
    if (!tag.is_ok() || tag.value() == kBeforeLoad) {
      if (n.bad++ == 0)
        n.first_bad = "load said OK but " + (tag.is_ok() ? std::string("changed no row") : tag.status().message());
    } else {
      n.last_tag = tag.value();
    }
    return;
  }
  ++n.failed;
  if (n.first_error.empty()) n.first_error = st.to_string();
  if (!tag.is_ok() || tag.value() != kBeforeLoad || s.step() != step_before) {
    if (n.bad++ == 0)
      n.first_bad =
          "load failed (" + st.to_string() + ") and changed the store: " +
          (tag.is_ok() ? "every row now from the save tagged " + std::to_string(tag.value()) : tag.status().message());
  }
}

class CheckpointConcurrency : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_ckpt_conc_" + std::to_string(::getpid()) + "_" + GetParam());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::remove_all(dir_);
    for (const char* who : {"a", "b"}) fs::remove(log(who));
  }
  std::string log(const char* who) const { return dir_.string() + ".saver-" + who + ".log"; }
  fs::path dir_;
};

// An evaluator loads the latest checkpoint over and over while a trainer (another process) saves
// into the same directory. Each load applies one whole save or changes nothing; tags only grow.
TEST_P(CheckpointConcurrency, LoadWhileAnotherProcessSaves) {
  constexpr std::int64_t kSaves = 40;
  const pid_t child = spawn_saver(dir_.string(), GetParam(), 1, kSaves, log("a"));
  ASSERT_GT(child, 0);
  auto s = Store::open(saver_config(GetParam()));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  LoadCounts n;
  int status = 0;
  std::int64_t went_back = 0;
  while (!exited(child, &status)) {
    if (!fs::exists(dir_ / "MANIFEST")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    const std::int64_t before = n.last_tag;
    checked_load(**s, dir_, n);
    if (n.last_tag < before) ++went_back;
  }
  ASSERT_TRUE(saver_ok(status, log("a")));
  std::cout << "[ loads    ] " << GetParam() << ": " << n.ok << " succeeded, " << n.failed << " failed, " << n.bad
            << " left the store mixed or changed" << (n.first_error.empty() ? "" : "; first error: " + n.first_error)
            << "\n";
  EXPECT_EQ(n.bad, 0) << n.first_bad;
  EXPECT_EQ(went_back, 0) << "a load returned an older save than the one before";
  // Once the saver is done, the directory holds its last save, whole.
  LoadCounts last;
  checked_load(**s, dir_, last);
  EXPECT_EQ(last.ok, 1) << last.first_error;
  EXPECT_EQ(last.bad, 0) << last.first_bad;
  EXPECT_EQ(last.last_tag, kSaves);
}

// Two trainers save into one directory at once (savers serialize on a lock of the directory) while
// an evaluator loads: every save succeeds, every load applies one whole save or nothing, and the
// directory ends up holding one whole save of one of them, with no stale table files left over.
TEST_P(CheckpointConcurrency, TwoProcessesSaveIntoOneDirectory) {
  constexpr std::int64_t kSaves = 25;
  const pid_t a = spawn_saver(dir_.string(), GetParam(), 1000, kSaves, log("a"));
  const pid_t b = spawn_saver(dir_.string(), GetParam(), 2000, kSaves, log("b"));
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  auto s = Store::open(saver_config(GetParam()));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  LoadCounts n;
  int status_a = 0, status_b = 0;
  bool done_a = false, done_b = false;
  while (!(done_a && done_b)) {
    done_a = done_a || exited(a, &status_a);
    done_b = done_b || exited(b, &status_b);
    if (!fs::exists(dir_ / "MANIFEST")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    checked_load(**s, dir_, n);
  }
  EXPECT_TRUE(saver_ok(status_a, log("a")));
  EXPECT_TRUE(saver_ok(status_b, log("b")));
  std::cout << "[ loads    ] " << GetParam() << ": " << n.ok << " succeeded, " << n.failed << " failed, " << n.bad
            << " left the store mixed or changed" << (n.first_error.empty() ? "" : "; first error: " + n.first_error)
            << "\n";
  EXPECT_EQ(n.bad, 0) << n.first_bad;
  LoadCounts last;
  checked_load(**s, dir_, last);
  EXPECT_EQ(last.ok, 1) << last.first_error;
  EXPECT_EQ(last.bad, 0) << last.first_bad;
  EXPECT_TRUE(last.last_tag == 1000 + kSaves - 1 || last.last_tag == 2000 + kSaves - 1) << last.last_tag;
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.path().filename() != "MANIFEST";
  EXPECT_EQ(files, 3) << "one table file per table";
}

INSTANTIATE_TEST_SUITE_P(Modes, CheckpointConcurrency, ::testing::Values("cpu", "cached"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace strata
