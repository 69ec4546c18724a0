// core/half.hpp against independent definitions: every bf16 and fp16 bit pattern decoded in
// double, round to nearest even against double's nearbyint on every fp32 exponent, F16C's
// conversions where the target has them, and stochastic rounding's bias counted exactly.

#include "core/half.hpp"

#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/row_math.hpp"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace strata {
namespace {

// A binary floating-point format: significand bits (with the implicit one), the smallest normal
// exponent and the largest finite value.
struct Format {
  int precision;
  int min_exp;
  double max_finite;
  int exp_bits;
};
constexpr Format kBf16Format{8, -126, 0x1.FEp127, 8};
constexpr Format kF16Format{11, -14, 65504.0, 5};

// Decodes a 16-bit pattern of `f` in double (NaN for every NaN pattern).
double decode(const Format& f, std::uint16_t h) {
  const int mant_bits = f.precision - 1;
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
  const int exp = (h >> mant_bits) & ((1 << f.exp_bits) - 1);
  const int mant = h & ((1 << mant_bits) - 1);
  if (exp == (1 << f.exp_bits) - 1) {
    return mant == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  }
  if (exp == 0) return sign * std::ldexp(mant, 1 - bias - mant_bits);
  return sign * std::ldexp((1 << mant_bits) + mant, exp - bias - mant_bits);
}

// x rounded to `f` to nearest even in double arithmetic (x is an fp32 value, exact in double).
double round_nearest(const Format& f, double x) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  const int e = std::max(std::ilogb(x), f.min_exp);
  const double quantum = std::ldexp(1.0, e - (f.precision - 1));
  const double r = std::nearbyint(x / quantum) * quantum;  // FE_TONEAREST: ties to even
  if (std::fabs(r) > f.max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r == 0.0 ? std::copysign(0.0, x) : r;
}

// The representable values of `f` next to x: rounded toward zero, and the next one away from zero.
std::pair<double, double> neighbours(const Format& f, double x) {
  const int e = std::max(std::ilogb(x), f.min_exp);
  const double quantum = std::ldexp(1.0, e - (f.precision - 1));
  const double down = std::trunc(x / quantum) * quantum;
  return {down, down + std::copysign(quantum, x)};
}

bool same(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

TEST(Half, WidenDecodesEveryPatternExactly) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto p = static_cast<std::uint16_t>(h);
    ASSERT_TRUE(same(widen_bf16(p), decode(kBf16Format, p))) << std::hex << h;
    ASSERT_TRUE(same(widen_f16(p), decode(kF16Format, p))) << std::hex << h;
    ASSERT_EQ(float_bits(widen(DType::kBF16, p)), float_bits(widen_bf16(p)));
    ASSERT_EQ(float_bits(widen(DType::kF16, p)), float_bits(widen_f16(p)));
  }
}

TEST(Half, NarrowingARepresentableValueGivesItsPatternBack) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto p = static_cast<std::uint16_t>(h);
    if (std::isnan(widen_bf16(p))) {
      ASSERT_EQ(narrow_bf16_rne(widen_bf16(p)), p | 0x0040) << std::hex << h;  // made quiet
    } else {
      ASSERT_EQ(narrow_bf16_rne(widen_bf16(p)), p) << std::hex << h;
      ASSERT_EQ(narrow_bf16_sr(widen_bf16(p), 0xFFFFFFFFu), p) << std::hex << h;
    }
    if (std::isnan(widen_f16(p))) {
      ASSERT_EQ(narrow_f16_rne(widen_f16(p)), p | 0x0200) << std::hex << h;
    } else {
      ASSERT_EQ(narrow_f16_rne(widen_f16(p)), p) << std::hex << h;
      ASSERT_EQ(narrow_f16_sr(widen_f16(p), 0xFFFFFFFFu), p) << std::hex << h;
    }
  }
}

