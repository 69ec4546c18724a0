#pragma once
// Synthetic workloads for the benchmarks: a JSON-described spec, a key sampler (uniform, Zipf with
// the hot rows scattered over the table, or Zipf whose hot rows move every N steps), batch generation
// with fixed or variable bag lengths, the built-in Criteo-shaped table set, a raw trace dump that
// peer benchmarks (bench/peers/*.py) replay, and a host memory read-bandwidth probe used as the
// roofline. The documented multi-table trace format is in toolkit/trace.hpp.
//
// Raw trace format ("STRKEYS1", version 1), all integers little-endian, no padding:
//
//   char[8]  magic        "STRKEYS1"
//   u32      version      1
//   u32      num_batches
//   u32      num_tables   every batch has this many features, in the same order
//   then for each batch, for each table (feature order of the batch):
//     u64    num_offsets  batch_size + 1
//     i64    offsets[num_offsets]   offsets[0] == 0, non-decreasing, last == num_keys
//     u64    num_keys
//     i64    keys[num_keys]         row ids in [0, rows)
//
// Table names, rows, dims and weights are not recorded: the reader gets them from the same
// command line / workload spec that produced the file.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/key_batch.hpp"
#include "core/status.hpp"
#include "core/table_spec.hpp"

namespace strata::bench {

/// One table of a workload: its name and shape.
struct TableShape {
  std::string name;       ///< unique in the workload; letters, digits, '_', '-', '.'
  std::int64_t rows = 0;  ///< rows (> 0)
  int dim = 0;            ///< row width in floats (> 0)
};

/// Most tables a workload may have (2^16, the tables a slot pool can key: cache/analysis.hpp).
/// Checked before any per-table state is built.
inline constexpr int kMaxWorkloadTables = 1 << 16;

/// Shape and key distribution of a synthetic workload: `tables` tables of `rows` x `dim` each
/// (named "t0", "t1", ...), or, when `table_list` is non-empty, exactly the tables it lists
/// (heterogeneous rows and dims; `tables`, `rows` and `dim` are then unused).
struct WorkloadSpec {
  int tables = 1;                      ///< number of tables (1..kMaxWorkloadTables)
  std::int64_t rows = 2000000;         ///< rows per table (> 0)
  int dim = 128;                       ///< row width in floats (> 0)
  std::vector<TableShape> table_list;  ///< non-empty: these tables instead of tables x rows x dim
  std::int64_t batch = 8192;           ///< bags per table per batch (> 0)
  int bag_size = 32;                   ///< keys per bag (>= 0): exact ("fixed") or mean ("uniform") bag length
  std::string bag_dist = "fixed";      ///< bag lengths: "fixed" (all bag_size) or "uniform" (i.i.d. in [0, 2*bag_size])
  std::string dist = "uniform";        ///< key distribution: "uniform", "zipf:ALPHA" or "drift:ALPHA:N"
  std::uint64_t seed = 42;             ///< seed of everything random (keys and the hot-row placement)
  int distinct_batches = 8;            ///< number of different batches generated (>= 1); runs cycle them
};

/// Parses a JSON object whose keys are the WorkloadSpec field names; missing keys keep their
/// defaults, an unknown key or a value of the wrong type is an error naming the key (and quoting
/// at most kMaxQuotedChars characters of the value). JSON nested deeper than kMaxJsonDepth is
/// refused before it is built (toolkit/bounded_input.hpp). The result is validated. "tables" is an integer (that many
/// tables of "rows" x "dim"), an array of
/// {"name": string (optional, default "t<index>"), "rows": integer, "dim": integer (optional,
/// default "dim")} objects, or a string in the syntax of apply_table_set ("criteo",
/// "criteo:TOTAL_ROWS" or "[NAME=]ROWS[xDIM],..."; the "dim" key gives the default dim wherever
/// it appears in the object).
Result<WorkloadSpec> parse_workload_json(const std::string& json_text);

/// Sets the tables of `spec` from a table-set string:
///   "N"                     N tables of spec.rows x spec.dim named t0..t{N-1} (table_list cleared)
///   "criteo"                the 26 Criteo Kaggle tables scaled to kCriteoDefaultMaxRows rows in
///                           total (criteo_default_tables), all of dim spec.dim
///   "criteo:TOTAL_ROWS"     the same scaled to at most TOTAL_ROWS rows in total
///   "[NAME=]ROWS[xDIM],..." one table per comma-separated item; NAME defaults to "t<index>",
///                           DIM to spec.dim (e.g. "user=1000000x128,item=50000x64,300")
/// More than kMaxWorkloadTables tables (N, or list items) is an error, found before any table is
/// built. Errors name the item, the value and what was expected ("table list item 2 'x64': rows '' is
/// not a positive integer (expected [NAME=]ROWS[xDIM])"); on error `spec` is unchanged.
/// The result is not validated as a whole (call validate).
Status apply_table_set(WorkloadSpec& spec, const std::string& table_set);

/// The tables of `spec`: table_list when non-empty, else `tables` copies of rows x dim named
/// "t0", "t1", ... Does not validate.
std::vector<TableShape> workload_tables(const WorkloadSpec& spec);

/// Checks ranges (rows, dim, batch > 0; bag_size >= 0; tables, distinct_batches >= 1; at most
/// kMaxWorkloadTables tables), that
/// `dist` parses and that `bag_dist` is "fixed" or "uniform"; for a table_list, that every entry
/// has a valid unique name, rows > 0 and dim > 0. The message names the field (or table), the
/// value and what was expected.
Status validate(const WorkloadSpec& spec);

/// The most key occurrences one generated batch of `spec` holds over every table: batch x
/// bag_size per table, twice that with bag_dist "uniform" (bag lengths reach 2 x bag_size). A
/// double, so that a spec no machine can hold still has a value.
double max_batch_keys(const WorkloadSpec& spec);

/// The most bytes of one generated batch of `spec`: its keys and its bags' offsets, 8 bytes each.
double max_batch_bytes(const WorkloadSpec& spec);

/// The spec as a one-line JSON object (the same keys parse_workload_json reads), for result files.
/// With a table_list, "tables" is the array of {"name", "rows", "dim"} objects and "rows"/"dim"
/// are left out.
std::string workload_to_json(const WorkloadSpec& spec);

/// A parsed key distribution.
struct Distribution {
  /// Which family.
  enum class Kind : std::uint8_t {
    kUniform = 0,  ///< every row equally likely
    kZipf = 1,     ///< P(rank r) proportional to r^-alpha, r = 1..rows
    kDrift = 2,    ///< Zipf whose rank->row map is re-keyed every `drift_steps` steps (a moving hot set)
  };
  Kind kind = Kind::kUniform;    ///< family
  double alpha = 0.0;            ///< Zipf exponent (> 0, finite); unused for uniform
  std::int64_t drift_steps = 0;  ///< drift only: steps per epoch (>= 1); the hot set moves at each epoch
};

/// Parses "uniform", "zipf:ALPHA" (ALPHA a finite number > 0, e.g. "zipf:1.05") or
/// "drift:ALPHA:N" (ALPHA as for zipf, N a decimal integer >= 1, e.g. "drift:1.05:100"). Otherwise:
/// "unknown distribution 'X' (expected uniform, zipf:ALPHA or drift:ALPHA:N)".
Result<Distribution> parse_distribution(const std::string& s);

/// Bag lengths of a generated feature.
enum class BagDist : std::uint8_t {
  kFixed = 0,    ///< every bag has exactly bag_size keys
  kUniform = 1,  ///< each bag length i.i.d. uniform in [0, 2 * bag_size] (mean bag_size; empty bags occur)
};

/// Parses "fixed" or "uniform"; otherwise "unknown bag length distribution 'X' (expected fixed or
/// uniform)".
Result<BagDist> parse_bag_dist(const std::string& s);

/// A fixed pseudo-random bijection of [0, n): a 4-round keyed Feistel network over the next power
/// of two (at least 4) with cycle-walking back into range. Used to scatter Zipf ranks over the
/// table so hot rows are not clustered at low ids. Immutable after construction; thread-safe.
class RowPermutation {
 public:
  /// Permutation of [0, n) selected by `seed`. Requires n >= 1 (aborts otherwise).
  RowPermutation(std::int64_t n, std::uint64_t seed);

