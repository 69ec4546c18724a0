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

#include <dirent.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/detail/batch_checks.hpp"
#include "store/detail/config_agreement.hpp"
#include "store/io/detail/crc32c.hpp"
#include "store/io/file_io.hpp"
#include "store/io/npy.hpp"
#include "store/store.hpp"

namespace strata {
namespace {

using nlohmann::json;

constexpr char kManifest[] = "MANIFEST";
constexpr char kTableMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'T', 'B'};
constexpr std::uint32_t kFormatVersion = 1;
constexpr std::size_t kHeaderBytes = 64;
constexpr std::int64_t kChunkRows = 1 << 14;

struct TableHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t dtype;
  std::int64_t rows;
  std::int32_t dim;
  std::int32_t state_dim;
  std::uint32_t optimizer;
  std::uint8_t pad[kHeaderBytes - 36];
};
static_assert(sizeof(TableHeader) == kHeaderBytes, "table header is 64 bytes");

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

struct ManifestTable {
  std::string name, file;
  std::int64_t rows = 0;
  std::int32_t dim = 0, state_dim = 0;
  std::string dtype, optimizer;
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
  float learning_rate = 0;
  bool has_learning_rate = false;  // false: a checkpoint from before learning rates were saved
};
struct Manifest {
  std::uint64_t generation = 0;
  std::int64_t step = 0;
  std::vector<ManifestTable> tables;
  std::string config;  // the "config" object as JSON text; empty: not recorded (an older checkpoint)
};

// Whether `file` names an entry of the checkpoint directory itself: no path components, so a
// manifest can never make load read (or save remove) anything outside the directory.
bool is_plain_file_name(const std::string& file) {
  return !file.empty() && file != "." && file != ".." && file.find('/') == std::string::npos &&
         file.find('\0') == std::string::npos;
}

// Parses and checks the text of the manifest at `path`.
Result<Manifest> parse_manifest(const std::string& path, const std::string& text) {
  const std::size_t cut = text.rfind("\ncrc32c ");
  if (cut == std::string::npos)
    return Status::data_loss(path + ": no checksum line (truncated or not a Strata manifest)");
  const std::string body = text.substr(0, cut);
  if (text.size() != cut + 8 + 8 + 1 || text.back() != '\n')
    return Status::data_loss(path + ": bytes after the checksum line (expected it to end the file; corrupt)");
  const std::string want = text.substr(cut + 8, 8);
  const std::string got = hex32(detail::crc32c(body.data(), body.size()));
  if (want != got)
    return Status::data_loss(path + ": checksum " + got + " does not match the recorded " + want + " (corrupt)");
  Manifest m;
  try {
    const json j = json::parse(body);
    if (j.at("format").get<std::string>() != "strata-checkpoint")
      return Status::data_loss(path + ": not a Strata checkpoint manifest");
    const auto version = j.at("version").get<std::uint32_t>();
    if (version != kFormatVersion)
      return Status::invalid_argument(path + ": format version " + std::to_string(version) + " (expected " +
                                      std::to_string(kFormatVersion) + ")");
    m.generation = j.at("generation").get<std::uint64_t>();
    m.step = j.at("step").get<std::int64_t>();
    if (m.step < 0 || m.step > Store::kMaxStep)
      return Status::data_loss(path + ": step " + std::to_string(m.step) + " (expected a step count from 0 to " +
                               std::to_string(Store::kMaxStep) + "; corrupt)");
    for (const auto& t : j.at("tables")) {
      ManifestTable mt;
      mt.name = t.at("name").get<std::string>();
      mt.file = t.at("file").get<std::string>();
      mt.rows = t.at("rows").get<std::int64_t>();
      mt.dim = t.at("dim").get<std::int32_t>();
      mt.state_dim = t.at("state_dim").get<std::int32_t>();
      mt.dtype = t.at("dtype").get<std::string>();
      mt.optimizer = t.at("optimizer").get<std::string>();
      mt.bytes = t.at("bytes").get<std::uint64_t>();
      mt.crc = static_cast<std::uint32_t>(std::stoul(t.at("crc32c").get<std::string>(), nullptr, 16));
      if (t.contains("learning_rate")) {
        const double lr = t.at("learning_rate").get<double>();
        mt.learning_rate = static_cast<float>(lr);
        mt.has_learning_rate = true;
        if (!(mt.learning_rate >= 0.0f) || !std::isfinite(mt.learning_rate))
          return Status::data_loss(path + ": table '" + mt.name + "': learning_rate " + t.at("learning_rate").dump() +
                                   " (expected a finite number >= 0; corrupt)");
      }
      if (!is_plain_file_name(mt.file))
        return Status::data_loss(path + ": table '" + mt.name + "': file '" + mt.file +
                                 "' is not a file name inside the checkpoint directory (expected a name without '/', "
                                 "such as '" +
                                 mt.name + ".1.tbl'; corrupt)");
      for (const auto& other : m.tables)
        if (other.name == mt.name)
          return Status::data_loss(path + ": table '" + mt.name + "' is listed twice (corrupt)");
      m.tables.push_back(std::move(mt));
    }
    if (j.contains("config")) m.config = j.at("config").dump();
  } catch (const std::exception& e) {
    return Status::data_loss(path + ": malformed manifest (" + e.what() + ")");
  }
  return m;
}