// Every fp32 exponent, every value of the low 16 bits (which hold every rounding case of both
// formats), the bits above them drawn at random.
TEST(Half, RoundToNearestEvenMatchesDoubleOnEveryExponent) {
  std::mt19937 rng(7);
  for (std::uint32_t exp = 0; exp < 255; ++exp) {
    const std::uint32_t high = (rng() & 0x7Fu) << 16;  // the mantissa bits bf16 keeps
    for (std::uint32_t low = 0; low < 0x10000; ++low) {
      const float x = bits_float((low & 1u) << 31 | (exp << 23) | high | low);  // both signs
      ASSERT_TRUE(same(widen_bf16(narrow_bf16_rne(x)), round_nearest(kBf16Format, x))) << std::hexfloat << x << " bf16";
      ASSERT_TRUE(same(widen_f16(narrow_f16_rne(x)), round_nearest(kF16Format, x))) << std::hexfloat << x << " fp16";
    }
  }
}

// The finite values that round to an infinity when stored: the refusal of write_rows and of
// converting loads. The thresholds from both sides, by bits; NaN, infinities and fp32 never.
TEST(Half, RoundsToInfinityFromTheHalfwayPointAboveTheLargestFiniteValue) {
  for (const float sign : {1.0f, -1.0f}) {
    EXPECT_FALSE(rounds_to_infinity(DType::kF16, sign * 65519.996f));
    EXPECT_TRUE(rounds_to_infinity(DType::kF16, sign * 65520.0f));
    EXPECT_FALSE(rounds_to_infinity(DType::kBF16, sign * bits_float(0x7F7F7FFFu)));
    EXPECT_TRUE(rounds_to_infinity(DType::kBF16, sign * bits_float(0x7F7F8000u)));
    EXPECT_FALSE(rounds_to_infinity(DType::kF32, sign * std::numeric_limits<float>::max()));
    for (const DType d : {DType::kF16, DType::kBF16}) {
      EXPECT_FALSE(rounds_to_infinity(d, sign * std::numeric_limits<float>::infinity()));
      EXPECT_FALSE(rounds_to_infinity(d, sign * std::numeric_limits<float>::quiet_NaN()));
      EXPECT_FALSE(rounds_to_infinity(d, sign * 1.0f));
    }
  }
}