  /// The image of x, for x in [0, n). Expected < 2 network evaluations.
  std::int64_t operator()(std::int64_t x) const noexcept;

  /// The domain size n.
  std::int64_t size() const noexcept { return n_; }

 private:
  std::uint64_t network(std::uint64_t x) const noexcept;

  std::int64_t n_;
  int bits_;               // width of the power-of-two domain the network permutes
  std::uint64_t keys_[4];  // one round key per Feistel round
};

/// Draws row ids of one table from a Distribution. Uniform: xoshiro256** with Lemire's unbiased
/// multiply-shift range reduction. Zipf: Hörmann & Derflinger's rejection-inversion over ranks
/// 1..rows (O(1) memory and expected O(1) time for any rows and any alpha > 0), rank mapped to a
/// row by a RowPermutation. The row permutation depends only on `seed` (and, for drift, on the
/// epoch set by set_step); the random stream on (`seed`, stream id), so copies given different
/// streams draw independent keys with the same hot rows. Drift: exactly Zipf, but set_step(s)
/// re-keys the permutation for epoch s / N, so the rows that are hot change every N steps (epoch 0
/// uses the same permutation as zipf:ALPHA with the same seed). Deterministic. Not thread-safe
/// (mutable RNG state); copy one per thread.
class KeySampler {
 public:
  /// Parses `dist` and builds a sampler for rows in [0, rows) (rows > 0) on stream 0.
  static Result<KeySampler> create(const std::string& dist, std::int64_t rows, std::uint64_t seed);

