// The communicator conformance suite (see conformance.hpp): every implementation must move the
// same bytes to the same places, count them the same way, and fail the same way: a rank that does
// not arrive is named after the timeout, ranks in different collectives or disagreeing on sizes
// get an error naming them, and a communicator stays broken after any of these.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "dispatch/communicator.hpp"
#include "gpu/device.hpp"
#include "tests/dispatch/conformance.hpp"

namespace strata::dispatch::testing {
namespace {

using ::testing::HasSubstr;

// Long enough never to fire on a loaded machine (sanitizers, 4 processes on 2 cores), short
// enough that a broken test fails instead of hanging.
CommOptions normal_options() {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

constexpr std::chrono::milliseconds kShortTimeout{500};

CommOptions short_options() {
  CommOptions o;
  o.timeout = kShortTimeout;
  return o;
}

// "rank 3" or "ranks 2, 3" as the communicators write them.
std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::vector<int> range(int from, int to) {
  std::vector<int> r;
  for (int i = from; i < to; ++i) r.push_back(i);
  return r;
}

// The byte that rank `src` sends to rank `dst` at offset i.
std::uint8_t pattern(int src, int dst, std::int64_t i) {
  return static_cast<std::uint8_t>(src * 131 + dst * 31 + i * 7 + (i >> 9) + 1);
}

constexpr std::uint8_t kSentinel = 0xEE;

// A rank's own device for the device-buffer tests: the communicator's GPU for `nccl`, else an
// emulated device of its own (thread ranks get one each, as the stores of a `local` world do).
// Moves bytes between host vectors and device buffers through pinned memory. Tells the
// communicator to forget the device before destroying it (Communicator::forget_device).
class RankDevice {
 public:
  /// `fail_after_ops` >= 0: an emulated device whose operation of that index fails
  /// (EmuOptions::fail_after_ops); only for communicators tied to no GPU.
  explicit RankDevice(Communicator& c, std::int64_t fail_after_ops = -1) : comm_(c) {
    if (c.device() >= 0) {
      dev_ = gpu::make_cuda_device(c.device()).value();
    } else {
      gpu::EmuOptions o;
      o.capacity = std::size_t{256} << 20;
      o.threads = 1;
      o.fail_after_ops = fail_after_ops;
      dev_ = gpu::make_emu_device(o).value();
    }
    stream_ = dev_->create_stream().value();
  }
  ~RankDevice() { comm_.forget_device(*dev_); }
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;
  gpu::Device& device() { return *dev_; }
  BufferSpace space() { return BufferSpace::on(*dev_, stream_.view()); }
  // Device memory holding `bytes` (one byte at least, so that the pointer is device memory).
  gpu::DeviceBuffer upload(const std::vector<std::uint8_t>& bytes) {
    gpu::DeviceBuffer d = dev_->allocate(std::max<std::size_t>(bytes.size(), 1)).value();
    gpu::PinnedBuffer p = dev_->allocate_pinned(std::max<std::size_t>(bytes.size(), 1)).value();
    if (!bytes.empty()) std::memcpy(p.data(), bytes.data(), bytes.size());
    dev_->copy_h2d(stream_.view(), d.data(), p.data(), bytes.size());
    EXPECT_TRUE(dev_->synchronize(stream_.view()).is_ok());
    return d;
  }
  std::vector<std::uint8_t> download(const gpu::DeviceBuffer& d, std::size_t bytes) {
    gpu::PinnedBuffer p = dev_->allocate_pinned(std::max<std::size_t>(bytes, 1)).value();
    dev_->copy_d2h(stream_.view(), p.data(), d.data(), bytes);
    EXPECT_TRUE(dev_->synchronize(stream_.view()).is_ok());
    std::vector<std::uint8_t> out(bytes);
    if (bytes) std::memcpy(out.data(), p.data(), bytes);
    return out;
  }

 private:
  Communicator& comm_;
  std::unique_ptr<gpu::Device> dev_;
  gpu::Stream stream_;
};

// Where exchange_and_check puts its send and receive ranges: two buffers, or one buffer passed as
// both `send` and `recv` (the send ranges first, then the receive ranges: only the displacements
// keep them apart), or two buffers packed in rank order from 0 without gaps (as dispatch::exchange
// lays them out: what a transport gives its Transport's device all_to_all directly).
enum class Layout { kTwoBuffers, kOneBuffer, kPacked };

// An all_to_all_v with per-pair sizes count(s, r), laid out with gaps (peers in reverse order when
// `reverse`), checked byte for byte, gaps included (and, in one buffer, the send ranges left as
// they were). Returns "" or the first problem.
template <class Count>
std::string exchange_and_check(Communicator& c, Count count, bool reverse, RankDevice* dev = nullptr,
                               Layout layout = Layout::kTwoBuffers) {
  const int me = c.rank();
  const int n = c.size();
  const std::int64_t kGap = layout == Layout::kPacked ? 0 : 5;
  if (layout == Layout::kPacked) reverse = false;
  std::vector<std::int64_t> sc(n), sd(n), rc(n), rd(n);
  std::int64_t send_bytes = kGap, recv_bytes = kGap;
  for (int i = 0; i < n; ++i) {
    const int r = reverse ? n - 1 - i : i;
    sc[r] = count(me, r);
    sd[r] = send_bytes;
    send_bytes += sc[r] + kGap;
    rc[r] = count(r, me);
    rd[r] = recv_bytes;
    recv_bytes += rc[r] + kGap;
  }
  std::vector<std::uint8_t> send(send_bytes, kSentinel), recv(recv_bytes, kSentinel);
  for (int r = 0; r < n; ++r) {
    for (std::int64_t i = 0; i < sc[r]; ++i) send[sd[r] + i] = pattern(me, r, i);
  }
  if (layout == Layout::kOneBuffer) {
    std::vector<std::uint8_t> all = send;
    all.insert(all.end(), recv.begin(), recv.end());
    std::vector<std::int64_t> rd_all = rd;
    for (std::int64_t& d : rd_all) d += send_bytes;
    Status s;
    if (dev) {
      const gpu::DeviceBuffer dall = dev->upload(all);
      s = c.all_to_all_v(dall.data(), sc.data(), sd.data(), dall.data(), rc.data(), rd_all.data(), dev->space());
      if (s.is_ok()) all = dev->download(dall, all.size());
    } else {
      s = c.all_to_all_v(all.data(), sc.data(), sd.data(), all.data(), rc.data(), rd_all.data());
    }
    if (!s.is_ok()) return "all_to_all_v in one buffer failed: " + s.to_string();
    if (!std::equal(send.begin(), send.end(), all.begin()))
      return "rank " + std::to_string(me) + ": all_to_all_v in one buffer wrote its send ranges";
    recv.assign(all.begin() + send_bytes, all.end());
  } else if (dev) {
    // The same exchange between device buffers (the gaps of recv start as sentinels there too).
    const gpu::DeviceBuffer dsend = dev->upload(send), drecv = dev->upload(recv);
    const Status s =
        c.all_to_all_v(dsend.data(), sc.data(), sd.data(), drecv.data(), rc.data(), rd.data(), dev->space());
    if (!s.is_ok()) return "all_to_all_v of device buffers failed: " + s.to_string();
    recv = dev->download(drecv, recv.size());
  } else {
    const Status s = c.all_to_all_v(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data());
    if (!s.is_ok()) return "all_to_all_v failed: " + s.to_string();
  }
  std::vector<bool> covered(recv_bytes, false);
  for (int src = 0; src < n; ++src) {
    for (std::int64_t i = 0; i < rc[src]; ++i) {
      covered[rd[src] + i] = true;
      if (recv[rd[src] + i] != pattern(src, me, i)) {
        return "rank " + std::to_string(me) + ": byte " + std::to_string(i) + " from rank " + std::to_string(src) +
               " is " + std::to_string(recv[rd[src] + i]) + ", expected " + std::to_string(pattern(src, me, i));
      }
    }
  }
  for (std::int64_t i = 0; i < recv_bytes; ++i) {
    if (!covered[i] && recv[i] != kSentinel)
      return "rank " + std::to_string(me) + ": gap byte " + std::to_string(i) + " was written";
  }
  return "";
}

// Every collective once more on a broken communicator: each must fail with `code`.
void expect_broken(Communicator& c, StatusCode code, const std::string& substr) {
  const int n = c.size();
  std::vector<std::int64_t> counts(n, 8), displs(n);
  for (int r = 0; r < n; ++r) displs[r] = 8 * r;
  std::vector<std::uint8_t> a(8 * n, 1), b(8 * n, 2);
  const std::vector<std::uint8_t> b_before = b;
  const Status results[] = {
      c.all_to_all_v(a.data(), counts.data(), displs.data(), b.data(), counts.data(), displs.data()),
      c.all_gather(a.data(), 8, b.data()),
      c.all_reduce(b.data(), 2, DataType::kInt32, ReduceOp::kSum),
      c.broadcast(b.data(), 8, 0),
      c.barrier(),
  };
  for (const Status& s : results) {
    EXPECT_FALSE(s.is_ok()) << "rank " << c.rank() << ": a call on a broken communicator succeeded";
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_THAT(s.message(), HasSubstr(substr));
  }
  EXPECT_EQ(b, b_before) << "rank " << c.rank() << ": a broken communicator wrote the caller's buffer";
}

TEST_P(Conformance, RanksSizeAndKind) {
  world().run(normal_options(), [&](RankEnv& env) {
    Communicator& c = env.comm;
    EXPECT_EQ(c.size(), n());
    EXPECT_GE(c.rank(), 0);
    EXPECT_LT(c.rank(), n());
    EXPECT_EQ(std::string(c.kind()), world().kind());
    const std::int32_t me = c.rank();
    std::vector<std::int32_t> all(n(), -1);
    ASSERT_TRUE(c.all_gather(&me, sizeof(me), all.data()).is_ok());
    for (int r = 0; r < n(); ++r) EXPECT_EQ(all[r], r) << "ranks must be 0..size-1, each once";
  });
}

TEST_P(Conformance, AllToAllVWithUnevenAndZeroCounts) {
  world().run(normal_options(), [&](RankEnv& env) {
    auto uneven = [](int s, int r) -> std::int64_t {
      return (s + 2 * r) % 3 == 1 ? 0 : 1 + ((s * 7 + r * 13) % 5) * 999;
    };
    EXPECT_EQ(exchange_and_check(env.comm, uneven, /*reverse=*/true), "");
    EXPECT_EQ(exchange_and_check(env.comm, uneven, /*reverse=*/false), "");
    // One pair only: the last rank to rank 0 (every other pair, and the rank itself, sends nothing).
    const int last = n() - 1;
    auto one_pair = [last](int s, int r) -> std::int64_t { return s == last && r == 0 ? 100 : 0; };
    EXPECT_EQ(exchange_and_check(env.comm, one_pair, true), "");
    // Self only.
    auto self_only = [](int s, int r) -> std::int64_t { return s == r ? 77 : 0; };
    EXPECT_EQ(exchange_and_check(env.comm, self_only, false), "");
  });
}

TEST_P(Conformance, AllToAllVWithNothingToSendAcceptsNullBuffers) {
  world().run(normal_options(), [&](RankEnv& env) {
    std::vector<std::int64_t> zero(n(), 0);
    const Status s = env.comm.all_to_all_v(nullptr, zero.data(), zero.data(), nullptr, zero.data(), zero.data());
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(env.comm.counters().calls, 1);
    EXPECT_EQ(env.comm.counters().sent_bytes, 0);
    EXPECT_EQ(env.comm.counters().received_bytes, 0);
  });
}

TEST_P(Conformance, AllToAllVOfLargeMessages) {
  world().run(normal_options(), [&](RankEnv& env) {
    // A few MiB per pair, odd sizes, different per pair.
    auto large = [](int s, int r) -> std::int64_t { return (std::int64_t{3} << 20) + 13 + s * 4096 + r; };
    EXPECT_EQ(exchange_and_check(env.comm, large, true), "");
  });
}

// send and recv may be one buffer (the same pointer) whose ranges only the displacements keep
// apart: every share moves, this rank's own included, and no sent byte is written.
TEST_P(Conformance, AllToAllVWithSendAndRecvInOneBuffer) {
  world().run(normal_options(), [&](RankEnv& env) {
    auto uneven = [](int s, int r) -> std::int64_t {
      return (s + 2 * r) % 3 == 1 ? 0 : 1 + ((s * 7 + r * 13) % 5) * 999;
    };
    EXPECT_EQ(exchange_and_check(env.comm, uneven, /*reverse=*/true, nullptr, Layout::kOneBuffer), "");
    auto self_only = [](int s, int r) -> std::int64_t { return s == r ? 77 : 0; };
    EXPECT_EQ(exchange_and_check(env.comm, self_only, false, nullptr, Layout::kOneBuffer), "");
  });
}

// This rank's own share in place (at the same address in send and recv, the other ranges apart):
// it stays as it is, and every peer's share arrives.
void own_share_in_place(Communicator& c, RankDevice* dev) {
  const int me = c.rank();
  const int n = c.size();
  constexpr std::int64_t kBytes = 8;
  // [own share][what goes to each peer][what comes from each peer], kBytes per rank each.
  std::vector<std::int64_t> counts(n, kBytes), sd(n), rd(n);
  for (int r = 0; r < n; ++r) {
    sd[r] = r == me ? 0 : kBytes * (1 + r);
    rd[r] = r == me ? 0 : kBytes * (1 + n + r);
  }
  std::vector<std::uint8_t> buf(kBytes * (1 + 2 * n), kSentinel);
  for (int r = 0; r < n; ++r) {
    for (std::int64_t i = 0; i < kBytes; ++i) buf[sd[r] + i] = pattern(me, r, i);
  }
  std::vector<std::uint8_t> expected = buf;
  for (int r = 0; r < n; ++r) {
    for (std::int64_t i = 0; i < kBytes; ++i) expected[rd[r] + i] = pattern(r, me, i);
  }
  Status s;
  if (dev) {
    const gpu::DeviceBuffer d = dev->upload(buf);
    s = c.all_to_all_v(d.data(), counts.data(), sd.data(), d.data(), counts.data(), rd.data(), dev->space());
    if (s.is_ok()) buf = dev->download(d, buf.size());
  } else {
    s = c.all_to_all_v(buf.data(), counts.data(), sd.data(), buf.data(), counts.data(), rd.data());
  }
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(buf, expected) << "rank " << me;
  EXPECT_EQ(c.counters().sent_bytes, kBytes * (n - 1));
  EXPECT_EQ(c.counters().received_bytes, kBytes * (n - 1));
}

TEST_P(Conformance, AllToAllVWithTheOwnShareInPlace) {
  world().run(normal_options(), [&](RankEnv& env) { own_share_in_place(env.comm, nullptr); });
}

TEST_P(Conformance, AllToAllCountsExchangesOneValuePerPeer) {
  world().run(normal_options(), [&](RankEnv& env) {
    const int me = env.comm.rank();
    std::vector<std::int64_t> send(n()), recv;
    for (int r = 0; r < n(); ++r) send[r] = 1000 * me + r + (std::int64_t{1} << 40);
    const Status s = all_to_all_counts(env.comm, send, recv);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ASSERT_EQ(static_cast<int>(recv.size()), n());
    for (int src = 0; src < n(); ++src) EXPECT_EQ(recv[src], 1000 * src + me + (std::int64_t{1} << 40));
  });
}

TEST_P(Conformance, AllGatherInRankOrder) {
  world().run(normal_options(), [&](RankEnv& env) {
    const int me = env.comm.rank();
    for (std::int64_t bytes : {std::int64_t{1}, std::int64_t{1000}, (std::int64_t{2} << 20) + 5, std::int64_t{0}}) {
      std::vector<std::uint8_t> send(bytes), recv(bytes * n() + 3, kSentinel);
      for (std::int64_t i = 0; i < bytes; ++i) send[i] = pattern(me, 0, i);
      const Status s = env.comm.all_gather(send.data(), bytes, recv.data());
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      std::int64_t wrong = 0;
      for (int r = 0; r < n(); ++r) {
        for (std::int64_t i = 0; i < bytes; ++i) wrong += recv[r * bytes + i] != pattern(r, 0, i);
      }
      EXPECT_EQ(wrong, 0) << "bytes " << bytes;
      for (int i = 0; i < 3; ++i) EXPECT_EQ(recv[bytes * n() + i], kSentinel) << "wrote past size() * bytes";
    }
  });
}

// Values whose sums, minima and maxima are exact in every type and every order.
template <class T>
T value(int rank, std::int64_t i) {
  const std::int64_t x = ((rank * 37 + i * 11) % 23) - 11;
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(x) / T(2);
  } else if constexpr (sizeof(T) == 8) {
    return static_cast<T>(x * (std::int64_t{1} << 40) + rank);  // beyond 32 bits
  } else {
    return static_cast<T>(x * 1000 + rank);
  }
}

template <class T>
void check_all_reduce(Communicator& c, DataType type, ReduceOp op, std::int64_t count) {
  std::vector<T> data(count), expected(count);
  for (std::int64_t i = 0; i < count; ++i) {
    data[i] = value<T>(c.rank(), i);
    expected[i] = value<T>(0, i);
    for (int r = 1; r < c.size(); ++r) {
      const T v = value<T>(r, i);
      switch (op) {
        case ReduceOp::kSum:
          expected[i] = expected[i] + v;
          break;
        case ReduceOp::kMin:
          expected[i] = std::min(expected[i], v);
          break;
        case ReduceOp::kMax:
          expected[i] = std::max(expected[i], v);
          break;
      }
    }
  }
  const Status s = c.all_reduce(data.data(), count, type, op);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < count; ++i) wrong += !(data[i] == expected[i]);
  EXPECT_EQ(wrong, 0) << "type " << static_cast<int>(type) << " op " << static_cast<int>(op) << " count " << count;
}

TEST_P(Conformance, AllReduceOfEveryTypeAndOp) {
  world().run(normal_options(), [&](RankEnv& env) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      // Counts below, at and not divisible by the world size.
      for (std::int64_t count : {std::int64_t{1}, std::int64_t{3}, std::int64_t{1001}, std::int64_t{0}}) {
        check_all_reduce<std::int32_t>(env.comm, DataType::kInt32, op, count);
        check_all_reduce<std::int64_t>(env.comm, DataType::kInt64, op, count);
        check_all_reduce<float>(env.comm, DataType::kFloat32, op, count);
        check_all_reduce<double>(env.comm, DataType::kFloat64, op, count);
      }
    }
  });
}

