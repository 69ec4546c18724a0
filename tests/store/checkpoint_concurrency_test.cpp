// Checkpoints shared between processes: an evaluator loads the latest checkpoint while a trainer
// keeps saving into the same directory, and two trainers save into one directory. Real processes:
// the test binary spawns itself (posix_spawn of /proc/self/exe, never a bare fork of a process
// whose oneTBB workers may be running) with a filter that selects the saver below and an
// environment variable that tells it what to do. Savers and evaluators are single stores or
// worlds of 2 thread ranks (world checkpoints: store/io/detail/world_checkpoint.hpp).
//
// Every save is distinguishable: the saver writes rows, a step and learning rates whose values
// encode (saver, generation), so a load either leaves every row of every table, the step and the
// rates from one save (on every rank of a world, all from the same one), or fails and changes
// nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "store/io/detail/checkpoint_format.hpp"
#include "store/io/detail/world_checkpoint.hpp"
#include "tests/store/store_test_util.hpp"
#include "tests/store/thread_ranks.hpp"

extern char** environ;

namespace strata {
namespace {

using namespace strata::testing;
namespace fs = std::filesystem;

constexpr char kSaverEnv[] = "STRATA_CHECKPOINT_SAVER";
// A world's ranks (threads) and the timeout of their collectives (wide: loaded machines, sanitizers).
constexpr int kWorld = 2;
constexpr int kTimeoutMs = 20000;

// Three tables: Adam and Adagrad (with optimizer state) and SGD (none). `mode` is "cpu",
// "cached" (the emu device backend, a cache of a third of each table) or "world" (one of kWorld
// thread ranks on emu: emb_a sharded by row on `gpu`, emb_b by column on `hybrid` with the cache of
// `cached`, emb_c by table on `gpu`). The first tables are the large ones: a load that copies them
// in and then finds the last one gone is the bug this guards.
StoreConfig saver_config(const std::string& mode) {
  const bool world = mode == "world";
  StoreConfig c = world ? thread_rank_config(64 << 20) : StoreConfig{};
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
    if (world) {
      const std::size_t i = c.tables.size();
      tc.sharding.type = i == 0   ? dispatch::ShardingType::kRow
                         : i == 1 ? dispatch::ShardingType::kColumn
                                  : dispatch::ShardingType::kTable;
      tc.placement = i == 1 ? Placement::kHybrid : Placement::kGpu;
      if (i == 1) tc.cache.rows = t.rows / 3;
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

// The learning rate a save tagged `tag` gives table `t` (exact in fp32, as `tagged`). The step is the tag.
float rate_of(std::int64_t tag, int t) { return static_cast<float>(tag) / 1024.0f + static_cast<float>(t); }

// Fills every row and state of every table with the values of save `tag`, sets its rates and step
// (collectives on a world: every rank gives the same).
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
    STRATA_RETURN_IF_ERROR(s.set_learning_rate(spec.name, rate_of(tag, static_cast<int>(t))));
  }
  return s.set_step(tag);
}

// The tag of the save every value of `s` comes from (rows, state, rates and step; read_rows is a
// collective on a world), or an error naming the first value that belongs to another save (or to
// none).
Result<std::int64_t> tag_of(Store& s) {
  const Snapshot snap = snapshot(s);
  if (snap.weights.empty() || snap.weights[0].empty()) return Status::data_loss("no rows");
  const std::int64_t tag = static_cast<std::int64_t>(std::floor(snap.weights[0][0]));
  if (tag < 1)
    return Status::data_loss("table 0 weight 0 = " + std::to_string(snap.weights[0][0]) + ": not from a save");
  const std::string like = ": not from the save tagged " + std::to_string(tag) + " like table 0 weight 0";
  for (std::size_t t = 0; t < snap.weights.size(); ++t) {
    for (const bool state : {false, true}) {
      const std::vector<float>& v = state ? snap.state[t] : snap.weights[t];
      for (std::size_t i = 0; i < v.size(); ++i)
        if (v[i] != tagged(tag, static_cast<int>(t), static_cast<std::int64_t>(i), state))
          return Status::data_loss("table " + std::to_string(t) + (state ? " state " : " weight ") + std::to_string(i) +
                                   " = " + std::to_string(v[i]) + like);
    }
    const Result<float> rate = s.learning_rate(s.config().tables[t].spec.name);
    if (!rate || rate.value() != rate_of(tag, static_cast<int>(t)))
      return Status::data_loss("table " + std::to_string(t) + " learning rate " +
                               (rate ? std::to_string(rate.value()) : rate.status().to_string()) + like);
  }
  if (s.step() != tag) return Status::data_loss("step " + std::to_string(s.step()) + like);
  return tag;
}

// Saves `saves` times into `dir`, with tags first, first+1, ... (a world: every rank calls it).
void save_tags(Store& s, const std::string& dir, std::int64_t first, std::int64_t saves, const std::string& who) {
  for (std::int64_t tag = first; tag < first + saves; ++tag) {
    ASSERT_TRUE(write_tag(s, tag).is_ok());
    const Status st = s.save(dir);
    ASSERT_TRUE(st.is_ok()) << who << "save tagged " << tag << ": " << st.to_string();
  }
}

// The saver of mode "world": kWorld thread ranks save_tags. Each save is checked whole at its commit, by loading it
// into a single store while rank 0 still holds the directory's lock (SavePoint::kCommitted: no other saver can replace
// it yet), so that every generation it commits is checked, even one replaced before any evaluator loaded it.
void save_as_world(const std::string& dir, std::int64_t first, std::int64_t saves) {
  auto checker = Store::open(saver_config("cpu"));
  ASSERT_TRUE(checker.is_ok()) << checker.status().to_string();
  std::int64_t committed = 0;  // rank 0's saves so far: the hook runs on rank 0's thread
  std::string not_whole;
  detail::set_world_save_hook([&](int rank, detail::SavePoint p) {
    if (rank != 0 || p != detail::SavePoint::kCommitted) return Status::ok();
    const std::int64_t saving = first + committed++;
    if (!not_whole.empty()) return Status::ok();
    const Status loaded = (*checker)->load(dir);
    const Result<std::int64_t> tag = tag_of(**checker);
    if (!loaded.is_ok() || !tag.is_ok() || tag.value() != saving)
      not_whole = "the save tagged " + std::to_string(saving) + " as committed: " +
                  (!loaded.is_ok() ? loaded.to_string()
                   : tag.is_ok()   ? "loads the save tagged " + std::to_string(tag.value())
                                   : tag.status().to_string());
    return Status::ok();
  });
  on_ranks(kWorld, kTimeoutMs, [&](int rank, std::shared_ptr<dispatch::Communicator> comm) {
    auto s = Store::open(saver_config("world"), comm);
    ASSERT_TRUE(s.is_ok()) << "rank " << rank << ": " << s.status().to_string();
    save_tags(**s, dir, first, saves, "rank " + std::to_string(rank) + ": ");
  });
  detail::set_world_save_hook({});
  EXPECT_EQ(committed, saves) << "commits checked";
  EXPECT_EQ(not_whole, "");
}

// The saver process: STRATA_CHECKPOINT_SAVER="<dir>;<mode>;<first tag>;<saves>" opens its own
// store (mode "world": save_as_world) and saves `saves` times into <dir>, with tags first,
// first+1, ... Skipped when the variable is not set (an ordinary run of the test binary).
TEST(CheckpointSaverProcess, SavesRepeatedly) {
  const char* env = std::getenv(kSaverEnv);
  if (!env) GTEST_SKIP() << "runs only as the child process of the CheckpointConcurrency tests";
  std::istringstream in(env);
  std::string dir, mode, first, saves;
  ASSERT_TRUE(std::getline(in, dir, ';') && std::getline(in, mode, ';') && std::getline(in, first, ';') &&
              std::getline(in, saves, ';'))
      << env;
  if (mode == "world") {
    save_as_world(dir, std::stoll(first), std::stoll(saves));
    return;
  }
  auto s = Store::open(saver_config(mode));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  save_tags(**s, dir, std::stoll(first), std::stoll(saves), "");
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
  int went_back = 0;                // loads that returned an older save than the one before
  std::int64_t last_tag = 0;
  std::string first_bad, first_error;
  std::string history;  // each load's outcome, a line each: the same on every rank of a world
};

// The tag the evaluator fills its store with before each load, used by no save: a load that
// fails must leave exactly these rows, rates and step, one that succeeds must replace all of them.
constexpr std::int64_t kBeforeLoad = 9999;

// One load into `s`, checked: success leaves one whole save, failure leaves the store unchanged.
// The store is refilled first, so that a load of the save it already holds still shows every row
// it overwrote. On a world, a collective: every rank calls it.
void checked_load(Store& s, const fs::path& dir, LoadCounts& n) {
  ASSERT_TRUE(write_tag(s, kBeforeLoad).is_ok());
  const Status st = s.load(dir.string());
  const Result<std::int64_t> tag = tag_of(s);
  if (st.is_ok()) {
    ++n.ok;
    if (!tag.is_ok() || tag.value() == kBeforeLoad) {
      if (n.bad++ == 0)
        n.first_bad = "load said OK but " + (tag.is_ok() ? std::string("changed nothing") : tag.status().message());
    } else {
      n.went_back += tag.value() < n.last_tag;
      n.last_tag = tag.value();
    }
    n.history += "loaded " + (tag.is_ok() ? std::to_string(tag.value()) : tag.status().message()) + "\n";
    return;
  }
  ++n.failed;
  n.history += "failed: " + st.to_string() + "\n";
  if (n.first_error.empty()) n.first_error = st.to_string();
  if (!tag.is_ok() || tag.value() != kBeforeLoad) {
    if (n.bad++ == 0)
      n.first_bad =
          "load failed (" + st.to_string() + ") and changed the store: " +
          (tag.is_ok() ? "everything now from the save tagged " + std::to_string(tag.value()) : tag.status().message());
  }
}

// Loads `dir` into `s` over and over (checked_load) until savers_done(), then once more into `last`
// (the directory then holds the savers' last save). On a rank of a world (`comm`), rank 0 alone
// asks savers_done() and whether a manifest is there yet, and tells every rank: all make the same
// loads.
void load_until_savers_exit(Store& s, dispatch::Communicator* comm, const fs::path& dir,
                            const std::function<bool()>& savers_done, LoadCounts& n, LoadCounts& last) {
  for (;;) {
    std::int64_t next = 0;  // 0: the savers are done; 1: load; 2: no manifest yet
    if (!comm || comm->rank() == 0) next = savers_done() ? 0 : fs::exists(dir / "MANIFEST") ? 1 : 2;
    if (comm) {
      ASSERT_TRUE(comm->broadcast(&next, sizeof next, 0).is_ok());
    }
    if (next == 0) break;
    if (next == 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    else
      checked_load(s, dir, n);
  }
  checked_load(s, dir, last);
}

void print(const std::string& who, const LoadCounts& n) {
  std::cout << "[ loads    ] " << who << ": " << n.ok << " succeeded, " << n.failed << " failed, " << n.bad
            << " left the store mixed or changed" << (n.first_error.empty() ? "" : "; first error: " + n.first_error)
            << "\n";
}

// The load after the savers exited: one whole save, the last of one saver (its tag in `tags`).
void expect_last_save(const LoadCounts& last, const std::set<std::int64_t>& tags, const std::string& who) {
  EXPECT_EQ(last.ok, 1) << who << ": " << last.first_error;
  EXPECT_EQ(last.bad, 0) << who << ": " << last.first_bad;
  EXPECT_EQ(tags.count(last.last_tag), 1u) << who << ": " << last.last_tag;
}

// The loads of every rank of a world (load_on_world).
struct WorldLoads {
  std::vector<LoadCounts> n, last;  // per rank
};

// A world of kWorld thread ranks (saver_config("world")) loads `dir` over and over until
// savers_done() (load_until_savers_exit): no load left any rank mixed or changed, and every rank saw
// the same outcome of every load (one load, one save for all).
WorldLoads load_on_world(const fs::path& dir, const std::function<bool()>& savers_done) {
  WorldLoads got{std::vector<LoadCounts>(kWorld), std::vector<LoadCounts>(kWorld)};
  on_ranks(kWorld, kTimeoutMs, [&](int rank, std::shared_ptr<dispatch::Communicator> comm) {
    auto s = Store::open(saver_config("world"), comm);
    ASSERT_TRUE(s.is_ok()) << "rank " << rank << ": " << s.status().to_string();
    const std::size_t r = static_cast<std::size_t>(rank);
    load_until_savers_exit(**s, comm.get(), dir, savers_done, got.n[r], got.last[r]);
  });
  for (std::size_t r = 0; r < got.n.size(); ++r) {
    print("world rank " + std::to_string(r), got.n[r]);
    EXPECT_EQ(got.n[r].bad, 0) << "rank " << r << ": " << got.n[r].first_bad;
    EXPECT_EQ(got.n[r].history, got.n[0].history) << "rank " << r << "'s loads differ from rank 0's";
    EXPECT_EQ(got.last[r].history, got.last[0].history) << "rank " << r << "'s last load differs from rank 0's";
  }
  return got;
}

class CheckpointConcurrency : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    // "<suite>.<test>/<param>", one directory: two suites share the parameters
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(test->test_suite_name()) + "." + test->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fs::temp_directory_path() / ("strata_ckpt_conc_" + std::to_string(::getpid()) + "_" + name);
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
  LoadCounts n, last;
  int status = 0;
  load_until_savers_exit(
      **s, nullptr, dir_, [&] { return exited(child, &status); }, n, last);
  ASSERT_TRUE(saver_ok(status, log("a")));
  print(GetParam(), n);
  EXPECT_EQ(n.bad, 0) << n.first_bad;
  EXPECT_EQ(n.went_back, 0) << "a load returned an older save than the one before";
  // Once the saver is done, the directory holds its last save, whole.
  expect_last_save(last, {kSaves}, "the last load");
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
  LoadCounts n, last;
  int status_a = 0, status_b = 0;
  bool done_a = false, done_b = false;
  load_until_savers_exit(
      **s, nullptr, dir_,
      [&] {
        done_a = done_a || exited(a, &status_a);
        done_b = done_b || exited(b, &status_b);
        return done_a && done_b;
      },
      n, last);
  EXPECT_TRUE(saver_ok(status_a, log("a")));
  EXPECT_TRUE(saver_ok(status_b, log("b")));
  print(GetParam(), n);
  EXPECT_EQ(n.bad, 0) << n.first_bad;
  expect_last_save(last, {1000 + kSaves - 1, 2000 + kSaves - 1}, "the last load");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.path().filename() != "MANIFEST";
  EXPECT_EQ(files, 3) << "one table file per table";
}

INSTANTIATE_TEST_SUITE_P(Modes, CheckpointConcurrency, ::testing::Values("cpu", "cached"),
                         [](const auto& info) { return std::string(info.param); });

// The same with world checkpoints. The parameter is the saver of the other process: "cpu" (a single
// store, whole tables in format 1, resharded by the world's load) or "world" (kWorld thread ranks,
// format 2: a piece per shard, written by each rank).
class WorldCheckpointConcurrency : public CheckpointConcurrency {};

// A world of thread ranks (tables sharded by row, column and table) loads the latest checkpoint over
// and over while another process saves into the same directory: each load applies one whole save on
// every rank, the same save on all, or fails on every rank and changes nothing; tags only grow.
TEST_P(WorldCheckpointConcurrency, AWorldLoadsWhileAnotherProcessSaves) {
  constexpr std::int64_t kSaves = 12;
  const pid_t child = spawn_saver(dir_.string(), GetParam(), 1, kSaves, log("a"));
  ASSERT_GT(child, 0);
  int status = 0;
  const WorldLoads got = load_on_world(dir_, [&] { return exited(child, &status); });
  ASSERT_TRUE(saver_ok(status, log("a")));
  for (std::size_t r = 0; r < got.n.size(); ++r) {
    EXPECT_EQ(got.n[r].went_back, 0) << "rank " << r << ": a load returned an older save than the one before";
    expect_last_save(got.last[r], {kSaves}, "rank " + std::to_string(r) + "'s last load");
  }
}

// A world saver and a saver of the parameter's kind save into one directory at once (they take turns
// on its lock) while a world loads: every save succeeds, and each is whole when it commits (the
// world saver loads each of its saves back while it still holds the lock: save_as_world); every
// save took a generation of its own (the last manifest's counts them all); every load applies one
// whole save or nothing; the directory ends up holding one whole save of one of them, and only its
// files.
TEST_P(WorldCheckpointConcurrency, AWorldAndAnotherSaverSaveIntoOneDirectory) {
  constexpr std::int64_t kSaves = 8;
  const pid_t a = spawn_saver(dir_.string(), "world", 1000, kSaves, log("a"));
  const pid_t b = spawn_saver(dir_.string(), GetParam(), 2000, kSaves, log("b"));
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  int status_a = 0, status_b = 0;
  bool done_a = false, done_b = false;
  const WorldLoads got = load_on_world(dir_, [&] {
    done_a = done_a || exited(a, &status_a);
    done_b = done_b || exited(b, &status_b);
    return done_a && done_b;
  });
  EXPECT_TRUE(saver_ok(status_a, log("a")));
  EXPECT_TRUE(saver_ok(status_b, log("b")));
  for (std::size_t r = 0; r < got.last.size(); ++r)
    expect_last_save(got.last[r], {1000 + kSaves - 1, 2000 + kSaves - 1}, "rank " + std::to_string(r) + "'s last load");
  const Result<detail::Manifest> m = detail::read_manifest(dir_.string());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m.value().generation, static_cast<std::uint64_t>(2 * kSaves)) << "two saves committed one generation";
  const std::vector<std::string> named = detail::file_names(m.value());
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.path().filename() != detail::kManifest && e.path().filename() != detail::kLockFile)
      files.insert(e.path().filename().string());
  EXPECT_EQ(files, std::set<std::string>(named.begin(), named.end())) << "files besides the last save's";
}

INSTANTIATE_TEST_SUITE_P(Savers, WorldCheckpointConcurrency, ::testing::Values("cpu", "world"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace strata