  /// Restarts the random stream at the start of stream `stream` (same rank->row map).
  void set_stream(std::uint64_t stream) noexcept;

  /// Moves to training step `step` (>= 0): for drift:ALPHA:N selects the rank->row permutation of
  /// epoch step / N (rebuilt only when the epoch changes; O(1)); other distributions ignore it.
  /// Does not touch the random stream.
  void set_step(std::int64_t step) noexcept;

  /// The current drift epoch (step / N of the last set_step; 0 before any and for non-drift).
  std::int64_t epoch() const noexcept { return epoch_; }

  /// Next row id in [0, rows): the row of next_rank().
  Key next() noexcept { return rank_to_row(next_rank()); }

  /// Next 0-based rank in [0, rows): rank 0 is the most likely under Zipf; for uniform the rank
  /// is already uniform over rows.
  std::int64_t next_rank() noexcept;

  /// Fills out[0 .. n) (host memory) with next().
  void fill(Key* out, std::int64_t n) noexcept;

  /// The row that holds 0-based rank `rank` in the current epoch (identity for uniform).
  Key rank_to_row(std::int64_t rank) const noexcept {
    return dist_.kind == Distribution::Kind::kUniform ? rank : perm_(rank);
  }

  /// The distribution sampled.
  const Distribution& distribution() const noexcept { return dist_; }
  /// Number of rows.
  std::int64_t rows() const noexcept { return rows_; }

 private:
  KeySampler(Distribution dist, std::int64_t rows, std::uint64_t seed);

  std::uint64_t next_u64() noexcept;
  double next_unit() noexcept;  // uniform in [0, 1)
  std::int64_t next_below(std::uint64_t range) noexcept;
  std::int64_t next_zipf_rank() noexcept;
  double h(double x) const noexcept;
  double h_integral(double x) const noexcept;
  double h_integral_inverse(double x) const noexcept;

