// Store::save / load / open_checkpoint / export_npy / import_npy and the row access by table name,
// written once on top of the Store's row access so every placement mode shares them.
//
// Layout of a checkpoint directory:
//   MANIFEST            JSON (format, version, generation, step, one entry per table, config)
//                       followed by a line "crc32c XXXXXXXX" over the JSON text. A table entry's
//                       "learning_rate" (the rate in force at save) is optional: manifests written
//                       before it existed lack it, and load then keeps the store's rate. "config"
//                       (the store's whole config, to_json's object, rates in force included) is
//                       optional too: without it the checkpoint loads into an open store but cannot
//                       be reopened alone (open_checkpoint). Both came with the same format version,
//                       so a build from before them loads a newer checkpoint and ignores them.
//   <table>.<gen>.tbl   64-byte header, then rows records of (dim weights | state_dim state) fp32
//                       (format 1: a store whose tables are all fp32, the format older builds read)
//   <table>.<gen>.<save>.r0.tbl  the same in format 3 (a store with a bf16 or fp16 table, or bf16 state: a world of
//                       one's pieces), each element of its table's element type
//   format 4: a store with a dynamic table, format 3 with one such file per dynamic table holding its rows in use,
//                       clock and sketch (store/io/detail/dynamic_piece.hpp)
//   format 5: a world with a dynamic table, format 4 with one such file per rank of the world (its shard: local rows,
//                       the common clock, its sketch); the manifest lists each with its keys, sketch bytes and shard
//                       capacity, and the table's sharding and clock. Loaded into the same layout (world size,
//                       sharding, owner), each rank restores its own file exactly; into another (or from a store's
//                       format 4 file into a world, or a world's into a store), each rank reads every file and keeps
//                       the keys it now owns (store/io/detail/world_checkpoint.hpp), their admission counts afresh
// (the format, its parsing and checks: store/io/detail/checkpoint_format.hpp).
// Table files of a new save get a new generation number, so the old ones stay untouched until the
// new MANIFEST has been renamed into place (the commit point); then the old generation is removed.
//
// Several processes may share a directory (a trainer saving while an evaluator loads, two savers):
//  - savers take turns on an flock of the directory (DirLock), held from reading the old MANIFEST
//    to removing the old generation, so generation numbers never collide and no saver removes the
//    files of a manifest another saver is committing;
//  - a reader takes no lock: it reads MANIFEST once (a rename replaces it whole, so it is never
//    half-written), opens every table file it names once, and verifies and applies through those
//    descriptors: a file removed by a later save stays readable through them. A file that vanished
//    before the reader opened it means a newer manifest is in place; the reader starts over with
//    that one.

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "core/half.hpp"
#include "core/row_math.hpp"
#include "store/detail/batch_checks.hpp"
#include "store/detail/config_agreement.hpp"
#include "store/detail/dynamic_state.hpp"
#include "store/detail/reference_world.hpp"
#include "store/io/detail/checkpoint_format.hpp"
#include "store/io/detail/dynamic_piece.hpp"
#include "store/io/detail/world_checkpoint.hpp"
#include "store/io/file_io.hpp"
#include "store/io/npy.hpp"
#include "store/store.hpp"