TEST_P(Conformance, AllReduceGivesEveryRankTheSameBits) {
  world().run(normal_options(), [&](RankEnv& env) {
    // Sums that depend on the order of the additions: whatever the order, it is the same everywhere.
    const std::int64_t count = 777;
    std::vector<float> data(count);
    for (std::int64_t i = 0; i < count; ++i)
      data[i] = 0.1f * static_cast<float>(env.comm.rank() + 1) + 1e-3f * static_cast<float>(i);
    ASSERT_TRUE(env.comm.all_reduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum).is_ok());
    std::vector<float> all(count * n());
    ASSERT_TRUE(env.comm.all_gather(data.data(), count * 4, all.data()).is_ok());
    for (int r = 0; r < n(); ++r) {
      EXPECT_EQ(std::memcmp(all.data() + r * count, data.data(), count * 4), 0) << "rank " << r << " got other bits";
    }
  });
}

TEST_P(Conformance, BroadcastFromEveryRoot) {
  world().run(normal_options(), [&](RankEnv& env) {
    const int me = env.comm.rank();
    for (int root = 0; root < n(); ++root) {
      for (std::int64_t bytes : {std::int64_t{5}, (std::int64_t{1} << 20) + 3}) {
        std::vector<std::uint8_t> data(bytes + 2, 0x5A);
        if (me == root) {
          for (std::int64_t i = 0; i < bytes; ++i) data[i] = pattern(root, 7, i);
        }
        const Status s = env.comm.broadcast(data.data(), bytes, root);
        ASSERT_TRUE(s.is_ok()) << s.to_string();
        std::int64_t wrong = 0;
        for (std::int64_t i = 0; i < bytes; ++i) wrong += data[i] != pattern(root, 7, i);
        EXPECT_EQ(wrong, 0) << "root " << root << " bytes " << bytes;
        EXPECT_EQ(data[bytes], 0x5A);
        EXPECT_EQ(data[bytes + 1], 0x5A);
      }
    }
  });
}

