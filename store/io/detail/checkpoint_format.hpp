#pragma once
// The on-disk format of checkpoints, shared by a single store's save/load (store/io/checkpoint.cpp, formats 1 and 3)
// and a world's (store/io/detail/world_checkpoint.cpp, formats 2 and 3): the manifest, its parsing and checks, the
// table and piece files, and the cleanup of stale files. Private to the store library.
//
// Format 1 (a store without a world): MANIFEST names one "<table>.<gen>.tbl" per table, a 64-byte TableHeader and
// then every row's record [dim weights | state_dim state] fp32. Format 2 (a world): each table is split into pieces
// "<table>.<gen>.<save>.r<rank>.tbl", one per rank that saved a part of it, each with a 64-byte PieceHeader and the
// records of its Box (reshard.hpp), fp32 too. Format 3: format 2's pieces, each record's elements of its table's
// element types, packed: [cols weights of dtype | state of state_dtype] (core/record_layout.hpp's RecordShape without
// its padding; rowwise_adagrad's one state element a row is fp32, as its state_dtype always is), half elements as
// their 16 bits, every element in the machine's (little-endian) byte order. A save writes the oldest format that holds
// it (save_format): 3 only when a table has half-size weights or state, so that older builds read the rest; every
// format loads. All parse into one Manifest, a format 1 table as one whole piece. MANIFEST is JSON followed by a line
// "crc32c XXXXXXXX" over the JSON text; each piece's CRC covers its bytes as written. Format 4 (a store with a dynamic
// table; save_format gives it before 3): format 3 whose dynamic tables each have one file instead of pieces
// (dynamic_piece.hpp). Format 5 (a world with a dynamic table): format 3 whose dynamic tables each have one such file
// per rank of the saving world, its shard (a table-wise shard of another rank: no keys), with the table's sharding and
// common clock.
//
// In memory a record is fp32 in every format ([cols weights | state] floats, what read_shard and write_shard take):
// PieceWriter narrows a format 3 record's half elements, exactly (they were read from a table of that dtype, so they
// are half values: a value that is not is refused, never rounded), and PieceReader widens them (exact).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/record_layout.hpp"
#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "store/io/detail/reshard.hpp"
#include "store/io/file_io.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

inline constexpr char kManifest[] = "MANIFEST";
/// Name of the lock file of a directory that cannot be flocked itself (see DirLock).
inline constexpr char kLockFile[] = "LOCK";
inline constexpr char kTableMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'T', 'B'};
/// The format of a single store's checkpoint (what older builds read).
inline constexpr std::uint32_t kFormatVersion = 1;
/// The format of a world's checkpoint (pieces); builds before it refuse it ("format version 2 (expected 1)").
inline constexpr std::uint32_t kWorldFormatVersion = 2;
/// Pieces whose records hold each element in its table's element type; builds before it refuse it ("format version 3
/// (expected 1 or 2)").
inline constexpr std::uint32_t kTypedFormatVersion = 3;
/// Format 3 with dynamic tables (dynamic_piece.hpp): the format of a save of a store with a dynamic table; builds
/// before it refuse it ("format version 4 (expected 1, 2 or 3)").
inline constexpr std::uint32_t kDynamicFormatVersion = 4;
/// Format 4 with a dynamic table's file per rank (its shard): a world's save of a store with a dynamic table; builds
/// before it refuse it ("format version 5 (expected 1, 2, 3 or 4)").
inline constexpr std::uint32_t kWorldDynamicFormatVersion = 5;
/// The newest format this build reads and writes.
inline constexpr std::uint32_t kNewestFormatVersion = kWorldDynamicFormatVersion;
/// Whether a file of format `version` holds each element in its table's element type (else every element is fp32).
constexpr bool typed_records(std::uint32_t version) { return version >= kTypedFormatVersion; }
inline constexpr std::size_t kHeaderBytes = 64;
/// Rows per read or write of a table file.
inline constexpr std::int64_t kChunkRows = 1 << 14;
/// How many manifests load (and open_checkpoint) try when saves keep replacing the one just read.
inline constexpr int kLoadAttempts = 10;

/// Header of a format 1 table file.
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

/// Header of a format 2 or 3 piece file: its box and the save it belongs to.
struct PieceHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t dtype;
  std::int64_t rows;  ///< of the piece
  std::int32_t cols;
  std::int32_t state_dim;  ///< of a record: optimizer_state_dim(kind, cols)
  std::uint32_t optimizer;
  std::int32_t row_start, row_step, col_offset;
  std::int32_t table_dim;
  std::uint32_t state_dtype;  ///< format 3: the DType of the state elements; 0 before
  std::uint64_t save_id;
};
static_assert(sizeof(PieceHeader) == kHeaderBytes, "piece header is 64 bytes");

