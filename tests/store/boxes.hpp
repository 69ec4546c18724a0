#pragma once
// Boxes for the tests of world checkpoints (checkpoint_format_test.cpp, reshard_test.cpp).

#include <cstdint>

#include "store/io/detail/reshard.hpp"

namespace strata::detail {

/// The rows start, start + step, ... of a table of `rows` rows, all `dim` columns: rank `start`'s shard of a table
/// row-sharded over `step` ranks.
inline Box row_box(std::int64_t rows, int start, int step, std::int32_t dim) {
  Box b = whole_box((rows - start + step - 1) / step, dim);
  b.row_start = start;
  b.row_step = step;
  return b;
}

/// Every one of `rows` rows, columns [c0, c0 + cols).
inline Box column_box(std::int64_t rows, std::int32_t c0, std::int32_t cols) {
  Box b = whole_box(rows, cols);
  b.col_offset = c0;
  return b;
}

}  // namespace strata::detail
