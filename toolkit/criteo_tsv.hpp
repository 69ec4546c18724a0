#pragma once
// Reader for Criteo's click-log TSV format (the Kaggle display-advertising challenge and the
// Terabyte click logs share it): one sample per line, fields separated by one TAB:
//
//   label  I1 .. I13  C1 .. C26
//
// label is 0 or 1; I1..I13 are integer counts; C1..C26 are categorical values, each a 32-bit hash
// written as hexadecimal ("68fd1e64"). Any field may be empty (a missing value). Kaggle's test.txt
// has no label column; set CriteoTsvOptions::has_label = false for it.
//
// Samples are grouped into KeyBatch batches of `batch_size` bags for the 26 tables. Each
// categorical field becomes one bag of its table: one key when present, an empty bag when the
// field is empty. The key of value v (the field parsed as an unsigned hexadecimal number) in
// table t (0-based column index among C1..C26) of `rows` rows is
//
//   key = mix64(v | (t << 32)) mod rows
//
// with mix64 the splitmix64 finalizer (z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27;
// z *= 0x94d049bb133111eb; z ^= z >> 31). The mixing makes the map independent of how the hex
// values were produced (a plain `v mod rows`, DLRM's "hashing trick", would do for uniform hashes),
// and the table index keeps equal values of different columns apart. Distinct values may share a
// key when rows < the number of distinct values, as in every hashed embedding.
// Integer features and the label are checked only for the field count; they are not returned.

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/key_batch.hpp"
#include "core/status.hpp"
#include "core/table_spec.hpp"

namespace strata::bench {

/// Number of integer features of a Criteo line.
inline constexpr int kCriteoDenseFeatures = 13;
/// Number of categorical features (and tables) of a Criteo line.
inline constexpr int kCriteoSparseFeatures = 26;

/// Key of categorical value `value` in table `table` (0..25) with `rows` rows (> 0): see the
/// header comment. Pure function.
Key criteo_key(std::uint32_t value, int table, std::int64_t rows) noexcept;

/// Options of CriteoTsvReader.
struct CriteoTsvOptions {
  std::int64_t batch_size = 8192;  ///< samples (bags per table) per batch (> 0)
  bool has_label = true;           ///< lines start with the label (40 fields) or not (39 fields)
  bool drop_last = false;          ///< drop a final batch with fewer than batch_size samples
  /// Column t's values are keyed as those of column key_columns[t] (criteo_key's `table`), so that the columns of one
  /// table (toolkit/feature_tables.hpp) key a value to one row; empty: each column as itself. 26 entries in [0, 26).
  std::vector<int> key_columns;
};

/// Reads batches from a Criteo TSV file. Lines may end in "\n" or "\r\n"; completely empty lines
/// are skipped. A line with the wrong number of fields, or a categorical field that is not 1 to 8
/// hexadecimal digits, is an invalid_argument error naming the file, the 1-based line number and
/// the 0-based field index (and, for a bad value, the value). Move-only; not thread-safe.
class CriteoTsvReader {
 public:
  /// Opens `path` for the 26 `tables` (their names and rows are used: feature t of every batch is
  /// tables[t], fed from column C(t+1)). Errors: tables.size() != 26, a table with rows <= 0, a
  /// batch_size <= 0, key_columns neither empty nor 26 columns (invalid_argument); a missing or
  /// unreadable file (not_found / io_error).
  static Result<CriteoTsvReader> open(const std::string& path, std::vector<TableSpec> tables,
                                      CriteoTsvOptions options = {});

  CriteoTsvReader(CriteoTsvReader&&) noexcept = default;
  CriteoTsvReader& operator=(CriteoTsvReader&&) noexcept = default;

  /// Reads up to batch_size samples into `out` (26 features, no weights) and returns true, or
  /// returns false at the end of the file (or when only a short batch is left and drop_last is
  /// set). On an error the reader goes back to where this call started (a retry meets the same
  /// error); `out` is unchanged.
  Result<bool> next(KeyBatch& out);

  /// Labels of the samples of the last batch returned (empty when has_label is false); 0 for an
  /// empty label field.
  const std::vector<float>& labels() const noexcept { return labels_; }
  /// 1-based number of the last line read (0 before the first).
  std::int64_t line_number() const noexcept { return line_; }
  /// Samples returned so far.
  std::int64_t samples_read() const noexcept { return samples_; }

 private:
  CriteoTsvReader() = default;

  std::string path_;
  std::unique_ptr<std::ifstream> in_;
  std::vector<TableSpec> tables_;
  CriteoTsvOptions options_;
  std::vector<float> labels_;
  std::string line_buf_;
  std::int64_t line_ = 0;
  std::int64_t samples_ = 0;
};

/// Reads a whole Criteo TSV file (at most `max_batches` batches; 0 means all).
Result<std::vector<KeyBatch>> read_criteo_tsv(const std::string& path, const std::vector<TableSpec>& tables,
                                              CriteoTsvOptions options = {}, std::int64_t max_batches = 0);

}  // namespace strata::bench
