#pragma once
// Per-row math written once for host code and the CUDA kernels: initial values, pooling
// accumulation and the fused optimizer steps. Every mode calls these, so results agree bit for bit
// wherever the order of reductions is the same.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/half.hpp"
#include "core/hd.hpp"
#include "core/table_spec.hpp"

namespace strata {

/// SplitMix64 finaliser: a cheap, well-mixed 64-bit hash.
STRATA_HD std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Per-table seed: mixes the store seed with the table's name hash.
STRATA_HD std::uint64_t table_seed(std::uint64_t seed, std::uint64_t name_hash) {
  return mix64(seed ^ mix64(name_hash));
}

/// What a stochastic rounding rounds: a table's weights, or one of its optimizer state vectors.
enum class RoundingSalt : std::uint64_t { kWeights = 0, kState0 = 1, kState1 = 2 };

/// The per-row key of the stochastic rounding bits (`rounding_bits` in core/half.hpp): a pure
/// function of the table's rounding seed, the row's global id, the step (the backward's 1-based
/// count) and what is rounded, so every placement, shard and cache draws the same bits.
STRATA_HD std::uint64_t rounding_row_key(std::uint64_t tseed, std::int64_t global_row, std::int64_t step,
                                         RoundingSalt salt) {
  return mix64(tseed ^
               mix64((static_cast<std::uint64_t>(global_row) * 0x100000001B3ull) ^
                     (static_cast<std::uint64_t>(step) * 0xD6E8FEB86659FD93ull) ^ static_cast<std::uint64_t>(salt)));
}

/// Initial value of element (row, col): uniform in [-bound, bound), pure in its arguments.
STRATA_HD float initial_value(std::uint64_t tseed, std::int64_t row, std::int32_t col, float bound) {
  const std::uint64_t h =
      mix64(tseed ^ mix64(static_cast<std::uint64_t>(row) * 0x100000001B3ull + static_cast<std::uint32_t>(col)));
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // 24 bits -> [0, 1)
  return (2.0f * u - 1.0f) * bound;
}

/// Fills one row (dim floats) with its initial values: columns col0 .. col0 + dim of row r.
STRATA_HD void init_row(float* row, std::uint64_t tseed, std::int64_t r, std::int32_t dim, float bound,
                        std::int32_t col0 = 0) {
  for (std::int32_t c = 0; c < dim; ++c) row[c] = initial_value(tseed, r, col0 + c, bound);
}

/// Initial value of every optimizer state float of a row.
STRATA_HD float initial_state_value(const OptimizerSpec& o) {
  return (o.kind == OptimizerKind::kAdagrad || o.kind == OptimizerKind::kRowwiseAdagrad) ? o.initial_accumulator : 0.0f;
}

/// Initial optimizer state of one row (state_dim floats).
STRATA_HD void init_state(float* state, const OptimizerSpec& o, std::int32_t state_dim) {
  const float v = initial_state_value(o);
  for (std::int32_t c = 0; c < state_dim; ++c) state[c] = v;
}

/// acc[0..dim) += w * row[0..dim)
STRATA_HD void row_axpy(float* __restrict__ acc, const float* __restrict__ row, float w, std::int32_t dim) {
  for (std::int32_t c = 0; c < dim; ++c) acc[c] += w * row[c];
}
/// acc[0..dim) += row[0..dim)
STRATA_HD void row_add(float* __restrict__ acc, const float* __restrict__ row, std::int32_t dim) {
  for (std::int32_t c = 0; c < dim; ++c) acc[c] += row[c];
}
/// row[0..dim) *= s
STRATA_HD void row_scale(float* row, float s, std::int32_t dim) {
  for (std::int32_t c = 0; c < dim; ++c) row[c] *= s;
}

/// Factor applied to each row of a bag of `len` keys: 1 for sum, 1/len for mean.
STRATA_HD float bag_scale(Pooling p, std::int64_t len) {
  return (p == Pooling::kMean && len > 0) ? 1.0f / static_cast<float>(len) : 1.0f;
}

/// Gradient scale of key position j in a bag of `len` keys: bag_scale * weight (weights may be
/// null). For pooling none a "bag" is the key itself (len 1).
STRATA_HD float grad_scale(Pooling p, std::int64_t len, const float* weights, std::int64_t j) {
  const float s = bag_scale(p, len);
  return weights ? s * weights[j] : s;
}

/// Uses of a row summed as one segment of its gradient. The gradient of a row used n times in a
/// batch is the sum, left to right, of its segments' sums: uses [0, S), [S, 2S), ... in ascending
/// position order, each segment summed from 0.0f (up to S uses that is the plain sum in position
/// order). Every mode sums in this order, so that the GPU can reduce a hot row (the one-row tables
/// of the default workload are used 8,192 times a batch, zipf keys tens of thousands of times) with
/// many warps at once, one segment each, and results still agree bit for bit.
inline constexpr std::int64_t kGradSegment = 128;

/// Mixed into a table's initializer seed to seed its stochastic rounding (rounding_seed), so the
/// rounding bits and the initial values are drawn from unrelated streams.
inline constexpr std::uint64_t kRoundingSeed = 0x7C1B5F2A93E4D068ull;

/// The seed of a table's stochastic rounding bits: a pure function of its initializer seed and
/// name, so every placement, shard, cache and rank of the table draws the same bits.
inline std::uint64_t rounding_seed(const TableSpec& spec) {
  return table_seed(spec.init.seed ^ kRoundingSeed, table_name_hash(spec.name));
}

/// How an optimizer step stores the values it computed in fp32: each updated weight (and state
/// element) is rounded once to its element type, to nearest even or stochastically with the bits
/// rounding_bits(row_key(local row, salt), col_offset + c) (core/half.hpp), so the bits depend on
/// (seed, table, global row, step, global column, salt) only. The identity for fp32 elements.
struct Rounding {
  std::uint64_t tseed = 0;          ///< rounding_seed(spec)
  std::int64_t step = 0;            ///< the backward's 1-based step (Adam's t)
  std::int64_t row_stride = 1;      ///< local row -> global row, as InitializerSpec::global_row
  std::int64_t row_offset = 0;      ///<
  std::int32_t col_offset = 0;      ///< local column -> global column
  DType dtype = DType::kF32;        ///< the weights' element type
  DType state_dtype = DType::kF32;  ///< the optimizer state's element type
  bool stochastic = false;          ///< stochastic rounding (else to nearest even)

