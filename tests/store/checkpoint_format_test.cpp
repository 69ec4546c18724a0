// The checkpoint format (store/io/detail/checkpoint_format.hpp): manifests of format 1 and 2, piece files.
#include <gtest/gtest.h>

#include "store/io/detail/checkpoint_format.hpp"

namespace strata::detail {
namespace {

TEST(CheckpointFormat, AFormat1ManifestRoundTripsAsOneWholePiecePerTable) {
  Manifest m;
  m.generation = 3;
  m.step = 7;
  ManifestTable t;
  t.name = "user";
  t.rows = 11;
  t.dim = 4;
  t.state_dim = 4;
  t.dtype = "fp32";
  t.optimizer = "adagrad";
  t.learning_rate = 0.5f;
  t.pieces.push_back({"user.3.tbl", 0, whole_box(11, 4), 64 + 11 * 8 * 4, 0x1234abcdu});
  m.tables.push_back(t);
  Result<Manifest> back = parse_manifest("MANIFEST", manifest_text(m));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back.value().version, kFormatVersion);
  EXPECT_EQ(manifest_text(back.value()), manifest_text(m));
  ASSERT_EQ(back.value().tables.size(), 1u);
  ASSERT_EQ(back.value().tables[0].pieces.size(), 1u);
  EXPECT_EQ(back.value().tables[0].pieces[0].box, whole_box(11, 4));
  EXPECT_EQ(back.value().tables[0].pieces[0].crc, 0x1234abcdu);
}

}  // namespace
}  // namespace strata::detail
