#pragma once
// TableSpec: the description of one embedding table (shape, pooling, initial values, optimizer).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace strata {

/// Keys are signed 64-bit; a key of a dense table is its row id in [0, rows).
using Key = std::int64_t;

/// Element type of rows, optimizer state, outputs and gradients (core/half.hpp); math is fp32.
enum class DType : std::uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

/// How the rows of one bag are combined.
enum class Pooling : std::uint8_t {
  kSum = 0,   ///< sum of (weighted) rows
  kMean = 1,  ///< sum divided by the bag length (an empty bag gives zeros)
  kNone = 2,  ///< no pooling: one output row per key
};

/// Which optimizer backward() applies to the rows it touched (fused, sparse: untouched rows do not change, including
/// their optimizer state).
enum class OptimizerKind : std::uint8_t { kSgd = 0, kAdagrad = 1, kRowwiseAdagrad = 2, kAdam = 3 };

/// Hyper-parameters of the optimizer; fields an optimizer does not use are ignored.
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;  ///< which update rule
  float learning_rate = 0.01f;               ///< step size (>= 0; 0 keeps weights, state advances)
  float eps = 1e-8f;                         ///< adagrad/adam denominator guard (> 0)
  float beta1 = 0.9f;                        ///< adam first-moment decay, in [0, 1)
  float beta2 = 0.999f;                      ///< adam second-moment decay, in [0, 1)
  float weight_decay = 0.0f;                 ///< L2 penalty added to the gradient (>= 0)
  float initial_accumulator = 0.0f;          ///< starting value of adagrad accumulators (>= 0)
};

/// Initial values: uniform(-bound, bound), a pure function of (seed, table name, row, column), so any shard, cache or
/// rank can create the same initial row without talking to anyone.
struct InitializerSpec {
  float bound = 0.01f;     ///< half-width of the uniform range (>= 0)
  std::uint64_t seed = 0;  ///< seed shared by all tables; the table name is mixed in
  /// Origin of a shard (set by dispatch for a sharded table's local part): local row l, column c starts as row
  /// l * row_stride + row_offset, column c + col_offset of the whole table. A config's tables must leave them at 1, 0,
  /// 0.
  std::int64_t row_stride = 1;
  std::int64_t row_offset = 0;
  std::int32_t col_offset = 0;
  /// Row of the whole table that local row `l` is.
  std::int64_t global_row(std::int64_t l) const noexcept { return l * row_stride + row_offset; }
};

/// Complete description of one table.
struct TableSpec {
  std::string name;                  ///< unique; see validate_table_name (it names checkpoint files)
  std::int64_t rows = 0;             ///< number of rows (> 0); keys are in [0, rows)
  std::int32_t dim = 0;              ///< row width in elements (> 0)
  DType dtype = DType::kF32;         ///< element type of the rows
  Pooling pooling = Pooling::kSum;   ///< bag pooling
  InitializerSpec init;              ///< initial values
  OptimizerSpec optimizer;           ///< update rule applied by backward()
  DType state_dtype = DType::kF32;   ///< optimizer state: fp32, or bf16 for adagrad and adam
  bool stochastic_rounding = false;  ///< round half-size updates stochastically, not to nearest even
  DType output_dtype = DType::kF32;  ///< forward outputs and backward gradients
};

/// Widest row a table may have (elements), and most bytes of weights and optimizer state a table may hold: bounds that
/// keep every size computation within 64 bits.
inline constexpr std::int32_t kMaxDim = 1 << 20;
inline constexpr std::int64_t kMaxTableBytes = std::int64_t{1} << 48;

/// Longest table name, in bytes: it is part of its checkpoint files' names ("<name>.<generation>.tbl.tmp-<pid>-<n>",
/// at most 61 bytes more), which must fit the 255 bytes of a Linux file name.
inline constexpr std::size_t kMaxTableNameBytes = 128;

/// Checks that `name` can name a table, and so a file: 1 to kMaxTableNameBytes bytes of ASCII letters, digits, '_', '-'
/// and '.', not starting with '.' (never ".", ".." or a hidden file); validate(TableSpec) and tools call it. Errors
/// name the table (its first 32 bytes, others as \xNN), what is wrong and the rule: "table 'user id': name holds ' '
/// at byte 4 (expected 1 to 128 bytes of letters, digits, '_', '-' and '.', not starting with '.')".
Status validate_table_name(const std::string& name);

/// Optimizer-state elements kept per row: sgd 0, adagrad dim, rowwise_adagrad 1, adam 2*dim.
std::int32_t optimizer_state_dim(OptimizerKind kind, std::int32_t dim) noexcept;

/// The element types' rules, their ranges checked: the state_dtype an optimizer may have (fp32, or bf16 for
/// adagrad and adam), and stochastic rounding only where something is rounded. Errors (kInvalidArgument) start with
/// `who`. validate(TableSpec) calls it, and checkpoint manifests are checked with it.
Status validate_dtypes(const TableSpec& spec, const std::string& who);

/// Checks a spec: its name (validate_table_name), then "table 'user': dim 0 must be > 0", its dtypes. Does not check
/// name uniqueness, nor the shard origin in `init` (validate(StoreConfig) does).
Status validate(const TableSpec& spec);

/// Names used in configs and messages ("sum", "rowwise_adagrad", "fp32") and their parsers.
const char* to_string(DType v) noexcept;
const char* to_string(Pooling v) noexcept;
const char* to_string(OptimizerKind v) noexcept;
Result<DType> parse_dtype(const std::string& s);
Result<Pooling> parse_pooling(const std::string& s);
Result<OptimizerKind> parse_optimizer(const std::string& s);

/// Stable 64-bit hash of a table name (FNV-1a), used to give each table its own initial values.
std::uint64_t table_name_hash(const std::string& name) noexcept;

}  // namespace strata