  /// The key of local row `local`'s rounding bits for what `salt` names (rounding_row_key).
  STRATA_HD std::uint64_t row_key(std::int64_t local, RoundingSalt salt) const {
    return rounding_row_key(tseed, local * row_stride + row_offset, step, salt);
  }
  /// The rounding bits of local column c of a row whose key is `key` (0 unless stochastic).
  STRATA_HD std::uint32_t bits(std::uint64_t key, std::int32_t c) const {
    return stochastic ? rounding_bits(key, std::int64_t{col_offset} + c) : 0u;
  }
};

/// Everything one optimizer step needs besides the row: the spec plus Adam's bias corrections for
/// the store-wide step number t (1-based), precomputed once per backward on the host, and how the
/// results are rounded into the row.
struct OptimizerStep {
  OptimizerSpec spec;
  float bias1 = 1.0f;  ///< 1 - beta1^t
  float bias2 = 1.0f;  ///< 1 - beta2^t
  Rounding round;
};

/// Builds the step parameters of an fp32 table for store step t >= 1 (rows stored unrounded).
inline OptimizerStep make_optimizer_step(const OptimizerSpec& spec, std::int64_t t) {
  OptimizerStep s;
  s.spec = spec;
  s.bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(spec.beta1), static_cast<double>(t)));
  s.bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(spec.beta2), static_cast<double>(t)));
  s.round.step = t;
  return s;
}