namespace strata {

// The checkpoint format (checkpoint_format.hpp).
using detail::join;
using detail::kFormatVersion;
using detail::kLoadAttempts;
using detail::kLockFile;
using detail::kManifest;
using detail::Manifest;
using detail::ManifestTable;

namespace {

// The DynamicAccess every Store of this library is (store/detail/dynamic_state.hpp).
detail::DynamicAccess& dynamic_access(Store& store) {
  auto* access = dynamic_cast<detail::DynamicAccess*>(&store);
  STRATA_CHECK(access != nullptr);
  return *access;
}

// `what` ("save '<dir>'") refused when `store` is the reference of a world of several ranks with a dynamic table: its
// shards side by side (detail::ReferenceWorld) are no checkpoint's (one store's file of a single index, or one file per
// rank of a world); reading them as a store's would write a file its own load refuses.
Status refuse_reference_world(const Store& store, const std::string& what) {
  const auto* reference = dynamic_cast<const detail::ReferenceWorld*>(&store);
  if (!reference || reference->reference_world() <= 1) return Status::ok();
  const std::string world = std::to_string(reference->reference_world());
  for (const TableConfig& t : store.config().tables)
    if (t.dynamic)
      return Status::failed_precondition(what + ": dynamic table '" + t.spec.name +
                                         "': the reference store of a world of " + world + " ranks holds its " + world +
                                         " shards side by side; a reference of a world is not saved or loaded "
                                         "(expected a reference of one rank, open_reference_store; nothing changed)");
  return Status::ok();
}

}  // namespace

Status Store::save(const std::string& dir) {
  // A world: each rank writes its pieces into one shared directory, rank 0 commits (format 2, 3 with half-size
  // tables, 5 with a dynamic table).
  if (dispatch::Communicator* comm = world()) return detail::save_world(*this, *comm, dir);
  STRATA_RETURN_IF_ERROR(refuse_reference_world(*this, "save '" + dir + "'"));
  // No flush of its own: read_rows flushes, and decides whether a table whose device failed can
  // still be read from host memory (README, "When the device fails").
  STRATA_RETURN_IF_ERROR(detail::make_dirs(dir));
  // Held until the old generation is gone: a second saver waits, then reads our manifest.
  STRATA_ASSIGN_OR_RETURN(detail::DirLock lock, detail::DirLock::acquire(dir, kLockFile));
  STRATA_ASSIGN_OR_RETURN(const std::uint64_t generation, detail::next_generation(dir));
  Manifest next;
  next.version = detail::save_format(config_, false);  // 1, or 3 (pieces) when a table holds half-size elements
  next.generation = generation;
  next.step = step_;
  if (next.version != kFormatVersion) next.save_id = detail::new_save_id();
  for (std::size_t ti = 0; ti < config_.tables.size(); ++ti) {
    const TableSpec& spec = config_.tables[ti].spec;
    ManifestTable mt = detail::table_entry(config_, static_cast<int>(ti));
    detail::PieceEntry piece;
    piece.file = next.version == kFormatVersion ? spec.name + "." + std::to_string(next.generation) + ".tbl"
                                                : detail::piece_file_name(spec.name, generation, next.save_id, 0);
    if (config_.tables[ti].dynamic) {  // its rows in use, clock and sketch: one file (dynamic_piece.hpp)
      detail::DynamicState state;
      STRATA_RETURN_IF_ERROR(dynamic_access(*this).read_dynamic(static_cast<int>(ti), state));
      mt.dynamic = true;
      piece.capacity = spec.rows;
      STRATA_RETURN_IF_ERROR(detail::write_dynamic_piece(dir, mt, state, next.save_id, next.version, 0, piece));
      mt.keys = piece.keys;
      mt.sketch_bytes = piece.sketch_bytes;
      mt.pieces.push_back(std::move(piece));
      next.tables.push_back(std::move(mt));
      continue;
    }
    piece.box = detail::whole_box(spec.rows, spec.dim);
    const auto read = [&](std::int64_t row0, std::int64_t n, float* weights, float* state) {
      return read_rows(static_cast<int>(ti), row0, n, weights, state);
    };
    STRATA_RETURN_IF_ERROR(detail::write_piece(read, mt, dir, next.save_id, next.version, 0, piece));
    mt.pieces.push_back(std::move(piece));
    next.tables.push_back(std::move(mt));
  }
  next.config = to_json(config_);  // rates in force included (config_ holds them)
  STRATA_RETURN_IF_ERROR(detail::write_file_atomic(join(dir, kManifest), detail::manifest_text(next)));
  detail::remove_stale_files(dir, detail::file_names(next));
  return Status::ok();
}

Status Store::load(const std::string& dir) { return load_checkpoint(dir, nullptr); }

Status Store::load_converting_dtypes(const std::string& dir) { return load_checkpoint(dir, nullptr, true); }

Status Store::load_checkpoint(const std::string& dir, const std::string* manifest, bool convert_dtypes) {
  // One loader for every checkpoint (format 1 to 5) and every store (a world: collective; see world_checkpoint.hpp). It
  // writes every table, a dynamic table's shard on each rank (DynamicAccess::write_dynamic), with agreed errors.
  STRATA_RETURN_IF_ERROR(refuse_reference_world(*this, "load '" + dir + "'"));
  STRATA_ASSIGN_OR_RETURN(detail::Loaded got, detail::load_pieces(*this, world(), dir, manifest, convert_dtypes));
  step_ = got.step;
  for (std::size_t ti = 0; ti < config_.tables.size(); ++ti) {
    // Not recorded: keep the store's. Else checked when the manifest was parsed (0 is a rate). The same manifest's on
    // every rank of a world.
    if (got.has_rate[ti]) apply_learning_rate(static_cast<int>(ti), got.rate[ti]);
  }
  return Status::ok();
}

Result<std::unique_ptr<Store>> Store::open_checkpoint(const std::string& dir, const ConfigOverrides& overrides) {
  const std::string who = "open_checkpoint '" + dir + "'";
  const std::string manifest_path = join(dir, kManifest);
  for (int attempt = 1;; ++attempt) {
    Result<std::string> text = detail::read_file(manifest_path);
    if (!text) return text.status().with_context(who);
    Result<StoreConfig> recorded = detail::recorded_config(dir, text.value());
    if (!recorded) return recorded.status().with_context(who);
    StoreConfig config = recorded.value();
    if (overrides) overrides(config);
    // What may differ from the recorded config is what may differ from rank to rank: one rule.
    const std::string diff = detail::config_difference(detail::shared_config(config),
                                                       detail::shared_config(recorded.value()), "the checkpoint's");
    if (!diff.empty())
      return Status::invalid_argument(
          who + ": " + diff + " (overrides may change only what may differ per rank and never changes results: " +
          detail::per_rank_fields() + "; set learning rates after opening)");
    Result<std::unique_ptr<Store>> store = Store::open(config);
    if (!store) return store.status().with_context(who);
    // The rows of the manifest the config came from, or none.
    const Status loaded = store.value()->load_checkpoint(dir, &text.value());
    if (loaded.is_ok()) return store;
    // A save that replaced the manifest meanwhile: start over with the new one (and its config).
    Result<std::string> now = detail::read_file(manifest_path);
    if (!now.is_ok() || now.value() == text.value()) return loaded.with_context(who);
    if (attempt == kLoadAttempts)
      return loaded.with_context(who + ": the checkpoint was replaced " + std::to_string(attempt) +
                                 " times while it was opened");
  }
}

Status Store::read_rows(const std::string& table, std::int64_t row0, std::int64_t n, float* weights, float* state) {
  Result<int> t = table_index(table);
  if (!t) return t.status().with_context("read_rows");
  return read_rows(t.value(), row0, n, weights, state);
}

Status Store::write_rows(const std::string& table, std::int64_t row0, std::int64_t n, const float* weights,
                         const float* state) {
  Result<int> t = table_index(table);
  if (!t) return t.status().with_context("write_rows");
  return write_rows(t.value(), row0, n, weights, state);
}

Status Store::write_keys(int table, const std::vector<Key>& keys, const float* weights, const float* state) {
  STRATA_RETURN_IF_ERROR(detail::check_table(table, config_).with_context("write_keys"));
  const TableConfig& tc = config_.tables[static_cast<std::size_t>(table)];
  const TableSpec& spec = tc.spec;
  const std::string who = "table '" + spec.name + "': write_keys";
  if (!tc.dynamic) return Status::invalid_argument(who + " of a dense table (expected a dynamic table)");
  if (in_flight() > 0) return detail::busy("write_keys", in_flight());
  const auto n = static_cast<std::int64_t>(keys.size());
  if (n > spec.rows)
    return Status::invalid_argument(who + ": " + std::to_string(n) + " keys (expected at most the capacity, " +
                                    std::to_string(spec.rows) + ")");
  if (!weights && n > 0)
    return Status::invalid_argument(who + ": weights is null (expected a buffer of " + std::to_string(n) + " x " +
                                    std::to_string(spec.dim) + " floats)");
  std::map<Key, std::size_t> at;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto [it, fresh] = at.emplace(keys[i], i);
    if (!fresh)
      return Status::invalid_argument(who + ": key " + std::to_string(keys[i]) + " at positions " +
                                      std::to_string(it->second) + " and " + std::to_string(i) +
                                      " (expected distinct keys)");
  }
  const std::int32_t sd = optimizer_state_dim(spec.optimizer.kind, spec.dim);
  STRATA_RETURN_IF_ERROR(detail::check_holdable("write_keys", spec, 0, n, spec.dim, weights, sd, state));
  detail::DynamicState now, next;
  STRATA_RETURN_IF_ERROR(dynamic_access(*this).read_dynamic(table, now));
  std::map<Key, std::size_t> held;  // key -> its entry in `now`
  for (std::size_t i = 0; i < now.entries.size(); ++i) held.emplace(now.entries[i].key, i);
  next.clock = now.clock;
  next.sketch = std::move(now.sketch);
  const auto dim = static_cast<std::size_t>(spec.dim), sdim = static_cast<std::size_t>(sd);
  if (n > 0) next.weights.assign(weights, weights + keys.size() * dim);
  next.state.resize(keys.size() * sdim);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    next.entries.push_back(KeyIndex::Entry{keys[i], static_cast<std::int64_t>(i), now.clock, 1});
    float* s = next.state.data() + i * sdim;
    const auto it = held.find(keys[i]);
    if (state)
      std::copy(state + i * sdim, state + (i + 1) * sdim, s);
    else if (it != held.end())
      std::copy(now.state.data() + it->second * sdim, now.state.data() + (it->second + 1) * sdim, s);
    else
      init_state(s, spec.optimizer, sd);
  }
  return dynamic_access(*this).write_dynamic(table, next);
}

