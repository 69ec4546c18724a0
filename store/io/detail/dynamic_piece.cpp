#include "store/io/detail/dynamic_piece.hpp"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "store/detail/batch_checks.hpp"
#include "store/io/detail/crc32c.hpp"
#include "store/io/detail/world_checkpoint.hpp"
#include "store/io/file_io.hpp"

namespace strata::detail {
namespace {

constexpr std::int64_t kEntryBytes = 4 * sizeof(std::int64_t);  // key, row, last use, count

// The header file `p` of dynamic table `t` has (its element types and optimizer parse: parse_manifest checked them).
DynamicHeader header_of(const ManifestTable& t, const PieceEntry& p, std::int64_t clock, std::uint32_t version,
                        std::uint64_t save_id) {
  DynamicHeader h{};
  std::memcpy(h.magic, kDynamicMagic, sizeof kDynamicMagic);
  h.version = version;
  h.dtype = static_cast<std::uint32_t>(parse_dtype(t.dtype).value());
  h.capacity = p.capacity;
  h.dim = t.dim;
  h.state_dim = t.state_dim;
  h.optimizer = static_cast<std::uint32_t>(parse_optimizer(t.optimizer).value());
  h.state_dtype = static_cast<std::uint32_t>(parse_dtype(t.state_dtype).value());
  h.keys = p.keys;
  h.clock = clock;
  h.save_id = save_id;
  return h;
}

// The first field in which `got` differs from `want` (the clock too when `clock`), "" when none.
std::string header_difference(const DynamicHeader& got, const DynamicHeader& want, bool clock) {
  const auto field = [](const char* name, auto g, decltype(g) w) { return field_difference(name, g, w); };
  if (std::memcmp(got.magic, want.magic, sizeof want.magic) != 0) return "no Strata dynamic table magic";
  std::string d = field("format version", got.version, want.version);
  if (d.empty()) d = field("capacity", got.capacity, want.capacity);
  if (d.empty()) d = field("keys", got.keys, want.keys);
  if (d.empty()) d = field("dim", got.dim, want.dim);
  if (d.empty()) d = field("state_dim", got.state_dim, want.state_dim);
  if (d.empty()) d = field("dtype", got.dtype, want.dtype);
  if (d.empty()) d = field("state dtype", got.state_dtype, want.state_dtype);
  if (d.empty()) d = field("optimizer", got.optimizer, want.optimizer);
  if (d.empty()) d = field("save id", got.save_id, want.save_id);
  if (d.empty() && clock) d = field("clock", got.clock, want.clock);
  return d;
}

}  // namespace

std::int64_t dynamic_record_bytes(const ManifestTable& t) {
  return kEntryBytes + 4 * (std::int64_t{t.dim} + t.state_dim);
}

std::uint64_t dynamic_file_bytes(const ManifestTable& t, const PieceEntry& p) {
  return kHeaderBytes + static_cast<std::uint64_t>(p.sketch_bytes) +
         static_cast<std::uint64_t>(p.keys) * static_cast<std::uint64_t>(dynamic_record_bytes(t));
}

Status write_dynamic_piece(const std::string& dir, const ManifestTable& t, const DynamicState& state,
                           std::uint64_t save_id, std::uint32_t version, int rank, PieceEntry& piece) {
  piece.keys = static_cast<std::int64_t>(state.entries.size());
  piece.sketch_bytes = static_cast<std::int64_t>(state.sketch.size());
  piece.box = whole_box(piece.keys, t.dim);
  STRATA_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::create(join(dir, piece.file)));
  const DynamicHeader h = header_of(t, piece, state.clock, version, save_id);
  STRATA_RETURN_IF_ERROR(w.append(&h, sizeof h));
  STRATA_RETURN_IF_ERROR(w.append(state.sketch.data(), state.sketch.size()));
  const auto dim = static_cast<std::size_t>(t.dim), sd = static_cast<std::size_t>(t.state_dim);
  const auto n = state.entries.size(), chunk = static_cast<std::size_t>(kChunkRows);
  const auto record = static_cast<std::size_t>(dynamic_record_bytes(t));
  // Chunk by chunk, each one progress (a shard's records may take longer than a communicator's timeout).
  std::vector<unsigned char> recs(std::min(n, chunk) * record);
  bool halfway = false;
  for (std::size_t i0 = 0; i0 < n; i0 += chunk) {
    const std::size_t m = std::min(chunk, n - i0);
    for (std::size_t j = 0; j < m; ++j) {
      const std::size_t i = i0 + j;
      const KeyIndex::Entry& e = state.entries[i];
      const std::int64_t head[4] = {e.key, e.row, e.last_use, e.count};
      unsigned char* rec = recs.data() + j * record;
      std::memcpy(rec, head, sizeof head);
      std::memcpy(rec + sizeof head, state.weights.data() + i * dim, dim * sizeof(float));
      if (sd) std::memcpy(rec + sizeof head + dim * sizeof(float), state.state.data() + i * sd, sd * sizeof(float));
    }
    STRATA_RETURN_IF_ERROR(w.append(recs.data(), m * record));
    STRATA_RETURN_IF_ERROR(progressed());
    if (!halfway && 2 * (i0 + m) >= n) {
      halfway = true;
      STRATA_RETURN_IF_ERROR(at_save_point(rank, SavePoint::kPieceHalfWritten));
    }
  }
  STRATA_RETURN_IF_ERROR(w.commit());
  piece.bytes = w.bytes();
  piece.crc = w.crc();
  return Status::ok();
}