/// Builds the step parameters of table `spec` (its optimizer, element types, rounding and shard
/// origin) for store step t >= 1.
inline OptimizerStep make_optimizer_step(const TableSpec& spec, std::int64_t t) {
  OptimizerStep s = make_optimizer_step(spec.optimizer, t);
  Rounding& r = s.round;
  r.dtype = spec.dtype;
  r.state_dtype = spec.state_dtype;
  r.stochastic = spec.stochastic_rounding;
  r.tseed = r.stochastic ? rounding_seed(spec) : 0;
  r.row_stride = spec.init.row_stride;
  r.row_offset = spec.init.row_offset;
  r.col_offset = spec.init.col_offset;
  return s;
}

/// Stores the fp32 value w as element c of a row of `Elem`s (float, Bf16 or F16), rounded as `r`
/// says; `key` is the row's r.row_key (with the salt of what the row holds: weights or a state
/// vector). The identity for float. A half element's 16 bits are copied (memcpy), not assigned
/// through Bf16 / F16: rows lie in records of fp32 words, which a store of a uint16_t member may
/// not alias, so the optimizer could keep a word loaded before the store.
template <class Elem>
STRATA_HD void store_weight(const Rounding& r, std::uint64_t key, std::int32_t c, float w, Elem* dst) {
  if constexpr (std::is_same_v<Elem, float>) {
    (void)r;
    (void)key;
    dst[c] = w;
  } else {
    const std::uint16_t bits = narrow(Elem::kDType, w, r.stochastic, r.bits(key, c));
    std::memcpy(dst + c, &bits, sizeof bits);
  }
}

/// The value an element of type `dtype` holds once w is stored as element c of the row keyed `key`
/// (store_weight, widened back): what the reference keeps in place of a half-size element.
STRATA_HD float stored_value(const Rounding& r, DType dtype, std::uint64_t key, std::int32_t c, float w) {
  return rounded(dtype, w, r.stochastic, r.bits(key, c));
}

/// Applies one optimizer step to a row in place. A learning rate of 0 leaves `w` as it is (its
/// state still advances): w - 0 * g would turn a weight of -0.0 into +0.0 where g < 0 (and into
/// NaN where g is not finite).
///   w     (dim)        the row's weights
///   state (state_dim)  its optimizer state (see optimizer_state_dim)
///   g     (dim)        the row's gradient, already summed over all its uses in the batch;
///                      modified (weight decay is folded in)
STRATA_HD void apply_optimizer(const OptimizerStep& st, float* __restrict__ w, float* __restrict__ state,
                               float* __restrict__ g, std::int32_t dim) {
  const OptimizerSpec& o = st.spec;
  const bool moves = o.learning_rate != 0.0f;
  if (o.weight_decay != 0.0f) {
    for (std::int32_t c = 0; c < dim; ++c) g[c] += o.weight_decay * w[c];
  }
  switch (o.kind) {
    case OptimizerKind::kSgd:
      if (moves)
        for (std::int32_t c = 0; c < dim; ++c) w[c] -= o.learning_rate * g[c];
      break;
    case OptimizerKind::kAdagrad:
      for (std::int32_t c = 0; c < dim; ++c) {
        state[c] += g[c] * g[c];
        if (moves) w[c] -= o.learning_rate * g[c] / (std::sqrt(state[c]) + o.eps);
      }
      break;
    case OptimizerKind::kRowwiseAdagrad: {
      float sq = 0.0f;
      for (std::int32_t c = 0; c < dim; ++c) sq += g[c] * g[c];
      state[0] += sq / static_cast<float>(dim);
      const float m = o.learning_rate / (std::sqrt(state[0]) + o.eps);
      if (moves)
        for (std::int32_t c = 0; c < dim; ++c) w[c] -= m * g[c];
      break;
    }
    case OptimizerKind::kAdam: {
      float* m = state;
      float* v = state + dim;
      for (std::int32_t c = 0; c < dim; ++c) {
        m[c] = o.beta1 * m[c] + (1.0f - o.beta1) * g[c];
        v[c] = o.beta2 * v[c] + (1.0f - o.beta2) * g[c] * g[c];
        const float mh = m[c] / st.bias1;
        const float vh = v[c] / st.bias2;
        if (moves) w[c] -= o.learning_rate * mh / (std::sqrt(vh) + o.eps);
      }
      break;
    }
  }
}

}  // namespace strata