TEST_P(Conformance, BarrierLetsNoRankThroughBeforeAllArrived) {
  world().run(normal_options(), [&](RankEnv& env) {
    namespace fs = std::filesystem;
    const int me = env.comm.rank();
    for (int round = 0; round < 10; ++round) {
      // Each rank leaves a mark before the barrier; after it, every mark of the round must exist.
      std::ofstream(fs::path(env.shared_dir) / ("r" + std::to_string(round) + "-" + std::to_string(me))) << me;
      const Status s = env.comm.barrier();
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      for (int r = 0; r < n(); ++r) {
        EXPECT_TRUE(fs::exists(fs::path(env.shared_dir) / ("r" + std::to_string(round) + "-" + std::to_string(r))))
            << "rank " << me << " passed barrier " << round << " before rank " << r << " arrived";
      }
    }
  });
}

TEST_P(Conformance, CountersCountBytesToAndFromOtherRanks) {
  world().run(normal_options(), [&](RankEnv& env) {
    Communicator& c = env.comm;
    const int me = c.rank();
    const std::int64_t peers = n() - 1;
    CommCounters k = c.counters();
    EXPECT_EQ(k.sent_bytes, 0);
    EXPECT_EQ(k.received_bytes, 0);
    EXPECT_EQ(k.calls, 0);

    std::int64_t sent = 0, received = 0;
    {
      auto count = [](int s, int r) -> std::int64_t { return 10 * (s + 1) + r; };
      ASSERT_EQ(exchange_and_check(c, count, false), "");
      for (int r = 0; r < n(); ++r) {
        if (r == me) continue;
        sent += count(me, r);
        received += count(r, me);
      }
    }
    std::vector<std::uint8_t> buf(64), gathered(24 * n());
    ASSERT_TRUE(c.all_gather(buf.data(), 24, gathered.data()).is_ok());
    sent += peers * 24;
    received += peers * 24;
    ASSERT_TRUE(c.all_reduce(buf.data(), 6, DataType::kInt64, ReduceOp::kMax).is_ok());
    sent += peers * 48;
    received += peers * 48;
    ASSERT_TRUE(c.broadcast(buf.data(), 40, n() - 1).is_ok());
    if (me == n() - 1) {
      sent += peers * 40;
    } else {
      received += 40;
    }
    ASSERT_TRUE(c.barrier().is_ok());
    k = c.counters();
    EXPECT_EQ(k.sent_bytes, sent);
    EXPECT_EQ(k.received_bytes, received);
    EXPECT_EQ(k.calls, 5);
  });
}

