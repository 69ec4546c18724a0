#pragma once
// Half-size elements (bf16 and fp16): the one definition of every conversion between them and
// fp32, for the host and (under nvcc) the device. Rows of a half-size table are stored at half
// size and computed in fp32: widened on load, rounded once when an update is stored. Every path
// (CPU kernels, their SIMD forms, the reference, the CUDA kernels) converts through these
// functions, so they agree bit for bit, NaN payloads and subnormals included.
//
// Only integer operations and exact fp32 operations (scalings by powers of two, floor and the
// exact subtraction of a number's integer part) are used: the results do not depend on FMA
// contraction, the rounding mode or the compiler. Denormals must not be flushed (bf16 has fp32's
// exponent range): host code runs with DAZ/FTZ off and the CUDA build never sets -ftz=true.
//
// Rounding: to nearest, ties to even (`narrow_*_rne`, the default), or stochastic
// (`narrow_*_sr`): the value rounds up to the next representable value with a probability equal
// to its distance from the one below, so the expected stored value equals the fp32 value. The
// random bits come from `rounding_bits`, a pure function of (table seed, global row, step, salt,
// global column), so every placement, shard, cache and the reference draw the same bits.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/hd.hpp"
#include "core/table_spec.hpp"

namespace strata {

/// A bf16 element (fp32's sign and exponent, 7 mantissa bits) and an fp16 element (IEEE
/// binary16), as their bit patterns. They tag the element type of kernels' templates.
struct Bf16 {
  std::uint16_t bits;
  static constexpr DType kDType = DType::kBF16;
};
struct F16 {
  std::uint16_t bits;
  static constexpr DType kDType = DType::kF16;
};

/// The bit pattern of an fp32 value, and back.
STRATA_HD std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}
STRATA_HD float bits_float(std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

/// bf16 -> fp32, exact.
STRATA_HD float widen_bf16(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

/// fp16 -> fp32, exact: subnormals normalised, Inf kept; a NaN keeps its sign and payload and is
/// made quiet (as F16C's vcvtph2ps does).
STRATA_HD float widen_f16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_float(sign | 0x7F800000u | (mant != 0 ? 0x400000u : 0u) | (mant << 13));
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);  // +-0
  std::uint32_t e = 113;                   // a subnormal is mant * 2^-24: normalise it
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return bits_float(sign | (e << 23) | ((mant & 0x3FFu) << 13));
}

/// fp32 -> bf16, round to nearest even. Overflow gives Inf; subnormals are kept; a NaN stays a
/// NaN with its sign and high payload, made quiet.
STRATA_HD std::uint16_t narrow_bf16_rne(float x) {
  const std::uint32_t b = float_bits(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

/// fp32 -> fp16, round to nearest even, subnormals included; at or above 65520 in magnitude it
/// gives Inf. A NaN gives sign | 0x7E00 | its high payload, the NaN that F16C's vcvtps2ph gives.
STRATA_HD std::uint16_t narrow_f16_rne(float x) {
  const std::uint32_t b = float_bits(x);
  const std::uint32_t sign = (b >> 16) & 0x8000u;
  const std::uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x38800000u) {               // >= 2^-14: a normal fp16 (or overflow)
    std::uint32_t m = a - 0x38000000u;  // rebias the exponent from 127 to 15
    m = (m + 0x0FFFu + ((m >> 13) & 1u)) >> 13;
    return static_cast<std::uint16_t>(sign | (m >= 0x7C00u ? 0x7C00u : m));
  }
  if (a <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: rounds to 0
  // A subnormal fp16: |x| / 2^-24 rounded to an integer in [0, 1024] (1024 is the smallest normal).
  const std::uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - (a >> 23);  // 14 .. 24
  std::uint32_t r = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u) != 0)) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

