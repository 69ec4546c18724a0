// The checkpoint protocol of a world and the one loader (see world_checkpoint.hpp).

#include "store/io/detail/world_checkpoint.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "dispatch/communicator.hpp"
#include "dispatch/shard_layout.hpp"
#include "dispatch/sharding_plan.hpp"
#include "store/detail/batch_checks.hpp"
#include "store/io/detail/checkpoint_format.hpp"
#include "store/io/detail/dynamic_piece.hpp"
#include "store/io/detail/reshard.hpp"
#include "store/io/file_io.hpp"
#include "store/store.hpp"

namespace strata::detail {
namespace {

std::function<Status(int, SavePoint)>& save_hook() {
  static std::function<Status(int, SavePoint)> hook;
  return hook;
}

Status at(int rank, SavePoint point) { return at_save_point(rank, point); }

std::function<Status(int, LoadPoint)>& load_hook() {
  static std::function<Status(int, LoadPoint)> hook;
  return hook;
}

Status at(int rank, LoadPoint point) { return load_hook() ? load_hook()(rank, point) : Status::ok(); }

// `job`'s result, an exception it throws (of any type) as an error: a job on a thread of its own has nothing else to
// catch it, and a communicator's call that throws must still let run_polled join its worker and every caller return a
// Status.
Status guarded(const std::function<Status()>& job) {
  try {
    return job();
  } catch (const std::bad_alloc&) {
    return Status::resource_exhausted("out of host memory");
  } catch (const std::exception& e) {
    return Status::internal(std::string("unexpected exception: ") + e.what());
  } catch (...) {
    return Status::internal("unexpected exception (not a std::exception)");
  }
}

// ---------------------------------------------------------------------------------------------
// Outcomes: every round of save and load ends in one all_gather of each rank's result, so every rank decides the
// same way (go on, retry, or fail with the same text). dispatch::agree would not do: it carries a short excerpt of
// each message and answers ranks differently.

constexpr std::size_t kMessageBytes = 1000;

struct Outcome {
  std::int32_t code = 0;
  std::int32_t pad = 0;
  std::int64_t value[2] = {0, 0};
  char message[kMessageBytes] = {};
};

struct Gathered {
  std::vector<Outcome> outcome;    // per rank
  std::vector<std::string> extra;  // per rank: the bytes it appended (the same size on every rank)
};

// One all_gather of this rank's `status`, two values and `extra` (the same number of bytes on every rank). Fails only
// when the collective does (a rank that never came: kUnavailable naming it, from the communicator).
Result<Gathered> gather_outcomes(dispatch::Communicator& comm, const Status& status, std::int64_t v0, std::int64_t v1,
                                 const std::string& extra = {}) {
  Outcome mine;
  mine.code = static_cast<std::int32_t>(status.code());
  mine.value[0] = v0;
  mine.value[1] = v1;
  if (!status.is_ok()) {
    const std::string& m = status.message();
    std::memcpy(mine.message, m.data(), std::min(m.size(), kMessageBytes - 1));
  }
  const std::size_t each = sizeof(Outcome) + extra.size();
  std::string send(each, '\0'), recv(each * static_cast<std::size_t>(comm.size()), '\0');
  std::memcpy(&send[0], &mine, sizeof mine);
  std::memcpy(&send[sizeof mine], extra.data(), extra.size());
  STRATA_RETURN_IF_ERROR(
      guarded([&] { return comm.all_gather(send.data(), static_cast<std::int64_t>(each), &recv[0]); }));
  Gathered g;
  for (int r = 0; r < comm.size(); ++r) {
    const char* at_r = recv.data() + each * static_cast<std::size_t>(r);
    Outcome o;
    std::memcpy(&o, at_r, sizeof o);
    o.message[kMessageBytes - 1] = '\0';
    g.outcome.push_back(o);
    g.extra.emplace_back(at_r + sizeof o, extra.size());
  }
  return g;
}

// The first failure among the gathered outcomes as every rank reports it ("<what>: rank r: <message>"), or OK.
Status first_failure(const Gathered& g, const std::string& what) {
  for (std::size_t r = 0; r < g.outcome.size(); ++r)
    if (g.outcome[r].code != 0)
      return Status::from_code(static_cast<StatusCode>(g.outcome[r].code),
                               what + ": rank " + std::to_string(r) + ": " + g.outcome[r].message);
  return Status::ok();
}

// Rank 0's `text` on every rank.
Status broadcast_text(dispatch::Communicator* comm, std::string& text) {
  if (!comm) return Status::ok();
  std::int64_t n = static_cast<std::int64_t>(text.size());
  STRATA_RETURN_IF_ERROR(comm->broadcast(&n, sizeof n, 0));
  text.resize(static_cast<std::size_t>(n));
  return n == 0 ? Status::ok() : comm->broadcast(&text[0], n, 0);
}

// ---------------------------------------------------------------------------------------------
// Long local work between collectives. A collective waits the communicator's timeout (CommOptions::timeout, 30 s by
// default) for its peers, and a rank may work alone far longer: write a whole table's piece (table sharding puts a
// table on one rank; one replica writes a replicated table), verify one, copy a table whose rows cross no rank. So such
// work runs on a thread of its own while the rank's thread meets the others every kPollInterval in an all_gather of
// each rank's flag and progress, until every rank's work is done: the ranks that finish first wait in short
// collectives, never in one long one. The work counts its progress (progressed(), at least once per chunk of rows);
// when no rank still working made any for one communicator timeout, every rank fails in step naming them.

constexpr auto kPollInterval = std::chrono::milliseconds(20);

// The job of run_polled running on this thread (its worker), or null.
struct PolledJob {
  std::atomic<std::int64_t> progress{0};
  std::atomic<bool> given_up{false};
  std::atomic<std::int64_t> call_since{-1};  // long_call: when its call began (steady_clock ticks), -1 outside one
};
thread_local PolledJob* t_polled_job = nullptr;

// "rank 1" or "ranks 1, 3".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// Runs `job` (local: it must never call the communicator, which this thread uses meanwhile) on a thread of its own,
// this thread joining all_gather rounds of each rank's flag (running, done, failed) and progress until every rank's job
// is done. The rounds end on the same round on every rank (the decision is the gathered flags'), so the collectives
// stay in step. `job_status`: the job's result. Returns whether any rank's job failed, or an error on every rank: the
// collective's (the communicator is broken), or kUnavailable naming the ranks whose job made no progress for the
// communicator's timeout (decided in step: a rank that saw none for that long says so in its next round). Either way
// the worker is joined first (it reads memory of the caller): a rank whose job is stuck in a system call returns only
// once that call does (its job then stops at its next progressed()), but its peers, done, return at once. comm null:
// the job on this thread.
Result<bool> run_polled(dispatch::Communicator* comm, const std::function<Status()>& job, Status& job_status) {
  if (!comm) {
    job_status = guarded(job);
    return !job_status.is_ok();
  }
  enum : std::int64_t { kRunning = 0, kDone = 1, kFailed = 2 };
  struct Round {
    std::int64_t flag = kRunning;
    std::int64_t progress = 0;
    std::int64_t stalled_ms = 0;  // > 0: this rank saw no progress of the working ranks for that long (its timeout)
  };
  const std::size_t world = static_cast<std::size_t>(comm->size());
  std::vector<Round> rounds(world), last(world);  // before the worker: the rounds allocate nothing
  std::vector<int> working;
  working.reserve(world);
  PolledJob polled;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status result;
  std::thread worker;
  try {
    worker = std::thread([&] {
      t_polled_job = &polled;
      Status s = guarded(job);
      t_polled_job = nullptr;
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(s);
      done = true;
      cv.notify_one();
    });
  } catch (const std::system_error& e) {  // no thread (EAGAIN): the rounds still run, and every rank learns it
    result = Status::resource_exhausted(std::string("could not start a thread for local I/O: ") + e.what());
    done = true;
  }
  // Joined on every way out (a worker still joinable at its destruction would std::terminate the process).
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{worker};
  const auto timeout = comm->timeout();
  auto moved = std::chrono::steady_clock::now();  // when a working rank last made progress (or the rounds began)
  Status failure;
  bool any_failed = false;
  for (bool first = true;; first = false) {
    Round mine;
    {
      std::unique_lock<std::mutex> lock(mu);
      if (done && !first) {
        lock.unlock();
        std::this_thread::sleep_for(kPollInterval);  // waiting for the others only
        lock.lock();
      } else {
        cv.wait_for(lock, kPollInterval, [&] { return done; });
      }
      if (done) mine.flag = result.is_ok() ? kDone : kFailed;
    }
    const auto now = std::chrono::steady_clock::now();
    // A long call (long_call) running for less than its allowance counts as progress.
    if (const std::int64_t since = polled.call_since.load(std::memory_order_relaxed);
        since >= 0 && now - std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(since)) <
                          kLongCallTimeouts * timeout)
      polled.progress.fetch_add(1, std::memory_order_relaxed);
    mine.progress = polled.progress.load(std::memory_order_relaxed);
    if (!first && now - moved >= timeout)
      mine.stalled_ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
    failure = guarded([&] { return comm->all_gather(&mine, sizeof mine, rounds.data()); });
    if (!failure.is_ok()) break;
    bool all_done = true;
    any_failed = false;
    std::int64_t stalled_ms = 0;
    working.clear();
    for (std::size_t r = 0; r < world; ++r) {
      const Round& g = rounds[r];
      all_done = all_done && g.flag != kRunning;
      any_failed = any_failed || g.flag == kFailed;
      if (g.flag == kRunning) working.push_back(static_cast<int>(r));
      if (first || g.progress != last[r].progress || g.flag != last[r].flag) moved = now;
      if (stalled_ms == 0) stalled_ms = g.stalled_ms;
    }
    last = rounds;
    if (all_done) break;
    if (stalled_ms > 0) {  // the same decision, and text, on every rank
      failure = Status::unavailable(rank_list(working) + "'s local I/O made no progress for " +
                                    std::to_string(stalled_ms) + " ms");
      polled.given_up = true;
      break;
    }
  }
  if (worker.joinable()) worker.join();
  job_status = result;
  if (!failure.is_ok()) return failure;
  return any_failed;
}

// What a rank tells the others about its piece of one table at the durable gather.
struct PieceInfo {
  std::int32_t present = 0;
  std::uint32_t crc = 0;
  std::uint64_t bytes = 0;
  Box box;
  std::int64_t keys = 0, sketch_bytes = 0, capacity = 0, clock = 0;  // a dynamic table's piece (PieceEntry's)
};
static_assert(std::is_trivially_copyable<PieceInfo>::value, "gathered as bytes");

// The layout of the keys of dynamic table `t` of `config` over a world of `world` ranks: ShardLayout of its plan for
// rows capacity + 1, as the store's key indexes have it (store/detail/dynamic_keys.hpp; the store validated the plan).
dispatch::ShardLayout key_layout(const StoreConfig& config, int t, int world) {
  const TableConfig& tc = config.tables[static_cast<std::size_t>(t)];
  TableSpec served = tc.spec;
  served.rows = tc.spec.rows + 1;
  Result<dispatch::ShardLayout> layout = dispatch::ShardLayout::make(served, tc.sharding, world, t);
  STRATA_CHECK(layout.is_ok());
  return layout.value();
}

// The DynamicAccess every Store of this library is (store/detail/dynamic_state.hpp).
DynamicAccess& dynamic_access(Store& store) {
  auto* access = dynamic_cast<DynamicAccess*>(&store);
  STRATA_CHECK(access != nullptr);
  return *access;
}

// Step 4 of save_world for dynamic table `t`: rank `me`'s shard (DynamicAccess::read_dynamic: its local rows, clock
// and sketch) as its piece, of its key capacity (a table-wise shard of another rank: no keys, capacity 0).
Status write_dynamic_shard(Store& store, int t, int me, int world, const std::string& dir, std::uint64_t generation,
                           std::uint64_t save_id, std::uint32_t version, PieceInfo& info) {
  const ManifestTable mt = table_entry(store.config(), t);
  PieceEntry piece;
  piece.file = piece_file_name(mt.name, generation, save_id, me);
  piece.capacity = key_layout(store.config(), t, world).key_capacity(me);
  DynamicState state;
  STRATA_RETURN_IF_ERROR(long_call([&] { return dynamic_access(store).read_dynamic(t, state); }));
  if (Status s = write_dynamic_piece(dir, mt, state, save_id, version, me, piece); !s.is_ok())
    return s.with_context("piece '" + piece.file + "'");
  info.present = 1;
  info.box = piece.box;
  info.bytes = piece.bytes;
  info.crc = piece.crc;
  info.keys = piece.keys;
  info.sketch_bytes = piece.sketch_bytes;
  info.capacity = piece.capacity;
  info.clock = state.clock;
  return progressed();
}

// Step 4 of save_world: the pieces rank `me` writes in format `version`, the shards it holds (a replicated table by
// one replica, spread over the ranks by table; a rank holding nothing writes nothing; a dynamic table: every rank its
// shard), recorded in `mine` (per config table).
Status write_pieces(Store& store, int me, int world, const std::string& dir, std::uint64_t generation,
                    std::uint64_t save_id, std::uint32_t version, std::vector<PieceInfo>& mine) {
  for (int t = 0; t < static_cast<int>(mine.size()); ++t) {
    if (store.config().tables[static_cast<std::size_t>(t)].dynamic) {
      STRATA_RETURN_IF_ERROR(write_dynamic_shard(store, t, me, world, dir, generation, save_id, version,
                                                 mine[static_cast<std::size_t>(t)]));
      continue;
    }
    STRATA_ASSIGN_OR_RETURN(const ShardInfo si, store.shard_info(t));
    if (si.replicas.empty() || si.replicas[static_cast<std::size_t>(t) % si.replicas.size()] != me) continue;
    PieceEntry piece;
    piece.box = box_of(si);
    if (piece.box.empty()) continue;
    const ManifestTable mt = table_entry(store.config(), t);
    piece.file = piece_file_name(mt.name, generation, save_id, me);
    const auto read = [&](std::int64_t row0, std::int64_t n, float* weights, float* state) {
      return store.read_shard(t, row0, n, weights, state);
    };
    if (Status s = write_piece(read, mt, dir, save_id, version, me, piece); !s.is_ok())
      return s.with_context("piece '" + piece.file + "'");
    PieceInfo& info = mine[static_cast<std::size_t>(t)];
    info.present = 1;
    info.box = piece.box;
    info.bytes = piece.bytes;
    info.crc = piece.crc;
  }
  return Status::ok();
}

// Rank 0's commit: the manifest listing every rank's pieces, checked against the directory as rank 0 sees it.
Status commit_manifest(const Store& store, const std::string& dir, std::uint64_t generation, std::uint64_t save_id,
                       std::uint32_t version, int world, const std::vector<std::string>& extra,
                       std::vector<std::string>& files) {
  const StoreConfig& config = store.config();
  Manifest m;
  m.version = version;
  m.generation = generation;
  m.save_id = save_id;
  m.world = world;
  m.step = store.step();
  m.config = to_json(config);
  for (int t = 0; t < static_cast<int>(config.tables.size()); ++t) {
    ManifestTable mt = table_entry(config, t);
    mt.dynamic = config.tables[static_cast<std::size_t>(t)].dynamic.has_value();
    std::vector<Box> boxes;
    std::vector<std::string> names;
    for (int r = 0; r < world; ++r) {
      PieceInfo info;
      std::memcpy(&info, extra[static_cast<std::size_t>(r)].data() + sizeof(PieceInfo) * static_cast<std::size_t>(t),
                  sizeof info);
      if (!info.present) continue;
      PieceEntry e;
      e.file = piece_file_name(mt.name, generation, save_id, r);
      e.rank = r;
      e.box = info.box;
      e.bytes = info.bytes;
      e.crc = info.crc;
      e.keys = info.keys;
      e.sketch_bytes = info.sketch_bytes;
      e.capacity = info.capacity;
      if (mt.dynamic && r == 0) mt.clock = info.clock;
      if (mt.dynamic && info.clock != mt.clock)  // every training submit ticks every shard's clock
        return Status::internal("dynamic table '" + mt.name + "': rank " + std::to_string(r) + "'s clock " +
                                std::to_string(info.clock) + " differs from rank 0's " + std::to_string(mt.clock) +
                                " (a bug)");
      const std::string shared = "(every rank must save into one directory on a file system they share)";
      struct stat st {};
      if (::stat(join(dir, e.file).c_str(), &st) != 0)
        return Status::failed_precondition("rank " + std::to_string(r) + "'s piece '" + e.file + "' is not in '" + dir +
                                           "' as rank 0 sees it " + shared);
      if (static_cast<std::uint64_t>(st.st_size) != e.bytes)
        return Status::failed_precondition("rank " + std::to_string(r) + "'s piece '" + e.file + "' in '" + dir +
                                           "' has " + std::to_string(st.st_size) +
                                           " bytes as rank 0 sees it (expected " + std::to_string(e.bytes) +
                                           ", as its rank wrote it) " + shared);
      boxes.push_back(e.box);
      names.push_back(e.file);
      files.push_back(e.file);
      mt.pieces.push_back(std::move(e));
    }
    if (mt.dynamic) {  // one piece per rank, no tiles
      m.tables.push_back(std::move(mt));
      continue;
    }
    if (Status s = check_tiling(mt.name, mt.rows, mt.dim, boxes, names); !s.is_ok())
      return Status::internal("the pieces saved do not tile their table (a bug): " + s.message());
    m.tables.push_back(std::move(mt));
  }
  STRATA_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::create(join(dir, kManifest)));
  const std::string text = manifest_text(m);
  STRATA_RETURN_IF_ERROR(w.append(text.data(), text.size()));
  STRATA_RETURN_IF_ERROR(at(0, SavePoint::kManifestWritten));
  STRATA_RETURN_IF_ERROR(w.commit());
  return at(0, SavePoint::kManifestRenamed);
}

}  // namespace

