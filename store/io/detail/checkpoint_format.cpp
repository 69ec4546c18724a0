#include "store/io/detail/checkpoint_format.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/half.hpp"
#include "dispatch/shard_layout.hpp"
#include "dispatch/sharding_plan.hpp"
#include "host/admission_sketch.hpp"
#include "store/detail/batch_checks.hpp"
#include "store/io/detail/crc32c.hpp"
#include "store/io/detail/dynamic_piece.hpp"
#include "store/store.hpp"

namespace strata::detail {

// Records are written and read in this machine's byte order; the header says little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint files are little-endian");

namespace {

using nlohmann::json;

// Parses the format 1 table entry `t` into `mt`: its file becomes the one whole piece.
void parse_v1_file(const json& t, ManifestTable& mt) {
  PieceEntry p;
  p.file = t.at("file").get<std::string>();
  p.box = whole_box(mt.rows, mt.dim);
  p.bytes = t.at("bytes").get<std::uint64_t>();
  p.crc = static_cast<std::uint32_t>(std::stoul(t.at("crc32c").get<std::string>(), nullptr, 16));
  mt.pieces.push_back(std::move(p));
}

// Parses the pieces of the format 2 table entry `t` of manifest `m` into `mt` (their names, ranks and sizes are
// checked by the caller).
Status parse_v2_pieces(const std::string& path, const Manifest& m, const json& t, ManifestTable& mt) {
  mt.sharding = t.at("sharding").get<std::string>();
  if (!dispatch::parse_sharding(mt.sharding).is_ok())
    return Status::data_loss(path + ": table '" + mt.name + "': sharding '" + mt.sharding +
                             "' (expected replicated, table, row or column; corrupt)");
  for (const auto& e : t.at("pieces")) {
    PieceEntry p;
    p.file = e.at("file").get<std::string>();
    p.rank = e.at("rank").get<int>();
    p.box.rows = e.at("rows").get<std::int64_t>();
    p.box.row_start = e.at("row_start").get<std::int32_t>();
    p.box.row_step = e.at("row_step").get<std::int32_t>();
    p.box.col_offset = e.at("col_offset").get<std::int32_t>();
    p.box.cols = e.at("cols").get<std::int32_t>();
    p.bytes = e.at("bytes").get<std::uint64_t>();
    const std::string crc = e.at("crc32c").get<std::string>();
    if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos)
      return Status::data_loss(path + ": table '" + mt.name + "': piece '" + p.file + "': crc32c '" + crc +
                               "' (expected 8 lowercase hex digits; corrupt)");
    p.crc = static_cast<std::uint32_t>(std::stoul(crc, nullptr, 16));
    if (p.rank < 0 || p.rank >= m.world)
      return Status::data_loss(path + ": table '" + mt.name + "': piece '" + p.file + "': rank " +
                               std::to_string(p.rank) + " (expected a rank of the world of " + std::to_string(m.world) +
                               "; corrupt)");
    mt.pieces.push_back(std::move(p));
  }
  return Status::ok();
}

// The bytes of an admission sketch of a key index of `capacity` rows (KeyIndex::sketch_state: its added count and
// kDepth x width 16-bit counters; an index of no rows has one, a table-wise shard of another rank's).
std::int64_t sketch_bytes_for(std::int64_t capacity) {
  return 8 +
         std::int64_t{2} * AdmissionSketch::kDepth * AdmissionSketch::width_for(std::max<std::int64_t>(capacity, 1));
}

// Parses a dynamic table's file `d` (format 4: the "dynamic" object; format 5: one of its "pieces") of `mt` (its shape
// already checked) into `p`, whose capacity is set: its keys within the capacity, its sketch none or of the capacity's
// bytes, its size what they make. `who`: "<path>: dynamic table 't': " and the piece, for messages.
Status parse_dynamic_file(const std::string& who, const json& d, const ManifestTable& mt, PieceEntry& p) {
  p.keys = d.at("keys").get<std::int64_t>();
  p.sketch_bytes = d.at("sketch_bytes").get<std::int64_t>();
  if (p.keys < 0 || p.keys > p.capacity)
    return Status::data_loss(who + "keys " + std::to_string(p.keys) + " (expected 0 to its capacity " +
                             std::to_string(p.capacity) + "; corrupt)");
  // A sketch is none (admit_after 1) or that of an index of its capacity.
  const std::int64_t sketch = p.capacity > kMaxDynamicCapacity ? -1 : sketch_bytes_for(p.capacity);
  if (p.capacity > kMaxDynamicCapacity || (p.sketch_bytes != 0 && p.sketch_bytes != sketch))
    return Status::data_loss(who + "capacity " + std::to_string(p.capacity) + ", sketch_bytes " +
                             std::to_string(p.sketch_bytes) + " (expected a capacity up to " +
                             std::to_string(kMaxDynamicCapacity) + " and a sketch of 0 or " + std::to_string(sketch) +
                             " bytes; corrupt)");
  p.file = d.at("file").get<std::string>();
  p.box = whole_box(p.keys, mt.dim);
  p.bytes = d.at("bytes").get<std::uint64_t>();
  const std::string crc = d.at("crc32c").get<std::string>();
  if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos)
    return Status::data_loss(who + "crc32c '" + crc + "' (expected 8 lowercase hex digits; corrupt)");
  p.crc = static_cast<std::uint32_t>(std::stoul(crc, nullptr, 16));
  if (p.bytes != dynamic_file_bytes(mt, p))
    return Status::data_loss(who + "file '" + p.file + "': " + std::to_string(p.bytes) + " bytes (expected " +
                             std::to_string(dynamic_file_bytes(mt, p)) + " for its keys and sketch; corrupt)");
  return Status::ok();
}