  Distribution dist_;
  std::int64_t rows_;
  std::uint64_t seed_;
  std::uint64_t perm_seed_;  // seed of the epoch-0 permutation
  std::int64_t epoch_ = 0;
  RowPermutation perm_;
  std::uint64_t state_[4] = {0, 0, 0, 0};  // xoshiro256** state
  // Rejection-inversion constants (Zipf only).
  double h_integral_x1_ = 0.0;
  double h_integral_n_ = 0.0;
  double s_ = 0.0;
};

/// Generates spec.distinct_batches batches; each has one JaggedKeys per table of
/// workload_tables(spec) (named table_names[t], in that order; keys in [0, rows of table t))
/// with spec.batch bags and no weights. Bag lengths follow
/// spec.bag_dist: all spec.bag_size ("fixed"), or i.i.d. uniform in [0, 2 * spec.bag_size]
/// ("uniform", drawn from a stream of their own, so the keys of fixed-length runs do not change).
/// Table t samples with seed mix(spec.seed, table_name_hash(name)), so a table's hot rows are the
/// same in every batch, except under drift:ALPHA:N where batch b is step b and the hot rows move
/// every N batches (runs that cycle the batches replay the epochs cyclically; generate at least
/// k * N distinct batches to see k epochs). Work is split in fixed chunks of bags, each with its
/// own stream, over `threads` threads (0: hardware concurrency); the result does not depend on
/// `threads`. Requires validate(spec) OK and table_names.size() == workload_tables(spec).size()
/// (aborts otherwise).
std::vector<KeyBatch> make_batches(const WorkloadSpec& spec, const std::vector<std::string>& table_names,
                                   int threads = 0);

/// make_batches with the names of workload_tables(spec).
std::vector<KeyBatch> make_batches(const WorkloadSpec& spec, int threads = 0);

/// A key of a dynamic workload (strata-bench --dynamic, strata-tune capacity --spread): row id k spread over
/// [0, 2^63) one to one (times an odd number modulo 2^63, a bijection there), so a workload's skew stays.
Key spread_key(Key k) noexcept;

/// spread_key on every key of `b` (int32 keys become int64 ones).
void spread_keys(KeyBatch& b);

/// Row counts of the 26 categorical features of the Criteo Kaggle display-advertising data set
/// (C1..C26, in column order), 33,762,577 rows in total.
extern const std::int64_t kCriteoKaggleRows[26];

/// Default bound on the rows of the built-in table set: 1.5e9 bytes / (64 floats x 4 bytes x 3),
/// i.e. at dim 64 fp32 with Adam state (two moments per element) the whole set holds at most
/// 1.5 GB. 1,953,125 rows.
inline constexpr std::int64_t kCriteoDefaultMaxRows = 1953125;

/// Scales `rows` down so the sum is at most `max_total_rows`, keeping every table >= 1 row and the
/// relative sizes roughly. Rule: if sum(rows) <= max_total_rows the counts are kept. Otherwise a
/// set P of tables is pinned at 1 row and every other table gets floor(rows[i] * s) with
/// s = (max_total_rows - |P|) / sum_{i not in P} rows[i]; P starts empty and grows by the tables
/// whose floor(rows[i] * s) < 1 until none is added (s only shrinks, so this ends within
/// rows.size() rounds). The result sums to at most max_total_rows. Errors: empty `rows`, a count
/// <= 0, or max_total_rows < rows.size() (one row per table would not fit); the message names
/// the value and what was expected.
Result<std::vector<std::int64_t>> scale_table_rows(const std::vector<std::int64_t>& rows, std::int64_t max_total_rows);

/// The built-in default table set: the 26 Criteo Kaggle tables named "C1".."C26" with
/// kCriteoKaggleRows scaled by scale_table_rows(.., max_total_rows), dim `dim`, fp32, sum pooling,
/// default initializer and optimizer. Errors as scale_table_rows, and dim <= 0.
Result<std::vector<TableSpec>> criteo_default_tables(std::int64_t max_total_rows = kCriteoDefaultMaxRows, int dim = 64);

/// Writes batches in the raw trace format above (overwriting `path`). Every batch must have the
/// same number of features. Errors: invalid_argument for inconsistent batches, io_error naming
/// the path and the OS reason.
Status write_batches_raw(const std::string& path, const std::vector<KeyBatch>& batches);

/// Sequential host read bandwidth in GB/s (1e9 bytes/s): allocates `bytes` (rounded down to a
/// multiple of 64 * threads; 0 means 1 GiB), touches it from the reading threads, then `threads`
/// threads (0: hardware concurrency) each sum 64-bit words of a disjoint slice. Returns the median
/// of 5 timed passes, or 0 if the buffer cannot be allocated. Blocks for a few passes over the
/// buffer; safe to call from any thread.
double measure_read_bandwidth_gbs(std::size_t bytes, int threads);

}  // namespace strata::bench