void set_world_save_hook(std::function<Status(int rank, SavePoint point)> hook) { save_hook() = std::move(hook); }

Status at_save_point(int rank, SavePoint point) { return save_hook() ? save_hook()(rank, point) : Status::ok(); }

// An error once run_polled gave up on the job (its rounds failed: the job stops at its next chunk, and its rank returns
// that failure as soon as the job ends).
Status progressed() {
  if (!t_polled_job) return Status::ok();
  t_polled_job->progress.fetch_add(1, std::memory_order_relaxed);
  return t_polled_job->given_up.load(std::memory_order_relaxed)
             ? Status::unavailable("local I/O abandoned: the ranks gave up waiting for it")
             : Status::ok();
}

Status long_call(const std::function<Status()>& call) {
  PolledJob* const job = t_polled_job;
  if (!job) return call();
  // Ended on every way out (an exception too: run_polled's worker catches it).
  struct Ended {
    PolledJob& job;
    ~Ended() { job.call_since.store(-1, std::memory_order_relaxed); }
  } ended{*job};
  job->call_since.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  STRATA_RETURN_IF_ERROR(call());
  return progressed();
}

void set_world_load_hook(std::function<Status(int rank, LoadPoint point)> hook) { load_hook() = std::move(hook); }

ManifestTable table_entry(const StoreConfig& config, int t) {
  const TableConfig& tc = config.tables[static_cast<std::size_t>(t)];
  ManifestTable mt = manifest_entry(tc.spec);
  mt.sharding = dispatch::to_string(tc.sharding.type);
  return mt;
}