// Parses the "dynamic" object `d` of a format 4 table entry into `mt` (its shape already checked): its file becomes its
// one piece, of the table's capacity.
Status parse_dynamic(const std::string& path, const json& d, ManifestTable& mt) {
  mt.dynamic = true;
  PieceEntry p;
  p.capacity = mt.rows;
  STRATA_RETURN_IF_ERROR(parse_dynamic_file(path + ": dynamic table '" + mt.name + "': ", d, mt, p));
  mt.keys = p.keys;
  mt.sketch_bytes = p.sketch_bytes;
  mt.pieces.push_back(std::move(p));
  return Status::ok();
}

// Parses the "dynamic" object `d` of a format 5 table entry of manifest `m` into `mt`: its sharding, clock and one
// piece per rank of the saving world, in rank order, each of its rank's capacity under that sharding.
Status parse_dynamic_shards(const std::string& path, const Manifest& m, const json& d, ManifestTable& mt) {
  mt.dynamic = true;
  const std::string who = path + ": dynamic table '" + mt.name + "': ";
  mt.sharding = d.at("sharding").get<std::string>();
  const Result<dispatch::ShardingType> type = dispatch::parse_sharding(mt.sharding);
  if (!type || (type.value() != dispatch::ShardingType::kRow && type.value() != dispatch::ShardingType::kTable))
    return Status::data_loss(who + "sharding '" + mt.sharding + "' (expected row or table; corrupt)");
  mt.clock = d.at("clock").get<std::int64_t>();
  if (mt.clock < 0) return Status::data_loss(who + "clock " + std::to_string(mt.clock) + " (expected >= 0; corrupt)");
  const json& pieces = d.at("pieces");
  if (pieces.size() != static_cast<std::size_t>(m.world))
    return Status::data_loss(who + std::to_string(pieces.size()) + " pieces (expected one per rank of the world of " +
                             std::to_string(m.world) + "; corrupt)");
  // The capacities of the saving world's shards: row sharding's for rows capacity + 1, or the whole on one owner (the
  // rank whose piece has any).
  dispatch::ShardingPlan plan{type.value(), -1};
  for (int r = 0; r < m.world; ++r)
    if (type.value() == dispatch::ShardingType::kTable && pieces[static_cast<std::size_t>(r)].at("capacity") != 0)
      plan.owner = r;
  TableSpec served;
  served.name = mt.name;
  served.rows = mt.rows + 1;
  served.dim = mt.dim;
  const Result<dispatch::ShardLayout> layout = dispatch::ShardLayout::make(served, plan, m.world, 0);
  if (!layout)
    return Status::data_loss(who + "capacity " + std::to_string(mt.rows) + " cannot be " + mt.sharding +
                             "-sharded over " + std::to_string(m.world) + " ranks (" + layout.status().message() +
                             "; corrupt)");
  for (int r = 0; r < m.world; ++r) {
    const json& e = pieces[static_cast<std::size_t>(r)];
    PieceEntry p;
    p.rank = e.at("rank").get<int>();
    p.capacity = e.at("capacity").get<std::int64_t>();
    const std::string piece = who + "piece " + std::to_string(r) + ": ";
    if (p.rank != r)
      return Status::data_loss(piece + "rank " + std::to_string(p.rank) + " (expected " + std::to_string(r) +
                               ": one piece per rank, in rank order; corrupt)");
    if (p.capacity != layout.value().key_capacity(r))
      return Status::data_loss(piece + "capacity " + std::to_string(p.capacity) + " (expected " +
                               std::to_string(layout.value().key_capacity(r)) + ", rank " + std::to_string(r) +
                               "'s shard of " + mt.sharding + " sharding over " + std::to_string(m.world) +
                               " ranks; corrupt)");
    STRATA_RETURN_IF_ERROR(parse_dynamic_file(piece, e, mt, p));
    mt.pieces.push_back(std::move(p));
  }
  return Status::ok();
}

// Whether `rows` records of `width` floats and a header fit in a file of at most 2^63 - 1 bytes (so every size and
// offset of it is an int64_t and a size_t).
bool file_bytes_fit(std::int64_t rows, std::int64_t width) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  return rows >= 0 && width >= 0 &&
         rows <= (kMax - static_cast<std::int64_t>(kHeaderBytes)) / 4 / std::max<std::int64_t>(1, width);
}

// Whether a box of `cols` columns of table `t` can hold its share of the optimizer state: every box that holds all
// columns can; a part of them only when the state is whole blocks of dim floats (not rowwise_adagrad's one a row).
bool holds_its_state(const ManifestTable& t, std::int32_t cols) {
  return cols == t.dim || (t.dim > 0 && t.state_dim % t.dim == 0);
}

// Why a box refused by holds_its_state is: "a part of the columns ... (expected all 4 columns", unclosed.
std::string unsplit_state(const ManifestTable& t) {
  return "a part of the columns of a table whose optimizer state (" + std::to_string(t.state_dim) +
         " floats a row) cannot be split by column (expected all " + std::to_string(t.dim) + " columns";
}