Result<Manifest> read_manifest(const std::string& dir) {
  const std::string path = join(dir, kManifest);
  STRATA_ASSIGN_OR_RETURN(std::string text, detail::read_file(path));
  return parse_manifest(path, text);
}

// The config recorded in the manifest `text` of `dir` (parse_manifest's checks first).
Result<StoreConfig> recorded_config(const std::string& dir, const std::string& text) {
  const std::string path = join(dir, kManifest);
  STRATA_ASSIGN_OR_RETURN(Manifest m, parse_manifest(path, text));
  if (m.config.empty())
    return Status::failed_precondition(path + ": the manifest holds no store config, so the checkpoint cannot be " +
                                       "reopened alone (it was saved before checkpoints recorded their config; " +
                                       "expected a checkpoint saved by this version: open a store with its config " +
                                       "and load() the checkpoint into it)");
  Result<StoreConfig> c = parse_store_config(m.config);
  if (!c) return c.status().with_context(path + ": recorded config");
  return c;
}

// Removes table files and temp files of other generations (best effort: leftovers cost only space).
// Called with the directory's DirLock held: no other saver is writing files there meanwhile, so
// temp files are those of saves that crashed.
void remove_stale_files(const std::string& dir, const Manifest& keep) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> doomed;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const bool ours = name.size() > 4 && name.compare(name.size() - 4, 4, ".tbl") == 0;
    const bool temp =
        name.rfind(std::string(kManifest) + ".tmp-", 0) == 0 || name.find(".tbl.tmp-") != std::string::npos;
    if (!ours && !temp) continue;
    bool referenced = false;
    for (const auto& t : keep.tables) referenced = referenced || t.file == name;
    if (!referenced) doomed.push_back(name);
  }
  closedir(d);
  for (const auto& name : doomed) ::unlink(join(dir, name).c_str());
}

// Checks a checkpoint's table entry against the store's spec: "checkpoint from another config".
Status check_entry(const ManifestTable& m, const TableSpec& spec, std::int32_t state_dim, const std::string& dir) {
  const std::string who = dir + ": table '" + spec.name + "'";
  auto mismatch = [&](const char* what, const std::string& got, const std::string& want) {
    return Status::invalid_argument(who + ": " + what + " " + got + " in the checkpoint (expected " + want +
                                    " from the store config)");
  };
  if (m.rows != spec.rows) return mismatch("rows", std::to_string(m.rows), std::to_string(spec.rows));
  if (m.dim != spec.dim) return mismatch("dim", std::to_string(m.dim), std::to_string(spec.dim));
  if (m.dtype != to_string(spec.dtype)) return mismatch("dtype", m.dtype, to_string(spec.dtype));
  if (m.optimizer != to_string(spec.optimizer.kind))
    return mismatch("optimizer", m.optimizer, to_string(spec.optimizer.kind));
  if (m.state_dim != state_dim) return mismatch("state_dim", std::to_string(m.state_dim), std::to_string(state_dim));
  return Status::ok();
}

std::uint64_t expected_file_bytes(const ManifestTable& m) {
  return kHeaderBytes + static_cast<std::uint64_t>(m.rows) * static_cast<std::uint64_t>(m.dim + m.state_dim) * 4u;
}