/// "0000abcd": 8 lowercase hex digits.
std::string hex32(std::uint32_t v);
/// "00000000deadbeef": 16 lowercase hex digits (save ids).
std::string hex64(std::uint64_t v);
/// dir + "/" + name.
std::string join(const std::string& dir, const std::string& name);
/// "<name> <got> (expected <want>)", or "" when they are equal: a header field that differs, in messages.
template <class T>
std::string field_difference(const char* name, T got, T want) {
  return got == want ? std::string()
                     : std::string(name) + " " + std::to_string(got) + " (expected " + std::to_string(want) + ")";
}

/// One file of a table: the whole table (format 1) or one rank's part of it (formats 2 and 3); a dynamic table's file
/// (format 4) or one rank's shard of it (format 5).
struct PieceEntry {
  std::string file;         ///< a plain file name inside the checkpoint directory
  int rank = 0;             ///< the saving rank (0 in format 1)
  Box box;                  ///< a dynamic table's: its keys' records (whole_box(keys, dim))
  std::uint64_t bytes = 0;  ///< file size, header included
  std::uint32_t crc = 0;    ///< CRC-32C of the whole file, header included
  /// A dynamic table's (dynamic_piece.hpp): the keys it holds (records), the bytes of its admission sketch, and the
  /// capacity of its shard (format 4: the table's; format 5: the saving rank's key_capacity, 0 for a table-wise shard
  /// of another rank).
  std::int64_t keys = 0, sketch_bytes = 0, capacity = 0;
};
/// One table of a manifest.
struct ManifestTable {
  std::string name;
  std::int64_t rows = 0;
  std::int32_t dim = 0, state_dim = 0;
  std::string dtype, optimizer;
  /// The optimizer state's element type: in the manifest only when it is not fp32 (a checkpoint from
  /// before half-size state has fp32 state).
  std::string state_dtype = "fp32";
  float learning_rate = 0;
  /// Whether learning_rate is recorded: manifest_text writes it only then, parse_manifest sets this false for a
  /// checkpoint from before learning rates were saved. True by default: a saver's entry carries its rate.
  bool has_learning_rate = true;
  std::string sharding;            ///< formats 2 and 3: the saving world's sharding type ("row"); empty in format 1
  std::vector<PieceEntry> pieces;  ///< tile the table (check_tiling); format 1: one whole piece; dynamic: its files
  /// Formats 4 and 5: a dynamic table (rows: its capacity) and its files (dynamic_piece.hpp). In the manifest, instead
  /// of "sharding" and "pieces": format 4 "dynamic": {"keys", "sketch_bytes", "file", "bytes", "crc32c"} (its one
  /// file); format 5 "dynamic": {"sharding", "clock", "pieces": [{"rank", "capacity", "keys", "sketch_bytes", "file",
  /// "bytes", "crc32c"}, one per rank in rank order]}, sharding (in `sharding`) row or table, the capacities each
  /// rank's key_capacity under it (dispatch::ShardLayout, rows capacity + 1; table: the owner's is the whole).
  bool dynamic = false;
  /// Format 5: the clock every piece's header holds (the shards tick together); -1 before (the file's own).
  std::int64_t clock = -1;
  /// Format 4 only: its one file's keys and sketch_bytes as the manifest records them (manifest_text writes these;
  /// parse_manifest sets them and its piece's, which the loader reads).
  std::int64_t keys = 0, sketch_bytes = 0;
};
struct Manifest {
  std::uint32_t version = kFormatVersion;  ///< 1 to 5
  std::uint64_t generation = 0;
  std::uint64_t save_id =
      0;          ///< formats 2 and 3: the save's random id (in every piece's name and header); 0 in format 1
  int world = 1;  ///< the saving world's size (1 in format 1)
  std::int64_t step = 0;
  std::vector<ManifestTable> tables;
  std::string config;  ///< the "config" object as JSON text; empty: not recorded (an older checkpoint)
};

/// Whether `file` names an entry of the checkpoint directory itself: no path components, so a manifest can never
/// make load read (or save remove) anything outside the directory.
bool is_plain_file_name(const std::string& file);

