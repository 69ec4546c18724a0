#pragma once
// TableEngine: what one placement mode does for one table. The store validates, tracks batches and
// fans out to the engines of the tables a batch touches; each mode (cpu now; offload, cached, gpu,
// hybrid later) is one engine. Engines run inside the store's oneTBB arena and receive only
// validated input.

#include <cstdint>
#include <memory>

#include "core/key_batch.hpp"
#include "core/row_math.hpp"

namespace strata::detail {

/// Per-batch, per-table state an engine builds at submit (dedup, cache plan, ...).
struct PreparedFeature {
  virtual ~PreparedFeature() = default;
};

class TableEngine {
 public:
  virtual ~TableEngine() = default;
  /// Called at submit with a validated feature (which outlives the returned state).
  virtual std::unique_ptr<PreparedFeature> prepare(const JaggedKeys& f) = 0;
  /// Writes the feature's output (shape checked by the store).
  virtual Status forward(const JaggedKeys& f, PreparedFeature& p, MatrixView out) = 0;
  /// Applies the gradient with the optimizer step `st`.
  virtual Status backward(const JaggedKeys& f, PreparedFeature& p, ConstMatrixView grad, const OptimizerStep& st) = 0;
  /// Makes all updates visible in host memory.
  virtual Status flush() = 0;
  /// Row copies in and out (range checked by the store); state may be null.
  virtual void read_rows(std::int64_t row0, std::int64_t n, float* weights, float* state) = 0;
  virtual void write_rows(std::int64_t row0, std::int64_t n, const float* weights, const float* state) = 0;
};

}  // namespace strata::detail