TEST(Half, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(narrow_bf16_rne(inf), 0x7F80);
  EXPECT_EQ(narrow_bf16_rne(-inf), 0xFF80);
  EXPECT_EQ(narrow_f16_rne(inf), 0x7C00);
  EXPECT_EQ(narrow_f16_rne(-inf), 0xFC00);
  EXPECT_EQ(narrow_f16_rne(65504.0f), 0x7BFF);
  EXPECT_EQ(narrow_f16_rne(65519.996f), 0x7BFF);
  EXPECT_EQ(narrow_f16_rne(65520.0f), 0x7C00);  // the tie rounds to the even neighbour: Inf
  EXPECT_EQ(narrow_bf16_rne(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(narrow_bf16_rne(-0.0f), 0x8000);
  EXPECT_EQ(narrow_f16_rne(-0.0f), 0x8000);
  EXPECT_EQ(narrow_f16_rne(std::ldexp(1.0f, -24)), 0x0001);  // the smallest fp16 subnormal
  EXPECT_EQ(narrow_f16_rne(std::ldexp(1.0f, -25)), 0x0000);  // half of it: a tie, to even
  EXPECT_EQ(narrow_f16_rne(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(narrow_bf16_rne(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(narrow_bf16_rne(std::ldexp(1.0f, -133)), 0x0001);  // a bf16 subnormal, kept
  // NaNs keep their sign and high payload, made quiet.
  EXPECT_EQ(narrow_bf16_rne(bits_float(0x7F800001u)), 0x7FC0);  // a signalling NaN, payload below bf16
  EXPECT_EQ(narrow_bf16_rne(bits_float(0xFFA50000u)), 0xFFE5);
  EXPECT_EQ(narrow_f16_rne(bits_float(0x7FC00000u)), 0x7E00);
  EXPECT_EQ(narrow_f16_rne(bits_float(0xFF812000u)), 0xFE09);
  EXPECT_EQ(narrow_bf16_sr(bits_float(0x7F800001u), 0xFFFFFFFFu), 0x7FC0);
  EXPECT_EQ(narrow_f16_sr(inf, 0xFFFFFFFFu), 0x7C00);
  EXPECT_EQ(rounded(DType::kF32, 0.1f, true, 0xFFFFFFFFu), 0.1f);
  EXPECT_EQ(element_bytes(DType::kF32), 4);
  EXPECT_EQ(element_bytes(DType::kBF16), 2);
  EXPECT_EQ(element_bytes(DType::kF16), 2);
}

#if defined(__F16C__)
// The target's F16C conversions agree with ours on every fp16 pattern and, to nearest even, on
// every fp32 exponent (NaN payloads included): the SIMD forms may use them.
TEST(Half, MatchesF16cInstructions) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float want = _cvtsh_ss(static_cast<std::uint16_t>(h));
    ASSERT_EQ(float_bits(widen_f16(static_cast<std::uint16_t>(h))), float_bits(want)) << std::hex << h;
  }
  std::mt19937 rng(11);
  for (std::uint32_t exp = 0; exp < 256; ++exp) {
    for (std::uint32_t low = 0; low < 0x10000; low += 3) {
      const float x = bits_float((rng() & 0x80000000u) | (exp << 23) | ((rng() & 0x7Fu) << 16) | low);
      ASSERT_EQ(narrow_f16_rne(x), _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)) << std::hexfloat << x;
    }
  }
}
#endif

// Values to round stochastically: normals and subnormals of both formats, both signs.
std::vector<float> stochastic_inputs(const Format& f, std::mt19937& rng) {
  std::vector<float> xs;
  std::uniform_int_distribution<int> exp(f.min_exp - f.precision + 1, f.min_exp + 20);
  for (int i = 0; i < 200; ++i) {
    const float m = 1.0f + static_cast<float>(rng() & 0x7FFFFF) * 0x1p-23f;
    const float x = std::ldexp(m, exp(rng));
    xs.push_back((rng() & 1) != 0 ? -x : x);
  }
  return xs;
}

// Over every value of the bits it uses, bf16's and normal fp16's stochastic rounding is exactly
// unbiased, and each result is one of x's two neighbours.
TEST(Half, StochasticRoundingIsExactlyUnbiased) {
  std::mt19937 rng(3);
  for (const float x : stochastic_inputs(kBf16Format, rng)) {
    double sum = 0;
    const auto [down, up] = neighbours(kBf16Format, x);
    for (std::uint32_t n = 0; n < 0x10000; ++n) {
      const double v = widen_bf16(narrow_bf16_sr(x, (n << 16) | (rng() & 0xFFFFu)));
      ASSERT_TRUE(v == down || v == up) << std::hexfloat << x;
      sum += v;
    }
    ASSERT_EQ(sum, static_cast<double>(x) * 0x10000) << std::hexfloat << x;
  }
  for (const float x : stochastic_inputs(kF16Format, rng)) {
    if (std::fabs(x) < 0x1p-14f) continue;  // subnormal results: the next test
    double sum = 0;
    const auto [down, up] = neighbours(kF16Format, x);
    for (std::uint32_t n = 0; n < 0x2000; ++n) {
      const double v = widen_f16(narrow_f16_sr(x, (n << 19) | (rng() & 0x7FFFFu)));
      ASSERT_TRUE(v == down || v == up) << std::hexfloat << x;
      sum += v;
    }
    ASSERT_EQ(sum, static_cast<double>(x) * 0x2000) << std::hexfloat << x;
  }
}

// An fp16 subnormal result rounds up when the dropped fraction, on 24 bits, exceeds r's top 24
// bits: rounding up is monotone in them, and the count that rounds up (found by bisection) is
// the dropped fraction rounded up, a bias below 2^-24 of a step.
TEST(Half, StochasticRoundingOfFp16SubnormalsIsUnbiasedTo24Bits) {
  std::mt19937 rng(5);
  int tested = 0;
  for (const float x : stochastic_inputs(kF16Format, rng)) {
    if (std::fabs(x) >= 0x1p-14f) continue;
    ++tested;
    const auto [down, up] = neighbours(kF16Format, x);
    const auto rounds_up = [&](std::uint32_t u) { return widen_f16(narrow_f16_sr(x, u << 8)) == up; };
    std::uint32_t lo = 0, hi = 1u << 24;  // rounds_up holds below `lo`'s answer and fails from `hi`
    while (lo < hi) {
      const std::uint32_t mid = lo + (hi - lo) / 2;
      if (rounds_up(mid)) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    for (std::uint32_t u : {0u, lo / 2, lo == 0 ? 0u : lo - 1}) {
      if (u < lo) {
        ASSERT_TRUE(rounds_up(u)) << std::hexfloat << x;
      }
    }
    for (std::uint32_t u : {lo, lo + (((1u << 24) - lo) / 2), (1u << 24) - 1}) {
      if (u < (1u << 24)) {
        ASSERT_EQ(widen_f16(narrow_f16_sr(x, u << 8)), down) << std::hexfloat << x;
      }
    }
    const double step = std::fabs(up - down);
    const double expected = down + std::copysign(step, x) * lo / 0x1p24;
    ASSERT_LE(std::fabs(expected - x), step * 0x1p-24) << std::hexfloat << x;
    ASSERT_GE(std::fabs(expected), std::fabs(static_cast<double>(x))) << std::hexfloat << x;  // ceil
  }
  EXPECT_GT(tested, 20);
}

TEST(Half, NarrowDispatchesOnTheDtype) {
  const float x = 0.1f;
  EXPECT_EQ(narrow(DType::kBF16, x, false, 0), narrow_bf16_rne(x));
  EXPECT_EQ(narrow(DType::kF16, x, false, 0), narrow_f16_rne(x));
  EXPECT_EQ(narrow(DType::kBF16, x, true, 0x12345678u), narrow_bf16_sr(x, 0x12345678u));
  EXPECT_EQ(narrow(DType::kF16, x, true, 0x12345678u), narrow_f16_sr(x, 0x12345678u));
  EXPECT_EQ(rounded(DType::kBF16, x, false, 0), widen_bf16(narrow_bf16_rne(x)));
  EXPECT_EQ(rounded(DType::kF16, x, true, 7), widen_f16(narrow_f16_sr(x, 7)));
}

// The rounding bits are a pure function of (table, row, step, salt, column), differ when any of
// them does, and their top 16 bits (what bf16 uses) are uniform.
TEST(Half, RoundingBitsArePureAndUniform) {
  const std::uint64_t t = table_seed(42, 0x1234);
  const std::uint64_t k = rounding_row_key(t, 1000, 3, RoundingSalt::kWeights);
  EXPECT_EQ(k, rounding_row_key(t, 1000, 3, RoundingSalt::kWeights));
  EXPECT_EQ(rounding_bits(k, 5), rounding_bits(k, 5));
  EXPECT_NE(k, rounding_row_key(t, 1001, 3, RoundingSalt::kWeights));
  EXPECT_NE(k, rounding_row_key(t, 1000, 4, RoundingSalt::kWeights));
  EXPECT_NE(k, rounding_row_key(t, 1000, 3, RoundingSalt::kState0));
  EXPECT_NE(k, rounding_row_key(table_seed(42, 0x1235), 1000, 3, RoundingSalt::kWeights));
  EXPECT_NE(rounding_bits(k, 5), rounding_bits(k, 6));

  constexpr int kBins = 256;
  constexpr int kSamples = 1 << 18;
  std::vector<int> bins(kBins, 0);
  int i = 0;
  for (std::int64_t row = 0; i < kSamples; ++row) {
    const std::uint64_t key = rounding_row_key(t, row, 1 + row % 7, RoundingSalt::kWeights);
    for (std::int64_t col = 0; col < 64 && i < kSamples; ++col, ++i) ++bins[rounding_bits(key, col) >> 24];
  }
  double chi2 = 0;
  const double expected = static_cast<double>(kSamples) / kBins;
  for (const int b : bins) chi2 += (b - expected) * (b - expected) / expected;
  // 255 degrees of freedom: the 99.99th percentile is about 347.
  EXPECT_LT(chi2, 347.0);
}

}  // namespace
}  // namespace strata