/// Parses and checks the text of the manifest at `path` (used in messages): the checksum line, format 1 to 5, step
/// range, each table's shape (rows >= 0, dim 1 to kMaxDim, a known optimizer and its state_dim, a file of every row
/// within 2^63 - 1 bytes), plain file names, each table listed once, each piece file named once, learning rates,
/// every table's pieces tiling it (check_tiling), piece sizes matching their boxes; a dynamic table's files: one per
/// rank (format 5: its capacity its rank's shard's, row or table sharding), keys within the capacity, a sketch of 0 or
/// its capacity's bytes, sizes matching them, a clock >= 0. kDataLoss "... (corrupt)" naming what is wrong;
/// kInvalidArgument for another format version ("format version 6 (expected 1, 2, 3, 4 or 5)").
Result<Manifest> parse_manifest(const std::string& path, const std::string& text);
/// The manifest text of `m` with its crc32c line, in format m.version: 1 writes one file per table (its one
/// piece; the bytes older builds read), 2 and 3 the pieces with their boxes and the save id, 4 and 5 a dynamic table's
/// files as ManifestTable::dynamic says.
std::string manifest_text(const Manifest& m);
/// Reads and parses `dir`/MANIFEST. kNotFound when it does not exist.
Result<Manifest> read_manifest(const std::string& dir);
/// The config recorded in the manifest `text` of `dir` (parse_manifest's checks first). kFailedPrecondition when
/// it records none.
Result<StoreConfig> recorded_config(const std::string& dir, const std::string& text);

/// Removes the table files ("*.tbl") and temp files (of tables and of the manifest) of `dir` whose names are not in
/// `keep` (best effort: leftovers cost only space). Call with the directory's DirLock held: no other saver is
/// writing files there meanwhile, so temp files are those of saves that crashed or failed.
/// `each_file` (optional) is called after each removal; its error stops the removals.
void remove_stale_files(const std::string& dir, const std::vector<std::string>& keep, Status (*each_file)() = nullptr);
/// The file names of every piece of `m`.
std::vector<std::string> file_names(const Manifest& m);

/// The manifest entry of a table of `spec`: its shape, element types, optimizer and learning rate
/// (no sharding, no pieces).
ManifestTable manifest_entry(const TableSpec& spec);
/// Checks a checkpoint's table entry against the store's spec (rows, dim, dtype, state_dtype, optimizer, state_dim; not
/// the sharding): kInvalidArgument "<dir>: table 'user': dim 8 in the checkpoint (expected 16 from the store config)".
/// `convert_dtypes`: another dtype or state_dtype passes (the load converts it).
Status check_entry(const ManifestTable& m, const TableSpec& spec, std::int32_t state_dim, const std::string& dir,
                   bool convert_dtypes);

/// The format a save of `config` writes: with a dynamic table kWorldDynamicFormatVersion (`world`) or
/// kDynamicFormatVersion, else kTypedFormatVersion when a table has half-size weights or state, else
/// kWorldFormatVersion (`world`) or kFormatVersion: the oldest that holds it, so that older builds read what they can.
std::uint32_t save_format(const StoreConfig& config, bool world);

/// Floats of a record of `box` in a file of table `m` (in memory): box.cols weights and their state (m.state_dim when
/// the box holds every column, else the same share of it).
std::int64_t record_floats(const ManifestTable& m, const Box& box);
/// What a record of `box` of table `m` holds in a file of format `version`: record_floats' elements, of m's dtype and
/// state_dtype in format 3, fp32 before. m's element types must parse (parse_manifest, PieceWriter::create and
/// PieceReader::open check them first); one that does not counts as fp32.
RecordShape file_record(const ManifestTable& m, const Box& box, std::uint32_t version);
/// Bytes of a record of `shape` in a file: its elements packed (no padding).
std::int64_t file_record_bytes(const RecordShape& shape);
/// The size a file of format `version` holding `box` of table `m` must have: header and records.
std::uint64_t expected_file_bytes(const ManifestTable& m, const Box& box, std::uint32_t version);

/// "<table>.<generation>.<save id, 16 hex digits>.r<rank>.tbl": the name of a format 2 or 3 piece.
std::string piece_file_name(const std::string& table, std::uint64_t generation, std::uint64_t save_id, int rank);

/// Writes one piece of format `version`: create() writes the header, append() the records in row order, commit() makes
/// the file durable under its name (AtomicFileWriter: temp, fsync, rename, directory fsync). Move-only; one thread.
class PieceWriter {
 public:
  /// Creates the temp file of `dir`/`file` for `box` of table `t` (its dtype and optimizer names must parse) and
  /// writes the header of format `version` (1: a TableHeader, the whole table only; 2 or 3: a PieceHeader). Errors as
  /// AtomicFileWriter::create; kInvalidArgument for a name that is not a plain file name, a box outside the table, a
  /// part of the columns of a table whose state cannot be split by column (rowwise_adagrad), records of no floats or
  /// past 2^63 - 1 bytes, or another version.
  static Result<PieceWriter> create(const std::string& dir, const std::string& file, const ManifestTable& t,
                                    const Box& box, std::uint64_t save_id, std::uint32_t version);