// Streams a table file's records through `reader` (the file opened once by load); calls
// fn(row0, n, records) per chunk. Verifies header, size and checksum; the checksum only once every
// chunk went through `fn`.
template <typename Fn>
Status scan_table_file(const detail::FileReader& reader, const ManifestTable& m, Fn&& fn) {
  const std::string& path = reader.path();
  const std::uint64_t want = expected_file_bytes(m);
  if (reader.size() != want || m.bytes != want)
    return Status::data_loss(path + ": " + std::to_string(reader.size()) + " bytes (expected " + std::to_string(want) +
                             " for table '" + m.name + "'; truncated or corrupt)");
  TableHeader h{};
  STRATA_RETURN_IF_ERROR(reader.read_at(0, &h, sizeof h));
  if (std::memcmp(h.magic, kTableMagic, sizeof kTableMagic) != 0 || h.version != kFormatVersion || h.rows != m.rows ||
      h.dim != m.dim || h.state_dim != m.state_dim)
    return Status::data_loss(path + ": table header does not match the manifest (corrupt)");
  std::uint32_t crc = detail::crc32c(&h, sizeof h);
  const std::int64_t rec = m.dim + m.state_dim;
  std::vector<float> buf(static_cast<std::size_t>(std::min(kChunkRows, m.rows) * rec));
  for (std::int64_t r = 0; r < m.rows; r += kChunkRows) {
    const std::int64_t n = std::min(kChunkRows, m.rows - r);
    const std::size_t bytes = static_cast<std::size_t>(n * rec) * sizeof(float);
    STRATA_RETURN_IF_ERROR(reader.read_at(kHeaderBytes + static_cast<std::uint64_t>(r * rec) * 4u, buf.data(), bytes));
    crc = detail::crc32c(buf.data(), bytes, crc);
    STRATA_RETURN_IF_ERROR(fn(r, n, buf.data()));
  }
  if (crc != m.crc)
    return Status::data_loss(path + ": checksum " + hex32(crc) + " does not match the manifest's " + hex32(m.crc) +
                             " (corrupt)");
  return Status::ok();
}

// A checkpoint as load sees it: the manifest read once and every table file it names opened
// once, matched to the store's tables and verified.
struct OpenCheckpoint {
  Manifest manifest;
  std::vector<std::size_t> entry;         // per config table: its index in manifest.tables
  std::vector<detail::FileReader> files;  // per config table: its file, open
};

// Reads the manifest `text` of `dir`, opens the files it names and verifies them against the
// store's config (names, shapes, optimizers) and their sizes and checksums. Changes nothing.
Result<OpenCheckpoint> open_files(const Store& store, const std::string& dir, const std::string& text) {
  OpenCheckpoint c;
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
    STRATA_RETURN_IF_ERROR(
        check_entry(c.manifest.tables[c.entry[ti]], spec, optimizer_state_dim(spec.optimizer.kind, spec.dim), dir));
  }
  // Open every file before reading any, to keep the time in which a concurrent save can remove
  // one of them short (the caller then starts over with the newer manifest).
  for (std::size_t ti = 0; ti < tables.size(); ++ti) {
    STRATA_ASSIGN_OR_RETURN(detail::FileReader f,
                            detail::FileReader::open(join(dir, c.manifest.tables[c.entry[ti]].file)));
    c.files.push_back(std::move(f));
  }
  for (std::size_t ti = 0; ti < tables.size(); ++ti)
    STRATA_RETURN_IF_ERROR(scan_table_file(c.files[ti], c.manifest.tables[c.entry[ti]],
                                           [](std::int64_t, std::int64_t, const float*) { return Status::ok(); }));
  return c;
}

// How many manifests load (and open_checkpoint) try when saves keep replacing the one just read.
constexpr int kLoadAttempts = 10;
// Name of the lock file of a directory that cannot be flocked itself (see DirLock).
constexpr char kLockFile[] = "LOCK";

}  // namespace