namespace {

// Where export_npy writes a dynamic table's keys: `<path stem>.keys.npy` beside `path`.
std::string keys_path(const std::string& path) {
  return std::filesystem::path(path).replace_extension(".keys.npy").string();
}

}  // namespace

Status Store::export_npy(const std::string& table, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(int ti, table_index(table));
  const TableConfig& tc = config_.tables[static_cast<std::size_t>(ti)];
  const TableSpec& spec = tc.spec;
  std::vector<Key> keys;  // a dynamic table's, in keys_held order
  if (tc.dynamic) {
    STRATA_ASSIGN_OR_RETURN(keys, keys_held(ti));
  }
  const std::int64_t n = tc.dynamic ? static_cast<std::int64_t>(keys.size()) : spec.rows;
  std::vector<float> rows(static_cast<std::size_t>(n * spec.dim));
  STRATA_RETURN_IF_ERROR(tc.dynamic ? read_keys(ti, keys, rows.data(), nullptr)
                                    : read_rows(ti, 0, spec.rows, rows.data(), nullptr));
  Status s;
  if (spec.dtype == DType::kF16) {  // float16, NumPy's own; bf16 (NumPy has none) widened to float32
    std::vector<std::uint16_t> bits(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) bits[i] = narrow_f16_rne(rows[i]);  // exact: fp16 values
    s = write_npy_f16(path, bits.data(), n, spec.dim);
  } else {
    s = write_npy(path, rows.data(), n, spec.dim);
  }
  if (s.is_ok() && tc.dynamic) s = write_npy_i64(keys_path(path), keys.data(), n);
  return s.is_ok() ? s : s.with_context("table '" + table + "'");
}

Status Store::import_npy(const std::string& table, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(int ti, table_index(table));
  if (in_flight() > 0) return detail::busy("import_npy", in_flight());
  const TableConfig& tc = config_.tables[static_cast<std::size_t>(ti)];
  const TableSpec& spec = tc.spec;
  std::vector<Key> keys;
  if (tc.dynamic) {
    Result<std::vector<Key>> read = read_npy_i64(keys_path(path));
    if (!read) return read.status().with_context("table '" + table + "'");
    keys = std::move(read).value();
  }
  const std::int64_t n = tc.dynamic ? static_cast<std::int64_t>(keys.size()) : spec.rows;
  auto rows = read_npy_matrix(path, n, spec.dim);  // float32 or float16, rounded as write_rows rounds
  if (!rows) return rows.status().with_context("table '" + table + "'");
  return tc.dynamic ? write_keys(ti, keys, rows.value().data(), nullptr)
                    : write_rows(ti, 0, spec.rows, rows.value().data(), nullptr);
}

}  // namespace strata