  PieceWriter() = default;
  /// Appends `n` records (host, n * record_floats(t, box) floats), each element stored as file_record gives it: a
  /// half element narrowed, exactly. kInvalidArgument naming the record, the column and the value for one that its
  /// element type does not hold exactly (none is written); kFailedPrecondition past box.rows records;
  /// AtomicFileWriter's errors.
  Status append(const float* records, std::int64_t n);
  /// Commits the file. kFailedPrecondition unless exactly box.rows records were appended; AtomicFileWriter's.
  Status commit();
  /// Bytes and CRC-32C of the file so far (the manifest's "bytes" and "crc32c" once every record is in).
  std::uint64_t bytes() const noexcept { return writer_.bytes(); }
  std::uint32_t crc() const noexcept { return writer_.crc(); }

 private:
  AtomicFileWriter writer_;
  std::string name_;   // "<dir>/<file> (table 't', <box>)" for messages
  RecordShape shape_;  // of a record in the file
  std::int64_t rows_ = 0, written_ = 0, width_ = 0, record_bytes_ = 0;
  std::unique_ptr<unsigned char[]> narrowed_;  // an append's records as the file holds them (half elements)
  std::int64_t narrowed_bytes_ = 0;
};

/// Reads one piece of a manifest (format 1, 2 or 3) through one descriptor: verify() checks it whole, then
/// read_next() streams its records from row 0 and finish() checks that what was read is what was verified.
/// Move-only; one thread.
class PieceReader {
 public:
  /// Opens `dir`/p.file, piece of table `t` of a manifest of format `version` and save `save_id`. kNotFound when
  /// the file does not exist (a newer save removed it: the caller reads the manifest again), kIoError for another
  /// OS error; kInvalidArgument, before opening anything, when p.file is not a plain file name, when its records
  /// would hold no floats or pass 2^63 - 1 bytes (a table parse_manifest would refuse), or when `t` names an unknown
  /// dtype, state_dtype or optimizer.
  static Result<PieceReader> open(const std::string& dir, const ManifestTable& t, const PieceEntry& p,
                                  std::uint32_t version, std::uint64_t save_id);

  PieceReader() = default;
  /// Checks the size, the header against the manifest (box, shape, element types, save id) and the CRC of the whole
  /// file.
  /// kDataLoss naming the file, the table, the box, what was found and what was expected. `each_chunk` (optional) is
  /// called after each chunk of rows read; its error stops the check with it. `into` (a load that converts dtypes:
  /// the store's spec of the table): kInvalidArgument naming the record, the column and the value for a finite value
  /// that its dtype (weights) or state_dtype (state) cannot hold, as write_rows refuses it, before any row changes.
  Status verify(Status (*each_chunk)() = nullptr, const TableSpec* into = nullptr);
  /// Reads the next `n` records (host, n * width() floats, half elements widened), from row 0 on (again after each
  /// verify()), accumulating their CRC. kFailedPrecondition before verify() succeeded; kOutOfRange past the piece's
  /// rows; read errors.
  Status read_next(std::int64_t n, float* records);
  /// kDataLoss when the CRC of header and rows read differs from the manifest's (the file changed in place since
  /// verify()); kFailedPrecondition unless every row was read.
  Status finish() const;
  /// Floats of one record.
  std::int32_t width() const noexcept { return static_cast<std::int32_t>(width_); }
  /// "<dir>/<file> (table 't', <box>)": the piece in messages.
  const std::string& name() const noexcept { return name_; }

 private:
  FileReader file_;
  std::string name_;
  std::uint64_t want_bytes_ = 0;      // the size of its box
  std::uint64_t manifest_bytes_ = 0;  // the size the manifest records
  std::uint32_t want_crc_ = 0;        // the manifest's
  bool verified_ = false;
  PieceHeader want_header_{};  // as it must be (format 1: TableHeader's fields, the rest 0)
  std::uint32_t version_ = kFormatVersion;
  RecordShape shape_;                                        // of a record in the file
  std::int64_t rows_ = 0, width_ = 0, cols_ = 0, next_ = 0;  // cols_: weights of a record
  std::int64_t record_bytes_ = 0;
  std::uint32_t header_crc_ = 0, crc_ = 0;
};

}  // namespace strata::detail
