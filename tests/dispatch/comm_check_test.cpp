// detail::check_a2a_arguments on its own: which send and receive ranges of an all_to_all_v may
// share memory (none, but a rank's own share at one address in both) and what it says when they
// do. The conformance suite checks that every communicator refuses such a call on every rank.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/detail/comm_check.hpp"

namespace strata::dispatch::detail {
namespace {

using ::testing::HasSubstr;

// One rank's all_to_all_v arguments over a world of sc.size() ranks.
struct Call {
  int me = 0;
  std::vector<std::int64_t> sc, sd, rc, rd;
};

std::string check(const Call& c, const void* send, const void* recv) {
  return check_a2a_arguments(static_cast<int>(c.sc.size()), c.me, send, c.sc.data(), c.sd.data(), recv, c.rc.data(),
                             c.rd.data());
}

TEST(CheckA2aArguments, SeparateBuffersAreFine) {
  std::vector<char> send(24), recv(24);
  const Call c{1, {8, 8, 8}, {0, 8, 16}, {8, 8, 8}, {0, 8, 16}};
  EXPECT_EQ(check(c, send.data(), recv.data()), "");
}

TEST(CheckA2aArguments, OneBufferWithRangesApartIsFine) {
  std::vector<char> buf(48);
  // Interleaved and touching (a range ends where the next begins), in no particular order.
  const Call c{0, {8, 8, 8}, {32, 0, 16}, {8, 8, 8}, {8, 40, 24}};
  EXPECT_EQ(check(c, buf.data(), buf.data()), "");
}

TEST(CheckA2aArguments, EmptyRangesNeverOverlap) {
  std::vector<char> buf(16);
  const Call c{0, {0, 8}, {0, 0}, {0, 8}, {0, 8}};
  EXPECT_EQ(check(c, buf.data(), buf.data()), "");
}

TEST(CheckA2aArguments, TheOwnShareMayBeInPlace) {
  std::vector<char> buf(24);
  const Call c{1, {8, 8, 0}, {0, 8, 0}, {0, 8, 8}, {0, 8, 16}};
  EXPECT_EQ(check(c, buf.data(), buf.data()), "");
}

TEST(CheckA2aArguments, TheOwnShareOneByteOffIsRefused) {
  std::vector<char> buf(24);
  const Call c{1, {0, 8, 0}, {0, 8, 0}, {0, 8, 0}, {0, 9, 0}};
  EXPECT_EQ(check(c, buf.data(), buf.data()),
            "send and recv overlap: the 8 bytes to rank 1 at send + 8 and the 8 bytes from rank 1 at recv + 9 share "
            "memory (only this rank's own share may be in place)");
}

TEST(CheckA2aArguments, APeersRangeOverTheOwnShareInPlaceIsRefused) {
  std::vector<char> buf(24);
  // Own share in place at [8, 16); what comes from rank 0 lands on it.
  const Call c{1, {0, 8}, {0, 8}, {4, 8}, {12, 8}};
  EXPECT_THAT(check(c, buf.data(), buf.data()),
              HasSubstr("the 8 bytes to rank 1 at send + 8 and the 4 bytes from rank 0 at recv + 12 share memory"));
}

TEST(CheckA2aArguments, AnOverlapBehindALongerRangeIsFound) {
  std::vector<char> buf(200);
  // Rank 0's long send range covers the short one to rank 1 and, past its end, rank 1's receive range.
  const Call c{2, {100, 10, 0}, {0, 10, 0}, {0, 8, 0}, {0, 50, 0}};
  EXPECT_THAT(check(c, buf.data(), buf.data()),
              HasSubstr("the 100 bytes to rank 0 at send + 0 and the 8 bytes from rank 1 at recv + 50"));
}

TEST(CheckA2aArguments, RecvBeforeSendInMemoryIsFound) {
  std::vector<char> buf(64);
  // recv starts 32 bytes before send: rank 1's receive range reaches into the send range to rank 0.
  const Call c{0, {8, 8}, {0, 8}, {8, 8}, {0, 28}};
  EXPECT_THAT(check(c, buf.data() + 32, buf.data()),
              HasSubstr("the 8 bytes to rank 0 at send + 0 and the 8 bytes from rank 1 at recv + 28"));
}

TEST(CheckA2aArguments, OtherErrorsComeFirst) {
  std::vector<char> buf(16);
  const Call c{0, {8, -1}, {0, 8}, {8, 8}, {0, 8}};
  EXPECT_EQ(check(c, buf.data(), buf.data()), "send_counts[1] = -1 is negative");
}

}  // namespace
}  // namespace strata::dispatch::detail
