#pragma once
// Synthetic workloads for the benchmarks: a JSON-described spec, a key sampler (uniform or Zipf with
// the hot rows scattered over the table), batch generation, a raw trace dump that peer benchmarks
// (bench/peers/*.py) replay, and a host memory read-bandwidth probe used as the roofline.
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

/// Shape and key distribution of a synthetic workload. Every table has the same shape.
struct WorkloadSpec {
  int tables = 1;                  ///< number of tables (>= 1)
  std::int64_t rows = 2000000;     ///< rows per table (> 0)
  int dim = 128;                   ///< row width in floats (> 0)
  std::int64_t batch = 8192;       ///< bags per table per batch (> 0)
  int bag_size = 32;               ///< keys per bag (>= 0); every bag has exactly this many
  std::string dist = "uniform";    ///< key distribution: "uniform" or "zipf:ALPHA" with ALPHA > 0
  std::uint64_t seed = 42;         ///< seed of everything random (keys and the hot-row placement)
  int distinct_batches = 8;        ///< number of different batches generated (>= 1); runs cycle them
};

/// Parses a JSON object whose keys are the WorkloadSpec field names; missing keys keep their
/// defaults, an unknown key or a value of the wrong type is an error naming the key. The result
/// is validated.
Result<WorkloadSpec> parse_workload_json(const std::string& json_text);

/// Checks ranges (rows, dim, batch > 0; bag_size >= 0; tables, distinct_batches >= 1) and that
/// `dist` parses. The message names the field, the value and what was expected.
Status validate(const WorkloadSpec& spec);

/// The spec as a one-line JSON object (the same keys parse_workload_json reads), for result files.
std::string workload_to_json(const WorkloadSpec& spec);

/// A parsed key distribution.
struct Distribution {
  /// Which family.
  enum class Kind : std::uint8_t {
    kUniform = 0,  ///< every row equally likely
    kZipf = 1,     ///< P(rank r) proportional to r^-alpha, r = 1..rows
  };
  Kind kind = Kind::kUniform;  ///< family
  double alpha = 0.0;          ///< Zipf exponent (> 0, finite); unused for uniform
};

/// Parses "uniform" or "zipf:ALPHA" (ALPHA a finite number > 0, e.g. "zipf:1.05"). Otherwise:
/// "unknown distribution 'X' (expected uniform or zipf:ALPHA)".
Result<Distribution> parse_distribution(const std::string& s);

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
  int bits_;                  // width of the power-of-two domain the network permutes
  std::uint64_t keys_[4];     // one round key per Feistel round
};

/// Draws row ids of one table from a Distribution. Uniform: xoshiro256** with Lemire's unbiased
/// multiply-shift range reduction. Zipf: Hörmann & Derflinger's rejection-inversion over ranks
/// 1..rows (O(1) memory and expected O(1) time for any rows and any alpha > 0), rank mapped to a
/// row by a RowPermutation. The row permutation depends only on `seed`; the random stream on
/// (`seed`, stream id), so copies given different streams draw independent keys with the same hot
/// rows. Deterministic. Not thread-safe (mutable RNG state); copy one per thread.
class KeySampler {
 public:
  /// Parses `dist` and builds a sampler for rows in [0, rows) (rows > 0) on stream 0.
  static Result<KeySampler> create(const std::string& dist, std::int64_t rows, std::uint64_t seed);

  /// Restarts the random stream at the start of stream `stream` (same rank->row map).
  void set_stream(std::uint64_t stream) noexcept;

  /// Next row id in [0, rows): the row of next_rank().
  Key next() noexcept { return rank_to_row(next_rank()); }

  /// Next 0-based rank in [0, rows): rank 0 is the most likely under Zipf; for uniform the rank
  /// is already uniform over rows.
  std::int64_t next_rank() noexcept;

  /// Fills out[0 .. n) (host memory) with next().
  void fill(Key* out, std::int64_t n) noexcept;

  /// The row that holds 0-based rank `rank` (identity for uniform).
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
  RowPermutation perm_;
  std::uint64_t state_[4] = {0, 0, 0, 0};  // xoshiro256** state
  // Rejection-inversion constants (Zipf only).
  double h_integral_x1_ = 0.0;
  double h_integral_n_ = 0.0;
  double s_ = 0.0;
};

/// Generates spec.distinct_batches batches; each has one JaggedKeys per table (named
/// table_names[t], in that order) with spec.batch bags of exactly spec.bag_size keys and no
/// weights. Table t samples with seed mix(spec.seed, table_name_hash(name)), so a table's hot rows
/// are the same in every batch. Work is split in fixed chunks of bags, each with its own stream,
/// over `threads` threads (0: hardware concurrency); the result does not depend on `threads`.
/// Requires validate(spec) OK and table_names.size() == spec.tables (aborts otherwise).
std::vector<KeyBatch> make_batches(const WorkloadSpec& spec, const std::vector<std::string>& table_names,
                                   int threads = 0);

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
