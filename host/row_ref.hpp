#pragma once
// RowRef: a trivially copyable view that maps a row id to its address, used by every kernel. A
// table is stored as records of `stride` 32-bit words ([weights (dim elements of dtype) | pad |
// optimizer state (state_dim elements of state_dtype) | pad], core/record_layout.hpp), in blocks of
// 2^block_shift rows dealt round-robin over `parts` base pointers (NUMA nodes).

#include <cstdint>

#include "core/record_layout.hpp"
#include "core/row_math.hpp"

namespace strata {

struct RowRef {
  float* const* bases = nullptr;    ///< (parts) base of each part's records, host memory
  std::int32_t parts = 1;           ///< number of parts (NUMA nodes interleaved by row block)
  std::int32_t block_shift = 62;    ///< log2 rows per block (62: one block, no interleaving)
  std::int64_t stride = 0;          ///< words between consecutive records
  std::int32_t dim = 0;             ///< weights per row
  std::int32_t state_dim = 0;       ///< optimizer state elements per row, from word row_words()
  DType dtype = DType::kF32;        ///< the weights' element type
  DType state_dtype = DType::kF32;  ///< the optimizer state's element type

  /// Words of a record's weights (its state starts at this word), and of its state.
  STRATA_HD std::int64_t row_words() const { return element_words(dim, dtype); }
  STRATA_HD std::int64_t state_words() const { return element_words(state_dim, state_dtype); }

  /// Address of row r's record (weights first, then state). No bounds check.
  STRATA_HD float* row(std::int64_t r) const {
    if (parts == 1) return bases[0] + r * stride;
    const std::int64_t block = r >> block_shift;
    const std::int64_t local = ((block / parts) << block_shift) + (r & ((std::int64_t{1} << block_shift) - 1));
    return bases[block % parts] + local * stride;
  }
  /// Address of row r's optimizer state (state_dim elements of state_dtype).
  STRATA_HD float* state(std::int64_t r) const { return row(r) + row_words(); }
};

}  // namespace strata