// Many collectives of random kinds and sizes (the same sequence on every rank), every result
// checked: shakes out generation and buffer-reuse bugs, and races under ThreadSanitizer.
TEST_P(Conformance, LongMixedSequence) {
  world().run(normal_options(), [&](RankEnv& env) {
    Communicator& c = env.comm;
    const int me = c.rank();
    std::mt19937 rng(1234);  // same seed on every rank: the same sequence of calls
    for (int round = 0; round < 120; ++round) {
      const int kind = static_cast<int>(rng() % 5);
      if (kind == 0) {
        std::vector<std::int64_t> m(n() * n());
        for (auto& x : m) x = rng() % 3 == 0 ? 0 : rng() % 3000;
        auto count = [&](int s, int r) { return m[s * n() + r]; };
        ASSERT_EQ(exchange_and_check(c, count, round % 2 == 0), "") << "round " << round;
      } else if (kind == 1) {
        const std::int64_t bytes = rng() % 2000;
        std::vector<std::uint8_t> send(bytes), recv(bytes * n());
        for (std::int64_t i = 0; i < bytes; ++i) send[i] = pattern(me, round, i);
        ASSERT_TRUE(c.all_gather(send.data(), bytes, recv.data()).is_ok());
        for (int r = 0; r < n(); ++r) {
          for (std::int64_t i = 0; i < bytes; ++i)
            ASSERT_EQ(recv[r * bytes + i], pattern(r, round, i)) << "round " << round;
        }
      } else if (kind == 2) {
        const std::int64_t count = rng() % 500;
        check_all_reduce<std::int64_t>(c, DataType::kInt64, static_cast<ReduceOp>(rng() % 3), count);
        if (::testing::Test::HasFatalFailure()) return;
      } else if (kind == 3) {
        const int root = static_cast<int>(rng() % n());
        const std::int64_t bytes = rng() % 5000;
        std::vector<std::uint8_t> data(bytes, 0);
        if (me == root) {
          for (std::int64_t i = 0; i < bytes; ++i) data[i] = pattern(root, round, i);
        }
        ASSERT_TRUE(c.broadcast(data.data(), bytes, root).is_ok());
        for (std::int64_t i = 0; i < bytes; ++i) ASSERT_EQ(data[i], pattern(root, round, i)) << "round " << round;
      } else {
        ASSERT_TRUE(c.barrier().is_ok());
      }
    }
    EXPECT_EQ(c.counters().calls, 120);
  });
}

// ---- errors ----

TEST_P(Conformance, TimeoutNamesTheRanksThatDidNotArrive) {
  if (n() < 2) GTEST_SKIP() << "needs two ranks";
  // The last rank (of 2), or the last two ranks, never make the call.
  const std::vector<int> missing = n() == 2 ? std::vector<int>{1} : std::vector<int>{n() - 2, n() - 1};
  const std::string expected = "all_to_all_v: timed out after " + std::to_string(kShortTimeout.count()) + " ms; " +
                               ranks_text(missing) + " of " + std::to_string(n()) + " did not arrive";
  world().run(short_options(), [&](RankEnv& env) {
    Communicator& c = env.comm;
    const bool arrives = c.rank() < missing.front();
    env.sync();
    if (arrives) {
      std::vector<std::int64_t> counts(n(), 8), displs(n());
      for (int r = 0; r < n(); ++r) displs[r] = 8 * r;
      std::vector<std::uint8_t> send(8 * n(), 1), recv(8 * n(), kSentinel);
      const Status s =
          c.all_to_all_v(send.data(), counts.data(), displs.data(), recv.data(), counts.data(), displs.data());
      EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
      EXPECT_THAT(s.message(), HasSubstr(expected));
      EXPECT_EQ(recv, std::vector<std::uint8_t>(8 * n(), kSentinel)) << "a failed call wrote the caller's buffer";
      EXPECT_EQ(c.counters().calls, 1);
      EXPECT_EQ(c.counters().sent_bytes, 0);
    }
    env.sync();  // every arriving rank has failed: now the group is broken for everyone
    // The ranks that arrived see their own error again; the late ones learn of it (or time out).
    expect_broken(c, StatusCode::kUnavailable, arrives ? expected : "");
  });
}

