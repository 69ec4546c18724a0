#include "store/io/detail/crc32c.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#define STRATA_CRC32C_X86 1
#else
#define STRATA_CRC32C_X86 0
#endif

namespace strata::detail {
namespace {

// Reflected Castagnoli polynomial.
constexpr std::uint32_t kPoly = 0x82F63B78u;

using Table = std::array<std::uint32_t, 256>;

// kSlice[0] is the byte-at-a-time table; kSlice[k][i] is the CRC of byte i followed by k zero
// bytes, which lets slice-by-8 fold eight input bytes with eight independent lookups.
constexpr std::array<Table, 8> make_slice_tables() {
  std::array<Table, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int b = 0; b < 8; ++b) c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  }
  return t;
}
constexpr std::array<Table, 8> kSlice = make_slice_tables();

// Little-endian loads regardless of host order; compilers turn these into single moves on x86.
inline std::uint32_t load_le32(const unsigned char* p) noexcept {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
}

#if STRATA_CRC32C_X86
// ---- shifting a CRC register past runs of zero bytes, for combining interleaved streams ----
// The CRC register is linear over GF(2): crc(A || B) = shift(crc(A), |B|) ^ crc0(B), where crc0
// starts from a zero register. shift() by a fixed length is a 32x32 bit matrix, tabulated per byte.
using Matrix = std::array<std::uint32_t, 32>;

constexpr std::uint32_t gf2_times(const Matrix& m, std::uint32_t v) {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; v != 0; ++i, v >>= 1) {
    if (v & 1u) sum ^= m[i];
  }
  return sum;
}

constexpr Matrix gf2_square(const Matrix& m) {
  Matrix sq{};
  for (std::size_t i = 0; i < 32; ++i) sq[i] = gf2_times(m, m[i]);
  return sq;
}

// Operator that feeds `len` zero bytes through the register; `len` must be a power of two.
constexpr Matrix zeros_operator(std::size_t len) {
  Matrix op{};  // one zero bit
  op[0] = kPoly;
  for (std::size_t i = 1; i < 32; ++i) op[i] = std::uint32_t{1} << (i - 1);
  for (int i = 0; i < 3; ++i) op = gf2_square(op);  // 2, 4, 8 bits: one zero byte
  for (; len > 1; len >>= 1) op = gf2_square(op);
  return op;
}

constexpr std::array<Table, 4> make_shift_table(std::size_t len) {
  const Matrix op = zeros_operator(len);
  std::array<Table, 4> t{};
  for (std::uint32_t n = 0; n < 256; ++n) {
    for (std::size_t k = 0; k < 4; ++k) t[k][n] = gf2_times(op, n << (8 * k));
  }
  return t;
}

// Stream lengths: three streams of kLong bytes for big buffers, of kShort for the tail. The
// crc32 instruction has a latency of 3 cycles and a throughput of 1, so three streams keep it busy.
constexpr std::size_t kLong = 8192;
constexpr std::size_t kShort = 256;
constexpr std::array<Table, 4> kShiftLong = make_shift_table(kLong);
constexpr std::array<Table, 4> kShiftShort = make_shift_table(kShort);

inline std::uint32_t shift(const std::array<Table, 4>& t, std::uint32_t crc) noexcept {
  return t[0][crc & 0xFFu] ^ t[1][(crc >> 8) & 0xFFu] ^ t[2][(crc >> 16) & 0xFFu] ^ t[3][crc >> 24];
}

inline std::uint64_t load64(const unsigned char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Three interleaved streams of `block` bytes each; returns the register after all 3 * block bytes.
__attribute__((target("sse4.2"))) inline std::uint64_t hw_three_streams(const unsigned char* p, std::size_t block,
                                                                        std::uint64_t crc0,
                                                                        const std::array<Table, 4>& shift_table) {
  std::uint64_t crc1 = 0;
  std::uint64_t crc2 = 0;
  const unsigned char* end = p + block;
  for (; p < end; p += 8) {
    crc0 = _mm_crc32_u64(crc0, load64(p));
    crc1 = _mm_crc32_u64(crc1, load64(p + block));
    crc2 = _mm_crc32_u64(crc2, load64(p + 2 * block));
  }
  crc0 = shift(shift_table, static_cast<std::uint32_t>(crc0)) ^ crc1;
  return shift(shift_table, static_cast<std::uint32_t>(crc0)) ^ crc2;
}

__attribute__((target("sse4.2"))) std::uint32_t hw_impl(const void* data, std::size_t n, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t reg = crc ^ 0xFFFFFFFFu;
  // Align to 8 bytes so the 64-bit loads never straddle cache lines.
  while (n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    reg = _mm_crc32_u8(static_cast<std::uint32_t>(reg), *p++);
    --n;
  }
  for (; n >= 3 * kLong; n -= 3 * kLong, p += 3 * kLong) reg = hw_three_streams(p, kLong, reg, kShiftLong);
  for (; n >= 3 * kShort; n -= 3 * kShort, p += 3 * kShort) reg = hw_three_streams(p, kShort, reg, kShiftShort);
  for (; n >= 8; n -= 8, p += 8) reg = _mm_crc32_u64(reg, load64(p));
  for (; n > 0; --n) reg = _mm_crc32_u8(static_cast<std::uint32_t>(reg), *p++);
  return static_cast<std::uint32_t>(reg) ^ 0xFFFFFFFFu;
}
#endif  // STRATA_CRC32C_X86

using Impl = std::uint32_t (*)(const void*, std::size_t, std::uint32_t) noexcept;

}  // namespace

std::uint32_t crc32c_sw(const void* data, std::size_t n, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t reg = crc ^ 0xFFFFFFFFu;
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo = reg ^ load_le32(p);
    const std::uint32_t hi = load_le32(p + 4);
    reg = kSlice[7][lo & 0xFFu] ^ kSlice[6][(lo >> 8) & 0xFFu] ^ kSlice[5][(lo >> 16) & 0xFFu] ^ kSlice[4][lo >> 24] ^
          kSlice[3][hi & 0xFFu] ^ kSlice[2][(hi >> 8) & 0xFFu] ^ kSlice[1][(hi >> 16) & 0xFFu] ^ kSlice[0][hi >> 24];
  }
  for (; n > 0; --n) reg = (reg >> 8) ^ kSlice[0][(reg ^ *p++) & 0xFFu];
  return reg ^ 0xFFFFFFFFu;
}

bool crc32c_hw_available() noexcept {
#if STRATA_CRC32C_X86
  // __builtin_cpu_init makes the check valid even when called from a static initializer.
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

std::uint32_t crc32c_hw(const void* data, std::size_t n, std::uint32_t crc) noexcept {
#if STRATA_CRC32C_X86
  static const bool available = crc32c_hw_available();
  if (available) return hw_impl(data, n, crc);
#else
  (void)data;
  (void)n;
  (void)crc;
#endif
  std::fprintf(stderr, "strata: crc32c_hw called on a CPU without SSE4.2\n");
  std::abort();
}

std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc) noexcept {
#if STRATA_CRC32C_X86
  static const Impl impl = crc32c_hw_available() ? &hw_impl : &crc32c_sw;
  return impl(data, n, crc);
#else
  return crc32c_sw(data, n, crc);
#endif
}

}  // namespace strata::detail