std::uint64_t new_save_id() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

Status write_piece(const ReadRecords& read, const ManifestTable& mt, const std::string& dir, std::uint64_t save_id,
                   std::uint32_t version, int rank, PieceEntry& piece) {
  const Box& box = piece.box;
  const std::int32_t cols = box.cols, sd = static_cast<std::int32_t>(record_floats(mt, box) - box.cols);
  STRATA_ASSIGN_OR_RETURN(PieceWriter w, PieceWriter::create(dir, piece.file, mt, box, save_id, version));
  const std::int64_t n_max = std::min(kChunkRows, box.rows);
  // Not zero-filled: `read` fills each chunk's rows before they are copied.
  const std::unique_ptr<float[]> weights(new float[static_cast<std::size_t>(n_max * cols)]),
      state(new float[static_cast<std::size_t>(n_max * sd)]),
      records(new float[static_cast<std::size_t>(n_max * (cols + sd))]);
  bool halfway = false;
  for (std::int64_t r = 0; r < box.rows; r += kChunkRows) {
    const std::int64_t n = std::min(kChunkRows, box.rows - r);
    STRATA_RETURN_IF_ERROR(read(r, n, weights.get(), sd ? state.get() : nullptr));
    for (std::int64_t i = 0; i < n; ++i) {
      float* rec = records.get() + i * (cols + sd);
      std::memcpy(rec, weights.get() + i * cols, sizeof(float) * static_cast<std::size_t>(cols));
      if (sd) std::memcpy(rec + cols, state.get() + i * sd, sizeof(float) * static_cast<std::size_t>(sd));
    }
    STRATA_RETURN_IF_ERROR(w.append(records.get(), n));
    STRATA_RETURN_IF_ERROR(progressed());
    if (!halfway && 2 * (r + n) >= box.rows) {
      halfway = true;
      STRATA_RETURN_IF_ERROR(at(rank, SavePoint::kPieceHalfWritten));
    }
  }
  STRATA_RETURN_IF_ERROR(w.commit());
  piece.bytes = w.bytes();
  piece.crc = w.crc();
  return Status::ok();
}

