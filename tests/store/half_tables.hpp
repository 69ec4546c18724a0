#pragma once
// Configs of half-size tables (issue 31) shared by the tests that run them against the reference:
// reference_half_test.cpp (one rank, every placement), mode_equivalence_test.cpp and
// sharded_equivalence_test.cpp.

#include <cstdint>
#include <random>

#include "store/store_config.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata::testing {

// `c` with every table's rows of `dtype`, bf16 state where the optimizer allows it, and stochastic
// rounding when `sr`.
inline StoreConfig half_config(StoreConfig c, DType dtype, bool sr) {
  for (TableConfig& t : c.tables) {
    t.spec.dtype = dtype;
    const OptimizerKind k = t.spec.optimizer.kind;
    if (k == OptimizerKind::kAdagrad || k == OptimizerKind::kAdam) t.spec.state_dtype = DType::kBF16;
    t.spec.stochastic_rounding = sr;
  }
  return c;
}

// fp32, bf16 and fp16 tables of several dims (odd ones and multiples of 16) in one store of
// `placement`: every forward and backward is one table-batched call over all of them.
inline StoreConfig mixed_dtypes_config(Placement placement) {
  std::mt19937_64 rng(71);
  StoreConfig c = testing::random_config(rng, 9);
  const std::int32_t dims[] = {16, 7, 64, 48, 128, 31, 3, 1, 32};  // (table 3: fp32 rows, bf16 state)
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (std::size_t i = 0; i < c.tables.size(); ++i) {
    TableSpec& s = c.tables[i].spec;
    c.tables[i].placement = placement;
    s.dim = dims[i];
    s.dtype = dtypes[i % 3];
    s.optimizer.kind = static_cast<OptimizerKind>(i % 4);
    const bool state_allowed = s.optimizer.kind == OptimizerKind::kAdagrad || s.optimizer.kind == OptimizerKind::kAdam;
    if (state_allowed && i % 2 == 1) s.state_dtype = DType::kBF16;
    // Rounding by thirds, not by optimizer: every optimizer rounds half elements stochastically
    // somewhere (adam: bf16 rows and state of dim 1, table 7) and, but row-wise adagrad, to nearest.
    s.stochastic_rounding = (s.dtype != DType::kF32 || s.state_dtype != DType::kF32) && i / 3 % 2 == 0;
  }
  return c;
}

// Random element types for `spec`: rows fp32, bf16 or fp16, a bf16 state where the optimizer allows
// it (half the time), rounding to nearest or (where an element is half) stochastic.
inline void random_dtypes(std::mt19937_64& rng, TableSpec& spec) {
  const OptimizerKind k = spec.optimizer.kind;
  spec.dtype = static_cast<DType>(rng() % 3);
  if ((k == OptimizerKind::kAdagrad || k == OptimizerKind::kAdam) && rng() % 2) spec.state_dtype = DType::kBF16;
  spec.stochastic_rounding = rng() % 2 == 0 && (spec.dtype != DType::kF32 || spec.state_dtype != DType::kF32);
}

}  // namespace strata::testing
