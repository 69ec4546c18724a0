// The geometry of world checkpoints (store/io/detail/reshard.hpp): boxes, tiling, spans, pack and unpack.
#include <gtest/gtest.h>

#include "store/io/detail/reshard.hpp"

namespace strata::detail {
namespace {

TEST(Reshard, WholeBoxHoldsEveryRowAndColumn) {
  const Box b = whole_box(37, 8);
  EXPECT_EQ(b.rows, 37);
  EXPECT_EQ(b.row_start, 0);
  EXPECT_EQ(b.row_step, 1);
  EXPECT_EQ(b.col_offset, 0);
  EXPECT_EQ(b.cols, 8);
}

}  // namespace
}  // namespace strata::detail
