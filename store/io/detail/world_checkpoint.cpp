// The checkpoint protocol of a world and the one loader (see world_checkpoint.hpp).

#include "store/io/detail/world_checkpoint.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <type_traits>
#include <utility>

#include "dispatch/communicator.hpp"
#include "dispatch/sharding_plan.hpp"
#include "store/detail/batch_checks.hpp"
#include "store/io/detail/checkpoint_format.hpp"
#include "store/io/detail/reshard.hpp"
#include "store/io/file_io.hpp"
#include "store/store.hpp"

namespace strata::detail {
namespace {

std::function<Status(int, SavePoint)>& save_hook() {
  static std::function<Status(int, SavePoint)> hook;
  return hook;
}

Status at(int rank, SavePoint point) { return save_hook() ? save_hook()(rank, point) : Status::ok(); }

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
  STRATA_RETURN_IF_ERROR(comm.all_gather(send.data(), static_cast<std::int64_t>(each), &recv[0]));
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

// `status` of this rank, agreed: every rank returns the first failing rank's. A store without a world (comm null)
// returns its own, unchanged.
Status agreed(dispatch::Communicator* comm, const Status& status, const std::string& what) {
  if (!comm) return status;
  STRATA_ASSIGN_OR_RETURN(Gathered g, gather_outcomes(*comm, status, 0, 0));
  return first_failure(g, what);
}

// Rank 0's `text` on every rank.
Status broadcast_text(dispatch::Communicator* comm, std::string& text) {
  if (!comm) return Status::ok();
  std::int64_t n = static_cast<std::int64_t>(text.size());
  STRATA_RETURN_IF_ERROR(comm->broadcast(&n, sizeof n, 0));
  text.resize(static_cast<std::size_t>(n));
  return n == 0 ? Status::ok() : comm->broadcast(&text[0], n, 0);
}

// The manifest entry of config table `t` (its pieces not yet listed).
ManifestTable table_entry(const StoreConfig& config, int t) {
  const TableConfig& tc = config.tables[static_cast<std::size_t>(t)];
  ManifestTable mt;
  mt.name = tc.spec.name;
  mt.rows = tc.spec.rows;
  mt.dim = tc.spec.dim;
  mt.state_dim = optimizer_state_dim(tc.spec.optimizer.kind, tc.spec.dim);
  mt.dtype = to_string(tc.spec.dtype);
  mt.optimizer = to_string(tc.spec.optimizer.kind);
  mt.learning_rate = tc.spec.optimizer.learning_rate;
  mt.has_learning_rate = true;
  mt.sharding = dispatch::to_string(tc.sharding.type);
  return mt;
}

// What a rank tells the others about its piece of one table at the durable gather.
struct PieceInfo {
  std::int32_t present = 0;
  std::uint32_t crc = 0;
  std::uint64_t bytes = 0;
  Box box;
};
static_assert(std::is_trivially_copyable<PieceInfo>::value, "gathered as bytes");

// Writes this rank's piece `file` of table `t` (its shard `box`): read_shard in chunks, records interleaved.
Status write_piece(Store& store, int t, const ManifestTable& mt, const Box& box, const std::string& dir,
                   const std::string& file, std::uint64_t save_id, int rank, PieceInfo& info) {
  const TableSpec& spec = store.config().tables[static_cast<std::size_t>(t)].spec;
  const std::int32_t cols = box.cols, sd = optimizer_state_dim(spec.optimizer.kind, box.cols);
  STRATA_ASSIGN_OR_RETURN(PieceWriter w, PieceWriter::create(dir, file, mt, box, save_id));
  const std::int64_t n_max = std::min(kChunkRows, box.rows);
  std::vector<float> weights(static_cast<std::size_t>(n_max * cols)), state(static_cast<std::size_t>(n_max * sd));
  std::vector<float> records(static_cast<std::size_t>(n_max * (cols + sd)));
  bool halfway = false;
  for (std::int64_t r = 0; r < box.rows; r += kChunkRows) {
    const std::int64_t n = std::min(kChunkRows, box.rows - r);
    STRATA_RETURN_IF_ERROR(store.read_shard(t, r, n, weights.data(), sd ? state.data() : nullptr));
    for (std::int64_t i = 0; i < n; ++i) {
      float* rec = records.data() + i * (cols + sd);
      std::memcpy(rec, weights.data() + i * cols, sizeof(float) * static_cast<std::size_t>(cols));
      if (sd) std::memcpy(rec + cols, state.data() + i * sd, sizeof(float) * static_cast<std::size_t>(sd));
    }
    STRATA_RETURN_IF_ERROR(w.append(records.data(), n));
    if (!halfway && 2 * (r + n) >= box.rows) {
      halfway = true;
      STRATA_RETURN_IF_ERROR(at(rank, SavePoint::kPieceHalfWritten));
    }
  }
  STRATA_RETURN_IF_ERROR(w.commit());
  info.present = 1;
  info.box = box;
  info.bytes = w.bytes();
  info.crc = w.crc();
  return Status::ok();
}

// Rank 0's commit: the manifest listing every rank's pieces, checked against the directory as rank 0 sees it.
Status commit_manifest(const Store& store, const std::string& dir, std::uint64_t generation, std::uint64_t save_id,
                       int world, const std::vector<std::string>& extra, std::vector<std::string>& files) {
  const StoreConfig& config = store.config();
  Manifest m;
  m.version = 2;
  m.generation = generation;
  m.save_id = save_id;
  m.world = world;
  m.step = store.step();
  m.config = to_json(config);
  for (int t = 0; t < static_cast<int>(config.tables.size()); ++t) {
    ManifestTable mt = table_entry(config, t);
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
      struct stat st {};
      if (::stat(join(dir, e.file).c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != e.bytes)
        return Status::failed_precondition(
            "rank " + std::to_string(r) + "'s piece '" + e.file + "' is not in '" + dir +
            "' as rank 0 sees it (every rank must save into one directory on a file system they share)");
      boxes.push_back(e.box);
      names.push_back(e.file);
      files.push_back(e.file);
      mt.pieces.push_back(std::move(e));
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
  // 1. Start: the directory, and the same step on every rank (else nothing is written).
  Status local = at(me, SavePoint::kStart);
  if (local.is_ok()) local = make_dirs(dir);
  STRATA_ASSIGN_OR_RETURN(Gathered start, gather_outcomes(comm, local, store.step(), 0));
  STRATA_RETURN_IF_ERROR(first_failure(start, what));
  bool same = true;
  std::string steps;
  for (int r = 0; r < world; ++r) {
    const std::int64_t s = start.outcome[static_cast<std::size_t>(r)].value[0];
    same = same && s == start.outcome[0].value[0];
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
    STRATA_ASSIGN_OR_RETURN(Gathered g, gather_outcomes(comm, s, held, 0));
    STRATA_RETURN_IF_ERROR(first_failure(g, what));
    if (g.outcome[0].value[0] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
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
      std::random_device rd;
      save_id = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    }
    STRATA_ASSIGN_OR_RETURN(Gathered g, gather_outcomes(comm, s, static_cast<std::int64_t>(generation),
                                                        static_cast<std::int64_t>(save_id)));
    STRATA_RETURN_IF_ERROR(first_failure(g, what));
    generation = static_cast<std::uint64_t>(g.outcome[0].value[0]);
    save_id = static_cast<std::uint64_t>(g.outcome[0].value[1]);
  }
  // 4. This rank's pieces: the shards it holds, a replicated table by one replica (spread over the ranks by table).
  std::vector<PieceInfo> mine(static_cast<std::size_t>(tables));
  Status wrote;
  for (int t = 0; t < tables && wrote.is_ok(); ++t) {
    Result<ShardInfo> si = store.shard_info(t);
    if (!si) {
      wrote = si.status();
      break;
    }
    const std::vector<int>& replicas = si.value().replicas;
    if (replicas.empty() || replicas[static_cast<std::size_t>(t) % replicas.size()] != me) continue;
    const Box box = box_of(si.value());
    if (box.empty()) continue;
    const ManifestTable mt = table_entry(store.config(), t);
    const std::string file = piece_file_name(mt.name, generation, save_id, me);
    wrote = write_piece(store, t, mt, box, dir, file, save_id, me, mine[static_cast<std::size_t>(t)]);
    if (!wrote.is_ok()) wrote = wrote.with_context("piece '" + file + "'");
  }
  if (wrote.is_ok()) wrote = at(me, SavePoint::kPiecesCommitted);
  // 5. Durable: every rank's pieces renamed into place (or the first failure, on every rank; nothing committed).
  std::string extra(sizeof(PieceInfo) * mine.size(), '\0');
  if (!mine.empty()) std::memcpy(&extra[0], mine.data(), extra.size());
  Result<Gathered> durable = gather_outcomes(comm, wrote, 0, 0, extra);
  if (!durable) return durable.status().with_context(what + " (nothing committed)");
  if (Status s = first_failure(durable.value(), what); !s.is_ok())
    return Status::from_code(s.code(), s.message() + " (nothing committed; the previous checkpoint stays)");
  // 6. Commit: rank 0 writes the manifest; every rank returns its result.
  Status committed;
  std::vector<std::string> files;
  if (me == 0) committed = commit_manifest(store, dir, generation, save_id, world, durable.value().extra, files);
  STRATA_ASSIGN_OR_RETURN(Gathered done, gather_outcomes(comm, committed, 0, 0));
  STRATA_RETURN_IF_ERROR(first_failure(done, what));
  // 7. Cleanup under the lock: the previous generation and whatever failed saves left.
  if (me == 0) remove_stale_files(dir, files);
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
  std::vector<std::vector<std::pair<std::size_t, PieceReader>>> readers;  // per config table: (piece, reader) I read
};

// Parses `text`, matches it to the config and plans every table. The same on every rank (same text, same config).
Result<Prepared> plan_load(const Store& store, int world, const std::string& dir, const std::string& text) {
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
    STRATA_RETURN_IF_ERROR(check_entry(mt, spec, optimizer_state_dim(spec.optimizer.kind, spec.dim), dir));
    std::vector<Box> pieces;
    for (const PieceEntry& p : mt.pieces) pieces.push_back(p.box);
    Result<TablePlan> plan = plan_table(spec, tables[ti].sharding, static_cast<int>(ti), world, std::move(pieces));
    if (!plan) return plan.status().with_context(dir + ": table '" + spec.name + "'");
    c.plans.push_back(std::move(plan).value());
  }
  return c;
}

// Opens (every one first, to keep the window in which a concurrent save removes one short) and verifies the pieces
// this rank reads. `vanished`: one was not found (a newer manifest may have replaced this one).
Status open_pieces(Store& store, int me, const std::string& dir, Prepared& c) {
  const auto& tables = store.config().tables;
  c.readers.clear();
  c.readers.resize(tables.size());
  for (std::size_t ti = 0; ti < tables.size(); ++ti) {
    // The plan's target for this rank is this store's shard: else the plan and the engines disagree (a bug).
    Result<ShardInfo> si = store.shard_info(static_cast<int>(ti));
    if (!si) return si.status();
    if (box_of(si.value()) != c.plans[ti].targets[static_cast<std::size_t>(me)])
      return Status::internal("table '" + tables[ti].spec.name +
                              "': the load plan's shard of this rank differs from the store's (a bug)");
    const ManifestTable& mt = c.manifest.tables[c.entry[ti]];
    for (std::size_t k = 0; k < mt.pieces.size(); ++k) {
      if (c.plans[ti].reader[k] != me) continue;
      STRATA_ASSIGN_OR_RETURN(PieceReader r,
                              PieceReader::open(dir, mt, mt.pieces[k], c.manifest.version, c.manifest.save_id));
      c.readers[ti].emplace_back(k, std::move(r));
    }
  }
  for (auto& table : c.readers)
    for (auto& kr : table) STRATA_RETURN_IF_ERROR(kr.second.verify());
  return Status::ok();
}

// Copies table `ti`'s rows: span by span, each reader reads its pieces' runs, packs what each rank holds, one
// all_to_all_v (when any row crosses ranks), each rank writes its window. A local failure keeps taking part in the
// collectives (so the ranks stay in step) and stops writing; returned at the end.
Status copy_table(Store& store, dispatch::Communicator* comm, int me, int world, Prepared& c, std::size_t ti) {
  const TablePlan& p = c.plans[ti];
  const Box& target = p.targets[static_cast<std::size_t>(me)];
  const TableSpec& spec = store.config().tables[ti].spec;
  const std::int32_t sd = optimizer_state_dim(spec.optimizer.kind, target.cols);
  Status failed;
  std::vector<std::vector<float>> runs(p.pieces.size());
  std::vector<const float*> records(p.pieces.size(), nullptr);
  std::vector<std::int64_t> send_counts(static_cast<std::size_t>(world)), send_displs(send_counts.size()),
      recv_counts(send_counts.size()), recv_displs(send_counts.size());
  std::vector<float> send, recv, weights, state;
  for (std::int64_t row0 = 0; row0 < p.rows; row0 += p.span_rows) {
    const std::int64_t n = std::min(p.span_rows, p.rows - row0);
    for (auto& kr : c.readers[ti]) {
      const std::size_t k = kr.first;
      const std::int64_t cnt = local_range(p.pieces[k], row0, n).second;
      runs[k].resize(static_cast<std::size_t>(cnt * kr.second.width()));
      if (failed.is_ok() && cnt > 0) failed = kr.second.read_next(cnt, runs[k].data());
      records[k] = runs[k].data();
    }
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
    send.resize(static_cast<std::size_t>(sent) / sizeof(float));
    recv.resize(static_cast<std::size_t>(received) / sizeof(float));
    pack_span(p, me, row0, n, records, send.data(), send_displs);
    if (comm && p.crosses) {
      Status s = comm->all_to_all_v(send.data(), send_counts.data(), send_displs.data(), recv.data(),
                                    recv_counts.data(), recv_displs.data());
      if (!s.is_ok()) return s;  // the communicator is broken: every rank learns it
    } else {
      // Nothing crosses ranks: this rank's own share is all it receives.
      const std::size_t mi = static_cast<std::size_t>(me);
      if (recv_counts[mi])
        std::memcpy(reinterpret_cast<char*>(recv.data()) + recv_displs[mi],
                    reinterpret_cast<const char*>(send.data()) + send_displs[mi],
                    static_cast<std::size_t>(recv_counts[mi]));
    }
    const auto [local0, cnt] = local_range(target, row0, n);
    weights.resize(static_cast<std::size_t>(cnt * target.cols));
    state.resize(static_cast<std::size_t>(cnt * sd));
    unpack_span(p, me, row0, n, recv.data(), recv_displs, weights.data(), state.data());
    if (failed.is_ok() && cnt > 0 && target.cols > 0)
      failed = store.write_shard(static_cast<int>(ti), local0, cnt, weights.data(), sd ? state.data() : nullptr);
  }
  for (auto& kr : c.readers[ti])
    if (failed.is_ok()) failed = kr.second.finish();
  return failed;
}

// 6. Step and rates, the same manifest's on every rank.
Loaded loaded(const Prepared& c) {
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
                           const std::string* pinned_manifest) {
  const int me = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  const std::string what = "load '" + dir + "'";
  const std::string path = join(dir, kManifest);
  STRATA_RETURN_IF_ERROR(agreed(comm, store.in_flight() > 0 ? busy("load", store.in_flight()) : Status::ok(), what));
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
    STRATA_RETURN_IF_ERROR(agreed(comm, s, what));
    STRATA_RETURN_IF_ERROR(broadcast_text(comm, text));
  }
  // 2-3. Plan, open and verify, before any row changes. A failure caused by a save that replaced the manifest
  // meanwhile (its cleanup removed a piece this one names) starts over with the new manifest, unless it is pinned.
  std::optional<Prepared> prepared;
  for (int attempt = 1;; ++attempt) {
    Status s;
    Result<Prepared> planned = plan_load(store, world, dir, text);
    if (planned) {
      prepared = std::move(planned).value();
      s = open_pieces(store, me, dir, *prepared);
    } else {
      s = planned.status();
    }
    s = agreed(comm, s, what);
    if (s.is_ok()) break;
    if (comm) s = Status::from_code(s.code(), s.message() + " (nothing changed)");
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
    if (comm) STRATA_RETURN_IF_ERROR(comm->broadcast(&changed, sizeof changed, 0));
    if (!changed) return s;
    if (attempt == kLoadAttempts)
      return s.with_context(dir + ": the checkpoint was replaced " + std::to_string(attempt) +
                            " times while load read it");
    STRATA_RETURN_IF_ERROR(broadcast_text(comm, now));
    text = std::move(now);
  }
  Prepared& c = *prepared;
  // 4. Nothing has changed yet. Write dirty cached rows back first, so that a device error there still leaves every
  // rank as it was.
  STRATA_RETURN_IF_ERROR(agreed(comm, store.flush(), what));
  // 5. Copy, table by table, span by span, through the descriptors verified above.
  const std::string mixed =
      "(the tables may now hold a mix of their previous rows and the checkpoint's; step unchanged; load again)";
  Status copied;
  for (std::size_t ti = 0; ti < c.plans.size(); ++ti) {
    Status s = copy_table(store, comm, me, world, c, ti);
    if (copied.is_ok() && !s.is_ok())
      copied = s.with_context(dir + ": load failed while copying rows into table '" +
                              store.config().tables[ti].spec.name + "' " + mixed);
  }
  if (!comm) {
    if (!copied.is_ok()) return copied;
    return loaded(c);
  }
  Result<Gathered> all = gather_outcomes(*comm, copied, 0, 0);
  if (!all) return all.status().with_context(dir + ": load failed while copying rows " + mixed);
  STRATA_RETURN_IF_ERROR(first_failure(all.value(), what));
  return loaded(c);
}

}  // namespace strata::detail