Result<DynamicState> read_dynamic_piece(const std::string& dir, const ManifestTable& t, const PieceEntry& piece,
                                        std::uint32_t version, std::uint64_t save_id, const TableConfig& into,
                                        bool convert_dtypes, bool keep_sketch) {
  const std::string name = join(dir, piece.file) + " (dynamic table '" + t.name + "')";
  if (!is_plain_file_name(piece.file))
    return Status::invalid_argument(name + ": not a file name inside the checkpoint directory");
  Result<FileReader> opened = FileReader::open(join(dir, piece.file));
  if (!opened)  // its code kept (kNotFound: a newer save removed it)
    return Status::from_code(opened.status().code(), "dynamic table '" + t.name + "': " + opened.status().message());
  const FileReader file = std::move(opened).value();
  const std::uint64_t want = dynamic_file_bytes(t, piece);
  if (file.size() != want || piece.bytes != want)
    return Status::data_loss(name + ": " + std::to_string(file.size()) + " bytes, the manifest says " +
                             std::to_string(piece.bytes) + " (expected " + std::to_string(want) + ", a header, " +
                             std::to_string(piece.sketch_bytes) + " bytes of sketch and " + std::to_string(piece.keys) +
                             " records of " + std::to_string(dynamic_record_bytes(t)) +
                             " bytes; truncated or corrupt)");
  // The header and sketch, then the records chunk by chunk (each one progress), the CRC over them all: checked before
  // the header, as one read of the whole file would.
  DynamicHeader h{};
  DynamicState s;
  s.sketch.resize(static_cast<std::size_t>(piece.sketch_bytes));
  STRATA_RETURN_IF_ERROR(file.read_at(0, &h, sizeof h));
  if (!s.sketch.empty()) STRATA_RETURN_IF_ERROR(file.read_at(kHeaderBytes, s.sketch.data(), s.sketch.size()));
  std::uint32_t crc = crc32c(s.sketch.data(), s.sketch.size(), crc32c(&h, sizeof h));
  const auto dim = static_cast<std::size_t>(t.dim), sd = static_cast<std::size_t>(t.state_dim);
  const auto n = static_cast<std::size_t>(piece.keys), chunk = static_cast<std::size_t>(kChunkRows);
  const auto record = static_cast<std::size_t>(dynamic_record_bytes(t));
  // Reserved (its pages untouched), then filled chunk by chunk: no step as long as the whole shard.
  s.entries.reserve(n);
  s.weights.reserve(n * dim);
  s.state.reserve(n * sd);
  std::vector<unsigned char> recs(std::min(n, chunk) * record);
  for (std::size_t i0 = 0; i0 < n; i0 += chunk) {
    const std::size_t m = std::min(chunk, n - i0);
    s.entries.resize(i0 + m);
    s.weights.resize((i0 + m) * dim);
    s.state.resize((i0 + m) * sd);
    STRATA_RETURN_IF_ERROR(file.read_at(kHeaderBytes + s.sketch.size() + i0 * record, recs.data(), m * record));
    crc = crc32c(recs.data(), m * record, crc);
    for (std::size_t j = 0; j < m; ++j) {
      const std::size_t i = i0 + j;
      const unsigned char* rec = recs.data() + j * record;
      std::int64_t head[4];
      std::memcpy(head, rec, sizeof head);
      s.entries[i] = KeyIndex::Entry{head[0], head[1], head[2], head[3]};
      std::memcpy(s.weights.data() + i * dim, rec + sizeof head, dim * sizeof(float));
      if (sd) std::memcpy(s.state.data() + i * sd, rec + sizeof head + dim * sizeof(float), sd * sizeof(float));
    }
    STRATA_RETURN_IF_ERROR(progressed());
  }
  if (crc != piece.crc)
    return Status::data_loss(name + ": checksum " + hex32(crc) + " does not match the manifest's " + hex32(piece.crc) +
                             " (corrupt)");
  const std::string diff = header_difference(h, header_of(t, piece, t.clock, version, save_id), t.clock >= 0);
  if (!diff.empty()) return Status::data_loss(name + ": header has " + diff + " from the manifest (corrupt)");
  s.clock = h.clock;
  // What an index of the piece's capacity would refuse, refused before any table changes (a probe of its capacity and
  // `into`'s options; an index of no rows has one row, as a table-wise shard of another rank's): one long call.
  // A store that admits at once (admit_after 1) keeps no admission counts: those saved are dropped; one that counts
  // loading a checkpoint without them starts from zero counts.
  Status r;
  STRATA_RETURN_IF_ERROR(long_call([&] {
    KeyIndex probe(std::max<std::int64_t>(piece.capacity, 1), *into.dynamic);
    if (probe.sketch_state_bytes() == 0 || !keep_sketch) s.sketch.clear();
    r = probe.restore(s.clock, s.entries, s.sketch);
    return Status::ok();
  }));
  if (!r.is_ok()) return Status::data_loss(name + ": " + r.message() + " (corrupt)");
  if (convert_dtypes)
    STRATA_RETURN_IF_ERROR(check_holdable("load", into.spec, 0, piece.keys, into.spec.dim, s.weights.data(),
                                          optimizer_state_dim(into.spec.optimizer.kind, into.spec.dim), s.state.data())
                               .with_context(name));
  return s;
}

}  // namespace strata::detail
