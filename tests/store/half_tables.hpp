#pragma once
// Configs of half-size tables (issue 31) shared by the tests that run them against the reference:
// reference_half_test.cpp (one rank, every placement), mode_equivalence_test.cpp and
// sharded_equivalence_test.cpp; the values of every element type that checkpoint tests save and
// compare bit for bit (checkpoint_test.cpp, world_checkpoint_test.cpp).

#include <cstdint>
#include <random>
#include <vector>

#include "core/half.hpp"
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

// `n` values an element of `dtype` holds, from `seed`: random bit patterns (subnormals among them,
// never an infinity) but element 0, a negative NaN with a payload, and element 1, a negative zero.
inline std::vector<float> values_of(DType dtype, std::size_t n, std::uint32_t seed) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t h = lowbias32<std::uint32_t>(seed * 0x9E3779B9u + static_cast<std::uint32_t>(i));
    if (dtype == DType::kF32) {
      if ((h & 0x7F800000u) == 0x7F800000u) h &= ~0x40000000u;  // a finite value
      out[i] = bits_float(i == 0 ? 0xFFC12345u : i == 1 ? 0x80000000u : h);
      continue;
    }
    auto bits = static_cast<std::uint16_t>(h);
    const std::uint16_t exponent = dtype == DType::kBF16 ? 0x7F80u : 0x7C00u;
    if ((bits & exponent) == exponent) bits &= 0xBFFFu;
    if (i == 0) bits = dtype == DType::kBF16 ? 0xFFC5u : 0xFE05u;
    if (i == 1) bits = 0x8000u;
    out[i] = widen(dtype, bits);
  }
  return out;
}

// The rows and state of every table of `c` as values_of their element types: what a store holds
// after write_snapshot.
inline Snapshot typed_values(const StoreConfig& c) {
  Snapshot s;
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    const TableSpec& spec = c.tables[t].spec;
    const auto n = static_cast<std::size_t>(spec.rows);
    const auto seed = static_cast<std::uint32_t>(2 * t + 1);
    s.weights.push_back(values_of(spec.dtype, n * static_cast<std::size_t>(spec.dim), seed));
    const auto sd = static_cast<std::size_t>(optimizer_state_dim(spec.optimizer.kind, spec.dim));
    s.state.push_back(values_of(spec.state_dtype, n * sd, seed + 1));
  }
  return s;
}

// Writes `s` into every table of `store` (write_rows: collective on a world, every rank giving the
// same rows).
inline void write_snapshot(Store& store, const Snapshot& s) {
  for (std::size_t t = 0; t < s.weights.size(); ++t) {
    const Status w = store.write_rows(static_cast<int>(t), 0, store.config().tables[t].spec.rows, s.weights[t].data(),
                                      s.state[t].empty() ? nullptr : s.state[t].data());
    ASSERT_TRUE(w.is_ok()) << "table " << t << ": " << w.to_string();
  }
}

}  // namespace strata::testing
