#pragma once
// The host kernels' SIMD vectors (GCC/Clang vector extension), as wide as the compile target's
// vector registers: 64 bytes with AVX-512, 32 with AVX2, 16 otherwise (SSE2, NEON, or scalar code
// the compiler generates). A vector type wider than the registers is split by the compiler, with
// AVX2 through the stack (GCC 12 kept a 64-byte accumulator in memory and rebuilt it with
// vpinsrq in the pooled gather's inner loop, halving its speed): every hot-path vector type comes
// from here, and the static_asserts below hold them to kVectorBytes.
//
// The width is fixed at compile time by the target macros (-march=native by default, see
// STRATA_NATIVE in CMakeLists.txt), so a build is for the CPU it targets. Lane-wise arithmetic does
// not depend on the width: each lane of a float accumulator sums in the same order as the scalar
// row math, so results are bit-identical at every width.

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace strata::simd {

/// Bytes of one vector register of the compile target.
#if defined(__AVX512F__)
inline constexpr int kVectorBytes = 64;
#elif defined(__AVX2__)
inline constexpr int kVectorBytes = 32;
#else
inline constexpr int kVectorBytes = 16;
#endif

/// One register of floats, and its lane count.
typedef float Floats __attribute__((vector_size(kVectorBytes)));
inline constexpr int kFloats = kVectorBytes / static_cast<int>(sizeof(float));

/// One register of 64-bit unsigned integers, and its lane count.
typedef std::uint64_t U64s __attribute__((vector_size(kVectorBytes)));
inline constexpr int kU64s = kVectorBytes / static_cast<int>(sizeof(std::uint64_t));

static_assert(sizeof(Floats) == kVectorBytes && sizeof(U64s) == kVectorBytes,
              "a hot-path vector type differs from the target's register width");
#if defined(__AVX512F__)
static_assert(kVectorBytes <= 64, "vector wider than an AVX-512 register");
#elif defined(__AVX2__) || defined(__AVX__)
static_assert(kVectorBytes <= 32, "vector wider than an AVX register");
#else
static_assert(kVectorBytes <= 16, "vector wider than an SSE/NEON register");
#endif

/// Loads / stores one register of floats at any alignment (table records are not aligned to it).
inline Floats load(const float* p) noexcept {
  Floats v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, const Floats& v) noexcept { std::memcpy(p, &v, sizeof v); }

/// Lane-wise square root, correctly rounded as std::sqrt is (IEEE 754), so the same bits as the
/// scalar loop. GCC does not vectorise std::sqrt itself (it keeps the errno call path), hence the
/// intrinsics.
inline Floats sqrt(const Floats& x) noexcept {
#if defined(__AVX512F__)
  // (maskz with every lane set: _mm512_sqrt_ps passes _mm512_undefined_ps, which GCC 12 warns about)
  return reinterpret_cast<Floats>(_mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xFFFF), reinterpret_cast<__m512>(x)));
#elif defined(__AVX2__)
  return reinterpret_cast<Floats>(_mm256_sqrt_ps(reinterpret_cast<__m256>(x)));
#elif defined(__SSE2__)
  return reinterpret_cast<Floats>(_mm_sqrt_ps(reinterpret_cast<__m128>(x)));
#elif defined(__ARM_NEON) && defined(__aarch64__)
  return reinterpret_cast<Floats>(vsqrtq_f32(reinterpret_cast<float32x4_t>(x)));
#else
  Floats r;
  for (int i = 0; i < kFloats; ++i) r[i] = std::sqrt(x[i]);
  return r;
#endif
}

}  // namespace strata::simd