Status Store::save(const std::string& dir) {
  // No flush of its own: read_rows flushes, and decides whether a table whose device failed can
  // still be read from host memory (README, "When the device fails").
  STRATA_RETURN_IF_ERROR(detail::make_dirs(dir));
  // Held until the old generation is gone: a second saver waits, then reads our manifest.
  STRATA_ASSIGN_OR_RETURN(detail::DirLock lock, detail::DirLock::acquire(dir, kLockFile));
  // Only a missing manifest means "no checkpoint here". One that cannot be read or parsed (a newer
  // format, an I/O error) names files this save must not delete as stale: refuse instead.
  Manifest old;
  if (auto m = read_manifest(dir)) {
    old = std::move(m).value();
  } else if (m.status().code() != StatusCode::kNotFound) {
    return m.status().with_context(
        "save into '" + dir +
        "': its manifest cannot be read, so this save would replace a checkpoint it does not "
        "understand (expected no manifest or a valid one; move it away or save elsewhere)");
  }
  Manifest next;
  next.generation = old.generation + 1;
  next.step = step_;
  for (std::size_t ti = 0; ti < config_.tables.size(); ++ti) {
    const TableSpec& spec = config_.tables[ti].spec;
    const std::int32_t sd = optimizer_state_dim(spec.optimizer.kind, spec.dim);
    ManifestTable mt;
    mt.name = spec.name;
    mt.file = spec.name + "." + std::to_string(next.generation) + ".tbl";
    mt.rows = spec.rows;
    mt.dim = spec.dim;
    mt.state_dim = sd;
    mt.dtype = to_string(spec.dtype);
    mt.optimizer = to_string(spec.optimizer.kind);
    mt.learning_rate = spec.optimizer.learning_rate;
    STRATA_ASSIGN_OR_RETURN(detail::AtomicFileWriter w, detail::AtomicFileWriter::create(join(dir, mt.file)));
    TableHeader h{};
    std::memcpy(h.magic, kTableMagic, sizeof kTableMagic);
    h.version = kFormatVersion;
    h.dtype = static_cast<std::uint32_t>(spec.dtype);
    h.rows = spec.rows;
    h.dim = spec.dim;
    h.state_dim = sd;
    h.optimizer = static_cast<std::uint32_t>(spec.optimizer.kind);
    STRATA_RETURN_IF_ERROR(w.append(&h, sizeof h));
    const std::int64_t n_max = std::min(kChunkRows, spec.rows);
    std::vector<float> weights(static_cast<std::size_t>(n_max * spec.dim)), state(static_cast<std::size_t>(n_max * sd));
    std::vector<float> records(static_cast<std::size_t>(n_max * (spec.dim + sd)));
    for (std::int64_t r = 0; r < spec.rows; r += kChunkRows) {
      const std::int64_t n = std::min(kChunkRows, spec.rows - r);
      STRATA_RETURN_IF_ERROR(read_rows(static_cast<int>(ti), r, n, weights.data(), sd ? state.data() : nullptr));
      for (std::int64_t i = 0; i < n; ++i) {
        float* rec = records.data() + i * (spec.dim + sd);
        std::memcpy(rec, weights.data() + i * spec.dim, sizeof(float) * static_cast<std::size_t>(spec.dim));
        if (sd) std::memcpy(rec + spec.dim, state.data() + i * sd, sizeof(float) * static_cast<std::size_t>(sd));
      }
      STRATA_RETURN_IF_ERROR(w.append(records.data(), sizeof(float) * static_cast<std::size_t>(n * (spec.dim + sd))));
    }
    mt.bytes = w.bytes();
    mt.crc = w.crc();
    STRATA_RETURN_IF_ERROR(w.commit());
    next.tables.push_back(std::move(mt));
  }
  json j;
  j["config"] = json::parse(to_json(config_));  // rates in force included (config_ holds them)
  j["format"] = "strata-checkpoint";
  j["version"] = kFormatVersion;
  j["generation"] = next.generation;
  j["step"] = next.step;
  j["tables"] = json::array();
  for (const auto& t : next.tables)
    j["tables"].push_back({{"name", t.name},
                           {"file", t.file},
                           {"rows", t.rows},
                           {"dim", t.dim},
                           {"state_dim", t.state_dim},
                           {"dtype", t.dtype},
                           {"optimizer", t.optimizer},
                           {"bytes", t.bytes},
                           {"crc32c", hex32(t.crc)},
                           {"learning_rate", t.learning_rate}});
  const std::string body = j.dump(2);
  STRATA_RETURN_IF_ERROR(detail::write_file_atomic(
      join(dir, kManifest), body + "\ncrc32c " + hex32(detail::crc32c(body.data(), body.size())) + "\n"));
  remove_stale_files(dir, next);
  return Status::ok();
}

Status Store::load(const std::string& dir) { return load_checkpoint(dir, nullptr); }