Result<std::uint64_t> next_generation(const std::string& dir) {
  // Only a missing manifest means "no checkpoint here". One that cannot be read or parsed (a newer format, an I/O
  // error) names files this save must not delete as stale: refuse instead.
  Result<Manifest> old = read_manifest(dir);
  if (old) return old.value().generation + 1;
  if (old.status().code() == StatusCode::kNotFound) return std::uint64_t{1};
  return old.status().with_context("save into '" + dir +
                                   "': its manifest cannot be read, so this save would replace a checkpoint it does "
                                   "not understand (expected no manifest or a valid one; move it away or save "
                                   "elsewhere)");
}

Status save_world(Store& store, dispatch::Communicator& comm, const std::string& dir) {
  const std::string what = "save '" + dir + "'";
  const int me = comm.rank(), world = comm.size();
  const int tables = static_cast<int>(store.config().tables.size());
  // A collective that failed broke the communicator (a rank that never came, named): each rank says what it knows of
  // the directory.
  const auto lost = [&](const Status& s, const std::string& state) {
    return Status::from_code(s.code(), what + ": " + s.message() + " (" + state + ")");
  };
  const std::string untouched = "nothing committed; the previous checkpoint stays";
  // 1. Start: the directory, and the same step on every rank (else nothing is written).
  Status local = at(me, SavePoint::kStart);
  if (local.is_ok()) local = make_dirs(dir);
  Result<Gathered> start = gather_outcomes(comm, local, store.step(), 0);
  if (!start) return lost(start.status(), untouched);
  STRATA_RETURN_IF_ERROR(first_failure(start.value(), what));
  bool same = true;
  std::string steps;
  for (int r = 0; r < world; ++r) {
    const std::int64_t s = start.value().outcome[static_cast<std::size_t>(r)].value[0];
    same = same && s == start.value().outcome[0].value[0];
    steps += (r ? ", rank " : "rank ") + std::to_string(r) + " at " + std::to_string(s);
  }
  if (!same)
    return Status::failed_precondition(what + ": ranks are at different steps: " + steps +
                                       " (expected every rank after the same backward; nothing written)");
  // 2. The lock: rank 0 alone takes it (flock conflicts between the threads of one process too), polling, so that a
  // wait for another saver is a series of short collectives that never time out the peers.
  DirLock lock;
  for (;;) {
    Status s;
    std::int64_t held = 0;
    if (me == 0) {
      Result<DirLock> l = DirLock::try_acquire(dir, kLockFile);
      if (!l) {
        s = l.status();
      } else if (l.value().held()) {
        lock = std::move(l).value();
        held = 1;
        s = at(0, SavePoint::kLocked);
      }
    }
    Result<Gathered> g = gather_outcomes(comm, s, held, 0);
    if (!g) return lost(g.status(), untouched);
    STRATA_RETURN_IF_ERROR(first_failure(g.value(), what));
    if (g.value().outcome[0].value[0] == 1) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  // 3. The generation and this save's id (rank 0's).
  std::uint64_t generation = 0, save_id = 0;
  {
    Status s;
    if (me == 0) {
      Result<std::uint64_t> next = next_generation(dir);
      if (next)
        generation = next.value();
      else
        s = next.status();
      save_id = new_save_id();
    }
    Result<Gathered> g =
        gather_outcomes(comm, s, static_cast<std::int64_t>(generation), static_cast<std::int64_t>(save_id));
    if (!g) return lost(g.status(), untouched);
    STRATA_RETURN_IF_ERROR(first_failure(g.value(), what));
    generation = static_cast<std::uint64_t>(g.value().outcome[0].value[0]);
    save_id = static_cast<std::uint64_t>(g.value().outcome[0].value[1]);
  }
  // 4. This rank's pieces, polled: a rank writing a whole table keeps its peers' collectives short. Every rank has the
  // same config, so the same format.
  const std::uint32_t version = save_format(store.config(), true);
  std::vector<PieceInfo> mine(static_cast<std::size_t>(tables));
  Status wrote;
  Result<bool> written = run_polled(
      &comm, [&] { return write_pieces(store, me, world, dir, generation, save_id, version, mine); }, wrote);
  if (!written) return lost(written.status(), untouched);
  if (wrote.is_ok()) wrote = at(me, SavePoint::kPiecesCommitted);
  // 5. Durable: every rank's pieces renamed into place (or the first failure, on every rank; nothing committed).
  std::string extra(sizeof(PieceInfo) * mine.size(), '\0');
  if (!mine.empty()) std::memcpy(&extra[0], mine.data(), extra.size());
  Result<Gathered> durable = gather_outcomes(comm, wrote, 0, 0, extra);
  if (!durable) return lost(durable.status(), untouched);
  if (Status s = first_failure(durable.value(), what); !s.is_ok())
    return Status::from_code(s.code(), s.message() + " (" + untouched + ")");
  // 6. Commit: rank 0 writes the manifest (polled: its fsyncs may take long); every rank returns its result.
  Status committed;
  std::vector<std::string> files;
  Result<bool> ran = run_polled(
      &comm,
      [&] {
        return me == 0 ? commit_manifest(store, dir, generation, save_id, version, world, durable.value().extra, files)
                       : Status::ok();
      },
      committed);
  if (ran) (void)at(me, SavePoint::kCommitted);
  Result<Gathered> done = ran ? gather_outcomes(comm, committed, 0, 0) : Result<Gathered>(ran.status());
  if (!done) {
    if (me != 0)
      return lost(done.status(),
                  "the checkpoint may have been committed: every rank's pieces were durable, and this rank could not "
                  "learn from rank 0 whether it renamed the manifest");
    if (!committed.is_ok())
      return Status::from_code(committed.code(),
                               what + ": rank 0: " + committed.message() +
                                   " (and the other ranks could not be told: " + done.status().message() + ")");
    remove_stale_files(dir, files);
    return lost(done.status(), "the manifest was committed: the checkpoint is saved; the other ranks may not know");
  }
  STRATA_RETURN_IF_ERROR(first_failure(done.value(), what));
  // 7. Cleanup under the lock: the previous generation and whatever failed saves left (rank 0; polled: many large
  // unlinks may take long).
  Status cleaned;
  Result<bool> swept = run_polled(
      &comm,
      [&] {
        if (me == 0) remove_stale_files(dir, files, progressed);
        return Status::ok();
      },
      cleaned);
  if (!swept)
    return lost(swept.status(), "the manifest was committed: the checkpoint is saved; stale files may remain");
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Load

namespace {

// A checkpoint as load sees it: one manifest, matched to the store's tables, planned, and this rank's pieces open
// and verified.
struct Prepared {
  Manifest manifest;
  std::vector<std::size_t> entry;  // per config table: its index in manifest.tables
  std::vector<TablePlan> plans;    // per config table
  bool convert_dtypes = false;     // load_converting_dtypes: verify refuses what the tables cannot hold
  std::vector<std::vector<std::pair<std::size_t, PieceReader>>> readers;  // per config table: (piece, reader) I read
  std::vector<DynamicState> dynamic;  // per config table: this rank's shard of a dynamic table, checked (dense: empty)
};

// Parses `text`, matches it to the config and plans every table. The same on every rank (same text, same config).
Result<Prepared> plan_load(const Store& store, int world, const std::string& dir, const std::string& text,
                           bool convert_dtypes) {
  Prepared c;
  STRATA_ASSIGN_OR_RETURN(c.manifest, parse_manifest(join(dir, kManifest), text));
  const auto& tables = store.config().tables;
  constexpr std::size_t kNone = ~std::size_t{0};
  c.entry.assign(tables.size(), kNone);
  for (std::size_t i = 0; i < c.manifest.tables.size(); ++i) {
    const ManifestTable& mt = c.manifest.tables[i];
    auto idx = store.table_index(mt.name);
    if (!idx)
      return Status::invalid_argument(dir + ": checkpoint has table '" + mt.name +
                                      "' that the store config does not define");
    c.entry[static_cast<std::size_t>(idx.value())] = i;
  }
  for (std::size_t ti = 0; ti < tables.size(); ++ti) {
    const TableSpec& spec = tables[ti].spec;
    if (c.entry[ti] == kNone)
      return Status::invalid_argument(dir + ": checkpoint has no table '" + spec.name +
                                      "' (expected every table of the config)");
    const ManifestTable& mt = c.manifest.tables[c.entry[ti]];
    const bool dynamic = tables[ti].dynamic.has_value();
    const auto kind = [](bool d) { return d ? "a dynamic table" : "a dense table"; };
    if (mt.dynamic != dynamic)
      return Status::invalid_argument(dir + ": table '" + spec.name + "' is " + kind(mt.dynamic) +
                                      " in the checkpoint and " + kind(dynamic) + " in the store config (expected " +
                                      kind(dynamic) + ")");
    if (dynamic && mt.rows != spec.rows)
      return Status::invalid_argument(dir + ": dynamic table '" + spec.name + "': capacity " + std::to_string(mt.rows) +
                                      " in the checkpoint (expected " + std::to_string(spec.rows) +
                                      " from the store config)");
    STRATA_RETURN_IF_ERROR(
        check_entry(mt, spec, optimizer_state_dim(spec.optimizer.kind, spec.dim), dir, convert_dtypes));
    if (dynamic) {  // no plan: its files are read whole (open_pieces, dynamic_shard) and applied at the end
      c.plans.emplace_back();
      continue;
    }
    std::vector<Box> pieces;
    for (const PieceEntry& p : mt.pieces) pieces.push_back(p.box);
    Result<TablePlan> plan = plan_table(spec, tables[ti].sharding, static_cast<int>(ti), world, std::move(pieces));
    if (!plan) return plan.status().with_context(dir + ": table '" + spec.name + "'");
    c.plans.push_back(std::move(plan).value());
  }
  c.convert_dtypes = convert_dtypes;
  return c;
}

// Whether the pieces of dynamic table `mt` are the shards of the store's layout (`layout`: of a world of `world`): as
// many as ranks, and (past one rank) of the same sharding, each of its rank's capacity (table: the same owner).
bool same_layout(const ManifestTable& mt, const TableConfig& tc, int world, const dispatch::ShardLayout& layout) {
  if (mt.pieces.size() != static_cast<std::size_t>(world)) return false;
  if (world == 1) return true;  // one index of the whole capacity, whatever the sharding
  if (mt.sharding != dispatch::to_string(tc.sharding.type)) return false;
  for (int r = 0; r < world; ++r)
    if (mt.pieces[static_cast<std::size_t>(r)].capacity != layout.key_capacity(r)) return false;
  return true;
}

// This rank's shard of dynamic table `ti` from the pieces of `c` (read and checked, nothing changed; `world` 0: a store
// without a world). The same layout: its own piece exactly (rows, order, clock, sketch). Else (a reshard) every piece,
// keeping the keys this rank owns under the store's layout, ordered by last use, then piece (the saving rank), then
// position in it, on rows 0 to n - 1, at the pieces' clock, with an empty sketch (keys seen but not admitted count
// afresh): kFailedPrecondition naming the table, the rank, the keys and its capacity when they do not fit.
Result<DynamicState> dynamic_shard(const StoreConfig& config, int me, int world, const std::string& dir,
                                   const Prepared& c, std::size_t ti) {
  const ManifestTable& mt = c.manifest.tables[c.entry[ti]];
  const TableConfig& tc = config.tables[ti];
  const auto t = static_cast<int>(ti);
  dispatch::ShardLayout layout;  // a world's (a store without one: one index of the whole capacity)
  if (world > 0) layout = key_layout(config, t, world);
  const auto owner = [&](Key k) { return world > 0 ? layout.key_owner(k) : 0; };
  const std::int64_t capacity = world > 0 ? layout.key_capacity(me) : tc.spec.rows;
  const auto read = [&](const PieceEntry& p, bool keep_sketch) {
    return read_dynamic_piece(dir, mt, p, c.manifest.version, c.manifest.save_id, tc, c.convert_dtypes, keep_sketch);
  };
  if (same_layout(mt, tc, std::max(world, 1), layout)) {
    const PieceEntry& p = mt.pieces[static_cast<std::size_t>(me)];
    STRATA_ASSIGN_OR_RETURN(DynamicState s, read(p, true));
    for (std::size_t i = 0; i < s.entries.size(); ++i) {
      const Key k = s.entries[i].key;
      if (owner(k) != me)
        return Status::data_loss(join(dir, p.file) + " (dynamic table '" + mt.name + "'): key " + std::to_string(k) +
                                 " is rank " + std::to_string(owner(k)) +
                                 "'s under the table's layout (expected only rank " + std::to_string(me) +
                                 "'s keys in its piece; corrupt)");
      if ((i + 1) % kChunkRows == 0) STRATA_RETURN_IF_ERROR(progressed());
    }
    STRATA_RETURN_IF_ERROR(progressed());
    return s;
  }
  // A reshard: the kept entries in piece order (then position), each with its weights and state.
  const auto dim = static_cast<std::size_t>(tc.spec.dim);
  const auto sd = static_cast<std::size_t>(optimizer_state_dim(tc.spec.optimizer.kind, tc.spec.dim));
  DynamicState kept;
  for (const PieceEntry& p : mt.pieces) {
    STRATA_ASSIGN_OR_RETURN(DynamicState s, read(p, false));
    kept.clock = s.clock;  // the manifest's (checked against each header), or format 4's one piece's
    for (std::size_t i = 0; i < s.entries.size(); ++i) {
      if ((i + 1) % kChunkRows == 0) STRATA_RETURN_IF_ERROR(progressed());
      if (owner(s.entries[i].key) != me) continue;
      kept.entries.push_back(s.entries[i]);
      kept.weights.insert(kept.weights.end(), s.weights.begin() + static_cast<std::ptrdiff_t>(i * dim),
                          s.weights.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
      kept.state.insert(kept.state.end(), s.state.begin() + static_cast<std::ptrdiff_t>(i * sd),
                        s.state.begin() + static_cast<std::ptrdiff_t>((i + 1) * sd));
    }
    STRATA_RETURN_IF_ERROR(progressed());
  }
  const auto n = static_cast<std::int64_t>(kept.entries.size());
  if (n > capacity)
    return Status::failed_precondition("dynamic table '" + mt.name + "': rank " + std::to_string(me) + "'s shard of " +
                                       std::to_string(capacity) + " rows would hold " + std::to_string(n) +
                                       " of the checkpoint's keys (expected at most its capacity " +
                                       std::to_string(capacity) + "; the checkpoint's " +
                                       std::to_string(mt.pieces.size()) + " shards do not reshard into this world)");
  // Last use ascending; ties keep piece, then position, order (stable).
  std::vector<std::size_t> order(kept.entries.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  STRATA_RETURN_IF_ERROR(long_call([&] {
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return kept.entries[a].last_use < kept.entries[b].last_use; });
    return Status::ok();
  }));
  DynamicState s;
  s.clock = kept.clock;
  s.entries.reserve(order.size());  // its pages untouched until filled, chunk by chunk
  s.weights.reserve(kept.weights.size());
  s.state.reserve(kept.state.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::size_t k = order[i];
    s.entries.push_back(KeyIndex::Entry{kept.entries[k].key, static_cast<std::int64_t>(i), kept.entries[k].last_use,
                                        kept.entries[k].count});
    const auto w = kept.weights.begin() + static_cast<std::ptrdiff_t>(k * dim);
    s.weights.insert(s.weights.end(), w, w + static_cast<std::ptrdiff_t>(dim));
    const auto x = kept.state.begin() + static_cast<std::ptrdiff_t>(k * sd);
    s.state.insert(s.state.end(), x, x + static_cast<std::ptrdiff_t>(sd));
    if ((i + 1) % kChunkRows == 0) STRATA_RETURN_IF_ERROR(progressed());
  }
  // What this shard's index would refuse (a key in two pieces), refused before any table changes.
  Status r;
  STRATA_RETURN_IF_ERROR(long_call([&] {
    KeyIndex probe(std::max<std::int64_t>(capacity, 1), *tc.dynamic);
    r = probe.restore(s.clock, s.entries, {});
    return Status::ok();
  }));
  if (!r.is_ok())
    return Status::data_loss(dir + ": dynamic table '" + mt.name + "': the keys of its pieces for rank " +
                             std::to_string(me) + "'s shard: " + r.message() + " (corrupt)");
  return s;
}

// Opens (every one first, to keep the window in which a concurrent save removes one short) and verifies the pieces
// this rank reads; reads this rank's shard of each dynamic table (dynamic_shard). `world` 0: a store without a world.
Status open_pieces(Store& store, int me, int world, const std::string& dir, Prepared& c) {
  const auto& tables = store.config().tables;
  c.readers.clear();
  c.readers.resize(tables.size());
  c.dynamic.clear();
  c.dynamic.resize(tables.size());
  for (std::size_t ti = 0; ti < tables.size(); ++ti) {
    const ManifestTable& mt = c.manifest.tables[c.entry[ti]];
    if (mt.dynamic) {
      STRATA_ASSIGN_OR_RETURN(c.dynamic[ti], dynamic_shard(store.config(), me, world, dir, c, ti));
      continue;
    }
    // The plan's target for this rank is this store's shard: else the plan and the engines disagree (a bug).
    Result<ShardInfo> si = store.shard_info(static_cast<int>(ti));
    if (!si) return si.status();
    if (box_of(si.value()) != c.plans[ti].targets[static_cast<std::size_t>(me)])
      return Status::internal("table '" + tables[ti].spec.name +
                              "': the load plan's shard of this rank differs from the store's (a bug)");
    for (std::size_t k = 0; k < mt.pieces.size(); ++k) {
      if (c.plans[ti].reader[k] != me) continue;
      STRATA_ASSIGN_OR_RETURN(PieceReader r,
                              PieceReader::open(dir, mt, mt.pieces[k], c.manifest.version, c.manifest.save_id));
      c.readers[ti].emplace_back(k, std::move(r));
    }
  }
  for (std::size_t ti = 0; ti < tables.size(); ++ti)
    for (auto& kr : c.readers[ti]) {
      STRATA_RETURN_IF_ERROR(kr.second.verify(progressed, c.convert_dtypes ? &tables[ti].spec : nullptr));
      STRATA_RETURN_IF_ERROR(at(me, LoadPoint::kPieceVerified));
    }
  return Status::ok();
}

// Copies table `ti`'s rows, span by span: each reader reads its pieces' runs and packs what each rank holds, one
// all_to_all_v moves them (when any row crosses ranks), each rank writes its window. Each side of the exchange runs
// polled (run_polled: a table that crosses no rank is copied with collectives as short as the others'), and the last
// round of each tells every rank whether any rank failed: then no rank writes that span or any later one (`stopped`,
// set alike on every rank), so no rank writes records a failed reader could not read. A rank whose exchange failed
// alone (a device-staged collective can, leaving the communicator usable) writes nothing of that span and stops every
// rank after it. Returns this rank's first failure (reported at load_pieces' final gather), or the error of the polled
// rounds, also in `rounds` (the same on every rank: a broken communicator or a rank whose I/O is stuck).
// A float buffer that only grows, its memory not zero-filled (every element a span uses is written before it is
// read): load's span buffers, kept across spans and tables, so that a load neither zero-fills nor faults in fresh
// memory per table (for tables of one span, that was most of a load's time).
class SpanBuffer {
 public:
  float* get(std::int64_t floats) {
    const std::size_t n = static_cast<std::size_t>(floats);
    if (n > size_) {
      data_.reset();  // the old one first: the peak stays one buffer
      size_ = 0;      // and no stale size if the next allocation throws
      data_.reset(new float[n]);
      size_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<float[]> data_;
  std::size_t size_ = 0;
};

// copy_table's buffers, kept by load_pieces across its tables.
struct CopyBuffers {
  std::vector<SpanBuffer> runs;  // per piece of a table
  SpanBuffer send, recv, weights, state;
};

Status copy_table(Store& store, dispatch::Communicator* comm, int me, int world, Prepared& c, std::size_t ti,
                  CopyBuffers& buf, bool& stopped, Status& rounds) {
  const TablePlan& p = c.plans[ti];
  const Box& target = p.targets[static_cast<std::size_t>(me)];
  const TableSpec& spec = store.config().tables[ti].spec;
  const std::int32_t sd = optimizer_state_dim(spec.optimizer.kind, target.cols);
  if (buf.runs.size() < p.pieces.size()) buf.runs.resize(p.pieces.size());
  std::vector<const float*> records(p.pieces.size(), nullptr);
  std::vector<std::int64_t> send_counts(static_cast<std::size_t>(world)), send_displs(send_counts.size()),
      recv_counts(send_counts.size()), recv_displs(send_counts.size());
  // Nothing crosses ranks: this rank's own share of `send` is all it receives, unpacked from there.
  const bool exchange = comm && p.crosses;
  Status failed;
  const auto note = [&](const Status& s) {
    if (failed.is_ok()) failed = s;
  };
  for (std::int64_t row0 = 0; row0 < p.rows && !stopped; row0 += p.span_rows) {
    const std::int64_t n = std::min(p.span_rows, p.rows - row0);
    std::int64_t sent = 0, received = 0;
    for (int q = 0; q < world; ++q) {
      const std::size_t qi = static_cast<std::size_t>(q);
      send_counts[qi] = span_bytes(p, me, q, row0, n);
      recv_counts[qi] = span_bytes(p, q, me, row0, n);
      send_displs[qi] = sent;
      recv_displs[qi] = received;
      sent += send_counts[qi];
      received += recv_counts[qi];
    }
    float* const send = buf.send.get(sent / static_cast<std::int64_t>(sizeof(float)));
    float* const recv = exchange ? buf.recv.get(received / static_cast<std::int64_t>(sizeof(float))) : nullptr;
    // Read and pack; a piece's last span also checks its CRC (finish), before its last rows are written anywhere.
    Status read;
    Result<bool> any = run_polled(
        comm,
        [&] {
          if (!c.readers[ti].empty()) STRATA_RETURN_IF_ERROR(at(me, LoadPoint::kSpanRead));
          for (auto& kr : c.readers[ti]) {
            const std::size_t k = kr.first;
            const std::int64_t cnt = local_range(p.pieces[k], row0, n).second;
            float* const run = buf.runs[k].get(cnt * kr.second.width());
            if (cnt > 0) STRATA_RETURN_IF_ERROR(kr.second.read_next(cnt, run));
            STRATA_RETURN_IF_ERROR(progressed());
            records[k] = run;
            if (row0 + n >= p.rows) STRATA_RETURN_IF_ERROR(kr.second.finish());
          }
          pack_span(p, me, row0, n, records, send, send_displs);
          return Status::ok();
        },
        read);
    if (!any) {
      stopped = true;
      rounds = any.status();
      return rounds;
    }
    note(read);
    if (any.value()) {
      stopped = true;  // a reader failed: nobody writes this span
      break;
    }
    Status moved;
    if (exchange)
      moved = comm->all_to_all_v(send, send_counts.data(), send_displs.data(), recv, recv_counts.data(),
                                 recv_displs.data());
    // Unpack and write (a failed exchange writes nothing: the window is not the checkpoint's).
    Status wrote;
    any = run_polled(
        comm,
        [&] {
          STRATA_RETURN_IF_ERROR(moved);
          const std::pair<std::int64_t, std::int64_t> run = local_range(target, row0, n);
          float* const weights = buf.weights.get(run.second * target.cols);
          float* const state = buf.state.get(run.second * sd);
          // Without an exchange only this rank's share holds records (at send_displs[me]; the others are empty).
          unpack_span(p, me, row0, n, exchange ? recv : send, exchange ? recv_displs : send_displs, weights, state);
          if (run.second == 0 || target.cols == 0) return Status::ok();
          STRATA_RETURN_IF_ERROR(
              store.write_shard(static_cast<int>(ti), run.first, run.second, weights, sd ? state : nullptr));
          STRATA_RETURN_IF_ERROR(progressed());
          return at(me, LoadPoint::kSpanWritten);
        },
        wrote);
    if (!any) {
      stopped = true;
      rounds = any.status();
      return rounds;
    }
    note(wrote);
    if (any.value()) stopped = true;
  }
  if (p.rows == 0)  // no span: the (header-only) pieces are checked here
    for (auto& kr : c.readers[ti]) note(kr.second.finish());
  return failed;
}

// 6. Step and rates, the same manifest's on every rank.
Loaded loaded(Prepared& c) {
  Loaded got;
  got.step = c.manifest.step;
  for (std::size_t ti = 0; ti < c.entry.size(); ++ti) {
    const ManifestTable& mt = c.manifest.tables[c.entry[ti]];
    got.rate.push_back(mt.learning_rate);
    got.has_rate.push_back(mt.has_learning_rate);
  }
  return got;
}

}  // namespace

Result<Loaded> load_pieces(Store& store, dispatch::Communicator* comm, const std::string& dir,
                           const std::string* pinned_manifest, bool convert_dtypes) {
  const int me = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  const std::string what = "load '" + dir + "'";
  const std::string path = join(dir, kManifest);
  // A collective that failed before the copy (the communicator is broken, naming the rank that never came).
  const auto nothing_changed = [&](const Status& s) {
    return Status::from_code(s.code(), what + ": " + s.message() + " (nothing changed)");
  };
  // Before the copy: `s` of this rank agreed ("load '<dir>': rank r: ...", the same on every rank), or the failed
  // collective's error, each saying that nothing changed (a store without a world: its own `s`).
  const auto agree = [&](const Status& s) {
    if (!comm) return s;
    Result<Gathered> g = gather_outcomes(*comm, s, 0, 0);
    if (!g) return nothing_changed(g.status());
    const Status first = first_failure(g.value(), what);
    return first.is_ok() ? first : Status::from_code(first.code(), first.message() + " (nothing changed)");
  };
  STRATA_RETURN_IF_ERROR(agree(store.in_flight() > 0 ? busy("load", store.in_flight()) : Status::ok()));
  // 1. One manifest for all: rank 0's.
  std::string text;
  {
    Status s;
    if (pinned_manifest) {
      text = *pinned_manifest;
    } else if (me == 0) {
      Result<std::string> t = read_file(path);
      if (t)
        text = std::move(t).value();
      else
        s = t.status();
    }
    STRATA_RETURN_IF_ERROR(agree(s));
    if (Status b = broadcast_text(comm, text); !b.is_ok()) return nothing_changed(b);
  }
  // 2-3. Plan, open and verify, before any row changes. A failure caused by a save that replaced the manifest
  // meanwhile (its cleanup removed a piece this one names) starts over with the new manifest, unless it is pinned.
  std::optional<Prepared> prepared;
  for (int attempt = 1;; ++attempt) {
    Status s;
    Result<Prepared> planned = plan_load(store, world, dir, text, convert_dtypes);
    const Status plan = planned.status();
    if (planned) prepared = std::move(planned).value();
    // Verifying reads whole pieces (a 1 -> M load reads a big table on one rank): polled.
    Result<bool> verified = run_polled(
        comm, [&] { return plan.is_ok() ? open_pieces(store, me, comm ? world : 0, dir, *prepared) : plan; }, s);
    if (!verified) return nothing_changed(verified.status());
    s = agree(s);
    if (s.is_ok()) break;
    if (pinned_manifest) return s;
    std::string now;
    Status reread;
    std::int64_t changed = 0;
    if (me == 0) {
      Result<std::string> n = read_file(path);
      if (n && n.value() != text) {
        changed = 1;
        now = std::move(n).value();
      }
    }
    if (comm)
      if (Status b = comm->broadcast(&changed, sizeof changed, 0); !b.is_ok()) return nothing_changed(b);
    if (!changed) return s;
    if (attempt == kLoadAttempts)
      return s.with_context(dir + ": the checkpoint was replaced " + std::to_string(attempt) +
                            " times while load read it");
    if (Status b = broadcast_text(comm, now); !b.is_ok()) return nothing_changed(b);
    text = std::move(now);
  }
  Prepared& c = *prepared;
  // 4. Nothing has changed yet. Write dirty cached rows back first, so that a device error there still leaves every
  // rank as it was.
  Status flushed;
  Result<bool> ran = run_polled(
      comm, [&] { return store.flush(); }, flushed);
  if (!ran) return nothing_changed(ran.status());
  STRATA_RETURN_IF_ERROR(agree(flushed));
  // 5. Copy, table by table, span by span, through the descriptors verified above.
  const std::string mixed =
      "(the tables may now hold a mix of their previous rows and the checkpoint's; step unchanged; load again)";
  // The first failure on any rank stops every rank's copy (a store without a world: at its first failing table).
  Status copied, rounds;
  CopyBuffers buffers;
  bool stopped = false;
  std::string at_table = "after every table";  // where this rank's copy ended
  for (std::size_t ti = 0; ti < c.plans.size() && !stopped; ++ti) {
    if (c.manifest.tables[c.entry[ti]].dynamic) continue;  // after the dense ones
    Status s = copy_table(store, comm, me, world, c, ti, buffers, stopped, rounds);
    if (stopped || !s.is_ok()) at_table = "into table '" + store.config().tables[ti].spec.name + "'";
    if (copied.is_ok() && !s.is_ok())
      copied = s.with_context(dir + ": load failed while copying rows into table '" +
                              store.config().tables[ti].spec.name + "' " + mixed);
  }
  // Then each rank's shard of each dynamic table (local: DynamicAccess::write_dynamic), polled as the copy is, a
  // failure on any rank stopping every rank before the next table.
  for (std::size_t ti = 0; ti < c.plans.size() && !stopped; ++ti) {
    if (!c.manifest.tables[c.entry[ti]].dynamic) continue;
    const std::string table = store.config().tables[ti].spec.name;
    Status s;
    Result<bool> any = run_polled(
        comm,
        [&] {
          return long_call([&] { return dynamic_access(store).write_dynamic(static_cast<int>(ti), c.dynamic[ti]); });
        },
        s);
    c.dynamic[ti] = DynamicState();
    if (!any) rounds = any.status();
    if (!any || any.value()) {
      stopped = true;
      at_table = "into table '" + table + "'";
    }
    if (copied.is_ok() && !s.is_ok())
      copied = s.with_context(dir + ": load failed while copying rows into table '" + table + "' " + mixed);
  }
  if (!comm) {
    if (!copied.is_ok()) return copied;
    return loaded(c);
  }
  // The polled rounds failed (in step on every rank: a broken communicator, a rank's I/O stuck): no final gather, which
  // would wait for a stuck rank.
  Result<Gathered> all = rounds.is_ok() ? gather_outcomes(*comm, copied, 0, 0) : Result<Gathered>(rounds);
  if (!all)  // the communicator broke (during the copy of `at_table` or at this gather), or a rank's I/O is stuck
    return Status::from_code(all.status().code(), what + ": load failed while copying rows " + at_table + ": " +
                                                      all.status().message() + " " + mixed);
  STRATA_RETURN_IF_ERROR(first_failure(all.value(), what));
  return loaded(c);
}

}  // namespace strata::detail
