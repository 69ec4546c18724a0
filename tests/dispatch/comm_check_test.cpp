// detail::check_a2a_arguments on its own: which send and receive ranges of an all_to_all_v may
// share memory (send ranges with each other; a send and a receive range never, but for a rank's
// own share at one address in both; two receive ranges never), what it says when they do, and
// that displacement + count must stay inside int64 and the address space. The conformance suite
// checks that every communicator refuses such a call on every rank.
//
// A binary of its own: it replaces the global operator new to count this thread's heap
// allocations, so that the usual call (two buffers apart, ranges in rank order) is seen to
// allocate nothing.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "dispatch/detail/comm_check.hpp"

namespace {
thread_local std::int64_t t_allocations = 0;
}  // namespace

// Not inlined: GCC would see free() of what operator new returned and warn of a mismatch.
[[gnu::noinline]] void* operator new(std::size_t bytes) {
  ++t_allocations;
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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

// In place means the same bytes each way: an own share that receives more than it sends at the
// same address is a receive range like any other, refused over the send range it covers.
TEST(CheckA2aArguments, AnOwnShareReceivingMoreThanItSendsIsNotInPlace) {
  std::vector<char> buf(24);
  const Call c{1, {0, 4, 0}, {0, 8, 0}, {0, 8, 0}, {0, 8, 0}};
  EXPECT_EQ(check(c, buf.data(), buf.data()),
            "send and recv overlap: the 4 bytes to rank 1 at send + 8 and the 8 bytes from rank 1 at recv + 8 share "
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

// Two ranks' shares received into the same bytes: MPI_Irecv into overlapping memory is erroneous
// and two ncclRecv race, so this is refused even with send and recv apart.
TEST(CheckA2aArguments, OverlappingReceiveRangesAreRefused) {
  std::vector<char> send(16), recv(16);
  const Call c{0, {8, 8}, {0, 8}, {8, 8}, {0, 4}};
  EXPECT_EQ(check(c, send.data(), recv.data()),
            "recv ranges overlap: the 8 bytes from rank 0 at recv + 0 and the 8 bytes from rank 1 at recv + 4 share "
            "memory (each byte of recv may receive one share only)");
}

TEST(CheckA2aArguments, OverlappingReceiveRangesOutOfRankOrderAreFound) {
  std::vector<char> send(24), recv(64);
  // Rank 1's share first in memory, then rank 2's, which rank 0's reaches into.
  const Call c{1, {8, 8, 8}, {0, 8, 16}, {10, 8, 8}, {44, 0, 40}};
  EXPECT_THAT(check(c, send.data(), recv.data()),
              HasSubstr("recv ranges overlap: the 8 bytes from rank 2 at recv + 40 and the 10 bytes from rank 0 at "
                        "recv + 44"));
}

TEST(CheckA2aArguments, ReceiveRangesThatTouchAreFine) {
  std::vector<char> send(24), recv(24);
  const Call c{0, {8, 8, 8}, {0, 8, 16}, {8, 8, 8}, {16, 8, 0}};
  EXPECT_EQ(check(c, send.data(), recv.data()), "");
}

// Reading the same bytes for several ranks is fine (MPI allows overlapping send ranges; nothing
// writes them): here every peer gets the same 8 bytes.
TEST(CheckA2aArguments, OverlappingSendRangesAreFine) {
  std::vector<char> send(8), recv(24);
  const Call c{2, {8, 8, 8}, {0, 0, 0}, {8, 8, 8}, {0, 8, 16}};
  EXPECT_EQ(check(c, send.data(), recv.data()), "");
}

TEST(CheckA2aArguments, DisplacementPlusCountOverflowingIsRefused) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::vector<char> send(16), recv(16);
  EXPECT_EQ(check(Call{0, {8, 8}, {0, kMax - 4}, {8, 8}, {0, 8}}, send.data(), recv.data()),
            "send_displs[1] + send_counts[1] = 9223372036854775803 + 8 overflows int64");
  EXPECT_EQ(check(Call{0, {8, 8}, {0, 8}, {8, kMax}, {kMax - 1, 8}}, send.data(), recv.data()),
            "recv_displs[0] + recv_counts[0] = 9223372036854775806 + 8 overflows int64");
  // An empty range does not count (nothing is addressed).
  EXPECT_EQ(check(Call{0, {8, 0}, {0, kMax}, {8, 8}, {0, 8}}, send.data(), recv.data()), "");
}

// Send ranges may overlap, so their counts are not bounded by what they span: a total past int64
// (which the communicators compute: stages, byte counters) is refused too.
TEST(CheckA2aArguments, SendCountsAddingUpPastInt64AreRefused) {
  constexpr std::int64_t kHalf = std::int64_t{1} << 62;
  // Never dereferenced: 2^62 bytes of send low in the address space, recv at its top.
  const void* send = reinterpret_cast<const void*>(std::uintptr_t{4096});
  const void* recv = reinterpret_cast<const void*>(std::numeric_limits<std::uintptr_t>::max() - 63);
  EXPECT_EQ(check(Call{0, {kHalf, kHalf}, {0, 0}, {8, 8}, {0, 8}}, send, recv),
            "the send counts overflow int64: send_counts[1] = 4611686018427387904 after 4611686018427387904 bytes to "
            "the ranks before it");
  EXPECT_EQ(check(Call{0, {kHalf, kHalf - 1}, {0, 0}, {8, 8}, {0, 8}}, send, recv), "");
}

TEST(CheckA2aArguments, RangesPastTheEndOfTheAddressSpaceAreRefused) {
  // Never dereferenced: a pointer 16 bytes below the top of the address space.
  const void* top = reinterpret_cast<const void*>(std::numeric_limits<std::uintptr_t>::max() - 15);
  std::vector<char> other(32);
  // The last range ends at the top (one past its last byte is the largest address).
  EXPECT_EQ(check(Call{0, {8, 8}, {0, 7}, {8, 8}, {0, 8}}, top, other.data()), "");
  EXPECT_EQ(check(Call{0, {8, 8}, {0, 8}, {8, 8}, {0, 8}}, top, other.data()),
            "the 8 bytes to rank 1 at send + 8 run past the end of the address space");
  EXPECT_EQ(check(Call{1, {8, 8}, {0, 8}, {8, 8}, {16, 0}}, other.data(), top),
            "the 8 bytes from rank 0 at recv + 16 run past the end of the address space");
}

// The usual call (send and recv apart, the receive ranges in rank order) is judged without
// allocating: no list of ranges to sort.
TEST(CheckA2aArguments, TheUsualCallAllocatesNothing) {
  std::vector<char> send(96), recv(96);
  const Call two_buffers{1, {8, 8, 8, 8}, {0, 8, 16, 24}, {8, 8, 0, 16}, {0, 8, 16, 16}};
  // One buffer: the send ranges, then the receive ranges (the exchange's layout).
  const Call one_buffer{1, {8, 8, 8, 8}, {0, 8, 16, 24}, {8, 8, 0, 16}, {32, 40, 48, 48}};
  std::string a, b;
  a.reserve(256);
  b.reserve(256);
  const std::int64_t before = t_allocations;
  a = check(two_buffers, send.data(), recv.data());
  b = check(one_buffer, send.data(), send.data());
  const std::int64_t allocations = t_allocations - before;
  EXPECT_EQ(a, "");
  EXPECT_EQ(b, "");
  EXPECT_EQ(allocations, 0);
}

// all_gather's receive buffer holds every rank's bytes: their total must fit int64 too.
TEST(CheckAllGatherArguments, BytesAddingUpPastInt64AreRefused) {
  std::vector<char> buf(16);
  const std::int64_t most = std::numeric_limits<std::int64_t>::max() / 4;
  EXPECT_EQ(check_all_gather_arguments(4, buf.data(), most, buf.data()), "");
  EXPECT_EQ(check_all_gather_arguments(4, buf.data(), most + 1, buf.data()),
            "bytes = 2305843009213693952 from each of 4 ranks add up past int64 (the receive buffer holds them all)");
}

TEST(CheckA2aArguments, OtherErrorsComeFirst) {
  std::vector<char> buf(16);
  const Call c{0, {8, -1}, {0, 8}, {8, 8}, {0, 8}};
  EXPECT_EQ(check(c, buf.data(), buf.data()), "send_counts[1] = -1 is negative");
}

// check_agreement's verdict on device errors (CallInfo::device_error, a device that failed before
// the collective): they fail the call without breaking the communicator, named in rank order
// with the first one's code; any disagreement comes first and breaks it.
std::vector<const CallInfo*> pointers(const std::vector<CallInfo>& calls) {
  std::vector<const CallInfo*> p;
  for (const CallInfo& c : calls) p.push_back(&c);
  return p;
}

TEST(CheckAgreement, DeviceErrorsFailTheCallWithoutBreakingTheCommunicator) {
  std::vector<CallInfo> calls(4);
  for (CallInfo& c : calls) {
    c.kind = Collective::kAllGather;
    c.bytes = 8;
  }
  Verdict v = check_agreement(pointers(calls));
  EXPECT_TRUE(v.status.is_ok()) << v.status.to_string();
  EXPECT_FALSE(v.breaks);
  calls[3].device_error = Status::internal("device emu3 failed before the collective: fault");
  calls[1].device_error = Status::resource_exhausted("pinned staging of device buffers: full");
  v = check_agreement(pointers(calls));
  EXPECT_FALSE(v.breaks);
  EXPECT_EQ(v.status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(v.status.message(),
            "all_gather: rank 1: pinned staging of device buffers: full; rank 3: device emu3 failed before the "
            "collective: fault (no data moved; the communicator stays usable)");
}

// Many failed ranks: one message for the ranks that share it, at most 16 messages and 16 ranks
// each. Regression: every failed rank's message was appended, without bound.
TEST(CheckAgreement, DeviceErrorsAreGroupedByMessageAndCapped) {
  std::vector<CallInfo> calls(48);
  for (CallInfo& c : calls) c.kind = Collective::kBarrier;
  for (int r = 0; r < 20; ++r) calls[r].device_error = Status::internal("device emu failed: fault");
  for (int r = 24; r < 44; ++r) calls[r].device_error = Status::unavailable("fault " + std::to_string(r));
  const Verdict v = check_agreement(pointers(calls));
  EXPECT_FALSE(v.breaks);
  EXPECT_EQ(v.status.code(), StatusCode::kInternal);
  std::string expected =
      "barrier: ranks 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 and 4 more: device emu "
      "failed: fault";
  for (int r = 24; r < 39; ++r) expected += "; rank " + std::to_string(r) + ": fault " + std::to_string(r);
  expected += "; and 5 more ranks (no data moved; the communicator stays usable)";
  EXPECT_EQ(v.status.message(), expected);
}

TEST(CheckAgreement, ADisagreementBeatsDeviceErrorsAndBreaks) {
  std::vector<CallInfo> calls(2);
  for (CallInfo& c : calls) c.kind = Collective::kBroadcast;
  calls[0].bytes = 8;
  calls[1].bytes = 16;
  calls[0].device_error = Status::internal("device emu0 failed before the collective: fault");
  Verdict v = check_agreement(pointers(calls));
  EXPECT_TRUE(v.breaks);
  EXPECT_EQ(v.status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status.message(), HasSubstr("ranks disagree on bytes"));
  calls[1].bytes = 8;
  calls[1].arg_error = "data is null but bytes = 8";
  v = check_agreement(pointers(calls));
  EXPECT_TRUE(v.breaks);
  EXPECT_EQ(v.status.message(), "broadcast: invalid arguments: rank 1: data is null but bytes = 8");
}

// What a header carries of a call's failure comes back as it went when it fits, else cut at a
// character with "…" (never a dangling "(" or half a character), the same on every rank.
CallInfo round_trip(const CallInfo& in) {
  std::int32_t has_arg_error = -1, device_code = -1;
  char text[32];
  std::memset(text, '?', sizeof(text));
  encode_failure(in, has_arg_error, device_code, text, sizeof(text));
  CallInfo out;
  decode_failure(has_arg_error, device_code, text, sizeof(text), out);
  return out;
}

TEST(WireFailure, EncodeThenDecodeKeepsAShortFailure) {
  CallInfo none;
  CallInfo out = round_trip(none);
  EXPECT_EQ(out.arg_error, "");
  EXPECT_TRUE(out.device_error.is_ok());
  CallInfo arg;
  arg.arg_error = "bytes = -1 is negative";
  arg.device_error = Status::internal("not sent with an argument error");
  out = round_trip(arg);
  EXPECT_EQ(out.arg_error, "bytes = -1 is negative");
  EXPECT_TRUE(out.device_error.is_ok());
  CallInfo dev;
  dev.device_error = Status::data_loss("device lost rows");
  out = round_trip(dev);
  EXPECT_EQ(out.arg_error, "");
  EXPECT_EQ(out.device_error.code(), StatusCode::kDataLoss);
  EXPECT_EQ(out.device_error.message(), "device lost rows");
}

TEST(WireFailure, ALongTextIsCutWithAMark) {
  char text[24];
  copy_text(text, sizeof(text), "exactly twenty-three ch");  // fits: 23 bytes and the NUL
  EXPECT_STREQ(text, "exactly twenty-three ch");
  copy_text(text, sizeof(text), "the source must be (pinned)");
  EXPECT_STREQ(text, "the source must be\u2026");  // no " (" dangling
  copy_text(text, sizeof(text), "device 012345678901234567890");
  EXPECT_STREQ(text, "device 0123456789012\u2026");
  // Not inside a character: "é" is 2 bytes, and the cut at byte 20 would split the last one.
  copy_text(text, sizeof(text), "abcdefghijklmnopqrs\u00e9\u00e9\u00e9");
  EXPECT_STREQ(text, "abcdefghijklmnopqrs\u2026");
  // Through a header's field of 32 bytes.
  CallInfo in;
  in.device_error = Status::io_error(std::string(100, 'x'));
  const CallInfo out = round_trip(in);
  EXPECT_EQ(out.device_error.code(), StatusCode::kIoError);
  EXPECT_EQ(out.device_error.message(), std::string(28, 'x') + "\u2026");
}

// One wire format for every header-exchanging communicator (mpi, nccl, transport): a call comes
// back as it went, the counts of an all_to_all_v only with valid arguments (and then in the words
// that follow the header), and anything without the magic is told apart.
TEST(WireHeader, EncodeThenDecodeKeepsTheCall) {
  const int size = 3;
  std::vector<std::int64_t> wire(wire_words(size), -1);
  const std::vector<std::int64_t> sc{1, 2, 3}, rc{4, 5, 6};
  CallInfo a2a;
  a2a.kind = Collective::kAllToAllV;
  a2a.send_counts = sc.data();
  a2a.recv_counts = rc.data();
  EXPECT_EQ(encode_call(a2a, 41, size, wire.data()), wire_words(size));
  EXPECT_TRUE(is_wire_header(wire.data()));
  CallInfo out;
  EXPECT_EQ(decode_call(wire.data(), size, out), 41u);
  EXPECT_EQ(out.kind, Collective::kAllToAllV);
  ASSERT_EQ(out.send_counts, wire.data() + kWireHeaderWords);
  EXPECT_EQ(std::vector<std::int64_t>(out.send_counts, out.send_counts + size), sc);
  EXPECT_EQ(std::vector<std::int64_t>(out.recv_counts, out.recv_counts + size), rc);

  CallInfo reduce;
  reduce.kind = Collective::kAllReduce;
  reduce.count = 7;
  reduce.type = DataType::kFloat64;
  reduce.op = ReduceOp::kMax;
  reduce.device_error = Status::data_loss("device lost rows");
  EXPECT_EQ(encode_call(reduce, 0, size, wire.data()), kWireHeaderWords);
  EXPECT_EQ(wire.back(), 0) << "the counts of a call without them are zeros";
  out = CallInfo{};
  EXPECT_EQ(decode_call(wire.data(), size, out), 0u);
  EXPECT_EQ(out.kind, Collective::kAllReduce);
  EXPECT_EQ(out.count, 7);
  EXPECT_EQ(out.type, DataType::kFloat64);
  EXPECT_EQ(out.op, ReduceOp::kMax);
  EXPECT_EQ(out.device_error.message(), "device lost rows");
  EXPECT_EQ(out.send_counts, nullptr);

  a2a.arg_error = "send_counts is null";  // invalid arguments: no counts on the wire
  EXPECT_EQ(encode_call(a2a, 1, size, wire.data()), kWireHeaderWords);
  out = CallInfo{};
  decode_call(wire.data(), size, out);
  EXPECT_EQ(out.arg_error, "send_counts is null");
  EXPECT_EQ(out.send_counts, nullptr);

  wire[0] = 0;
  EXPECT_FALSE(is_wire_header(wire.data()));
}

}  // namespace
}  // namespace strata::dispatch::detail