Status Store::load_checkpoint(const std::string& dir, const std::string* manifest) {
  if (in_flight() > 0) return detail::busy("load", in_flight());
  const std::string manifest_path = join(dir, kManifest);
  // Pass 1: one manifest, every file open and verified, every table matching the config, before
  // any row changes. A failure caused by a save that replaced the manifest meanwhile (its cleanup
  // removed a file this manifest names) is retried with the new manifest, unless the manifest is
  // pinned (open_checkpoint's, whose config must match the rows: it starts over itself).
  std::string text;
  if (manifest) {
    text = *manifest;
  } else {
    STRATA_ASSIGN_OR_RETURN(text, detail::read_file(manifest_path));
  }
  Result<OpenCheckpoint> opened = open_files(*this, dir, text);
  if (manifest && !opened.is_ok()) return opened.status();
  for (int attempt = 1; !opened.is_ok(); ++attempt) {
    Result<std::string> now = detail::read_file(manifest_path);
    if (!now.is_ok() || now.value() == text) return opened.status();
    if (attempt == kLoadAttempts)
      return opened.status().with_context(dir + ": the checkpoint was replaced " + std::to_string(attempt) +
                                          " times while load read it");
    text = std::move(now).value();
    opened = open_files(*this, dir, text);
  }
  OpenCheckpoint& c = opened.value();
  // Nothing has changed yet. Write dirty cached rows back first, so that a device error there
  // still leaves the store as it was.
  STRATA_RETURN_IF_ERROR(flush());
  // Pass 2: copy the rows in through the descriptors pass 1 verified. The files cannot change under
  // them (saves write new files and rename them; they never write into a committed one), so this
  // fails only on a read error, a device error, or a file modified in place by something else
  // (its checksum is checked again); the tables may then hold a mix (see Store::load).
  for (std::size_t ti = 0; ti < config_.tables.size(); ++ti) {
    const ManifestTable& mt = c.manifest.tables[c.entry[ti]];
    std::vector<float> weights, state;
    Status s = scan_table_file(c.files[ti], mt, [&](std::int64_t r, std::int64_t n, const float* recs) {
      weights.resize(static_cast<std::size_t>(n * mt.dim));
      state.resize(static_cast<std::size_t>(n * mt.state_dim));
      for (std::int64_t i = 0; i < n; ++i) {
        const float* rec = recs + i * (mt.dim + mt.state_dim);
        std::memcpy(weights.data() + i * mt.dim, rec, sizeof(float) * static_cast<std::size_t>(mt.dim));
        if (mt.state_dim)  // sgd keeps no state (and an empty vector's data() may be null)
          std::memcpy(state.data() + i * mt.state_dim, rec + mt.dim,
                      sizeof(float) * static_cast<std::size_t>(mt.state_dim));
      }
      return write_rows(static_cast<int>(ti), r, n, weights.data(), mt.state_dim ? state.data() : nullptr);
    });
    if (!s.is_ok())
      return s.with_context(dir + ": load failed while copying rows into table '" + mt.name +
                            "' (the tables may now hold a mix of their previous rows and the checkpoint's; step "
                            "unchanged; load again)");
  }
  step_ = c.manifest.step;
  for (std::size_t ti = 0; ti < config_.tables.size(); ++ti) {
    const ManifestTable& mt = c.manifest.tables[c.entry[ti]];
    // Not recorded: keep the store's. Else checked when the manifest was parsed (0 is a rate).
    // Local, like the rows (load is not a collective).
    if (mt.has_learning_rate) apply_learning_rate(static_cast<int>(ti), mt.learning_rate);
  }
  return Status::ok();
}

Result<std::unique_ptr<Store>> Store::open_checkpoint(const std::string& dir, const ConfigOverrides& overrides) {
  const std::string who = "open_checkpoint '" + dir + "'";
  const std::string manifest_path = join(dir, kManifest);
  for (int attempt = 1;; ++attempt) {
    Result<std::string> text = detail::read_file(manifest_path);
    if (!text) return text.status().with_context(who);
    Result<StoreConfig> recorded = recorded_config(dir, text.value());
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

Status Store::export_npy(const std::string& table, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(int ti, table_index(table));
  const TableSpec& spec = config_.tables[static_cast<std::size_t>(ti)].spec;
  std::vector<float> rows(static_cast<std::size_t>(spec.rows * spec.dim));
  STRATA_RETURN_IF_ERROR(read_rows(ti, 0, spec.rows, rows.data(), nullptr));
  Status s = write_npy(path, rows.data(), spec.rows, spec.dim);
  return s.is_ok() ? s : s.with_context("table '" + table + "'");
}

Status Store::import_npy(const std::string& table, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(int ti, table_index(table));
  if (in_flight() > 0) return detail::busy("import_npy", in_flight());
  const TableSpec& spec = config_.tables[static_cast<std::size_t>(ti)].spec;
  auto rows = read_npy_f32_matrix(path, spec.rows, spec.dim);
  if (!rows) return rows.status().with_context("table '" + table + "'");
  return write_rows(ti, 0, spec.rows, rows.value().data(), nullptr);
}

}  // namespace strata
