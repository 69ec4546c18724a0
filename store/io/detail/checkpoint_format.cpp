#include "store/io/detail/checkpoint_format.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/io/detail/crc32c.hpp"
#include "store/store.hpp"

namespace strata::detail {
namespace {

using nlohmann::json;

Status not_implemented(const char* what) {
  return Status::internal(std::string(what) + " is not implemented yet (world checkpoints, issue 34)");
}

// Parses the format 1 table entry `t` into `mt`: its file becomes the one whole piece.
void parse_v1_file(const json& t, ManifestTable& mt) {
  PieceEntry p;
  p.file = t.at("file").get<std::string>();
  p.box = whole_box(mt.rows, mt.dim);
  p.bytes = t.at("bytes").get<std::uint64_t>();
  p.crc = static_cast<std::uint32_t>(std::stoul(t.at("crc32c").get<std::string>(), nullptr, 16));
  mt.pieces.push_back(std::move(p));
}

}  // namespace

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

bool is_plain_file_name(const std::string& file) {
  return !file.empty() && file != "." && file != ".." && file.find('/') == std::string::npos &&
         file.find('\0') == std::string::npos;
}

Result<Manifest> parse_manifest(const std::string& path, const std::string& text) {
  const std::size_t cut = text.rfind("\ncrc32c ");
  if (cut == std::string::npos)
    return Status::data_loss(path + ": no checksum line (truncated or not a Strata manifest)");
  const std::string body = text.substr(0, cut);
  if (text.size() != cut + 8 + 8 + 1 || text.back() != '\n')
    return Status::data_loss(path + ": bytes after the checksum line (expected it to end the file; corrupt)");
  const std::string want = text.substr(cut + 8, 8);
  const std::string got = hex32(crc32c(body.data(), body.size()));
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
    m.version = version;
    m.generation = j.at("generation").get<std::uint64_t>();
    m.step = j.at("step").get<std::int64_t>();
    if (m.step < 0 || m.step > Store::kMaxStep)
      return Status::data_loss(path + ": step " + std::to_string(m.step) + " (expected a step count from 0 to " +
                               std::to_string(Store::kMaxStep) + "; corrupt)");
    for (const auto& t : j.at("tables")) {
      ManifestTable mt;
      mt.name = t.at("name").get<std::string>();
      mt.rows = t.at("rows").get<std::int64_t>();
      mt.dim = t.at("dim").get<std::int32_t>();
      mt.state_dim = t.at("state_dim").get<std::int32_t>();
      mt.dtype = t.at("dtype").get<std::string>();
      mt.optimizer = t.at("optimizer").get<std::string>();
      parse_v1_file(t, mt);
      if (t.contains("learning_rate")) {
        const double lr = t.at("learning_rate").get<double>();
        mt.learning_rate = static_cast<float>(lr);
        mt.has_learning_rate = true;
        if (!(mt.learning_rate >= 0.0f) || !std::isfinite(mt.learning_rate))
          return Status::data_loss(path + ": table '" + mt.name + "': learning_rate " + t.at("learning_rate").dump() +
                                   " (expected a finite number >= 0; corrupt)");
      }
      for (const PieceEntry& p : mt.pieces)
        if (!is_plain_file_name(p.file))
          return Status::data_loss(path + ": table '" + mt.name + "': file '" + p.file +
                                   "' is not a file name inside the checkpoint directory (expected a name without "
                                   "'/', such as '" +
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

std::string manifest_text(const Manifest& m) {
  json j;
  if (!m.config.empty()) j["config"] = json::parse(m.config);
  j["format"] = "strata-checkpoint";
  j["version"] = m.version;
  j["generation"] = m.generation;
  j["step"] = m.step;
  j["tables"] = json::array();
  for (const auto& t : m.tables) {
    // Format 1's table entry, key by key as it always was (json objects sort their keys when dumped).
    json e = {{"name", t.name},
              {"rows", t.rows},
              {"dim", t.dim},
              {"state_dim", t.state_dim},
              {"dtype", t.dtype},
              {"optimizer", t.optimizer},
              {"learning_rate", t.learning_rate}};
    if (m.version == kFormatVersion) {
      const PieceEntry& p = t.pieces.at(0);
      e["file"] = p.file;
      e["bytes"] = p.bytes;
      e["crc32c"] = hex32(p.crc);
    }
    j["tables"].push_back(std::move(e));
  }
  const std::string body = j.dump(2);
  return body + "\ncrc32c " + hex32(crc32c(body.data(), body.size())) + "\n";
}

Result<Manifest> read_manifest(const std::string& dir) {
  const std::string path = join(dir, kManifest);
  STRATA_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_manifest(path, text);
}

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

void remove_stale_files(const std::string& dir, const std::vector<std::string>& keep) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> doomed;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const bool ours = name.size() > 4 && name.compare(name.size() - 4, 4, ".tbl") == 0;
    const bool temp =
        name.rfind(std::string(kManifest) + ".tmp-", 0) == 0 || name.find(".tbl.tmp-") != std::string::npos;
    if (!ours && !temp) continue;
    if (std::find(keep.begin(), keep.end(), name) == keep.end()) doomed.push_back(name);
  }
  closedir(d);
  for (const auto& name : doomed) ::unlink(join(dir, name).c_str());
}

std::vector<std::string> file_names(const Manifest& m) {
  std::vector<std::string> names;
  for (const auto& t : m.tables)
    for (const auto& p : t.pieces) names.push_back(p.file);
  return names;
}

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

std::int64_t record_floats(const ManifestTable& m, const Box& box) {
  if (box.cols == m.dim || m.dim == 0) return std::int64_t{box.cols} + m.state_dim;
  return std::int64_t{box.cols} + std::int64_t{m.state_dim} / m.dim * box.cols;
}

std::uint64_t expected_file_bytes(const ManifestTable& m, const Box& box) {
  return kHeaderBytes + static_cast<std::uint64_t>(box.rows) * static_cast<std::uint64_t>(record_floats(m, box)) * 4u;
}

std::string piece_file_name(const std::string& table, std::uint64_t generation, std::uint64_t save_id, int rank) {
  return table + "." + std::to_string(generation) + "." + hex64(save_id) + ".r" + std::to_string(rank) + ".tbl";
}

Result<PieceWriter> PieceWriter::create(const std::string&, const std::string&, const ManifestTable&, const Box&,
                                        std::uint64_t) {
  return not_implemented("PieceWriter::create");
}
Status PieceWriter::append(const float*, std::int64_t) { return not_implemented("PieceWriter::append"); }
Status PieceWriter::commit() { return not_implemented("PieceWriter::commit"); }

Result<PieceReader> PieceReader::open(const std::string&, const ManifestTable&, const PieceEntry&, std::uint32_t,
                                      std::uint64_t) {
  return not_implemented("PieceReader::open");
}
Status PieceReader::verify() { return not_implemented("PieceReader::verify"); }
Status PieceReader::read_next(std::int64_t, float*) { return not_implemented("PieceReader::read_next"); }
Status PieceReader::finish() const { return not_implemented("PieceReader::finish"); }

Status scan_table_file(const FileReader& reader, const ManifestTable& m,
                       const std::function<Status(std::int64_t, std::int64_t, const float*)>& fn) {
  const std::string& path = reader.path();
  const PieceEntry& p = m.pieces.at(0);
  const std::uint64_t want = expected_file_bytes(m, p.box);
  if (reader.size() != want || p.bytes != want)
    return Status::data_loss(path + ": " + std::to_string(reader.size()) + " bytes (expected " + std::to_string(want) +
                             " for table '" + m.name + "'; truncated or corrupt)");
  TableHeader h{};
  STRATA_RETURN_IF_ERROR(reader.read_at(0, &h, sizeof h));
  if (std::memcmp(h.magic, kTableMagic, sizeof kTableMagic) != 0 || h.version != kFormatVersion || h.rows != m.rows ||
      h.dim != m.dim || h.state_dim != m.state_dim)
    return Status::data_loss(path + ": table header does not match the manifest (corrupt)");
  std::uint32_t crc = crc32c(&h, sizeof h);
  const std::int64_t rec = m.dim + m.state_dim;
  std::vector<float> buf(static_cast<std::size_t>(std::min(kChunkRows, m.rows) * rec));
  for (std::int64_t r = 0; r < m.rows; r += kChunkRows) {
    const std::int64_t n = std::min(kChunkRows, m.rows - r);
    const std::size_t bytes = static_cast<std::size_t>(n * rec) * sizeof(float);
    STRATA_RETURN_IF_ERROR(reader.read_at(kHeaderBytes + static_cast<std::uint64_t>(r * rec) * 4u, buf.data(), bytes));
    crc = crc32c(buf.data(), bytes, crc);
    STRATA_RETURN_IF_ERROR(fn(r, n, buf.data()));
  }
  if (crc != p.crc)
    return Status::data_loss(path + ": checksum " + hex32(crc) + " does not match the manifest's " + hex32(p.crc) +
                             " (corrupt)");
  return Status::ok();
}

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
    STRATA_ASSIGN_OR_RETURN(FileReader f,
                            FileReader::open(join(dir, c.manifest.tables[c.entry[ti]].pieces.at(0).file)));
    c.files.push_back(std::move(f));
  }
  for (std::size_t ti = 0; ti < tables.size(); ++ti)
    STRATA_RETURN_IF_ERROR(scan_table_file(c.files[ti], c.manifest.tables[c.entry[ti]],
                                           [](std::int64_t, std::int64_t, const float*) { return Status::ok(); }));
  return c;
}

}  // namespace strata::detail
