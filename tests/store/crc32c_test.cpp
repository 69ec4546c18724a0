#include "store/io/detail/crc32c.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace strata::detail {
namespace {

using CrcFn = std::uint32_t (*)(const void*, std::size_t, std::uint32_t) noexcept;

std::vector<unsigned char> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> b(n);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  return b;
}

// Runs `check` on the dispatching entry point, the table one, and the SSE4.2 one when present.
struct Impl {
  const char* name;
  CrcFn fn;
};
std::vector<Impl> implementations() {
  std::vector<Impl> impls = {{"crc32c", &crc32c}, {"crc32c_sw", &crc32c_sw}};
  if (crc32c_hw_available()) impls.push_back({"crc32c_hw", &crc32c_hw});
  return impls;
}

TEST(Crc32c, StandardCheckValue) {
  for (const Impl& impl : implementations()) {
    SCOPED_TRACE(impl.name);
    EXPECT_EQ(impl.fn("123456789", 9, 0), 0xE3069283u);
  }
}

TEST(Crc32c, EmptyInputReturnsTheSeed) {
  for (const Impl& impl : implementations()) {
    SCOPED_TRACE(impl.name);
    EXPECT_EQ(impl.fn(nullptr, 0, 0), 0u);
    EXPECT_EQ(impl.fn(nullptr, 0, 0xDEADBEEFu), 0xDEADBEEFu);
  }
}

// RFC 3720 (iSCSI), appendix B.4.
TEST(Crc32c, Rfc3720Vectors) {
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<unsigned char>(i);
    dec[i] = static_cast<unsigned char>(31 - i);
  }
  for (const Impl& impl : implementations()) {
    SCOPED_TRACE(impl.name);
    EXPECT_EQ(impl.fn(zeros.data(), 32, 0), 0x8A9136AAu);
    EXPECT_EQ(impl.fn(ones.data(), 32, 0), 0x62A8AB43u);
    EXPECT_EQ(impl.fn(inc.data(), 32, 0), 0x46DD794Eu);
    EXPECT_EQ(impl.fn(dec.data(), 32, 0), 0x113FDB5Cu);
  }
}

TEST(Crc32c, IncrementalEqualsOneShotAtEverySplit) {
  const auto b = random_bytes(1000, 1);
  for (const Impl& impl : implementations()) {
    SCOPED_TRACE(impl.name);
    const std::uint32_t whole = impl.fn(b.data(), b.size(), 0);
    for (std::size_t split = 0; split <= b.size(); ++split) {
      const std::uint32_t first = impl.fn(b.data(), split, 0);
      ASSERT_EQ(impl.fn(b.data() + split, b.size() - split, first), whole) << "split " << split;
    }
  }
}

TEST(Crc32c, IncrementalAcrossInterleavedBlockSizes) {
  // Pieces that straddle the 3 x 8192 and 3 x 256 stream blocks of the hardware path.
  const auto b = random_bytes(200000, 2);
  const std::uint32_t whole = crc32c_sw(b.data(), b.size());
  const std::size_t pieces[] = {1, 7, 768, 769, 24575, 24576, 24577, 50000, 3};
  for (const Impl& impl : implementations()) {
    SCOPED_TRACE(impl.name);
    std::uint32_t crc = 0;
    std::size_t off = 0;
    for (std::size_t i = 0; off < b.size(); ++i) {
      const std::size_t n = std::min(pieces[i % std::size(pieces)], b.size() - off);
      crc = impl.fn(b.data() + off, n, crc);
      off += n;
    }
    EXPECT_EQ(crc, whole);
  }
}

TEST(Crc32c, DetectsSingleBitFlips) {
  auto b = random_bytes(4096, 3);
  const std::uint32_t base = crc32c(b.data(), b.size());
  for (std::size_t i = 0; i < b.size(); i += 97) {
    b[i] ^= 0x10;
    EXPECT_NE(crc32c(b.data(), b.size()), base) << "byte " << i;
    b[i] ^= 0x10;
  }
}

// Hardware and table paths agree for every length class and every misalignment.
class Crc32cHwVsSw : public ::testing::TestWithParam<std::size_t> {};

TEST_P(Crc32cHwVsSw, AgreeOnRandomBuffers) {
  if (!crc32c_hw_available()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  const std::size_t misalign = GetParam();
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 1100; ++n) lengths.push_back(n);
  for (std::size_t n : std::initializer_list<std::size_t>{3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1, 3 * 8192 + 3 * 256 + 9,
                                                          2 * 3 * 8192 + 13, (std::size_t{1} << 20) + 5}) {
    lengths.push_back(n);
  }
  const auto storage = random_bytes(lengths.back() + 16, static_cast<std::uint32_t>(misalign) + 10);
  const unsigned char* p = storage.data() + misalign;
  std::mt19937 rng(static_cast<std::uint32_t>(misalign));
  for (std::size_t n : lengths) {
    const std::uint32_t seed = (n % 3 == 0) ? 0u : static_cast<std::uint32_t>(rng());
    ASSERT_EQ(crc32c_hw(p, n, seed), crc32c_sw(p, n, seed)) << "length " << n << " misalign " << misalign;
    ASSERT_EQ(crc32c(p, n, seed), crc32c_sw(p, n, seed)) << "length " << n << " misalign " << misalign;
  }
}

INSTANTIATE_TEST_SUITE_P(Misalignments, Crc32cHwVsSw, ::testing::Range<std::size_t>(0, 8));

}  // namespace
}  // namespace strata::detail