/// fp32 -> bf16, stochastic: adds the top 16 bits of `r` below the kept bits and truncates.
/// Exactly unbiased over the 2^16 values of those bits; a value next to bf16's largest may round
/// to Inf. Inf and NaN round to nearest.
STRATA_HD std::uint16_t narrow_bf16_sr(float x, std::uint32_t r) {
  const std::uint32_t b = float_bits(x);
  if ((b & 0x7F800000u) == 0x7F800000u) return narrow_bf16_rne(x);
  return static_cast<std::uint16_t>((b + (r >> 16)) >> 16);
}

/// fp32 -> fp16, stochastic: normal values add the top 13 bits of `r` below the kept bits and
/// truncate (exactly unbiased); subnormal results round up with probability equal to the dropped
/// fraction, compared on 24 bits of `r` (bias at most 2^-24 of a subnormal step). At or above
/// 65504 in magnitude, and for Inf and NaN, it rounds to nearest.
STRATA_HD std::uint16_t narrow_f16_sr(float x, std::uint32_t r) {
  const std::uint32_t b = float_bits(x);
  const std::uint32_t sign = (b >> 16) & 0x8000u;
  const std::uint32_t a = b & 0x7FFFFFFFu;
  if (a >= 0x477FE000u) return narrow_f16_rne(x);  // >= 65504, Inf, NaN
  if (a >= 0x38800000u) return static_cast<std::uint16_t>(sign | ((a - 0x38000000u + (r >> 19)) >> 13));
  // |x| * 2^24 is exact (a power-of-two scaling), as are its integer part and the fraction left.
  const float m = bits_float(a) * 16777216.0f;
#if defined(__CUDA_ARCH__)
  const float whole = floorf(m);
#else
  const float whole = std::floor(m);
#endif
  const float dropped = (m - whole) * 16777216.0f;  // the fraction on 24 bits, exact
  const std::uint32_t up = dropped > static_cast<float>(r >> 8) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (static_cast<std::uint32_t>(whole) + up));
}

/// 32-bit finaliser (Chris Wellons' lowbias32): a well-mixed hash of one word, or lane by lane of
/// a vector of words (core/simd.hpp).
template <class U32>
STRATA_HD U32 lowbias32(U32 x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

/// The stochastic rounding bits of one element: a hash of its row's key (`rounding_row_key` in
/// core/row_math.hpp: table seed, global row, step, what is rounded) and its global column.
STRATA_HD std::uint32_t rounding_bits(std::uint64_t row_key, std::int64_t global_col) {
  const auto lo = static_cast<std::uint32_t>(row_key);
  const auto hi = static_cast<std::uint32_t>(row_key >> 32);
  return lowbias32<std::uint32_t>(lo ^ hi ^ (static_cast<std::uint32_t>(global_col) * 0x9E3779B9u));
}

/// fp32 -> the bits of a half element of type `dtype` (kBF16 or kF16), rounded to nearest or,
/// when `stochastic`, with the random bits `r`.
STRATA_HD std::uint16_t narrow(DType dtype, float x, bool stochastic, std::uint32_t r) {
  if (dtype == DType::kBF16) return stochastic ? narrow_bf16_sr(x, r) : narrow_bf16_rne(x);
  return stochastic ? narrow_f16_sr(x, r) : narrow_f16_rne(x);
}

/// The bits of a half element of type `dtype` -> fp32, exact.
STRATA_HD float widen(DType dtype, std::uint16_t h) { return dtype == DType::kBF16 ? widen_bf16(h) : widen_f16(h); }

/// The value an element of type `dtype` stores for x: x itself for fp32, else x rounded to the
/// half type and widened back (what the reference keeps in place of a half-size row).
STRATA_HD float rounded(DType dtype, float x, bool stochastic, std::uint32_t r) {
  return dtype == DType::kF32 ? x : widen(dtype, narrow(dtype, x, stochastic, r));
}

/// Bytes of one element of `dtype`.
STRATA_HD int element_bytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

}  // namespace strata