// Checks that table `mt` of the manifest at `path` has a shape a store can have: rows >= 0, dim 1 to kMaxDim, element
// types and an optimizer it knows, with the state_dim that optimizer keeps, and a file of every row within 2^63 - 1
// bytes (so that no size computed from them wraps).
Status check_shape(const std::string& path, const ManifestTable& mt) {
  const std::string who = path + ": table '" + mt.name + "': ";
  if (mt.rows < 0) return Status::data_loss(who + "rows " + std::to_string(mt.rows) + " (expected >= 0; corrupt)");
  if (mt.dim < 1 || mt.dim > kMaxDim)
    return Status::data_loss(who + "dim " + std::to_string(mt.dim) + " (expected 1 to " + std::to_string(kMaxDim) +
                             "; corrupt)");
  for (const std::string* dtype : {&mt.dtype, &mt.state_dtype})
    if (Result<DType> d = parse_dtype(*dtype); !d) return Status::data_loss(who + d.status().message() + " (corrupt)");
  Result<OptimizerKind> kind = parse_optimizer(mt.optimizer);
  if (!kind) return Status::data_loss(who + kind.status().message() + " (corrupt)");
  // The element types a table may have (no store writes a rowwise_adagrad table with bf16 state).
  TableSpec types;
  types.optimizer.kind = kind.value();
  types.dtype = parse_dtype(mt.dtype).value();
  types.state_dtype = parse_dtype(mt.state_dtype).value();
  if (Status s = validate_dtypes(types, path + ": table '" + mt.name + "'"); !s.is_ok())
    return Status::data_loss(s.message() + " (corrupt)");
  const std::int32_t state_dim = optimizer_state_dim(kind.value(), mt.dim);
  if (mt.state_dim != state_dim)
    return Status::data_loss(who + "state_dim " + std::to_string(mt.state_dim) + " (expected " +
                             std::to_string(state_dim) + " for optimizer " + mt.optimizer + " and dim " +
                             std::to_string(mt.dim) + "; corrupt)");
  const std::int64_t width = std::int64_t{mt.dim} + mt.state_dim;
  if (!file_bytes_fit(mt.rows, width))
    return Status::data_loss(who + "rows " + std::to_string(mt.rows) + " of " + std::to_string(width) +
                             " floats each make more than 2^63 - 1 bytes (expected a table a file can hold; corrupt)");
  return Status::ok();
}

// "a header and 9 records of 16 bytes": what a file of `box` of table `t` in format `version` holds, in messages.
std::string file_contents(const ManifestTable& t, const Box& box, std::uint32_t version) {
  return "a header and " + std::to_string(box.rows) + " records of " +
         std::to_string(file_record_bytes(file_record(t, box, version))) + " bytes";
}

