#pragma once
// The layout of one record: a row's weights and its optimizer state, as every placement stores it
// (host tables, device slots, staging, flush chunks). A record is [weights | pad | state | pad] in
// whole 32-bit words: the weights take row_words words (dim fp32 elements, or dim half elements
// two to a word), the state starts at word row_words and takes state_words words, and the record
// is padded to record_words words, the stride between records. Strides are counted in words, so
// code that moves whole records (fills, write-backs, flush) moves bytes without knowing the dtype.
//
// Stride rule: a record whose elements are all fp32 is rounded up to a power of two below 16 words,
// else to a multiple of 16 words (64 bytes), so it never straddles more cache lines than it must.
// A record holding half-size elements is rounded up to a power of two up to 4 words, else to a
// multiple of 4 words (16 bytes): 64 bytes would give away most of the half size on narrow rows
// (dim 64 bf16 with rowwise adagrad: 36 words, not 48), and 16 bytes keeps 128-bit loads aligned.

#include <cstdint>
#include <tuple>

#include "core/hd.hpp"
#include "core/table_spec.hpp"

namespace strata {

/// What a record holds: `dim` weights of `dtype`, then `state_dim` optimizer state elements of
/// `state_dtype`.
struct RecordShape {
  std::int32_t dim = 0;
  DType dtype = DType::kF32;
  std::int32_t state_dim = 0;
  DType state_dtype = DType::kF32;
};

/// Words (4 bytes) that `n` elements of `dtype` take: n for fp32, two half elements a word.
STRATA_HD constexpr std::int64_t element_words(std::int64_t n, DType dtype) {
  return dtype == DType::kF32 ? n : (n + 1) / 2;
}
/// Words of a record's weights: its state starts at this word.
STRATA_HD constexpr std::int64_t row_words(const RecordShape& s) { return element_words(s.dim, s.dtype); }
/// Words of a record's optimizer state.
STRATA_HD constexpr std::int64_t state_words(const RecordShape& s) { return element_words(s.state_dim, s.state_dtype); }

/// Words per record, padding included: the stride between records (see the file comment).
STRATA_HD constexpr std::int64_t record_words(const RecordShape& s) {
  const std::int64_t n = row_words(s) + state_words(s);
  const bool half = (s.dim > 0 && s.dtype != DType::kF32) || (s.state_dim > 0 && s.state_dtype != DType::kF32);
  const std::int64_t line = half ? 4 : 16;  // the multiple above the powers of two
  if (n >= line) return (n + line - 1) / line * line;
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

/// Orders record shapes: by dim, state elements, then element types (fp32 first). The key of a slot
/// pool, in the store (store/engines/detail/slot_pool_engine.hpp) and in its model
/// (store/model/table_cost.hpp).
struct RecordShapeLess {
  bool operator()(const RecordShape& a, const RecordShape& b) const noexcept {
    auto key = [](const RecordShape& s) { return std::make_tuple(s.dim, s.state_dim, s.dtype, s.state_dtype); };
    return key(a) < key(b);
  }
};

/// The record shape of a table: its dim and dtype, optimizer_state_dim state elements of its
/// state_dtype.
inline RecordShape record_shape(const TableSpec& spec) {
  return {spec.dim, spec.dtype, optimizer_state_dim(spec.optimizer.kind, spec.dim), spec.state_dtype};
}

/// Words per all-fp32 record of `dim` weights and `state_dim` state floats: record_words of that
/// shape (for code that holds fp32 records only: device probes, tests).
STRATA_HD constexpr std::int64_t record_stride(std::int32_t dim, std::int32_t state_dim) {
  return record_words({dim, DType::kF32, state_dim, DType::kF32});
}

}  // namespace strata