TEST_P(Conformance, DifferentCollectivesAreRejectedOnEveryRank) {
  if (n() < 2) GTEST_SKIP() << "needs two ranks";
  world().run(normal_options(), [&](RankEnv& env) {
    Communicator& c = env.comm;
    std::vector<std::uint8_t> send(8, 3), recv(8 * n(), kSentinel);
    const Status s = c.rank() == 0 ? c.all_gather(send.data(), 8, recv.data()) : c.barrier();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    EXPECT_THAT(s.message(), HasSubstr("collective mismatch: rank 0 called all_gather; " + ranks_text(range(1, n())) +
                                       " called barrier"));
    EXPECT_EQ(recv, std::vector<std::uint8_t>(8 * n(), kSentinel));
    expect_broken(c, StatusCode::kFailedPrecondition, "collective mismatch");
  });
  world().run(normal_options(), [&](RankEnv& env) {
    Communicator& c = env.comm;
    const int last = n() - 1;
    std::vector<std::int64_t> counts(n(), 4), displs(n());
    for (int r = 0; r < n(); ++r) displs[r] = 4 * r;
    std::vector<std::int32_t> a(n(), 1), b(n(), 0);
    const Status s = c.rank() == last ? c.all_to_all_v(a.data(), counts.data(), displs.data(), b.data(), counts.data(),
                                                       displs.data())
                                      : c.all_reduce(a.data(), n(), DataType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    EXPECT_THAT(s.message(), HasSubstr(ranks_text(range(0, last)) + " called all_reduce; rank " + std::to_string(last) +
                                       " called all_to_all_v"));
    expect_broken(c, StatusCode::kFailedPrecondition, "collective mismatch");
  });
}

// Rank `odd` (the last) calls with a different size than the others: every rank must get
// InvalidArgument with `message`, nothing may be written, and the communicator stays broken.
struct SizeMismatch {
  const char* name;
  std::function<Status(Communicator&, bool odd, std::vector<std::uint8_t>& buf)> call;
  std::function<std::string(int n)> message;
};

TEST_P(Conformance, DisagreeingSizesAreRejectedOnEveryRank) {
  if (n() < 2) GTEST_SKIP() << "needs two ranks";
  auto others = [](int n) { return ranks_text(range(0, n - 1)); };
  auto last = [](int n) { return "rank " + std::to_string(n - 1); };
  const std::vector<SizeMismatch> cases = {
      {"all_gather bytes",
       [](Communicator& c, bool odd, std::vector<std::uint8_t>& buf) {
         std::vector<std::uint8_t> send(64, 1);
         return c.all_gather(send.data(), odd ? 32 : 64, buf.data());
       },
       [&](int n) { return "all_gather: ranks disagree on bytes: " + others(n) + ": 64; " + last(n) + ": 32"; }},
      {"all_reduce count",
       [](Communicator& c, bool odd, std::vector<std::uint8_t>& buf) {
         return c.all_reduce(buf.data(), odd ? 10 : 11, DataType::kInt32, ReduceOp::kSum);
       },
       [&](int n) { return "all_reduce: ranks disagree on count: " + others(n) + ": 11; " + last(n) + ": 10"; }},
      {"all_reduce type",
       [](Communicator& c, bool odd, std::vector<std::uint8_t>& buf) {
         return c.all_reduce(buf.data(), 4, odd ? DataType::kFloat64 : DataType::kFloat32, ReduceOp::kSum);
       },
       [&](int n) {
         return "all_reduce: ranks disagree on data type: " + others(n) + ": float32; " + last(n) + ": float64";
       }},
      {"all_reduce op",
       [](Communicator& c, bool odd, std::vector<std::uint8_t>& buf) {
         return c.all_reduce(buf.data(), 4, DataType::kInt64, odd ? ReduceOp::kMax : ReduceOp::kSum);
       },
       [&](int n) { return "all_reduce: ranks disagree on reduce op: " + others(n) + ": sum; " + last(n) + ": max"; }},
      {"broadcast root",
       [](Communicator& c, bool odd, std::vector<std::uint8_t>& buf) {
         return c.broadcast(buf.data(), 16, odd ? 1 : 0);
       },
       [&](int n) { return "broadcast: ranks disagree on root: " + others(n) + ": 0; " + last(n) + ": 1"; }},
      {"broadcast bytes",
       [](Communicator& c, bool odd, std::vector<std::uint8_t>& buf) {
         return c.broadcast(buf.data(), odd ? 17 : 16, 0);
       },
       [&](int n) { return "broadcast: ranks disagree on bytes: " + others(n) + ": 16; " + last(n) + ": 17"; }},
      {"all_to_all_v counts",
       [](Communicator& c, bool, std::vector<std::uint8_t>& buf) {
         // Rank 0 sends 100 bytes to rank 1, which expects 96 from it; all else matches.
         const int n = c.size();
         std::vector<std::int64_t> sc(n, 8), rc(n, 8), displs(n);
         for (int r = 0; r < n; ++r) displs[r] = 128 * r;
         if (c.rank() == 0) sc[1] = 100;
         if (c.rank() == 1) rc[0] = 96;
         std::vector<std::uint8_t> send(128 * n, 1);
         return c.all_to_all_v(send.data(), sc.data(), displs.data(), buf.data(), rc.data(), displs.data());
       },
       [](int) {
         return std::string(
             "all_to_all_v: send and receive counts disagree: rank 0 sends 100 bytes to rank 1, which expects 96 from "
             "it");
       }},
  };
  for (const SizeMismatch& m : cases) {
    SCOPED_TRACE(m.name);
    world().run(normal_options(), [&](RankEnv& env) {
      Communicator& c = env.comm;
      std::vector<std::uint8_t> buf(128 * n(), kSentinel);
      const Status s = m.call(c, c.rank() == n() - 1, buf);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
      EXPECT_EQ(s.message(), m.message(n()));
      EXPECT_EQ(buf, std::vector<std::uint8_t>(128 * n(), kSentinel)) << "a rejected call moved data";
      EXPECT_EQ(c.counters().sent_bytes + c.counters().received_bytes, 0);
      expect_broken(c, StatusCode::kInvalidArgument, m.message(n()));
    });
  }
}

TEST_P(Conformance, InvalidArgumentsOnOneRankFailEveryRank) {
  world().run(normal_options(), [&](RankEnv& env) {
    Communicator& c = env.comm;
    const int last = n() - 1;
    std::vector<std::int32_t> data(4, 1);
    const Status s = c.all_reduce(data.data(), c.rank() == last ? -1 : 4, DataType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_EQ(s.message(), "all_reduce: invalid arguments: rank " + std::to_string(last) + ": count = -1 is negative");
    EXPECT_EQ(data, std::vector<std::int32_t>(4, 1));
    expect_broken(c, StatusCode::kInvalidArgument, "count = -1 is negative");
  });
  world().run(normal_options(), [&](RankEnv& env) {
    std::vector<std::uint8_t> data(8, 1);
    const Status s = env.comm.broadcast(data.data(), 8, n());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_THAT(s.message(),
                HasSubstr("rank 0: root " + std::to_string(n()) + " out of range [0, " + std::to_string(n()) + ")"));
  });
  world().run(normal_options(), [&](RankEnv& env) {
    // all_to_all_counts with one entry too many on rank 0.
    std::vector<std::int64_t> send(env.comm.rank() == 0 ? n() + 1 : n(), 1), recv;
    const Status s = all_to_all_counts(env.comm, send, recv);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    if (env.comm.rank() == 0) {
      EXPECT_THAT(s.message(), HasSubstr("send has " + std::to_string(n() + 1) + " entries"));
    } else {
      EXPECT_THAT(s.message(), HasSubstr("invalid arguments: rank 0"));
    }
  });
}

// A byte both sent and received (an in-place all_to_all_v, as MPI_Alltoallv with one buffer and
// no MPI_IN_PLACE), or received from two ranks, is an invalid argument in every communicator and
// memory space alike: peers would read bytes this rank already overwrote, or two shares would land
// on the same bytes (erroneous for MPI_Irecv, a race for ncclRecv and for thread ranks). The last
// rank makes the mistake; every rank fails, nothing is written, and the communicator stays broken.
TEST_P(Conformance, AllToAllVWithOverlappingRangesFailsEveryRank) {
  const int last = n() - 1;
  struct Case {
    const char* name;
    bool one_buffer;          // the last rank passes its send buffer as recv too
    std::int64_t recv_step;   // the last rank's receive displacements: recv_step * r + recv_shift
    std::int64_t recv_shift;  // (the other ranks': 8 * r, into a buffer of their own)
    std::string message;      // what follows "rank <last>: "
  };
  std::vector<Case> cases = {
      {"receive ranges 4 bytes into the send ranges", true, 8, 4,
       "send and recv overlap: the 8 bytes to rank 0 at send + 0 and the 8 bytes from rank 0 at recv + 4 "
       "share memory"},
  };
  // The same displacements for both: only this rank's own share may be in place, so with peers
  // this overlaps (with no peer it is the own share in place, which is fine). And with peers, two
  // receive ranges can overlap.
  if (n() > 1) {
    cases.push_back({"send == recv with the same displacements", true, 8, 0,
                     "send and recv overlap: the 8 bytes to rank 0 at send + 0 and the 8 bytes from rank 0 at recv + "
                     "0 share memory"});
    cases.push_back({"receive ranges 4 bytes apart in a buffer of their own", false, 4, 0,
                     "recv ranges overlap: the 8 bytes from rank 0 at recv + 0 and the 8 bytes from rank 1 at recv + "
                     "4 share memory"});
  }
  for (const Case& k : cases) {
    for (bool on_device : {false, true}) {
      SCOPED_TRACE(std::string(k.name) + (on_device ? ", device buffers" : ", host buffers"));
      world().run(normal_options(), [&](RankEnv& env) {
        Communicator& c = env.comm;
        const bool bad = c.rank() == last;
        const bool one_buffer = bad && k.one_buffer;
        std::vector<std::int64_t> counts(n(), 8), sd(n()), rd(n());
        for (int r = 0; r < n(); ++r) {
          sd[r] = 8 * r;
          rd[r] = bad ? k.recv_step * r + k.recv_shift : 8 * r;
        }
        const std::vector<std::uint8_t> a(8 * n() + 8, 1), b(8 * n() + 8, kSentinel);
        std::vector<std::uint8_t> a_after = a, b_after = b;
        Status s;
        if (on_device) {
          RankDevice dev(c);
          const gpu::DeviceBuffer da = dev.upload(a), db = dev.upload(b);
          s = c.all_to_all_v(da.data(), counts.data(), sd.data(), one_buffer ? da.data() : db.data(), counts.data(),
                             rd.data(), dev.space());
          a_after = dev.download(da, a.size());
          b_after = dev.download(db, b.size());
        } else {
          s = c.all_to_all_v(a_after.data(), counts.data(), sd.data(), one_buffer ? a_after.data() : b_after.data(),
                             counts.data(), rd.data());
        }
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
        EXPECT_THAT(s.message(),
                    HasSubstr("all_to_all_v: invalid arguments: rank " + std::to_string(last) + ": " + k.message));
        EXPECT_EQ(a_after, a) << "rank " << c.rank() << ": a rejected call wrote the send buffer";
        EXPECT_EQ(b_after, b) << "rank " << c.rank() << ": a rejected call wrote the receive buffer";
        EXPECT_EQ(c.counters().sent_bytes + c.counters().received_bytes, 0);
        expect_broken(c, StatusCode::kInvalidArgument, k.message.substr(0, k.message.find(':')));
      });
    }
  }
}

// Send ranges may overlap: nothing writes them, and MPI allows it. Here every rank sends the same
// bytes to every rank (all its send displacements 0), from host and from device buffers.
TEST_P(Conformance, AllToAllVMaySendTheSameBytesToSeveralRanks) {
  for (bool on_device : {false, true}) {
    SCOPED_TRACE(on_device ? "device buffers" : "host buffers");
    world().run(normal_options(), [&](RankEnv& env) {
      Communicator& c = env.comm;
      const int me = c.rank();
      constexpr std::int64_t kBytes = 1000;
      std::vector<std::int64_t> counts(n(), kBytes), sd(n(), 0), rd(n());
      for (int r = 0; r < n(); ++r) rd[r] = kBytes * r;
      std::vector<std::uint8_t> send(kBytes), recv(kBytes * n(), kSentinel);
      for (std::int64_t i = 0; i < kBytes; ++i) send[i] = pattern(me, 0, i);
      const std::vector<std::uint8_t> send_before = send;
      Status s;
      if (on_device) {
        RankDevice dev(c);
        const gpu::DeviceBuffer dsend = dev.upload(send), drecv = dev.upload(recv);
        s = c.all_to_all_v(dsend.data(), counts.data(), sd.data(), drecv.data(), counts.data(), rd.data(), dev.space());
        send = dev.download(dsend, send.size());
        recv = dev.download(drecv, recv.size());
      } else {
        s = c.all_to_all_v(send.data(), counts.data(), sd.data(), recv.data(), counts.data(), rd.data());
      }
      ASSERT_TRUE(s.is_ok()) << "rank " << me << ": " << s.to_string();
      EXPECT_EQ(send, send_before) << "rank " << me << ": all_to_all_v wrote its send buffer";
      std::int64_t wrong = 0;
      for (int src = 0; src < n(); ++src) {
        for (std::int64_t i = 0; i < kBytes; ++i) wrong += recv[kBytes * src + i] != pattern(src, 0, i);
      }
      EXPECT_EQ(wrong, 0) << "rank " << me;
    });
  }
}

// A displacement whose range ends past int64 (undefined behaviour to compute) is refused on the
// rank that passes it, and every rank fails alike; nothing is read.
TEST_P(Conformance, AllToAllVWithADisplacementPlusCountPastInt64FailsEveryRank) {
  const int last = n() - 1;
  for (bool on_device : {false, true}) {
    SCOPED_TRACE(on_device ? "device buffers" : "host buffers");
    world().run(normal_options(), [&](RankEnv& env) {
      Communicator& c = env.comm;
      std::vector<std::int64_t> counts(n(), 8), sd(n()), rd(n());
      for (int r = 0; r < n(); ++r) sd[r] = rd[r] = 8 * r;
      if (c.rank() == last) sd[0] = std::numeric_limits<std::int64_t>::max() - 4;
      const std::vector<std::uint8_t> a(8 * n(), 1), b(8 * n(), kSentinel);
      std::vector<std::uint8_t> b_after = b;
      Status s;
      if (on_device) {
        RankDevice dev(c);
        const gpu::DeviceBuffer da = dev.upload(a), db = dev.upload(b);
        s = c.all_to_all_v(da.data(), counts.data(), sd.data(), db.data(), counts.data(), rd.data(), dev.space());
        b_after = dev.download(db, b.size());
      } else {
        s = c.all_to_all_v(a.data(), counts.data(), sd.data(), b_after.data(), counts.data(), rd.data());
      }
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
      EXPECT_THAT(s.message(), HasSubstr("all_to_all_v: invalid arguments: rank " + std::to_string(last) +
                                         ": send_displs[0] + send_counts[0] = 9223372036854775803 + 8 overflows "
                                         "int64"));
      EXPECT_EQ(b_after, b) << "rank " << c.rank() << ": a rejected call wrote the receive buffer";
    });
  }
}

// An all_reduce whose bytes (count * the type's size, gathered from every rank) add up past
// int64 is refused on every rank before anything is read, like all_gather's.
TEST_P(Conformance, AllReduceWhoseBytesAddUpPastInt64FailsEveryRank) {
  // Invalid arguments break the communicator: one world each.
  for (const std::int64_t count :
       {std::numeric_limits<std::int64_t>::max() / 8 + 1, std::numeric_limits<std::int64_t>::max() / (8 * n()) + 1}) {
    world().run(normal_options(), [&](RankEnv& env) {
      Communicator& c = env.comm;
      std::vector<double> data(4, 1.0);
      const Status s = c.all_reduce(data.data(), count, DataType::kFloat64, ReduceOp::kSum);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
      EXPECT_THAT(s.message(), HasSubstr("count = " + std::to_string(count) + " of float64 from each of " +
                                         std::to_string(n()) + " ranks add up past int64"));
      EXPECT_EQ(data, std::vector<double>(4, 1.0));
    });
  }
}

// ---- device buffers (BufferSpace::on): the same bytes, counted the same way ----

TEST_P(Conformance, DeviceBuffersAllToAllV) {
  world().run(normal_options(), [&](RankEnv& env) {
    RankDevice dev(env.comm);
    auto uneven = [](int s, int r) -> std::int64_t {
      return (s + 2 * r) % 3 == 1 ? 0 : 1 + ((s * 7 + r * 13) % 5) * 999;
    };
    EXPECT_EQ(exchange_and_check(env.comm, uneven, /*reverse=*/true, &dev), "");
    auto self_only = [](int s, int r) -> std::int64_t { return s == r ? 77 : 0; };
    EXPECT_EQ(exchange_and_check(env.comm, self_only, false, &dev), "");
    auto large = [](int s, int r) -> std::int64_t { return (std::int64_t{1} << 20) + 13 + s * 4096 + r; };
    EXPECT_EQ(exchange_and_check(env.comm, large, false, &dev), "");
    // Nothing to send: null device pointers are fine, as for host buffers.
    std::vector<std::int64_t> zero(n(), 0);
    const Status s =
        env.comm.all_to_all_v(nullptr, zero.data(), zero.data(), nullptr, zero.data(), zero.data(), dev.space());
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_TRUE(dev.device().status().is_ok()) << dev.device().status().to_string();
  });
}

// Packed in rank order from 0 (the layout of dispatch::exchange; a transport whose Transport takes
// the device gives it these buffers directly), the own share alone included.
TEST_P(Conformance, DeviceBuffersAllToAllVPacked) {
  world().run(normal_options(), [&](RankEnv& env) {
    RankDevice dev(env.comm);
    auto uneven = [](int s, int r) -> std::int64_t {
      return (s + 2 * r) % 3 == 1 ? 0 : 1 + ((s * 7 + r * 13) % 5) * 999;
    };
    EXPECT_EQ(exchange_and_check(env.comm, uneven, false, &dev, Layout::kPacked), "");
    auto self_only = [](int s, int r) -> std::int64_t { return s == r ? 77 : 0; };
    EXPECT_EQ(exchange_and_check(env.comm, self_only, false, &dev, Layout::kPacked), "");
    EXPECT_TRUE(dev.device().status().is_ok()) << dev.device().status().to_string();
  });
}

TEST_P(Conformance, DeviceBuffersAllToAllVWithSendAndRecvInOneBuffer) {
  world().run(normal_options(), [&](RankEnv& env) {
    RankDevice dev(env.comm);
    auto uneven = [](int s, int r) -> std::int64_t {
      return (s + 2 * r) % 3 == 1 ? 0 : 1 + ((s * 7 + r * 13) % 5) * 999;
    };
    EXPECT_EQ(exchange_and_check(env.comm, uneven, /*reverse=*/true, &dev, Layout::kOneBuffer), "");
    auto self_only = [](int s, int r) -> std::int64_t { return s == r ? 77 : 0; };
    EXPECT_EQ(exchange_and_check(env.comm, self_only, false, &dev, Layout::kOneBuffer), "");
    auto large = [](int s, int r) -> std::int64_t { return (std::int64_t{1} << 20) + 13 + s * 4096 + r; };
    EXPECT_EQ(exchange_and_check(env.comm, large, false, &dev, Layout::kOneBuffer), "");
    EXPECT_TRUE(dev.device().status().is_ok()) << dev.device().status().to_string();
  });
}

TEST_P(Conformance, DeviceBuffersAllToAllVWithTheOwnShareInPlace) {
  world().run(normal_options(), [&](RankEnv& env) {
    RankDevice dev(env.comm);
    own_share_in_place(env.comm, &dev);
  });
}

// Two devices taking turns on one communicator (two stores sharing it): after a first round with
// each, no collective allocates or frees anything on either device (`mpi` keeps pinned staging per
// device), and forgetting one device leaves the other's alone.
TEST_P(Conformance, DeviceBuffersOfTwoDevicesTakingTurnsAllocateNothingAfterWarmUp) {
  world().run(normal_options(), [&](RankEnv& env) {
    Communicator& c = env.comm;
    const int me = c.rank();
    const int n = c.size();
    RankDevice a(c), b(c);
    // Each device has its own sizes, so the two need stages of different sizes.
    struct Side {
      RankDevice& dev;
      std::int64_t base;  // bytes per pair, plus a little per rank
      std::vector<std::int64_t> sc, sd, rc, rd;
      gpu::DeviceBuffer send, recv, gathered;
    };
    auto make_side = [&](RankDevice& dev, std::int64_t base) {
      Side side{dev,
                base,
                std::vector<std::int64_t>(n),
                std::vector<std::int64_t>(n),
                std::vector<std::int64_t>(n),
                std::vector<std::int64_t>(n),
                {},
                {},
                {}};
      std::int64_t send_bytes = 0, recv_bytes = 0;
      for (int r = 0; r < n; ++r) {
        side.sc[r] = base + 8 * me + r;
        side.sd[r] = send_bytes;
        send_bytes += side.sc[r];
        side.rc[r] = base + 8 * r + me;
        side.rd[r] = recv_bytes;
        recv_bytes += side.rc[r];
      }
      std::vector<std::uint8_t> send(send_bytes);
      for (int r = 0; r < n; ++r) {
        for (std::int64_t i = 0; i < side.sc[r]; ++i) send[side.sd[r] + i] = pattern(me, r, i + base);
      }
      side.send = dev.upload(send);
      side.recv = dev.upload(std::vector<std::uint8_t>(recv_bytes, kSentinel));
      side.gathered = dev.upload(std::vector<std::uint8_t>(base * n, kSentinel));
      return side;
    };
    Side sides[] = {make_side(a, 3000), make_side(b, 7000)};
    // EXPECT and an early-out rather than ASSERT: an ASSERT would leave only this lambda, and the
    // rank would go on to the next collective on its own. A failed round says which call failed.
    auto round = [&](Side& s) -> bool {
      const BufferSpace space = s.dev.space();
      auto ok = [&](const Status& st, const char* what) {
        EXPECT_TRUE(st.is_ok()) << what << " with base " << s.base << ", rank " << me << ": " << st.to_string();
        return st.is_ok();
      };
      return ok(c.all_to_all_v(s.send.data(), s.sc.data(), s.sd.data(), s.recv.data(), s.rc.data(), s.rd.data(), space),
                "all_to_all_v") &&
             ok(c.all_gather(s.send.data(), s.base, s.gathered.data(), space), "all_gather") &&
             ok(c.broadcast(s.gathered.data(), s.base, n - 1, space), "broadcast");
    };
    auto expect_none = [&](const gpu::ResourceCounts& during, const char* what) {
      EXPECT_EQ(during.allocations, 0u) << what << ", rank " << me;
      EXPECT_EQ(during.frees, 0u) << what << ", rank " << me;
      EXPECT_EQ(during.events, 0u) << what << ", rank " << me;
    };
    for (Side& s : sides) {
      if (!round(s)) return;  // warm-up
    }
    const gpu::ResourceCounts a0 = a.device().resource_counts(), b0 = b.device().resource_counts();
    for (int turn = 0; turn < 6; ++turn) {
      if (!round(sides[turn % 2])) return;
    }
    expect_none(a.device().resource_counts() - a0, "device a, taking turns");
    expect_none(b.device().resource_counts() - b0, "device b, taking turns");

    if (!round(sides[0])) return;
    c.forget_device(a.device());
    const gpu::ResourceCounts b1 = b.device().resource_counts();
    if (!round(sides[1])) return;
    expect_none(b.device().resource_counts() - b1, "device b, after a was forgotten");
    if (!round(sides[0])) return;  // a again: it may allocate anew

    for (Side& s : sides) {
      std::int64_t recv_bytes = 0;
      for (int r = 0; r < n; ++r) recv_bytes += s.rc[r];
      const std::vector<std::uint8_t> recv = s.dev.download(s.recv, static_cast<std::size_t>(recv_bytes));
      std::int64_t wrong = 0;
      for (int src = 0; src < n; ++src) {
        for (std::int64_t i = 0; i < s.rc[src]; ++i) wrong += recv[s.rd[src] + i] != pattern(src, me, i + s.base);
      }
      EXPECT_EQ(wrong, 0) << "all_to_all_v with base " << s.base << ", rank " << me;
      const std::vector<std::uint8_t> gathered = s.dev.download(s.gathered, static_cast<std::size_t>(s.base * n));
      // The broadcast from the last rank left its gathered bytes everywhere: rank r's first
      // s.base bytes of what it sends (to rank 0) at r * s.base.
      wrong = 0;
      for (int r = 0; r < n; ++r) {
        for (std::int64_t i = 0; i < s.base; ++i) wrong += gathered[r * s.base + i] != pattern(r, 0, i + s.base);
      }
      EXPECT_EQ(wrong, 0) << "all_gather then broadcast with base " << s.base << ", rank " << me;
    }
  });
}

TEST_P(Conformance, DeviceBuffersAllGatherAndBroadcast) {
  world().run(normal_options(), [&](RankEnv& env) {
    RankDevice dev(env.comm);
    const int me = env.comm.rank();
    for (std::int64_t bytes : {std::int64_t{1}, (std::int64_t{1} << 20) + 5}) {
      std::vector<std::uint8_t> send(bytes);
      for (std::int64_t i = 0; i < bytes; ++i) send[i] = pattern(me, 0, i);
      const gpu::DeviceBuffer dsend = dev.upload(send);
      const gpu::DeviceBuffer drecv = dev.upload(std::vector<std::uint8_t>(bytes * n() + 3, kSentinel));
      const Status s = env.comm.all_gather(dsend.data(), bytes, drecv.data(), dev.space());
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      const std::vector<std::uint8_t> recv = dev.download(drecv, bytes * n() + 3);
      std::int64_t wrong = 0;
      for (int r = 0; r < n(); ++r) {
        for (std::int64_t i = 0; i < bytes; ++i) wrong += recv[r * bytes + i] != pattern(r, 0, i);
      }
      EXPECT_EQ(wrong, 0) << "all_gather of " << bytes << " bytes";
      EXPECT_EQ(recv[bytes * n()], kSentinel) << "all_gather wrote past its buffer";
    }
    for (int root = 0; root < n(); ++root) {
      const std::int64_t bytes = (std::int64_t{1} << 16) + 3;
      std::vector<std::uint8_t> data(bytes + 2, 0x5A);
      if (me == root) {
        for (std::int64_t i = 0; i < bytes; ++i) data[i] = pattern(root, 7, i);
      }
      const gpu::DeviceBuffer d = dev.upload(data);
      const Status s = env.comm.broadcast(d.data(), bytes, root, dev.space());
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      data = dev.download(d, bytes + 2);
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < bytes; ++i) wrong += data[i] != pattern(root, 7, i);
      EXPECT_EQ(wrong, 0) << "broadcast from root " << root;
      EXPECT_EQ(data[bytes], 0x5A);
    }
    EXPECT_TRUE(dev.device().status().is_ok()) << dev.device().status().to_string();
  });
}

TEST_P(Conformance, DeviceBuffersCountTheSameBytesAsHostBuffers) {
  world().run(normal_options(), [&](RankEnv& env) {
    RankDevice dev(env.comm);
    Communicator& c = env.comm;
    const int me = c.rank();
    const std::int64_t peers = n() - 1;
    std::int64_t sent = 0, received = 0;
    auto count = [](int s, int r) -> std::int64_t { return 10 * (s + 1) + r; };
    ASSERT_EQ(exchange_and_check(c, count, false, &dev), "");
    for (int r = 0; r < n(); ++r) {
      if (r == me) continue;
      sent += count(me, r);
      received += count(r, me);
    }
    const gpu::DeviceBuffer buf = dev.upload(std::vector<std::uint8_t>(64, 3));
    const gpu::DeviceBuffer gathered = dev.upload(std::vector<std::uint8_t>(24 * n(), 0));
    ASSERT_TRUE(c.all_gather(buf.data(), 24, gathered.data(), dev.space()).is_ok());
    sent += peers * 24;
    received += peers * 24;
    ASSERT_TRUE(c.broadcast(buf.data(), 40, n() - 1, dev.space()).is_ok());
    if (me == n() - 1) {
      sent += peers * 40;
    } else {
      received += 40;
    }
    const CommCounters k = c.counters();
    EXPECT_EQ(k.sent_bytes, sent);
    EXPECT_EQ(k.received_bytes, received);
    EXPECT_EQ(k.calls, 3);
  });
}

TEST_P(Conformance, DeviceBuffersOnAStreamOfAnotherDeviceFailEveryRank) {
  world().run(normal_options(), [&](RankEnv& env) {
    RankDevice dev(env.comm), other(env.comm);
    const gpu::DeviceBuffer d = dev.upload(std::vector<std::uint8_t>(16, 1));
    // The last rank orders its device buffers on a stream of another device.
    const bool bad = env.comm.rank() == n() - 1;
    BufferSpace space = dev.space();
    if (bad) space.stream = other.space().stream;
    const Status s = env.comm.broadcast(d.data(), 16, 0, space);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_THAT(s.message(), HasSubstr("rank " + std::to_string(n() - 1) +
                                       ": device buffers ordered on a stream of "
                                       "another device"));
    EXPECT_TRUE(dev.device().status().is_ok()) << "refused before any device work";
  });
}

// A device that failed before a device collective, by work on another stream that the call's
// stream never saw (a sticky error, device-wide, as a kernel fault on a GPU), fails the call on
// every rank with the same error naming the rank, before any data moved. The ranks are still in
// step, so the communicator stays usable: host collectives go on, and the device collectives fail
// the same way again while the device stays failed (a sharded store that saw a device fault still
// reads its rows and saves through the communicator; it once broke it).
TEST_P(Conformance, ADeviceThatFailedBeforeADeviceCollectiveFailsEveryRankAndTheCommunicatorGoesOn) {
  if (world().kind() == "nccl") GTEST_SKIP() << "a failed CUDA context cannot be made on purpose and outlived";
  world().run(normal_options(), [&](RankEnv& env) {
    Communicator& c = env.comm;
    const int me = c.rank(), last = n() - 1;
    // The last rank's device fails at its third operation, after the two uploads.
    RankDevice dev(c, me == last ? 2 : -1);
    const std::vector<std::uint8_t> sent(8 * n(), static_cast<std::uint8_t>(me)), empty(8 * n(), kSentinel);
    const gpu::DeviceBuffer dsend = dev.upload(sent), drecv = dev.upload(empty);
    if (me == last) {
      gpu::Stream other = dev.device().create_stream().value();
      const gpu::PinnedBuffer byte = dev.device().allocate_pinned(1).value();
      dev.device().copy_h2d(other.view(), dsend.data(), byte.data(), 1);
      EXPECT_FALSE(dev.device().synchronize(other.view()).is_ok());
    }
    std::vector<std::int64_t> counts(n(), 8), displs(n());
    for (int r = 0; r < n(); ++r) displs[r] = 8 * r;
    auto expect_refused = [&](const Status& s, const std::string& what) {
      EXPECT_EQ(s.code(), StatusCode::kInternal) << what << ", rank " << me << ": " << s.to_string();
      EXPECT_THAT(s.message(), HasSubstr(what + ": rank " + std::to_string(last) + ": device "));
      EXPECT_THAT(s.message(), HasSubstr(" failed before the collective: emulated device fault at operation 2"));
    };
    for (int round = 0; round < 2; ++round) {
      expect_refused(c.all_to_all_v(dsend.data(), counts.data(), displs.data(), drecv.data(), counts.data(),
                                    displs.data(), dev.space()),
                     "all_to_all_v");
      expect_refused(c.all_gather(dsend.data(), 8, drecv.data(), dev.space()), "all_gather");
      expect_refused(c.broadcast(drecv.data(), 8, 0, dev.space()), "broadcast");
      // In step: host collectives move their bytes.
      EXPECT_EQ(exchange_and_check(
                    c, [](int s, int r) -> std::int64_t { return 3 + s + 2 * r; }, false),
                "");
      std::int64_t one = 1;
      const Status reduced = c.all_reduce(&one, 1, DataType::kInt64, ReduceOp::kSum);
      EXPECT_TRUE(reduced.is_ok()) << "rank " << me << ": " << reduced.to_string();
      EXPECT_EQ(one, n());
      const Status met = c.barrier();
      EXPECT_TRUE(met.is_ok()) << "rank " << me << ": " << met.to_string();
    }
    if (me != last) {
      EXPECT_EQ(dev.download(drecv, empty.size()), empty) << "rank " << me << ": a refused call wrote";
    }
  });
}

}  // namespace
}  // namespace strata::dispatch::testing