// Checks the size the manifest (of format `version`) records for each piece of `mt` (tiled) against its box.
Status check_piece_sizes(const std::string& path, const ManifestTable& mt, std::uint32_t version) {
  for (const PieceEntry& p : mt.pieces) {
    const std::string who = path + ": table '" + mt.name + "': piece '" + p.file + "' (" + describe(p.box) + ")";
    if (!holds_its_state(mt, p.box.cols)) return Status::data_loss(who + ": " + unsplit_state(mt) + "; corrupt)");
    const std::uint64_t want = expected_file_bytes(mt, p.box, version);
    if (p.bytes != want)
      return Status::data_loss(who + ": " + std::to_string(p.bytes) + " bytes (expected " + std::to_string(want) +
                               ", " + file_contents(mt, p.box, version) + "; corrupt)");
  }
  return Status::ok();
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
  std::set<std::string> files_seen;
  try {
    const json j = json::parse(body);
    if (j.at("format").get<std::string>() != "strata-checkpoint")
      return Status::data_loss(path + ": not a Strata checkpoint manifest");
    const auto version = j.at("version").get<std::uint32_t>();
    if (version < kFormatVersion || version > kNewestFormatVersion)
      return Status::invalid_argument(
          path + ": format version " + std::to_string(version) + " (expected " + std::to_string(kFormatVersion) + ", " +
          std::to_string(kWorldFormatVersion) + ", " + std::to_string(kTypedFormatVersion) + ", " +
          std::to_string(kDynamicFormatVersion) + " or " + std::to_string(kWorldDynamicFormatVersion) + ")");
    m.version = version;
    if (version != kFormatVersion) {  // pieces
      const std::string save = j.at("save").get<std::string>();
      if (save.size() != 16 || save.find_first_not_of("0123456789abcdef") != std::string::npos)
        return Status::data_loss(path + ": save id '" + save + "' (expected 16 lowercase hex digits; corrupt)");
      m.save_id = std::stoull(save, nullptr, 16);
      m.world = j.at("world").get<int>();
      if (m.world < 1)
        return Status::data_loss(path + ": world " + std::to_string(m.world) + " (expected >= 1; corrupt)");
    }
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
      if (t.contains("state_dtype")) mt.state_dtype = t.at("state_dtype").get<std::string>();
      mt.optimizer = t.at("optimizer").get<std::string>();
      STRATA_RETURN_IF_ERROR(check_shape(path, mt));
      if (version >= kWorldDynamicFormatVersion && t.contains("dynamic")) {
        STRATA_RETURN_IF_ERROR(parse_dynamic_shards(path, m, t.at("dynamic"), mt));
      } else if (version == kDynamicFormatVersion && t.contains("dynamic")) {
        STRATA_RETURN_IF_ERROR(parse_dynamic(path, t.at("dynamic"), mt));
      } else if (version == kFormatVersion) {
        parse_v1_file(t, mt);
      } else {
        STRATA_RETURN_IF_ERROR(parse_v2_pieces(path, m, t, mt));
      }
      mt.has_learning_rate = t.contains("learning_rate");
      if (mt.has_learning_rate) {
        const double lr = t.at("learning_rate").get<double>();
        mt.learning_rate = static_cast<float>(lr);
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
      for (const PieceEntry& p : mt.pieces)
        // A file listed twice would be read for two parts of the tables (or removed as stale under another).
        if (!files_seen.insert(p.file).second)
          return Status::data_loss(path + ": table '" + mt.name + "': file '" + p.file +
                                   "' is listed twice (expected one file per piece; corrupt)");
      if (mt.dynamic) {  // its size checked by parse_dynamic; no tiles
        m.tables.push_back(std::move(mt));
        continue;
      }
      std::vector<Box> boxes;
      std::vector<std::string> files;
      for (const PieceEntry& p : mt.pieces) {
        boxes.push_back(p.box);
        files.push_back(p.file);
      }
      const Status tiled = check_tiling(mt.name, mt.rows, mt.dim, boxes, files);
      if (!tiled.is_ok()) return tiled.with_context(path);
      if (version != kFormatVersion) STRATA_RETURN_IF_ERROR(check_piece_sizes(path, mt, version));
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
  if (m.version != kFormatVersion) {
    j["save"] = hex64(m.save_id);
    j["world"] = m.world;
  }
  j["tables"] = json::array();
  for (const auto& t : m.tables) {
    // Format 1's table entry, key by key as it always was (json objects sort their keys when dumped).
    json e;
    e["name"] = t.name;
    e["rows"] = t.rows;
    e["dim"] = t.dim;
    e["state_dim"] = t.state_dim;
    e["dtype"] = t.dtype;
    if (t.state_dtype != "fp32") e["state_dtype"] = t.state_dtype;
    e["optimizer"] = t.optimizer;
    if (t.has_learning_rate) e["learning_rate"] = t.learning_rate;
    if (t.dynamic && m.version >= kWorldDynamicFormatVersion) {
      json pieces = json::array();
      for (const PieceEntry& p : t.pieces)
        pieces.push_back({{"rank", p.rank},
                          {"capacity", p.capacity},
                          {"keys", p.keys},
                          {"sketch_bytes", p.sketch_bytes},
                          {"file", p.file},
                          {"bytes", p.bytes},
                          {"crc32c", hex32(p.crc)}});
      e["dynamic"] = {{"sharding", t.sharding}, {"clock", t.clock}, {"pieces", std::move(pieces)}};
    } else if (t.dynamic) {
      const PieceEntry& p = t.pieces.at(0);
      e["dynamic"] = {{"keys", t.keys},
                      {"sketch_bytes", t.sketch_bytes},
                      {"file", p.file},
                      {"bytes", p.bytes},
                      {"crc32c", hex32(p.crc)}};
    } else if (m.version == kFormatVersion) {
      const PieceEntry& p = t.pieces.at(0);
      e["file"] = p.file;
      e["bytes"] = p.bytes;
      e["crc32c"] = hex32(p.crc);
    } else {
      e["sharding"] = t.sharding;
      e["pieces"] = json::array();
      for (const PieceEntry& p : t.pieces)
        e["pieces"].push_back({{"file", p.file},
                               {"rank", p.rank},
                               {"rows", p.box.rows},
                               {"row_start", p.box.row_start},
                               {"row_step", p.box.row_step},
                               {"col_offset", p.box.col_offset},
                               {"cols", p.box.cols},
                               {"bytes", p.bytes},
                               {"crc32c", hex32(p.crc)}});
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

void remove_stale_files(const std::string& dir, const std::vector<std::string>& keep, Status (*each_file)()) {
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
  for (const auto& name : doomed) {
    ::unlink(join(dir, name).c_str());
    if (each_file && !each_file().is_ok()) return;
  }
}

std::vector<std::string> file_names(const Manifest& m) {
  std::vector<std::string> names;
  for (const auto& t : m.tables)
    for (const auto& p : t.pieces) names.push_back(p.file);
  return names;
}

ManifestTable manifest_entry(const TableSpec& spec) {
  ManifestTable mt;
  mt.name = spec.name;
  mt.rows = spec.rows;
  mt.dim = spec.dim;
  mt.state_dim = optimizer_state_dim(spec.optimizer.kind, spec.dim);
  mt.dtype = to_string(spec.dtype);
  mt.state_dtype = to_string(spec.state_dtype);
  mt.optimizer = to_string(spec.optimizer.kind);
  mt.learning_rate = spec.optimizer.learning_rate;
  mt.has_learning_rate = true;
  return mt;
}

Status check_entry(const ManifestTable& m, const TableSpec& spec, std::int32_t state_dim, const std::string& dir,
                   bool convert_dtypes) {
  const std::string who = dir + ": table '" + spec.name + "'";
  auto mismatch = [&](const char* what, const std::string& got, const std::string& want, const char* note = "") {
    return Status::invalid_argument(who + ": " + what + " " + got + " in the checkpoint (expected " + want +
                                    " from the store config" + note + ")");
  };
  if (m.rows != spec.rows) return mismatch("rows", std::to_string(m.rows), std::to_string(spec.rows));
  if (m.dim != spec.dim) return mismatch("dim", std::to_string(m.dim), std::to_string(spec.dim));
  const char* convert = "; load_converting_dtypes (Python: load(dir, convert_dtypes=True)) converts it";
  if (m.dtype != to_string(spec.dtype) && !convert_dtypes)
    return mismatch("dtype", m.dtype, to_string(spec.dtype), convert);
  if (m.state_dtype != to_string(spec.state_dtype) && !convert_dtypes)
    return mismatch("state_dtype", m.state_dtype, to_string(spec.state_dtype), convert);
  if (m.optimizer != to_string(spec.optimizer.kind))
    return mismatch("optimizer", m.optimizer, to_string(spec.optimizer.kind));
  if (m.state_dim != state_dim) return mismatch("state_dim", std::to_string(m.state_dim), std::to_string(state_dim));
  return Status::ok();
}

std::int64_t record_floats(const ManifestTable& m, const Box& box) {
  if (box.cols == m.dim || m.dim == 0) return std::int64_t{box.cols} + m.state_dim;
  return std::int64_t{box.cols} + std::int64_t{m.state_dim} / m.dim * box.cols;
}

std::uint32_t save_format(const StoreConfig& config, bool world) {
  for (const TableConfig& t : config.tables)
    if (t.dynamic) return world ? kWorldDynamicFormatVersion : kDynamicFormatVersion;
  for (const TableConfig& t : config.tables)
    if (t.spec.dtype != DType::kF32 || t.spec.state_dtype != DType::kF32) return kTypedFormatVersion;
  return world ? kWorldFormatVersion : kFormatVersion;
}

RecordShape file_record(const ManifestTable& m, const Box& box, std::uint32_t version) {
  RecordShape s;
  s.dim = box.cols;
  s.state_dim = static_cast<std::int32_t>(record_floats(m, box) - box.cols);
  if (typed_records(version)) {
    const auto dtype = [](const std::string& name) {
      Result<DType> d = parse_dtype(name);
      return d ? d.value() : DType::kF32;
    };
    s.dtype = dtype(m.dtype);
    s.state_dtype = dtype(m.state_dtype);
  }
  return s;
}

std::int64_t file_record_bytes(const RecordShape& shape) {
  return std::int64_t{shape.dim} * element_bytes(shape.dtype) +
         std::int64_t{shape.state_dim} * element_bytes(shape.state_dtype);
}

std::uint64_t expected_file_bytes(const ManifestTable& m, const Box& box, std::uint32_t version) {
  return kHeaderBytes + static_cast<std::uint64_t>(box.rows) *
                            static_cast<std::uint64_t>(file_record_bytes(file_record(m, box, version)));
}

std::string piece_file_name(const std::string& table, std::uint64_t generation, std::uint64_t save_id, int rank) {
  return table + "." + std::to_string(generation) + "." + hex64(save_id) + ".r" + std::to_string(rank) + ".tbl";
}

namespace {

// "<dir>/<file> (table 't', rows 2 + 4i (9 rows), columns 0-7)": a piece in messages.
std::string piece_name(const std::string& dir, const std::string& file, const ManifestTable& t, const Box& box) {
  return join(dir, file) + " (table '" + t.name + "', " + describe(box) + ")";
}

// Checks what PieceWriter::create and PieceReader::open take for piece `file` (`name` in messages) of `box` of
// table `t`: a plain file name and records of a width a file can hold (parse_manifest refuses the rest).
Status check_piece_args(const std::string& name, const std::string& file, const ManifestTable& t, const Box& box) {
  if (!is_plain_file_name(file))
    return Status::invalid_argument(name + ": '" + file +
                                    "' is not a file name inside the checkpoint directory (expected a name without "
                                    "'/')");
  const std::int64_t width = record_floats(t, box);
  if (width < 1 || !file_bytes_fit(box.rows, width))
    return Status::invalid_argument(name + ": " + std::to_string(box.rows) + " records of " + std::to_string(width) +
                                    " floats (dim " + std::to_string(t.dim) + ", state_dim " +
                                    std::to_string(t.state_dim) +
                                    "; expected records of at least 1 float within 2^63 - 1 bytes)");
  return Status::ok();
}

// The header a piece of `box` of table `t` has in format `version` (format 1: TableHeader's fields, the rest 0; the
// state's element type from format 3 on).
Result<PieceHeader> header_of(const ManifestTable& t, const Box& box, std::uint32_t version, std::uint64_t save_id) {
  PieceHeader h{};
  std::memcpy(h.magic, kTableMagic, sizeof kTableMagic);
  h.version = version;
  h.rows = box.rows;
  h.cols = box.cols;
  h.state_dim = static_cast<std::int32_t>(record_floats(t, box) - box.cols);
  Result<DType> dtype = parse_dtype(t.dtype);
  if (!dtype) return dtype.status().with_context("table '" + t.name + "'");
  Result<DType> state_dtype = parse_dtype(t.state_dtype);
  if (!state_dtype) return state_dtype.status().with_context("table '" + t.name + "': state_dtype");
  Result<OptimizerKind> kind = parse_optimizer(t.optimizer);
  if (!kind) return kind.status().with_context("table '" + t.name + "'");
  h.dtype = static_cast<std::uint32_t>(dtype.value());
  h.optimizer = static_cast<std::uint32_t>(kind.value());
  if (version == kFormatVersion) return h;
  h.row_start = box.row_start;
  h.row_step = box.row_step;
  h.col_offset = box.col_offset;
  h.table_dim = t.dim;
  if (typed_records(version)) h.state_dtype = static_cast<std::uint32_t>(state_dtype.value());
  h.save_id = save_id;
  return h;
}

// The first field in which header `got` differs from `want` (format `version`'s fields), "" when none.
std::string header_difference(const PieceHeader& got, const PieceHeader& want, std::uint32_t version) {
  const auto field = [](const char* name, auto g, decltype(g) w) { return field_difference(name, g, w); };
  if (std::memcmp(got.magic, want.magic, sizeof want.magic) != 0) return "no Strata table magic";
  std::string d = field("format version", got.version, want.version);
  if (d.empty()) d = field("rows", got.rows, want.rows);
  if (d.empty()) d = field(version == kFormatVersion ? "dim" : "columns", got.cols, want.cols);
  if (d.empty()) d = field("state_dim", got.state_dim, want.state_dim);
  if (version == kFormatVersion || !d.empty()) return d;
  if (d.empty()) d = field("dtype", got.dtype, want.dtype);
  if (d.empty()) d = field("optimizer", got.optimizer, want.optimizer);
  if (d.empty()) d = field("first row", got.row_start, want.row_start);
  if (d.empty()) d = field("row step", got.row_step, want.row_step);
  if (d.empty()) d = field("first column", got.col_offset, want.col_offset);
  if (d.empty()) d = field("table dim", got.table_dim, want.table_dim);
  if (d.empty()) d = field("state dtype", got.state_dtype, want.state_dtype);
  if (d.empty() && got.save_id != want.save_id)
    d = "save id " + hex64(got.save_id) + " (expected " + hex64(want.save_id) + ", the manifest's save)";
  return d;
}

// Stores the `n` fp32 elements at `in` as half elements at `out` (2 bytes each) through `narrow_one` (bf16's or fp16's
// rounding to nearest, core/half.hpp), checked back through `widen_one`. Returns the index of the first element the
// half type does not hold exactly (its narrowing widens to other bits), or n. The conversions are the template's
// parameters (lambdas: one loop per half type, each inlined).
template <class Narrow, class Widen>
std::int64_t store_halves(const float* in, std::int64_t n, unsigned char* out, Narrow narrow_one, Widen widen_one) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t h = narrow_one(in[i]);
    if (float_bits(widen_one(h)) != float_bits(in[i])) return i;
    std::memcpy(out + 2 * i, &h, sizeof h);
  }
  return n;
}

// Stores the `n` fp32 elements at `in` as `dtype` elements at `out` (n * element_bytes(dtype) bytes), exactly: returns
// the index of the first element that `dtype` does not hold exactly (the caller refuses the record), or n.
std::int64_t store_exactly(DType dtype, const float* in, std::int64_t n, unsigned char* out) {
  if (dtype == DType::kBF16)
    return store_halves(
        in, n, out, [](float x) { return narrow_bf16_rne(x); }, [](std::uint16_t h) { return widen_bf16(h); });
  if (dtype == DType::kF16)
    return store_halves(
        in, n, out, [](float x) { return narrow_f16_rne(x); }, [](std::uint16_t h) { return widen_f16(h); });
  std::memcpy(out, in, static_cast<std::size_t>(n) * sizeof(float));
  return n;
}

// Loads `n` half elements at `in` (as store_halves stores them) as fp32 at `out` through `widen_one`, element by
// element from the first: `in` may lie inside `out` as load_records allows.
template <class Widen>
void load_halves(const unsigned char* in, std::int64_t n, float* out, Widen widen_one) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, sizeof h);
    out[i] = widen_one(h);
  }
}

// Loads the `n` `dtype` elements at `in` (as store_exactly stores them) as fp32 at `out`, half elements widened; `in`
// may lie inside `out` as load_records allows.
void load_elements(DType dtype, const unsigned char* in, std::int64_t n, float* out) {
  if (dtype == DType::kBF16) {
    load_halves(in, n, out, [](std::uint16_t h) { return widen_bf16(h); });
  } else if (dtype == DType::kF16) {
    load_halves(in, n, out, [](std::uint16_t h) { return widen_f16(h); });
  } else {
    std::memmove(out, in, static_cast<std::size_t>(n) * sizeof(float));
  }
}

// Whether every element of `shape` is fp32: its records are the in-memory ones, byte for byte.
bool all_fp32(const RecordShape& shape) {
  return (shape.dim == 0 || shape.dtype == DType::kF32) && (shape.state_dim == 0 || shape.state_dtype == DType::kF32);
}

// Loads `n` records of `shape` (`record_bytes` each, as a file holds them) at `in` as fp32 records at `out`, record by
// record and element by element from the first. In place too: `in` may be the last n * record_bytes bytes of `out`'s
// n records, since no element is wider in the file than in memory, so each element written ends before the next one
// to read begins.
void load_records(const RecordShape& shape, std::int64_t record_bytes, const unsigned char* in, std::int64_t n,
                  float* out) {
  const std::int64_t width = std::int64_t{shape.dim} + shape.state_dim;
  const std::int64_t state_at = std::int64_t{shape.dim} * element_bytes(shape.dtype);
  for (std::int64_t r = 0; r < n; ++r) {
    const unsigned char* rec = in + r * record_bytes;
    load_elements(shape.dtype, rec, shape.dim, out + r * width);
    load_elements(shape.state_dtype, rec + state_at, shape.state_dim, out + r * width + shape.dim);
  }
}

}  // namespace

