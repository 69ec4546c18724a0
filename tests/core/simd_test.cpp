// The host kernels' vector types are no wider than the target's registers: a wider GCC vector is
// split by the compiler (through the stack with AVX2), which halved the pooled gather's speed.
#include "core/simd.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "core/row_math.hpp"

namespace strata {
namespace {

// Register width the compiler targets, from its own macros (independent of core/simd.hpp's choice).
constexpr int target_register_bytes() {
#if defined(__AVX512F__)
  return 64;
#elif defined(__AVX__)
  return 32;
#else
  return 16;
#endif
}

TEST(Simd, VectorsAreNoWiderThanTheTargetRegisters) {
  static_assert(sizeof(simd::Floats) <= target_register_bytes());
  static_assert(sizeof(simd::U64s) <= target_register_bytes());
  EXPECT_EQ(simd::kFloats * static_cast<int>(sizeof(float)), simd::kVectorBytes);
  EXPECT_EQ(simd::kU64s * static_cast<int>(sizeof(std::uint64_t)), simd::kVectorBytes);
#if defined(__AVX512F__)
  EXPECT_EQ(simd::kVectorBytes, 64);
#elif defined(__AVX2__)
  EXPECT_EQ(simd::kVectorBytes, 32);
#endif
}

// Every vector type of the library comes from core/simd.hpp, whose width is checked above: no other
// source declares one (a hand-written 64-byte type is one AVX-512 register but two AVX2 ones).
TEST(Simd, NoVectorTypeOutsideSimdHeader) {
  const std::filesystem::path root = STRATA_SOURCE_DIR;
  const std::string attribute = std::string("vector_") + "size(";  // not spelled whole: this file is scanned too
  std::vector<std::string> offenders;
  int scanned = 0;
  for (const char* dir : {"core", "host", "cache", "store", "dispatch", "gpu", "bench", "tests"}) {
    if (!std::filesystem::exists(root / dir)) continue;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root / dir)) {
      const auto ext = e.path().extension();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh")) continue;
      ++scanned;
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      const std::string rel = std::filesystem::relative(e.path(), root).generic_string();
      if (text.str().find(attribute) != std::string::npos && rel != "core/simd.hpp") offenders.push_back(rel);
    }
  }
  EXPECT_GT(scanned, 20) << "sources not found under " << root;
  EXPECT_TRUE(offenders.empty()) << "vector types outside core/simd.hpp (use simd::Floats / simd::U64s): "
                                 << ::testing::PrintToString(offenders);
}

// Values every half conversion must agree on: every fp32 exponent with random mantissas, the
// edges of both formats (subnormals, 65504 and its neighbours, bf16's largest), +-0, +-Inf, NaNs.
std::vector<float> conversion_inputs() {
  std::mt19937 rng(19);
  std::vector<float> xs;
  for (std::uint32_t exp = 0; exp < 256; ++exp) {
    for (int i = 0; i < 64; ++i) xs.push_back(bits_float((rng() & 0x80000000u) | (exp << 23) | (rng() & 0x7FFFFFu)));
  }
  for (const float x :
       {0.0f, 65504.0f, 65519.996f, 65520.0f, 65535.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1.FEp127f,
        std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()}) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  for (const std::uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFFA50000u, 0x7F812000u, 0xFFFFFFFFu})
    xs.push_back(bits_float(nan));
  while (xs.size() % simd::kFloats != 0) xs.push_back(1.0f);
  return xs;
}

TEST(Simd, HalfWideningEqualsTheScalarConversionOnEveryPattern) {
  for (std::uint32_t h0 = 0; h0 < 0x10000; h0 += simd::kFloats) {
    std::uint16_t in[simd::kFloats];
    for (int i = 0; i < simd::kFloats; ++i) in[i] = static_cast<std::uint16_t>(h0 + i);
    const simd::Floats bf = simd::widen_bf16(simd::load_half(in));
    const simd::Floats f = simd::widen_f16(simd::load_half(in));
    for (int i = 0; i < simd::kFloats; ++i) {
      ASSERT_EQ(float_bits(bf[i]), float_bits(widen_bf16(in[i]))) << std::hex << in[i];
      ASSERT_EQ(float_bits(f[i]), float_bits(widen_f16(in[i]))) << std::hex << in[i];
    }
  }
}

TEST(Simd, HalfNarrowingEqualsTheScalarConversionLaneForLane) {
  const std::vector<float> xs = conversion_inputs();
  std::mt19937 rng(23);
  for (std::size_t k = 0; k < xs.size(); k += simd::kFloats) {
    const simd::Floats x = simd::load(xs.data() + k);
    simd::U32s bits;
    for (int i = 0; i < simd::kFloats; ++i) bits[i] = rng();
    const simd::U16h bf = simd::narrow_bf16_rne(x);
    const simd::U16h f = simd::narrow_f16_rne(x);
    const simd::U16h bf_sr = simd::narrow_bf16_sr(x, bits);
    const simd::U16h f_sr = simd::narrow_f16_sr(x, bits);
    for (int i = 0; i < simd::kFloats; ++i) {
      ASSERT_EQ(bf[i], narrow_bf16_rne(x[i])) << std::hexfloat << x[i];
      ASSERT_EQ(f[i], narrow_f16_rne(x[i])) << std::hexfloat << x[i];
      ASSERT_EQ(bf_sr[i], narrow_bf16_sr(x[i], bits[i])) << std::hexfloat << x[i];
      ASSERT_EQ(f_sr[i], narrow_f16_sr(x[i], bits[i])) << std::hexfloat << x[i];
    }
  }
}

TEST(Simd, RoundingBitsEqualTheScalarHashLaneForLane) {
  const std::uint64_t key = rounding_row_key(table_seed(1, 2), 12345, 9, RoundingSalt::kState1);
  for (const std::int64_t col0 : {0, 8, 61, 1000}) {
    const simd::U32s v = simd::rounding_bits(key, col0);
    for (int i = 0; i < simd::kFloats; ++i) ASSERT_EQ(v[i], rounding_bits(key, col0 + i));
  }
}

}  // namespace
}  // namespace strata
