#pragma once
// The file of a dynamic table (TableConfig::dynamic) in a checkpoint of format 4, or of one rank's shard of it in
// format 5 (checkpoint_format.hpp): everything its next decisions read (store/detail/dynamic_state.hpp), so that a
// store (a world of the same layout) loaded from it continues bit for bit as the one that saved it. Private to the
// store library.
//
// "<table>.<gen>.<save>.r<rank>.tbl": a 64-byte DynamicHeader, then the admission sketch's bytes
// (KeyIndex::sketch_state(): none when admit_after <= 1), then one record per row in use, in the eviction tie order
// (KeyIndex::entries(): the row touched earliest first): key, row (the shard's local row), last use, count (int64
// each), then dim weights and state_dim state as fp32 (a half-size table's values widened, exactly). Little-endian.
// The manifest's table entry names each file with its size and CRC-32C and records its "keys", "sketch_bytes" (and in
// format 5 its "capacity"), so that parse_manifest checks the size as it checks a piece's.

#include <cstdint>
#include <string>

#include "core/status.hpp"
#include "store/detail/dynamic_state.hpp"
#include "store/io/detail/checkpoint_format.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

inline constexpr char kDynamicMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'D', 'Y'};

/// Header of a dynamic table's file.
struct DynamicHeader {
  char magic[8];
  std::uint32_t version;  ///< the manifest's format version (4)
  std::uint32_t dtype;
  std::int64_t capacity;  ///< of its index: the table's (format 4), its shard's (format 5)
  std::int32_t dim;
  std::int32_t state_dim;
  std::uint32_t optimizer;
  std::uint32_t state_dtype;
  std::int64_t keys;   ///< records
  std::int64_t clock;  ///< format 5: the manifest's
  std::uint64_t save_id;
};
static_assert(sizeof(DynamicHeader) == kHeaderBytes, "dynamic header is 64 bytes");

/// Bytes of one record of table `t`: key, row, last use, count, then its weights and state as fp32.
std::int64_t dynamic_record_bytes(const ManifestTable& t);
/// The size of file `p` of dynamic table `t` (p.keys records, p.sketch_bytes of sketch).
std::uint64_t dynamic_file_bytes(const ManifestTable& t, const PieceEntry& p);

/// Writes `state` of dynamic table `t` (piece.capacity set: its index's) as `dir`/piece.file, its header's clock
/// state.clock, durable under that name once this returns OK (AtomicFileWriter), and sets piece's keys, sketch_bytes,
/// box, bytes and crc. As write_piece: counts progress per chunk of kChunkRows records (progressed()) and calls the
/// save hook at kPieceHalfWritten as rank `rank`. AtomicFileWriter's, progressed()'s and the hook's errors.
Status write_dynamic_piece(const std::string& dir, const ManifestTable& t, const DynamicState& state,
                           std::uint64_t save_id, std::uint32_t version, int rank, PieceEntry& piece);

/// Reads and checks the file `piece` of dynamic table `t` of a manifest of format `version` and save `save_id`, for
/// the table `into` of a store: its size (the manifest's and the records'), header (against the manifest: its clock
/// t.clock in format 5), CRC-32C, and contents as KeyIndex::restore checks them under the piece's capacity and `into`'s
/// options. `keep_sketch` false: the sketch is dropped (a reshard); else kept when `into`'s options keep one. kNotFound
/// when the file does not exist (a newer save removed it), kDataLoss naming the file and what is wrong; with
/// `convert_dtypes`, kInvalidArgument for a value `into`'s element types cannot hold (check_holdable). Changes no
/// store. Reads chunk by chunk, each one progress (progressed()), its probe restore one long_call
/// (world_checkpoint.hpp).
Result<DynamicState> read_dynamic_piece(const std::string& dir, const ManifestTable& t, const PieceEntry& piece,
                                        std::uint32_t version, std::uint64_t save_id, const TableConfig& into,
                                        bool convert_dtypes, bool keep_sketch);

}  // namespace strata::detail