Result<PieceWriter> PieceWriter::create(const std::string& dir, const std::string& file, const ManifestTable& t,
                                        const Box& box, std::uint64_t save_id, std::uint32_t version) {
  const std::string name = piece_name(dir, file, t, box);
  if (version < kFormatVersion || version > kNewestFormatVersion)
    return Status::invalid_argument(name + ": format version " + std::to_string(version) + " (expected " +
                                    std::to_string(kFormatVersion) + " to " + std::to_string(kNewestFormatVersion) +
                                    ")");
  if (box.empty() || box.row_start < 0 || box.row_step < 1 || box.col_offset < 0 ||
      std::int64_t{box.col_offset} + box.cols > t.dim)
    return Status::invalid_argument(name + ": not a part of the table (expected at least one row and columns " +
                                    "inside 0-" + std::to_string(t.dim - 1) + ")");
  if (version == kFormatVersion && box != whole_box(t.rows, t.dim))
    return Status::invalid_argument(name + ": a part of the table in format 1 (expected the whole table)");
  STRATA_RETURN_IF_ERROR(check_piece_args(name, file, t, box));
  if (!holds_its_state(t, box.cols)) return Status::invalid_argument(name + ": " + unsplit_state(t) + ")");
  STRATA_ASSIGN_OR_RETURN(PieceHeader h, header_of(t, box, version, save_id));
  PieceWriter w;
  STRATA_ASSIGN_OR_RETURN(w.writer_, AtomicFileWriter::create(join(dir, file)));
  STRATA_RETURN_IF_ERROR(w.writer_.append(&h, sizeof h));
  w.name_ = name;
  w.shape_ = file_record(t, box, version);
  w.rows_ = box.rows;
  w.width_ = record_floats(t, box);
  w.record_bytes_ = file_record_bytes(w.shape_);
  return w;
}

