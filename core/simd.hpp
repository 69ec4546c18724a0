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

#include "core/half.hpp"

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

/// One register of 32-bit unsigned integers (the bits of a Floats), and kFloats 16-bit half
/// elements (half a register: the half-size row elements a Floats widens from or narrows to).
typedef std::uint32_t U32s __attribute__((vector_size(kVectorBytes)));
typedef std::uint16_t U16h __attribute__((vector_size(kVectorBytes / 2)));
/// The lane masks a comparison of U32s gives: all ones (-1) where it holds, 0 elsewhere.
typedef std::int32_t I32s __attribute__((vector_size(kVectorBytes)));

static_assert(sizeof(Floats) == kVectorBytes && sizeof(U64s) == kVectorBytes && sizeof(U32s) == kVectorBytes &&
                  sizeof(U16h) * 2 == kVectorBytes,
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

// Half-size elements. Each lane equals core/half.hpp's scalar conversion, NaN payloads and
// subnormals included (tests/core/simd_test.cpp holds them lane for lane); F16C's instructions
// where the target has them, integer lanes or the scalar code otherwise. Never AVX-512 BF16's
// vcvtneps2bf16: it flushes subnormals whatever MXCSR says.

/// Loads / stores kFloats half elements at any alignment.
inline U16h load_half(const std::uint16_t* p) noexcept {
  U16h v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_half(std::uint16_t* p, const U16h& v) noexcept { std::memcpy(p, &v, sizeof v); }

/// bf16 -> fp32 lanes, exact.
inline Floats widen_bf16(const U16h& h) noexcept {
  return reinterpret_cast<Floats>(__builtin_convertvector(h, U32s) << 16);
}

/// fp16 -> fp32 lanes, exact (NaNs made quiet, as the scalar form).
inline Floats widen_f16(const U16h& h) noexcept {
#if defined(__F16C__) && defined(__AVX512F__)
  return reinterpret_cast<Floats>(_mm512_maskz_cvtph_ps(static_cast<__mmask16>(0xFFFF), reinterpret_cast<__m256i>(h)));
#elif defined(__F16C__) && defined(__AVX2__)
  return reinterpret_cast<Floats>(_mm256_cvtph_ps(reinterpret_cast<__m128i>(h)));
#elif defined(__F16C__)
  __m128i v = _mm_setzero_si128();
  std::memcpy(&v, &h, sizeof h);
  return reinterpret_cast<Floats>(_mm_cvtph_ps(v));
#else
  Floats r;
  for (int i = 0; i < kFloats; ++i) r[i] = strata::widen_f16(h[i]);
  return r;
#endif
}

/// fp32 -> bf16 lanes, to nearest even (quiet NaNs as the scalar form).
inline U16h narrow_bf16_rne(const Floats& x) noexcept {
  const U32s b = reinterpret_cast<U32s>(x);
  const U32s nan = reinterpret_cast<U32s>((b & 0x7FFFFFFFu) > 0x7F800000u);
  const U32s r = ((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16 & ~nan) | (((b >> 16) | 0x0040u) & nan);
  return __builtin_convertvector(r, U16h);
}

/// fp32 -> bf16 lanes, stochastic with each lane's random bits (Inf and NaN to nearest).
inline U16h narrow_bf16_sr(const Floats& x, const U32s& bits) noexcept {
  const U32s b = reinterpret_cast<U32s>(x);
  const U32s special = reinterpret_cast<U32s>((b & 0x7F800000u) == 0x7F800000u);
  const U32s sr = (b + (bits >> 16)) >> 16;
  const U32s rne = reinterpret_cast<U32s>(__builtin_convertvector(narrow_bf16_rne(x), U32s));
  return __builtin_convertvector((sr & ~special) | (rne & special), U16h);
}

/// fp32 -> fp16 lanes, to nearest even.
inline U16h narrow_f16_rne(const Floats& x) noexcept {
#if defined(__F16C__)
  constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif
#if defined(__F16C__) && defined(__AVX512F__)
  return reinterpret_cast<U16h>(
      _mm512_maskz_cvtps_ph(static_cast<__mmask16>(0xFFFF), reinterpret_cast<__m512>(x), kMode));
#elif defined(__F16C__) && defined(__AVX2__)
  return reinterpret_cast<U16h>(_mm256_cvtps_ph(reinterpret_cast<__m256>(x), kMode));
#elif defined(__F16C__)
  const __m128i v = _mm_cvtps_ph(reinterpret_cast<__m128>(x), kMode);
  U16h r;
  std::memcpy(&r, &v, sizeof r);
  return r;
#else
  U16h r;
  for (int i = 0; i < kFloats; ++i) r[i] = strata::narrow_f16_rne(x[i]);
  return r;
#endif
}

/// fp32 -> fp16 lanes, stochastic with each lane's random bits: integer lanes for normal results,
/// the scalar form for the rare lanes outside them (subnormal, at or above 65504, Inf, NaN).
inline U16h narrow_f16_sr(const Floats& x, const U32s& bits) noexcept {
  const U32s b = reinterpret_cast<U32s>(x);
  const U32s a = b & 0x7FFFFFFFu;
  const U32s normal = reinterpret_cast<U32s>((a >= 0x38800000u) & (a < 0x477FE000u));
  U16h r = __builtin_convertvector(((b >> 16) & 0x8000u) | ((a - 0x38000000u + (bits >> 19)) >> 13), U16h);
  for (int i = 0; i < kFloats; ++i) {
    if (normal[i] == 0) r[i] = strata::narrow_f16_sr(x[i], bits[i]);
  }
  return r;
}

/// The stochastic rounding bits of kFloats consecutive columns col0, col0 + 1, ... of one row (the
/// scalar `rounding_bits` lane for lane).
inline U32s rounding_bits(std::uint64_t row_key, std::int64_t col0) noexcept {
  U32s col;
  for (int i = 0; i < kFloats; ++i) col[i] = static_cast<std::uint32_t>(col0 + i);
  return strata::lowbias32<U32s>((static_cast<std::uint32_t>(row_key) ^ static_cast<std::uint32_t>(row_key >> 32)) ^
                                 (col * 0x9E3779B9u));
}

}  // namespace strata::simd
