#pragma once
// The batches a benchmark runs: generated in memory (toolkit/workload.hpp), or read from a STRTRACE
// trace (toolkit/trace.hpp) or a Criteo TSV file (toolkit/criteo_tsv.hpp) as the steps need them.
//
// A run uses batches 0, 1, 2, ... of its sequence; batch i is batch i mod size() of the source, so
// a source shorter than the run is cycled (as generated batches are). A file source is opened and
// its first size() batches are read and checked once by open_*() (the checksums of a trace, every
// line of a TSV file), before any long work; a trace's later records are checked for their framing
// only (a truncated trace is found; a corrupt record the run never reads is not). After that only
// cursors read it again, each with its
// own file handle, holding one batch at a time: memory does not grow with the file.
// Every batch returned has one feature per table of tables(), in that order (a trace record that
// leaves a table out gets empty bags for it).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/key_batch.hpp"
#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "toolkit/criteo_tsv.hpp"
#include "toolkit/trace.hpp"

namespace strata::bench {

/// Batches kept in memory from the start of a file source (for probes that need a few batches).
inline constexpr std::int64_t kSourceHeadBatches = 9;

/// Most timed steps, and most warm-up steps, per phase of a strata-bench run (its --steps and
/// --warmup, and strata-tune validate's --steps, which it passes on): their sum and the batch
/// counts made from them stay far from int overflow.
inline constexpr int kMaxSteps = 1000000;

/// Checks that a file source of `batches` batches holds one phase of a run: `warmup` + `steps`
/// batches per rank on `world` ranks (a run reads up to twice that; a source between the two is
/// cycled). `kind` and `path` name the source ("trace", "day0.strtrace"). strata-bench applies it
/// to its --trace and --criteo, strata-tune validate before it predicts the run. Error
/// (kInvalidArgument): "<kind> <path> has N batches but --warmup W + --steps S [on R ranks] need at
/// least P (...): lower --steps to at most S" (or which flags to lower when --steps alone cannot).
Status check_source_holds_phase(const std::string& kind, const std::string& path, std::int64_t batches,
                                std::int64_t warmup, std::int64_t steps, int world);

/// Reads the batches of a source in the order of a run, one at a time. Not thread-safe; one per
/// thread.
class BatchCursor {
 public:
  virtual ~BatchCursor() = default;
  /// The next batch of the cursor's sequence (see BatchSource::cursor).
  virtual Result<KeyBatch> next() = 0;
};

/// What the first size() batches of a source hold (computed when it is opened).
struct SourceSummary {
  std::int64_t max_batch_size = 0;  ///< the most bags of a table in one batch
  double mean_keys_per_bag = 0;     ///< keys / bags over every table and batch
  std::int64_t keys = 0;            ///< keys of every table and batch
  std::int64_t samples = 0;         ///< samples (a batch's most bags of a table) of every batch: a TSV's lines
  std::int64_t min_batch_size = 0;  ///< the fewest samples of one batch (a TSV's last batch holds the lines left over)
};

/// A sequence of batches for a run. Copyable (file sources share nothing but the path).
class BatchSource {
 public:
  /// Generated batches (at least one), kept in memory; tables are the features of the first.
  static BatchSource generated(std::vector<KeyBatch> batches);

  /// A STRTRACE file: tables from its header; the first min(num_batches, `needed`) batches are
  /// the sequence, read and checked now. Errors (one line each): the trace's own (not found,
  /// truncated, corrupt: the file and the offset), "trace F has no batches", "trace F has no keys
  /// in its first N batches". `progress` (may be empty) is called with (batches read, total).
  static Result<BatchSource> open_trace(const std::string& path, std::int64_t needed,
                                        const std::function<void(std::int64_t, std::int64_t)>& progress = {});

  /// A Criteo TSV file for the 26 `tables` (C1..C26 in order; criteo_key maps each value into
  /// its table's rows, column t as options.key_columns says), options.batch_size samples per batch
  /// (the last batch may be shorter); the first `needed` batches (or all when the file has fewer)
  /// are the sequence, read and checked now. Errors: the reader's (line and field named), "criteo F
  /// has no samples".
  static Result<BatchSource> open_criteo(const std::string& path, const std::vector<TableSpec>& tables,
                                         const CriteoTsvOptions& options, std::int64_t needed,
                                         const std::function<void(std::int64_t, std::int64_t)>& progress = {});

  /// Batches in the sequence (>= 1).
  std::int64_t size() const noexcept { return size_; }
  /// The features (name and rows: a trace's header entries, a Criteo file's 26 columns), in the
  /// batches' order. Which tables they look up: toolkit/feature_tables.hpp.
  const std::vector<TraceTable>& tables() const noexcept { return tables_; }
  /// The first min(size(), kSourceHeadBatches) batches.
  const std::vector<KeyBatch>& head() const noexcept { return head_; }
  /// Counts over the sequence.
  const SourceSummary& summary() const noexcept { return summary_; }
  /// "generated", "trace" or "criteo".
  const std::string& kind() const noexcept { return kind_; }
  /// The file read ("" when generated).
  const std::string& path() const noexcept { return path_; }
  /// Whether the batches come from a file (streamed) rather than memory.
  bool from_file() const noexcept { return kind_ != "generated"; }

  /// A cursor over batches first, first + stride, first + 2 * stride, ... of the run (each mod
  /// size()); first >= 0, stride >= 1. A file source opens the file again.
  Result<std::unique_ptr<BatchCursor>> cursor(std::int64_t first, std::int64_t stride) const;

 private:
  std::string kind_ = "generated";
  std::string path_;
  std::vector<TraceTable> tables_;
  std::vector<TableSpec> criteo_tables_;
  CriteoTsvOptions criteo_options_;
  std::int64_t size_ = 0;
  std::vector<KeyBatch> head_;
  std::shared_ptr<const std::vector<KeyBatch>> all_;  // generated batches
  SourceSummary summary_;
};

/// Puts the features of `batch` in the order of `tables` (by name) and gives a table the batch
/// leaves out `batch_size` empty bags. Requires every feature to name one of `tables` (the trace
/// reader checks it).
void order_features(KeyBatch& batch, const std::vector<TraceTable>& tables);

}  // namespace strata::bench