Status PieceWriter::append(const float* records, std::int64_t n) {
  if (n < 0 || n > rows_ - written_)
    return Status::failed_precondition(name_ + ": " + std::to_string(n) + " more records after " +
                                       std::to_string(written_) + " (expected at most " + std::to_string(rows_) +
                                       " in all)");
  if (all_fp32(shape_)) {
    STRATA_RETURN_IF_ERROR(writer_.append(records, static_cast<std::size_t>(n * width_) * sizeof(float)));
    written_ += n;
    return Status::ok();
  }
  if (narrowed_bytes_ < n * record_bytes_) {  // grown, never zero-filled: an append fills every byte it writes out
    narrowed_.reset();
    narrowed_bytes_ = 0;
    narrowed_.reset(new unsigned char[static_cast<std::size_t>(n * record_bytes_)]);
    narrowed_bytes_ = n * record_bytes_;
  }
  unsigned char* const out = narrowed_.get();
  const std::int64_t state_at = std::int64_t{shape_.dim} * element_bytes(shape_.dtype);
  for (std::int64_t r = 0; r < n; ++r) {
    const float* rec = records + r * width_;
    unsigned char* const o = out + r * record_bytes_;
    bool state = false;
    std::int64_t c = store_exactly(shape_.dtype, rec, shape_.dim, o);
    if (c == shape_.dim) {
      state = true;
      c = store_exactly(shape_.state_dtype, rec + shape_.dim, shape_.state_dim, o + state_at);
      if (c == shape_.state_dim) continue;
    }
    const float x = rec[(state ? shape_.dim : 0) + c];
    std::ostringstream value;
    value.precision(9);
    value << x << " (bits " << hex32(float_bits(x)) << ")";
    return Status::invalid_argument(name_ + ": record " + std::to_string(written_ + r) + ", " +
                                    (state ? "state" : "weight") + " column " + std::to_string(c) + " is " +
                                    value.str() + ", which " + to_string(state ? shape_.state_dtype : shape_.dtype) +
                                    " does not hold exactly (expected a value of the table's elements: a checkpoint "
                                    "never rounds; none of these records written)");
  }
  STRATA_RETURN_IF_ERROR(writer_.append(out, static_cast<std::size_t>(n * record_bytes_)));
  written_ += n;
  return Status::ok();
}

