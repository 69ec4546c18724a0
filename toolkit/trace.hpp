#pragma once
// Trace files: recorded batches of several tables (offsets, keys and optional weights per table),
// checksummed per batch so a truncated or corrupt file is detected. docs/trace-format.md
// documents the format byte by byte; the summary:
//
//   header   "STRTRACE", u32 version (1), u32 flags (0), u32 num_tables, u64 num_batches,
//            num_tables x (u32 name_len, name bytes, i64 rows), u32 CRC-32C of the header bytes
//   record   u32 0x48435442 ("BTCH"), u64 payload_len, payload, u32 CRC-32C of the record bytes
//   payload  u32 num_features, i64 batch_size, then per feature: u32 table_index, u32 flags
//            (bit 0: weights), u64 num_keys, i64 offsets[batch_size + 1], i64 keys[num_keys],
//            f32 weights[num_keys] when flagged
//
// All integers little-endian, no padding. TraceWriter writes to a temporary file next to the
// target and renames it into place on close(), so a trace under its final name is always complete.
// The older raw format of write_batches_raw (STRKEYS1, toolkit/workload.hpp) is a different format.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/key_batch.hpp"
#include "core/status.hpp"

namespace strata::bench {

/// Magic bytes at offset 0 of a trace file.
inline constexpr char kTraceMagic[8] = {'S', 'T', 'R', 'T', 'R', 'A', 'C', 'E'};
/// The format version this code writes and reads.
inline constexpr std::uint32_t kTraceVersion = 1;
/// Magic of every batch record: the bytes "BTCH" read as a little-endian u32.
inline constexpr std::uint32_t kTraceRecordMagic = 0x48435442u;
/// Longest table name accepted (bytes).
inline constexpr std::uint32_t kTraceMaxNameBytes = 4096;

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `n` bytes at `data` (host memory; may
/// be nullptr when n == 0), continuing from `crc`, the value returned for the preceding bytes (0 to
/// start). trace_crc32c("123456789", 9) == 0xE3069283. Table-driven, thread-safe, no allocation.
std::uint32_t trace_crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept;

/// A table as the trace header records it.
struct TraceTable {
  std::string name;       ///< table name (1..kTraceMaxNameBytes bytes, unique within a trace)
  std::int64_t rows = 0;  ///< number of rows (> 0); every key of this table is in [0, rows)
};

/// Writes a trace file. Create with create(), append() batches, then close(); until close()
/// succeeds the data lives in a temporary file "<path>.tmp-<pid>-<n>" that the destructor removes,
/// so an abandoned or failed writer never leaves a partial file under `path`. Move-only; not
/// thread-safe.
class TraceWriter {
 public:
  /// Opens the temporary file and writes the header for `tables` (at least one; names non-empty,
  /// unique, at most kTraceMaxNameBytes; rows > 0). Errors: invalid_argument naming the table,
  /// io_error naming the path and the OS reason.
  static Result<TraceWriter> create(const std::string& path, std::vector<TraceTable> tables);

  TraceWriter(TraceWriter&& other) noexcept;
  TraceWriter& operator=(TraceWriter&& other) noexcept;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  /// Removes the temporary file unless close() succeeded. Never throws.
  ~TraceWriter();

  /// Validates and appends one batch: at least one feature; each feature names a header table
  /// (at most once per batch) and passes validate(JaggedKeys, ...) against that table's rows;
  /// every feature has the same batch size. A rejected batch writes nothing (invalid_argument or
  /// out_of_range naming the batch index and table); a write failure is an io_error and makes
  /// every later call fail.
  Status append(const KeyBatch& batch);

  /// Records the batch count in the header, flushes, fsyncs, renames the temporary file to `path`
  /// (replacing it) and fsyncs the directory. Errors: io_error naming the path and the OS reason;
  /// failed_precondition when already closed or after an earlier write failure.
  Status close();

  /// Batches appended so far.
  std::uint64_t batches_written() const noexcept { return batches_; }
  /// The final path.
  const std::string& path() const noexcept { return path_; }

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const noexcept;
  };
  TraceWriter() = default;
  void discard() noexcept;

  std::string path_;
  std::string temp_path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::vector<TraceTable> tables_;
  std::unordered_map<std::string, std::uint32_t> index_;  // table name -> header index
  std::vector<unsigned char> header_;                     // header bytes without the checksum
  std::vector<unsigned char> record_;                     // scratch for one record
  std::uint64_t batches_ = 0;
  bool failed_ = false;
  bool closed_ = false;
};

/// Reads a trace file written by TraceWriter. Every error names the file, the byte offset and
/// what was expected: data_loss for a truncated file, a bad checksum, a bad record or trailing
/// bytes; invalid_argument for a wrong magic or an unsupported version or flags; not_found /
/// io_error when the file cannot be opened or read. Move-only; not thread-safe.
class TraceReader {
 public:
  /// Opens `path` and reads and checks the whole header (magic, version, flags, tables, checksum).
  static Result<TraceReader> open(const std::string& path);

  TraceReader(TraceReader&&) noexcept = default;
  TraceReader& operator=(TraceReader&&) noexcept = default;
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  /// Reads the next batch into `out` (replacing its contents; features carry the header's table
  /// names and are in record order) and returns true, or returns false after the last batch,
  /// once the end of the file has been checked. The record's checksum is verified before it is
  /// decoded, and the decoded batch is validated against the header's row counts.
  Result<bool> next(KeyBatch& out);

  /// Steps over the next batch without reading its payload: checks its record header (magic, and
  /// a length within the file) and seeks past it, not its checksum. Returns false after the last
  /// batch, once the end of the file has been checked (as next()). Finds a truncated file without
  /// decoding it.
  Result<bool> skip();

  /// Goes back to the first batch.
  Status rewind();

  /// The tables of the header, in header order.
  const std::vector<TraceTable>& tables() const noexcept { return tables_; }
  /// The batch count recorded in the header.
  std::uint64_t num_batches() const noexcept { return num_batches_; }
  /// Batches returned by next() since open() or rewind().
  std::uint64_t batches_read() const noexcept { return batches_read_; }
  /// The path given to open().
  const std::string& path() const noexcept { return path_; }

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const noexcept;
  };
  TraceReader() = default;
  Status read_exact(void* dst, std::size_t n, const char* what);
  // Reads and checks the next record's header into `head` (kRecordHeadBytes) and its payload
  // length; false at the checked end of the file.
  Result<bool> record_head(unsigned char* head, std::uint64_t& payload_len);
  Status error_at(std::uint64_t offset, const std::string& what) const;

  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::uint64_t file_size_ = 0;
  std::uint64_t pos_ = 0;           // byte offset of the next read
  std::uint64_t first_record_ = 0;  // byte offset of batch 0
  std::vector<TraceTable> tables_;
  std::uint64_t num_batches_ = 0;
  std::uint64_t batches_read_ = 0;
  std::vector<unsigned char> record_;  // scratch for one record
};

/// A whole trace in memory.
struct Trace {
  std::vector<TraceTable> tables;  ///< header tables, in order
  std::vector<KeyBatch> batches;   ///< every batch, in order
};

/// Writes `batches` to `path` through a TraceWriter (atomic: all or nothing under `path`).
Status write_trace(const std::string& path, const std::vector<TraceTable>& tables,
                   const std::vector<KeyBatch>& batches);

/// Reads a whole trace (TraceReader::open, then next() until false); errors as TraceReader.
Result<Trace> read_trace(const std::string& path);

}  // namespace strata::bench
