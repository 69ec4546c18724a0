#pragma once
// The file of a dynamic table (TableConfig::dynamic) in a checkpoint of format 4 (checkpoint_format.hpp): everything
// its next decisions read (store/detail/dynamic_state.hpp), so that a store loaded from it continues bit for bit as the
// store that saved it. Private to the store library.
//
// "<table>.<gen>.<save>.r0.tbl": a 64-byte DynamicHeader, then the admission sketch's bytes (KeyIndex::sketch_state():
// none when admit_after <= 1), then one record per row in use, in the eviction tie order (KeyIndex::entries(): the row
// touched earliest first): key, row, last use, count (int64 each), then dim weights and state_dim state as fp32 (a
// half-size table's values widened, exactly). Little-endian. The manifest's table entry names the file with its size
// and CRC-32C and records "keys" and "sketch_bytes", so that parse_manifest checks the size as it checks a piece's.

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
  std::int64_t capacity;
  std::int32_t dim;
  std::int32_t state_dim;
  std::uint32_t optimizer;
  std::uint32_t state_dtype;
  std::int64_t keys;  ///< records
  std::int64_t clock;
  std::uint64_t save_id;
};
static_assert(sizeof(DynamicHeader) == kHeaderBytes, "dynamic header is 64 bytes");

/// Bytes of one record of table `t`: key, row, last use, count, then its weights and state as fp32.
std::int64_t dynamic_record_bytes(const ManifestTable& t);
/// The size of the file of dynamic table `t` (t.keys records, t.sketch_bytes of sketch).
std::uint64_t dynamic_file_bytes(const ManifestTable& t);

/// Writes `state` of dynamic table `t` (its keys and sketch_bytes set from `state`) as `dir`/piece.file, durable under
/// that name once this returns OK (AtomicFileWriter), and sets piece.bytes and piece.crc. AtomicFileWriter's errors.
Status write_dynamic_piece(const std::string& dir, const ManifestTable& t, const DynamicState& state,
                           std::uint64_t save_id, std::uint32_t version, PieceEntry& piece);

/// Reads and checks the file `piece` of dynamic table `t` of a manifest of format `version` and save `save_id` into the
/// table `into` of a store: its size (the manifest's and the records'), header (against the manifest), CRC-32C, and
/// contents as KeyIndex::restore checks them under `into`'s capacity and options. kNotFound when the file does not
/// exist (a newer save removed it), kDataLoss naming the file and what is wrong; with `convert_dtypes`,
/// kInvalidArgument for a value `into`'s element types cannot hold (check_holdable). Changes no store.
Result<DynamicState> read_dynamic_piece(const std::string& dir, const ManifestTable& t, const PieceEntry& piece,
                                        std::uint32_t version, std::uint64_t save_id, const TableConfig& into,
                                        bool convert_dtypes);

}  // namespace strata::detail