Status PieceWriter::commit() {
  if (written_ != rows_)
    return Status::failed_precondition(name_ + ": commit after " + std::to_string(written_) + " records (expected " +
                                       std::to_string(rows_) + ")");
  return writer_.commit();
}

Result<PieceReader> PieceReader::open(const std::string& dir, const ManifestTable& t, const PieceEntry& p,
                                      std::uint32_t version, std::uint64_t save_id) {
  PieceReader r;
  r.name_ = piece_name(dir, p.file, t, p.box);
  STRATA_RETURN_IF_ERROR(check_piece_args(r.name_, p.file, t, p.box));
  STRATA_ASSIGN_OR_RETURN(r.want_header_, header_of(t, p.box, version, save_id));
  STRATA_ASSIGN_OR_RETURN(r.file_, FileReader::open(join(dir, p.file)));
  r.cols_ = p.box.cols;
  r.want_bytes_ = expected_file_bytes(t, p.box, version);
  r.manifest_bytes_ = p.bytes;
  r.want_crc_ = p.crc;
  r.version_ = version;
  r.shape_ = file_record(t, p.box, version);
  r.rows_ = p.box.rows;
  r.width_ = record_floats(t, p.box);
  r.record_bytes_ = file_record_bytes(r.shape_);
  return r;
}

Status PieceReader::verify(Status (*each_chunk)(), const TableSpec* into) {
  verified_ = false;
  if (file_.size() != want_bytes_ || manifest_bytes_ != want_bytes_)
    return Status::data_loss(name_ + ": " + std::to_string(file_.size()) + " bytes, the manifest says " +
                             std::to_string(manifest_bytes_) + " (expected " + std::to_string(want_bytes_) +
                             ", a header and " + std::to_string(rows_) + " records of " +
                             std::to_string(record_bytes_) + " bytes; truncated or corrupt)");
  PieceHeader h{};
  STRATA_RETURN_IF_ERROR(file_.read_at(0, &h, sizeof h));
  const std::string diff = header_difference(h, want_header_, version_);
  if (!diff.empty()) return Status::data_loss(name_ + ": header has " + diff + " from the manifest (corrupt)");
  header_crc_ = crc32c(&h, sizeof h);
  std::uint32_t crc = header_crc_;
  const std::int64_t chunk = std::max<std::int64_t>(1, std::min(kChunkRows, rows_));
  // Not zero-filled: each chunk is read into it before its CRC (and widened before its values are checked).
  const std::unique_ptr<unsigned char[]> buf(new unsigned char[static_cast<std::size_t>(chunk * record_bytes_)]);
  const std::unique_ptr<float[]> values(into ? new float[static_cast<std::size_t>(chunk * width_)] : nullptr);
  for (std::int64_t r = 0; r < rows_; r += chunk) {
    const std::int64_t n = std::min(chunk, rows_ - r);
    const std::size_t bytes = static_cast<std::size_t>(n * record_bytes_);
    STRATA_RETURN_IF_ERROR(
        file_.read_at(kHeaderBytes + static_cast<std::uint64_t>(r * record_bytes_), buf.get(), bytes));
    crc = crc32c(buf.get(), bytes, crc);
    if (into) load_records(shape_, record_bytes_, buf.get(), n, values.get());
    for (std::int64_t i = 0; into && i < n * width_; ++i) {
      const bool state = i % width_ >= cols_;
      const DType dtype = state ? into->state_dtype : into->dtype;
      if (rounds_to_infinity(dtype, values[static_cast<std::size_t>(i)]))
        return Status::invalid_argument(name_ + ": record " + std::to_string(r + i / width_) + ", " +
                                        (state ? "state" : "weight") + " column " +
                                        std::to_string(i % width_ - (state ? cols_ : 0)) + " is " +
                                        unholdable(dtype, values[static_cast<std::size_t>(i)]));
    }
    if (each_chunk) STRATA_RETURN_IF_ERROR(each_chunk());
  }
  if (crc != want_crc_)
    return Status::data_loss(name_ + ": checksum " + hex32(crc) + " does not match the manifest's " + hex32(want_crc_) +
                             " (corrupt)");
  verified_ = true;
  next_ = 0;
  crc_ = header_crc_;
  return Status::ok();
}

Status PieceReader::read_next(std::int64_t n, float* records) {
  if (!verified_) return Status::failed_precondition(name_ + ": read before verify() succeeded");
  if (n < 0 || n > rows_ - next_)
    return Status::out_of_range(name_ + ": " + std::to_string(n) + " more records after " + std::to_string(next_) +
                                " (expected at most " + std::to_string(rows_) + " in all)");
  const std::size_t bytes = static_cast<std::size_t>(n * record_bytes_);
  const std::uint64_t offset = kHeaderBytes + static_cast<std::uint64_t>(next_ * record_bytes_);
  // Read into the end of `records` and widened in place (load_records): no buffer of its own to allocate and fault in
  // per piece. All fp32: the file's records are the caller's, byte for byte.
  unsigned char* const in =
      reinterpret_cast<unsigned char*>(records) + (static_cast<std::size_t>(n * width_) * sizeof(float) - bytes);
  STRATA_RETURN_IF_ERROR(file_.read_at(offset, in, bytes));
  crc_ = crc32c(in, bytes, crc_);
  if (!all_fp32(shape_)) load_records(shape_, record_bytes_, in, n, records);
  next_ += n;
  return Status::ok();
}

Status PieceReader::finish() const {
  if (!verified_ || next_ != rows_)
    return Status::failed_precondition(name_ + ": finish after " + std::to_string(next_) + " of " +
                                       std::to_string(rows_) + " records read (expected all, after verify())");
  if (crc_ != want_crc_)
    return Status::data_loss(name_ + ": checksum " + hex32(crc_) + " of the rows read does not match the manifest's " +
                             hex32(want_crc_) + " (the file changed since it was verified; corrupt)");
  return Status::ok();
}

}  // namespace strata::detail
