#include "host/kernels.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/line_prefetch.hpp"
#include "core/simd.hpp"

namespace strata {

namespace {

// Table rows ahead of the current lookup that are prefetched, into L2 (prefetcht1): an L1
// prefetch holds a line-fill buffer until the line arrives, so with 8 lines per row only about two
// rows are ever in flight and the gather is latency-bound; L2 prefetches keep far more misses in
// flight. Measured on the 2-core VM (1 GiB table, uniform keys, dim 128, two threads): L1 at 8, 16
// or 32 rows gives 15.0-16.1 GB/s (no prefetch at all: 15.3), L2 at 32-96 rows 20.7-21.5 GB/s.
constexpr std::int64_t kPrefetchDistance = 48;
// Backward prefetches each unique row's record twice: into L2 kPrefetchDistance rows ahead (as the
// gather), then for writing (prefetchw, into L1 in exclusive state) kUpdatePrefetch rows ahead, so
// the update's stores do not wait for ownership. Measured on the 2-core VM (SGD, 245k unique rows
// of a 1 GiB table, dim 128): prefetchw alone 16 ahead 13.3-15.2 ms, L2 48 ahead 9.0 ms, both
// (4 or 8 ahead) 8.4-8.7 ms.
constexpr std::int64_t kUpdatePrefetch = 8;
// Gradient rows (mostly in L3) prefetched ahead in backward.
constexpr std::int64_t kGradPrefetch = 8;
// Floats per register, as a pointer offset: a row's c-th register starts at row + kF * c.
constexpr std::ptrdiff_t kF = simd::kFloats;

// Bags per task: large enough to amortise scheduling, small enough to balance two cores.
std::int64_t bag_grain(std::int64_t batch) {
  return std::max<std::int64_t>(8, std::min<std::int64_t>(256, batch / 64));
}

// The instance of a kernel for `dim`, the rows' element type and the outputs' and gradients' one:
// Kernel<dim, Elem, Io>::run for the multiples of 16 up to 256 (the per-row loops get compile-time
// trip counts), Kernel<0, Elem, Io>::run (dim at run time) otherwise. Elem is float, Bf16 or F16
// (core/half.hpp): rows are widened to fp32 where they are read and rounded back where they are
// stored, the math between stays fp32. Io is the table's output_dtype as a type (float, Bf16 or
// F16): outputs are fp32 sums rounded to nearest even into it once per output row, gradients are
// widened from it where they are read. Chosen once per table, so fp32 tables run the kernels'
// float instances, with no per-element test of either type.
template <template <std::int32_t, class, class> class Kernel, class Elem, class Io, int... C>
auto for_dim(std::int32_t dim, std::integer_sequence<int, C...>) {
  auto fn = Kernel<0, Elem, Io>::run;
  ((dim == 16 * (C + 1) ? (fn = Kernel<16 * (C + 1), Elem, Io>::run, 0) : 0), ...);
  return fn;
}
// Half outputs and gradients get compile-time instances for the common dims 64 and 128 only, every
// other dim the run-time-dim instance (same results): each compile-time dim is an instance per row
// dtype, and all 16 for each output dtype tripled this file's build time. Builds that check rather
// than run fast do the same for fp32 outputs: the sanitizer presets (STRATA_FEW_KERNEL_DIMS,
// host/CMakeLists.txt) and clang-tidy's analyzer (__clang_analyzer__), which would otherwise check
// sixteen copies of each kernel's code (the file took 471 s to compile under ASan, 288 s to lint).
template <template <std::int32_t, class, class> class Kernel, class Elem>
auto for_dim_io(std::int32_t dim, DType io) {
  constexpr auto kHalfIoSeq = std::integer_sequence<int, 3, 7>{};
#if defined(STRATA_FEW_KERNEL_DIMS) || defined(__clang_analyzer__)
  constexpr auto kSeq = kHalfIoSeq;
#else
  constexpr auto kSeq = std::make_integer_sequence<int, 16>{};
#endif
  if (io == DType::kBF16) return for_dim<Kernel, Elem, Bf16>(dim, kHalfIoSeq);
  if (io == DType::kF16) return for_dim<Kernel, Elem, F16>(dim, kHalfIoSeq);
  return for_dim<Kernel, Elem, float>(dim, kSeq);
}
template <template <std::int32_t, class, class> class Kernel>
auto for_dim(std::int32_t dim, DType dtype, DType io = DType::kF32) {
  if (dtype == DType::kBF16) return for_dim_io<Kernel, Bf16>(dim, io);
  if (dtype == DType::kF16) return for_dim_io<Kernel, F16>(dim, io);
  return for_dim_io<Kernel, float>(dim, io);
}

// The element type of Elem, and the words `n` of them take.
template <class Elem>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<Elem, float>) {
    return DType::kF32;
  } else {
    return Elem::kDType;
  }
}

// A row's elements at record address `rec`.
template <class Elem>
const Elem* elems(const float* rec) {
  return reinterpret_cast<const Elem*>(rec);
}
template <class Elem>
Elem* elems(float* rec) {
  return reinterpret_cast<Elem*>(rec);
}

// Element c of a row, widened to fp32 (exact).
template <class Elem>
inline float widen_at(const Elem* row, std::int64_t c) {
  if constexpr (std::is_same_v<Elem, float>) {
    return row[c];
  } else {
    std::uint16_t h;
    std::memcpy(&h, row + c, sizeof h);
    return widen(Elem::kDType, h);
  }
}

// kF elements of a row from p, widened to fp32 (exact).
template <class Elem>
inline simd::Floats load_elems(const Elem* p) {
  if constexpr (std::is_same_v<Elem, float>) {
    return simd::load(p);
  } else {
    const simd::U16h h = simd::load_half(reinterpret_cast<const std::uint16_t*>(p));
    if constexpr (std::is_same_v<Elem, Bf16>) {
      return simd::widen_bf16(h);
    } else {
      return simd::widen_f16(h);
    }
  }
}

// Stores kF fp32 values as the elements c0 .. c0 + kF of a row at `row`, rounded as
// store_weight rounds each (r.bits(key, c) lane by lane): the vector form of store_weight.
template <class Elem>
inline void store_elems(const Rounding& r, std::uint64_t key, std::int32_t c0, const simd::Floats& v, Elem* row) {
  if constexpr (std::is_same_v<Elem, float>) {
    (void)r;
    (void)key;
    simd::store(row + c0, v);
  } else {
    simd::U16h h;
    if (r.stochastic) {
      const simd::U32s bits = simd::rounding_bits(key, std::int64_t{r.col_offset} + c0);
      if constexpr (std::is_same_v<Elem, Bf16>) {
        h = simd::narrow_bf16_sr(v, bits);
      } else {
        h = simd::narrow_f16_sr(v, bits);
      }
    } else if constexpr (std::is_same_v<Elem, Bf16>) {
      h = simd::narrow_bf16_rne(v);
    } else {
      h = simd::narrow_f16_rne(v);
    }
    simd::store_half(reinterpret_cast<std::uint16_t*>(row + c0), h);
  }
}

// Element c of an output row of Io at `o`: the fp32 value v, rounded to nearest even when Io is a
// half type (the reference store rounds its fp32 outputs so, core/half.hpp).
template <class Io>
inline void put_out(Io* o, std::int64_t c, float v) {
  if constexpr (std::is_same_v<Io, float>) {
    o[c] = v;
  } else {
    const std::uint16_t h = std::is_same_v<Io, Bf16> ? narrow_bf16_rne(v) : narrow_f16_rne(v);
    std::memcpy(o + c, &h, sizeof h);
  }
}

// kF fp32 values rounded to nearest even into the half elements at p (put_out's vector form).
template <class Half>
inline void put_out_vec(Half* p, const simd::Floats& v) {
  if constexpr (std::is_same_v<Half, Bf16>) {
    simd::store_half(reinterpret_cast<std::uint16_t*>(p), simd::narrow_bf16_rne(v));
  } else {
    simd::store_half(reinterpret_cast<std::uint16_t*>(p), simd::narrow_f16_rne(v));
  }
}

// Row r of a (rows, dim) matrix of Io elements whose first element is at `m` (outputs and
// gradients keep their views' float* addresses whatever their element type).
template <class Io>
inline Io* io_row(float* m, std::int64_t r, std::int32_t dim) {
  return elems<Io>(m) + r * dim;
}
template <class Io>
inline const Io* io_row(const float* m, std::int64_t r, std::int32_t dim) {
  return elems<Io>(m) + r * dim;
}

// acc[0..dim) += s * g[0..dim), g widened from Io where it is read: row_axpy's operations.
template <class Io>
inline void grad_axpy(float* acc, const Io* g, float s, std::int32_t dim) {
  if constexpr (std::is_same_v<Io, float>) {
    row_axpy(acc, g, s, dim);
  } else {
    for (std::int32_t c = 0; c < dim; ++c) acc[c] += s * widen_at(g, c);
  }
}

// A row's gradient accumulator: on the stack for a compile-time dim, else on the heap.
template <std::int32_t kDim>
struct RowAcc {
  explicit RowAcc(std::int32_t dim) : run(kDim > 0 ? 0 : static_cast<std::size_t>(dim)) {}
  float* data() noexcept { return kDim > 0 ? fixed : run.data(); }
  alignas(64) float fixed[kDim > 0 ? kDim : 1];
  std::vector<float> run;
};

}  // namespace

namespace {

// Pools bags [b0, b1) of any dim, accumulating in the output row (L1-resident). Half rows are
// widened element by element, with row_axpy's / row_add's operations in their order. Half outputs
// (Io Bf16 or F16) accumulate in an fp32 row of their own, rounded into the output once per bag.
template <class Elem, class Io>
void pool_bags_any(RowRef t, const BagsView& bags, Pooling pooling, float* out, std::int64_t b0, std::int64_t b1) {
  // The keys through one typed pointer (int64, or int32 read as they are): no width test per key.
  const auto run = [&](const auto* keys) {
    const std::int32_t dim = t.dim;
    const std::int64_t words = element_words(dim, dtype_of<Elem>());
    std::vector<float> sum;  // half outputs: the bag's fp32 sum
    if constexpr (!std::is_same_v<Io, float>) sum.resize(static_cast<std::size_t>(dim));
    const std::int64_t j_end = bags.offset(b1);
    for (std::int64_t j = bags.offset(b0); j < std::min(j_end, bags.offset(b0) + kPrefetchDistance); ++j)
      prefetch_row(t.row(static_cast<Key>(keys[j])), words);
    for (std::int64_t b = b0; b < b1; ++b) {
      float* o = out + b * dim;
      if constexpr (!std::is_same_v<Io, float>) o = sum.data();
      std::memset(o, 0, sizeof(float) * static_cast<std::size_t>(dim));
      const std::int64_t lo = bags.offset(b), hi = bags.offset(b + 1);
      for (std::int64_t j = lo; j < hi; ++j) {
        if (j + kPrefetchDistance < j_end) prefetch_row(t.row(static_cast<Key>(keys[j + kPrefetchDistance])), words);
        const Elem* row = elems<Elem>(t.row(static_cast<Key>(keys[j])));
        if constexpr (std::is_same_v<Elem, float>) {
          if (bags.weights) {
            row_axpy(o, row, bags.weights[j], dim);
          } else {
            row_add(o, row, dim);
          }
        } else if (bags.weights) {
          const float w = bags.weights[j];
          for (std::int32_t c = 0; c < dim; ++c) o[c] += w * widen_at(row, c);
        } else {
          for (std::int32_t c = 0; c < dim; ++c) o[c] += widen_at(row, c);
        }
      }
      if (pooling == Pooling::kMean && hi > lo) row_scale(o, bag_scale(pooling, hi - lo), dim);
      if constexpr (!std::is_same_v<Io, float>)
        for (std::int32_t c = 0; c < dim; ++c) put_out(io_row<Io>(out, b, dim), c, o[c]);
    }
  };
  if (bags.keys32) {
    run(bags.keys32);
  } else {
    run(bags.keys);
  }
}

// Pools bags [b0, b1) of dim 16 * C keeping the bag's sum in registers: the output row is written
// once per bag instead of loaded and stored once per key (1.2x on uniform keys, 1.35x when the
// rows hit the caches, on the 2-core VM). The accumulators are registers of the target's width
// (simd::Floats); a wider type is split through the stack. kWeighted takes the per-sample-weights
// branch out of the inner loop. The arithmetic per lane is the scalar row math's, in the same
// order (sum of w * row, or of row, in key order; then the mean's scale), so the results are
// bit-identical to pool_bags_any at every width. (A row of more floats than the register file
// holds, dim 256 with AVX2's 16 registers, is summed in an L1-resident array on the stack.)
// Half rows (Elem Bf16 or F16) are widened register by register as they are loaded; half outputs
// (Io Bf16 or F16) are the sum's registers rounded to nearest even as they are stored.
template <int C, bool kWeighted, class Elem, class Io>
void pool_bags_vec(RowRef t, const BagsView& bags, Pooling pooling, float* out, std::int64_t b0, std::int64_t b1) {
  // The keys through one typed pointer (int64, or int32 read as they are): no width test per key.
  const auto run = [&](const auto* keys) {
    constexpr std::int32_t dim = 16 * C;
    constexpr int kVecs = dim / simd::kFloats;
    constexpr std::int64_t kWords = element_words(dim, dtype_of<Elem>());
    static_assert(dim % simd::kFloats == 0, "a row is a whole number of registers");
    const std::int64_t j_end = bags.offset(b1);
    for (std::int64_t j = bags.offset(b0); j < std::min(j_end, bags.offset(b0) + kPrefetchDistance); ++j)
      prefetch_row(t.row(static_cast<Key>(keys[j])), kWords);
    for (std::int64_t b = b0; b < b1; ++b) {
      simd::Floats acc[kVecs];
      for (int c = 0; c < kVecs; ++c) acc[c] = simd::Floats{};
      const std::int64_t lo = bags.offset(b), hi = bags.offset(b + 1);
      for (std::int64_t j = lo; j < hi; ++j) {
        if (j + kPrefetchDistance < j_end) prefetch_row(t.row(static_cast<Key>(keys[j + kPrefetchDistance])), kWords);
        const Elem* row = elems<Elem>(t.row(static_cast<Key>(keys[j])));
        if constexpr (kWeighted) {
          const float w = bags.weights[j];
          for (int c = 0; c < kVecs; ++c) acc[c] += w * load_elems(row + kF * c);
        } else {
          for (int c = 0; c < kVecs; ++c) acc[c] += load_elems(row + kF * c);
        }
      }
      if (pooling == Pooling::kMean && hi > lo) {
        const float s = bag_scale(pooling, hi - lo);
        for (int c = 0; c < kVecs; ++c) acc[c] *= s;
      }
      if constexpr (std::is_same_v<Io, float>) {
        float* o = out + b * dim;
        for (int c = 0; c < kVecs; ++c) std::memcpy(o + kF * c, &acc[c], sizeof acc[c]);
      } else {
        Io* o = io_row<Io>(out, b, dim);
        for (int c = 0; c < kVecs; ++c) put_out_vec(o + kF * c, acc[c]);
      }
    }
  };
  if (bags.keys32) {
    run(bags.keys32);
  } else {
    run(bags.keys);
  }
}

template <int C, class Elem, class Io>
void pool_bags_16(RowRef t, const BagsView& bags, Pooling pooling, float* out, std::int64_t b0, std::int64_t b1) {
  if (bags.weights) {
    pool_bags_vec<C, true, Elem, Io>(t, bags, pooling, out, b0, b1);
  } else {
    pool_bags_vec<C, false, Elem, Io>(t, bags, pooling, out, b0, b1);
  }
}

template <std::int32_t kDim, class Elem, class Io>
struct PoolBags {
  static constexpr auto run = pool_bags_16<kDim / 16, Elem, Io>;
};
template <class Elem, class Io>
struct PoolBags<0, Elem, Io> {
  static constexpr auto run = pool_bags_any<Elem, Io>;
};

}  // namespace

void gather_pool(RowRef t, const BagsView& bags, Pooling pooling, float* out) {
  // Register accumulation for dims that are multiples of 16 up to 256 (dim / simd::kFloats
  // registers); other dims accumulate in the output row.
  const auto pool = for_dim<PoolBags>(t.dim, t.dtype);
  tbb::parallel_for(
      tbb::blocked_range<std::int64_t>(0, bags.batch, bag_grain(bags.batch)),
      [&](const tbb::blocked_range<std::int64_t>& r) { pool(t, bags, pooling, out, r.begin(), r.end()); });
}

namespace {

// Unpooled lookups [j0, j1) of gather_rows (half rows widened; half outputs rounded to nearest
// even from the fp32 w * row, as the reference rounds them).
template <class Elem, class Io>
void gather_rows_elems(RowRef t, const BagsView& bags, std::int64_t j0, std::int64_t j1, float* out) {
  // The keys through one typed pointer (int64, or int32 read as they are): no width test per key.
  const auto run = [&](const auto* keys) {
    const float* weights = bags.weights;
    const std::int32_t dim = t.dim;
    const std::int64_t words = element_words(dim, dtype_of<Elem>());
    for (std::int64_t j = j0; j < std::min(j1, j0 + kPrefetchDistance); ++j)
      prefetch_row(t.row(static_cast<Key>(keys[j])), words);
    for (std::int64_t j = j0; j < j1; ++j) {
      if (j + kPrefetchDistance < j1) prefetch_row(t.row(static_cast<Key>(keys[j + kPrefetchDistance])), words);
      const Elem* row = elems<Elem>(t.row(static_cast<Key>(keys[j])));
      if constexpr (!std::is_same_v<Io, float>) {
        Io* o = io_row<Io>(out, j, dim);
        const float w = weights ? weights[j] : 1.0f;
        if (weights) {
          for (std::int32_t c = 0; c < dim; ++c) put_out(o, c, w * widen_at(row, c));
        } else {
          for (std::int32_t c = 0; c < dim; ++c) put_out(o, c, widen_at(row, c));
        }
        continue;
      }
      float* o = out + j * dim;
      if (weights) {
        const float w = weights[j];
        for (std::int32_t c = 0; c < dim; ++c) o[c] = w * widen_at(row, c);
      } else if constexpr (std::is_same_v<Elem, float>) {
        std::memcpy(o, row, sizeof(float) * (dim));
      } else {
        for (std::int32_t c = 0; c < dim; ++c) o[c] = widen_at(row, c);
      }
    }
  };
  if (bags.keys32) {
    run(bags.keys32);
  } else {
    run(bags.keys);
  }
}

template <class Elem>
void gather_rows_io(RowRef t, const BagsView& bags, std::int64_t j0, std::int64_t j1, float* out, DType io) {
  if (io == DType::kBF16) {
    gather_rows_elems<Elem, Bf16>(t, bags, j0, j1, out);
  } else if (io == DType::kF16) {
    gather_rows_elems<Elem, F16>(t, bags, j0, j1, out);
  } else {
    gather_rows_elems<Elem, float>(t, bags, j0, j1, out);
  }
}

// gather_rows_elems of the table's element type and the outputs' (io).
void gather_rows_range(RowRef t, const BagsView& bags, std::int64_t j0, std::int64_t j1, float* out,
                       DType io = DType::kF32) {
  if (t.dtype == DType::kBF16) {
    gather_rows_io<Bf16>(t, bags, j0, j1, out, io);
  } else if (t.dtype == DType::kF16) {
    gather_rows_io<F16>(t, bags, j0, j1, out, io);
  } else {
    gather_rows_io<float>(t, bags, j0, j1, out, io);
  }
}

}  // namespace

void gather_rows(RowRef t, const Key* keys, const float* weights, std::int64_t n, float* out) {
  BagsView bags;
  bags.keys = keys;
  bags.weights = weights;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, 256), [&](const tbb::blocked_range<std::int64_t>& r) {
    gather_rows_range(t, bags, r.begin(), r.end(), out);
  });
}

namespace {

// acc = sum of the gradient contributions of positions [p_lo, p_hi) of a unique row, from 0.0f in
// ascending position order. kDim > 0 fixes the dim at compile time (then `dim` must equal it); 0
// takes it at run time. p_end: where the prefetches stop. Gradients are of Io, widened as read.
template <std::int32_t kDim, class Io>
inline void reduce_segment(const BagsView& bags, Pooling pooling, const UniqueView& unique, const std::int32_t* bag_of,
                           const float* grads, std::int32_t run_dim, std::int64_t p_lo, std::int64_t p_hi,
                           std::int64_t p_end, float* acc) {
  const std::int32_t dim = kDim > 0 ? kDim : run_dim;
  std::fill(acc, acc + dim, 0.0f);
  for (std::int64_t p = p_lo; p < p_hi; ++p) {
    // Gradient rows are read in a random order from a buffer larger than L2: prefetch them too.
    // Its bag comes from bag_of, a random read too: that is prefetched twice as far ahead, so the
    // gradient prefetch does not wait for it.
    if (p + 2 * kGradPrefetch < p_end && pooling != Pooling::kNone)
      __builtin_prefetch(&bag_of[unique.positions[p + 2 * kGradPrefetch]]);
    if (p + kGradPrefetch < p_end) {
      const std::int64_t jp = unique.positions[p + kGradPrefetch];
      prefetch_row<Into::kL1>(
          reinterpret_cast<const float*>(io_row<Io>(grads, pooling == Pooling::kNone ? jp : bag_of[jp], dim)),
          element_words(dim, dtype_of<Io>()));
    }
    const std::int64_t j = unique.positions[p];
    if (pooling == Pooling::kNone) {
      grad_axpy(acc, io_row<Io>(grads, j, dim), grad_scale(pooling, 1, bags.weights, j), dim);
    } else {
      const std::int64_t b = bag_of[j];
      const float s = grad_scale(pooling, bags.offset(b + 1) - bags.offset(b), bags.weights, j);
      grad_axpy(acc, io_row<Io>(grads, b, dim), s, dim);
    }
  }
}

// acc = the summed gradient of unique row u: its uses in segments of kGradSegment positions, each
// summed from 0.0f, then the segments added in order (core/row_math.hpp; the one reduction every
// mode shares, so results are bit-exact between modes).
template <std::int32_t kDim, class Io>
inline void reduce_one(const BagsView& bags, Pooling pooling, const UniqueView& unique, const std::int32_t* bag_of,
                       const float* grads, std::int32_t run_dim, std::int64_t u, std::int64_t p_end, float* acc) {
  const std::int32_t dim = kDim > 0 ? kDim : run_dim;
  const std::int64_t p_lo = unique.offsets[u], p_hi = unique.offsets[u + 1];
  reduce_segment<kDim, Io>(bags, pooling, unique, bag_of, grads, dim, p_lo, std::min(p_lo + kGradSegment, p_hi), p_end,
                           acc);
  if (p_hi - p_lo <= kGradSegment) return;
  RowAcc<kDim> part_acc(dim);
  float* part = part_acc.data();
  for (std::int64_t s = p_lo + kGradSegment; s < p_hi; s += kGradSegment) {
    reduce_segment<kDim, Io>(bags, pooling, unique, bag_of, grads, dim, s, std::min(s + kGradSegment, p_hi), p_end,
                             part);
    row_add(acc, part, dim);
  }
}

// The fused optimizer of a row for a compile-time dim, in one pass over the record where the row
// math needs one: weight decay folded into the update's loop (apply_optimizer first adds it to the
// gradient in place, a pass of its own), and the gradient read from where it already is (GradIn:
// a reduction or a bag's gradient) or computed in the same loop (ScaledGradIn: 0 + s * g, what
// row_axpy leaves on a zeroed accumulator; the 0 + is kept, it turns -0 into +0). Registers of
// the target's width (simd::Floats); GCC leaves apply_optimizer's Adagrad and Adam loops scalar
// (std::sqrt keeps its errno path), simd::sqrt is the same correctly rounded square root. Every
// element gets apply_optimizer's operations in its order, so the bits are the same:
//   decay    g + wd * w
//   SGD      w - lr * g
//   Adagrad  a = a + g * g;  w - (lr * g) / (sqrt(a) + eps)
//   row-wise a = a + (sum of g * g in column order) / dim;  w - (lr / (sqrt(a) + eps)) * g
//   Adam     m = b1 * m + (1 - b1) * g;  v = b2 * v + ((1 - b2) * g) * g;
//            w - (lr * (m / bias1)) / (sqrt(v / bias2) + eps)
struct GradIn {
  const float* g;
  simd::Floats operator()(int i) const noexcept { return simd::load(g + kF * i); }
};
template <class Io>
struct ScaledGradIn {  // g of Io, widened as it is loaded
  const Io* g;
  float s;
  simd::Floats operator()(int i) const noexcept { return 0.0f + s * load_elems(g + kF * i); }
};

// The row-wise Adagrad sum of squares, column by column as apply_optimizer adds it (a sequential
// float sum: not vectorised, so its order stays the row math's).
template <std::int32_t kDim>
inline float sum_squares(const float* g) {
  float sq = 0.0f;
  for (std::int32_t c = 0; c < kDim; ++c) sq += g[c] * g[c];
  return sq;
}

// One optimizer step of the record at `rec` (local row `row`: kDim weights of Elem, then an fp32
// state) with gradient `grad`. Half weights are widened as they are loaded and stored through
// store_elems (store_weight's rounding, the bits of (row, column)). `scratch` (kDim floats, may be
// the GradIn's row) holds the row-wise gradient when it must be materialised; `known_sq`, when not
// null, is that gradient's sum_squares (row-wise Adagrad without decay: the same for every key of
// a bag).
template <std::int32_t kDim, class Elem, class Grad>
inline void fused_step(const OptimizerStep& st, float* rec, std::int64_t row, const Grad& grad, float* scratch,
                       const float* known_sq) {
  static_assert(kDim % simd::kFloats == 0, "a row is a whole number of registers");
  constexpr int kVecs = kDim / simd::kFloats;
  const OptimizerSpec& o = st.spec;
  const float lr = o.learning_rate, wd = o.weight_decay, eps = o.eps;
  const bool decays = wd != 0.0f;
  const bool moves = lr != 0.0f;  // a rate of 0 keeps the weights (apply_optimizer says why)
  Elem* __restrict__ w = elems<Elem>(rec);
  float* __restrict__ state = rec + element_words(kDim, dtype_of<Elem>());
  const Rounding& rd = st.round;
  std::uint64_t key = 0;
  if constexpr (!std::is_same_v<Elem, float>) {
    if (rd.stochastic) key = rd.row_key(row, RoundingSalt::kWeights);
  } else {
    (void)row;
  }
  switch (o.kind) {
    case OptimizerKind::kSgd:
      for (int i = 0; i < kVecs; ++i) {
        const simd::Floats wv = load_elems(w + kF * i);
        simd::Floats g = grad(i);
        if (decays) g = g + wd * wv;
        if (moves) store_elems(rd, key, kF * i, wv - lr * g, w);
      }
      break;
    case OptimizerKind::kAdagrad:
      for (int i = 0; i < kVecs; ++i) {
        const simd::Floats wv = load_elems(w + kF * i);
        simd::Floats g = grad(i);
        if (decays) g = g + wd * wv;
        const simd::Floats a = simd::load(state + kF * i) + g * g;
        simd::store(state + kF * i, a);
        if (moves) store_elems(rd, key, kF * i, wv - (lr * g) / (simd::sqrt(a) + eps), w);
      }
      break;
    case OptimizerKind::kRowwiseAdagrad: {
      // Without decay a GradIn row is the gradient itself; else it is written to scratch.
      const bool materialise = !std::is_same_v<Grad, GradIn> || decays;
      const float* g = scratch;
      if constexpr (std::is_same_v<Grad, GradIn>) {
        if (!materialise) g = grad.g;
      }
      if (materialise) {
        for (int i = 0; i < kVecs; ++i) {
          simd::Floats gv = grad(i);
          if (decays) gv = gv + wd * load_elems(w + kF * i);
          simd::store(scratch + kF * i, gv);
        }
      }
      const float sq = known_sq ? *known_sq : sum_squares<kDim>(g);
      state[0] += sq / static_cast<float>(kDim);
      const float m = lr / (std::sqrt(state[0]) + eps);
      if (moves)
        for (int i = 0; i < kVecs; ++i)
          store_elems(rd, key, kF * i, load_elems(w + kF * i) - m * simd::load(g + kF * i), w);
      break;
    }
    case OptimizerKind::kAdam: {
      float* __restrict__ mom = state;
      float* __restrict__ var = state + kDim;
      const float b1 = o.beta1, b2 = o.beta2, c1 = 1.0f - o.beta1, c2 = 1.0f - o.beta2;
      for (int i = 0; i < kVecs; ++i) {
        const simd::Floats wv = load_elems(w + kF * i);
        simd::Floats g = grad(i);
        if (decays) g = g + wd * wv;
        const simd::Floats m = b1 * simd::load(mom + kF * i) + c1 * g;
        const simd::Floats v = b2 * simd::load(var + kF * i) + (c2 * g) * g;
        simd::store(mom + kF * i, m);
        simd::store(var + kF * i, v);
        const simd::Floats mh = m / st.bias1;
        const simd::Floats vh = v / st.bias2;
        if (moves) store_elems(rd, key, kF * i, wv - (lr * mh) / (simd::sqrt(vh) + eps), w);
      }
      break;
    }
  }
}

// One optimizer step of the record at `rec` (local row `row`) through apply_optimizer: an fp32 row
// and state in place, as ever; half weights or a bf16 state widened into `wide` (dim + state_dim
// floats), stepped, then stored through store_weight, the weights with the bits of
// (row, kWeights), state vector v with those of (row, 1 + v), as the reference rounds them.
// g: as apply_optimizer's (weight decay is folded into it).
template <class Elem>
inline void step_widened(const OptimizerStep& st, RowRef t, float* rec, std::int64_t row, float* g, float* wide) {
  const std::int32_t dim = t.dim;
  const bool half_state = t.state_dtype != DType::kF32;
  float* state = rec + t.row_words();
  if constexpr (std::is_same_v<Elem, float>) {
    if (!half_state) {
      apply_optimizer(st, rec, state, g, dim);
      return;
    }
  }
  const Rounding& rd = st.round;
  Elem* w = elems<Elem>(rec);
  float* wv = rec;
  if constexpr (!std::is_same_v<Elem, float>) {
    wv = wide;
    for (std::int32_t c = 0; c < dim; ++c) wv[c] = widen_at(w, c);
  }
  float* sv = state;
  if (half_state) {
    sv = wide + dim;
    const Bf16* s = elems<Bf16>(state);
    for (std::int32_t c = 0; c < t.state_dim; ++c) sv[c] = widen_at(s, c);
  }
  apply_optimizer(st, wv, sv, g, dim);
  if constexpr (!std::is_same_v<Elem, float>) {
    const std::uint64_t key = rd.stochastic ? rd.row_key(row, RoundingSalt::kWeights) : 0;
    for (std::int32_t c = 0; c < dim; ++c) store_weight(rd, key, c, wv[c], w);
  }
  if (half_state) {
    Bf16* s = elems<Bf16>(state);
    for (std::int32_t v = 0; v * dim < t.state_dim; ++v) {
      const std::uint64_t key = rd.stochastic ? rd.row_key(row, static_cast<RoundingSalt>(1 + v)) : 0;
      const std::ptrdiff_t off = static_cast<std::ptrdiff_t>(v) * dim;
      const std::int32_t n = std::min(dim, t.state_dim - v * dim);
      for (std::int32_t c = 0; c < n; ++c) store_weight(rd, key, c, sv[off + c], s + off);
    }
  }
}

// Scratch for step_widened: dim + state_dim floats where a table holds a half element, else none.
std::vector<float> widened_scratch(const RowRef& t) {
  const bool half = t.dtype != DType::kF32 || t.state_dtype != DType::kF32;
  return std::vector<float>(half ? static_cast<std::size_t>(t.dim + t.state_dim) : 0);
}

// The dim whose instance of the update kernels updates table t: its dim (for_dim takes multiples of
// 16 at compile time), or 0, the run-time-dim instance, for a bf16 state. So an instance of a
// compile-time dim always has an fp32 state (fused_step keeps one), which it knows at compile time:
// an fp32 table's update compiles to the code it had before half rows (issue 31 review).
std::int32_t update_dim(const RowRef& t) { return t.state_dtype == DType::kF32 ? t.dim : 0; }

// Whether the update kernel <kDim, Elem> has fp32 rows and state (update_dim).
template <std::int32_t kDim, class Elem>
constexpr bool kFp32Record = kDim > 0 && std::is_same_v<Elem, float>;

// Words of a record's weights and state (the span the update kernels prefetch).
template <std::int32_t kDim, class Elem>
std::int64_t record_span(const RowRef& t) {
  if constexpr (kDim > 0) {
    return element_words(kDim, dtype_of<Elem>()) + t.state_dim;  // an fp32 state
  } else {
    return t.row_words() + t.state_words();
  }
}

// The update kernels' optimizer step of a record outside fused_step: apply_optimizer in place for
// fp32 rows and state of a compile-time dim, else step_widened (which `wide` serves).
template <std::int32_t kDim, class Elem>
inline void step_row(const OptimizerStep& st, RowRef t, float* rec, std::int64_t row, float* g, float* wide) {
  if constexpr (kFp32Record<kDim, Elem>) {
    (void)row;
    (void)wide;
    apply_optimizer(st, rec, rec + kDim, g, kDim);
  } else {
    step_widened<Elem>(st, t, rec, row, g, wide);
  }
}

// Unique rows [u0, u1) of backward_update. The loop is memory-bound, but how many rows it keeps in
// flight depends on how little else each row costs, so:
//  - with kDim > 0 every per-row loop (reduction, optimizer) has a compile-time trip count and a
//    stack accumulator, and Adagrad, row-wise Adagrad and Adam are fused_step (vectorised square
//    roots and divisions: strata-bench cpu uniform dim 128, backward 159 -> 36 ms with Adagrad).
//    SGD on fp32 rows stays apply_optimizer, already one pass without decay: fused_step there measured 1.4-1.5x
//    slower in BM_StepBackwardUpdate on the 2-core VM (same loads, stores and arithmetic in the
//    generated code; the time is spent waiting at the row prefetches), so it is not used;
//  - prefetches start with the task's first row instead of a burst of kPrefetchDistance rows up
//    front: tasks are short (128 rows or fewer), and a burst of 400 prefetches filled the queues
//    that the first rows' own loads then waited in;
//  - [[gnu::flatten]]: GCC 12 left RowRef::row out of line here, so each prefetch paid a call
//    (with vzeroupper and register spills around it).
// strata-micro BM_StepBackwardUpdate (dim 128 SGD, 245k unique rows of a 1 GiB table, two threads,
// 2-core VM): run-time dim with the burst 13.4 ms, without it 12.2 ms, compile-time dim without it
// 10.5 ms.
template <std::int32_t kDim, class Elem, class Io>
[[gnu::flatten]] void update_rows(RowRef t, const BagsView& bags, Pooling pooling, const UniqueView& unique,
                                  const std::int32_t* bag_of, const float* grads, const OptimizerStep& step,
                                  std::int64_t u0, std::int64_t u1) {
  const std::int32_t dim = kDim > 0 ? kDim : t.dim;
  const std::int64_t rec = record_span<kDim, Elem>(t);
  RowAcc<kDim> row_acc(dim);
  float* acc = row_acc.data();
  std::vector<float> wide;
  if constexpr (!kFp32Record<kDim, Elem>) wide = widened_scratch(t);
  const std::int64_t p_end = unique.offsets[u1];
  for (std::int64_t u = u0; u < u1; ++u) {
    if (u + kPrefetchDistance < u1) prefetch_row(t.row(unique.keys[u + kPrefetchDistance]), rec);
    if (u + kUpdatePrefetch < u1) prefetch_row<Into::kWrite>(t.row(unique.keys[u + kUpdatePrefetch]), rec);
    reduce_one<kDim, Io>(bags, pooling, unique, bag_of, grads, dim, u, p_end, acc);
    const Key row = unique.keys[u];
    float* w = t.row(row);
    bool fused = false;
    if constexpr (kDim > 0) {
      // SGD on fp32 rows stays apply_optimizer (above); on half rows fused_step widens and rounds
      // the row register by register, as update_used_once does, where step_widened would go
      // element by element through scratch.
      if (step.spec.kind != OptimizerKind::kSgd || !std::is_same_v<Elem, float>) {
        fused_step<kDim, Elem>(step, w, row, GradIn{acc}, acc, nullptr);
        fused = true;
      }
    }
    if (!fused) step_row<kDim, Elem>(step, t, w, row, acc, wide.data());
  }
}

template <std::int32_t kDim, class Elem, class Io>
struct UpdateRows {
  static constexpr auto run = update_rows<kDim, Elem, Io>;
};

}  // namespace

void backward_update(RowRef t, const BagsView& bags, Pooling pooling, UniqueView unique, const std::int32_t* bag_of,
                     const float* grads, const OptimizerStep& step) {
  // Compile-time dims for multiples of 16 up to 256, as gather_pool; other dims at run time.
  const auto update = for_dim<UpdateRows>(update_dim(t), t.dtype);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, unique.size, 128),
                    [&](const tbb::blocked_range<std::int64_t>& r) {
                      update(t, bags, pooling, unique, bag_of, grads, step, r.begin(), r.end());
                    });
}

namespace {

// Bags [b0, b1) of backward_update_by_bag: each key used once gets its bag's gradient, scaled as
// in reduce_one onto a zeroed accumulator (so the arithmetic is the same), and the optimizer
// step; repeated keys are skipped. Rows are prefetched by position, as in update_rows. Pooling
// none has a gradient row per key: each key is its own "bag" [b, b + 1).
// Without per-sample weights every key of a bag gets the same gradient, so it is computed once per
// bag (the same 0 + s * g, so the same bits), and so is row-wise Adagrad's sum of its squares when
// there is no weight decay. For a compile-time dim the optimizer is fused_step: one pass over the
// record (with weights the gradient 0 + s * g is computed in that pass); for a run-time dim
// apply_optimizer, with the bag's gradient copied first when weight decay is on (it adds the decay
// to the gradient in place). Flattened, as update_rows.
template <std::int32_t kDim, class Elem, class Io>
[[gnu::flatten]] void update_used_once(RowRef t, const BagsView& bags, Pooling pooling, const std::uint8_t* repeated,
                                       const float* grads, const OptimizerStep& step, std::int64_t b0,
                                       std::int64_t b1) {
  // The keys through one typed pointer (int64, or int32 read as they are): no width test per key.
  const auto run = [&](const auto* keys) {
    const std::int32_t dim = kDim > 0 ? kDim : t.dim;
    const std::int64_t rec = record_span<kDim, Elem>(t);
    std::vector<float> wide;
    if constexpr (!kFp32Record<kDim, Elem>) wide = widened_scratch(t);
    RowAcc<kDim> row_acc(dim), bag_row_acc(dim);
    float* acc = row_acc.data();
    float* bag_acc = bag_row_acc.data();
    const bool none = pooling == Pooling::kNone;
    const bool per_bag = bags.weights == nullptr;
    const bool decays = step.spec.weight_decay != 0.0f;
    // Row-wise Adagrad without decay: the sum of squares of a bag's gradient, once per bag too.
    const bool bag_sq = kDim > 0 && per_bag && !decays && step.spec.kind == OptimizerKind::kRowwiseAdagrad;
    float bag_sq_value = 0.0f;
    const std::int64_t j_end = none ? b1 : bags.offset(b1);
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t lo = none ? b : bags.offset(b), hi = none ? b + 1 : bags.offset(b + 1);
      bool bag_ready = false;
      for (std::int64_t j = lo; j < hi; ++j) {
        // (Repeated rows are not prefetched: with skewed keys they are the hot rows, and both
        // threads taking them for writing would bounce their lines between the cores: zipf:1.05
        // backward 10.7 -> 8.6 ms.)
        if (j + kPrefetchDistance < j_end && !repeated[j + kPrefetchDistance])
          prefetch_row(t.row(static_cast<Key>(keys[j + kPrefetchDistance])), rec);
        if (j + kUpdatePrefetch < j_end && !repeated[j + kUpdatePrefetch])
          prefetch_row<Into::kWrite>(t.row(static_cast<Key>(keys[j + kUpdatePrefetch])), rec);
        if (repeated[j]) continue;
        const Key row = static_cast<Key>(keys[j]);
        float* w = t.row(row);
        if constexpr (kDim > 0) {
          if (per_bag) {
            if (!bag_ready) {
              std::fill(bag_acc, bag_acc + dim, 0.0f);
              grad_axpy(bag_acc, io_row<Io>(grads, b, dim), grad_scale(pooling, hi - lo, nullptr, j), dim);
              if (bag_sq) bag_sq_value = sum_squares<kDim>(bag_acc);
              bag_ready = true;
            }
            fused_step<kDim, Elem>(step, w, row, GradIn{bag_acc}, acc, bag_sq ? &bag_sq_value : nullptr);
          } else {
            fused_step<kDim, Elem>(
                step, w, row,
                ScaledGradIn<Io>{io_row<Io>(grads, b, dim), grad_scale(pooling, hi - lo, bags.weights, j)}, acc,
                nullptr);
          }
        } else {
          float* g = acc;
          if (per_bag) {
            if (!bag_ready) {
              std::fill(bag_acc, bag_acc + dim, 0.0f);
              grad_axpy(bag_acc, io_row<Io>(grads, b, dim), grad_scale(pooling, hi - lo, nullptr, j), dim);
              bag_ready = true;
            }
            if (decays) {
              std::copy(bag_acc, bag_acc + dim, acc);
            } else {
              g = bag_acc;
            }
          } else {
            std::fill(acc, acc + dim, 0.0f);
            grad_axpy(acc, io_row<Io>(grads, b, dim), grad_scale(pooling, hi - lo, bags.weights, j), dim);
          }
          step_row<kDim, Elem>(step, t, w, row, g, wide.data());
        }
      }
    }
  };
  if (bags.keys32) {
    run(bags.keys32);
  } else {
    run(bags.keys);
  }
}

template <std::int32_t kDim, class Elem, class Io>
struct UpdateUsedOnce {
  static constexpr auto run = update_used_once<kDim, Elem, Io>;
};

}  // namespace

namespace {

// The units (bags, or key positions for pooling none) of a batch of `units` units whose chunk
// reads about kTableChunkBytes of records of row_bytes, for `keys` keys in all (at least 1).
std::int64_t chunk_units(std::int64_t units, std::int64_t keys, std::int64_t row_bytes) {
  const std::int64_t keys_per_unit = std::max<std::int64_t>(1, units > 0 ? keys / units : 1);
  return std::max<std::int64_t>(1, kTableChunkBytes / (row_bytes * keys_per_unit));
}

// Appends item i's chunks of [0, units) units, `per` units each.
void add_chunks(std::vector<TableBatchScratch::Chunk>& chunks, std::int32_t i, std::int64_t units, std::int64_t per) {
  for (std::int64_t lo = 0; lo < units; lo += per) {
    TableBatchScratch::Chunk c;
    c.item = i;
    c.lo = lo;
    c.hi = std::min(units, lo + per);
    chunks.push_back(c);
  }
}

// Runs fn(chunk) for every chunk, as one parallel loop (consecutive chunks, mostly of one table,
// go to one task; oneTBB's partitioner balances the rest).
template <class Fn>
void for_each_chunk(const std::vector<TableBatchScratch::Chunk>& chunks, Fn fn) {
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks.size(), 1),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t c = r.begin(); c < r.end(); ++c) fn(chunks[c]);
                    });
}

}  // namespace

void backward_update_by_bag(RowRef t, const BagsView& bags, Pooling pooling, const Repeats& repeats,
                            const std::int32_t* bag_of, const float* grads, const OptimizerStep& step) {
  const std::int64_t n = bags.offset(bags.batch);
  const std::int64_t batch = pooling == Pooling::kNone ? n : bags.batch;
  const std::int64_t grain = pooling == Pooling::kNone ? 4096 : bag_grain(batch);
  const auto once = for_dim<UpdateUsedOnce>(update_dim(t), t.dtype);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, batch, grain), [&](const tbb::blocked_range<std::int64_t>& r) {
    once(t, bags, pooling, repeats.repeated.data(), grads, step, r.begin(), r.end());
  });
  // The repeated keys, range by range (their rows are disjoint from the ones above).
  const auto rows = for_dim<UpdateRows>(update_dim(t), t.dtype);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, repeats.ranges.size(), 1),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t g = r.begin(); g < r.end(); ++g) {
                        const UniqueView v = view_of(repeats.ranges[g]);
                        if (v.size > 0) rows(t, bags, pooling, v, bag_of, grads, step, 0, v.size);
                      }
                    });
}

void gather_pool_tables(const std::vector<TableBatchItem>& items, TableBatchScratch& scratch) {
  using Pool = decltype(for_dim<PoolBags>(0, DType::kF32));
  std::vector<Pool> pool(items.size(), nullptr);
  auto& chunks = scratch.chunks;
  chunks.clear();
  for (std::size_t i = 0; i < items.size(); ++i) {
    const TableBatchItem& it = items[i];
    const std::int64_t n = it.bags.offset(it.bags.batch);
    const std::int64_t row_bytes = it.table.row_words() * static_cast<std::int64_t>(sizeof(float));
    const bool none = it.pooling == Pooling::kNone;
    const std::int64_t units = none ? n : it.bags.batch;
    if (!none) pool[i] = for_dim<PoolBags>(it.table.dim, it.table.dtype, it.out_dtype);
    add_chunks(chunks, static_cast<std::int32_t>(i), units, chunk_units(units, none ? units : n, row_bytes));
  }
  for_each_chunk(chunks, [&](const TableBatchScratch::Chunk& c) {
    const TableBatchItem& it = items[static_cast<std::size_t>(c.item)];
    if (it.pooling == Pooling::kNone) {
      gather_rows_range(it.table, it.bags, c.lo, c.hi, it.out, it.out_dtype);
    } else {
      pool[static_cast<std::size_t>(c.item)](it.table, it.bags, it.pooling, it.out, c.lo, c.hi);
    }
  });
}

void backward_update_tables(const std::vector<TableBatchItem>& items, TableBatchScratch& scratch) {
  using Once = decltype(for_dim<UpdateUsedOnce>(0, DType::kF32));
  using Rows = decltype(for_dim<UpdateRows>(0, DType::kF32));
  std::vector<Once> once(items.size(), nullptr);
  std::vector<Rows> rows(items.size(), nullptr);
  auto& chunks = scratch.chunks;
  chunks.clear();
  for (std::size_t i = 0; i < items.size(); ++i) {
    const TableBatchItem& it = items[i];
    once[i] = for_dim<UpdateUsedOnce>(update_dim(it.table), it.table.dtype, it.out_dtype);
    rows[i] = for_dim<UpdateRows>(update_dim(it.table), it.table.dtype, it.out_dtype);
    // backward_update_by_bag's tasks: its bag grain, and each repeated range whole. The update
    // kernels prefetch from a task's first row on, without a burst up front, so a task's first
    // rows wait: smaller chunks (128 KiB of records, 25 bags of 20 keys) made the --pooling 20
    // training step slower (321 -> 387 ms p50 in two loaded pairs).
    const std::int64_t n = it.bags.offset(it.bags.batch);
    const bool none = it.pooling == Pooling::kNone;
    const std::int64_t units = none ? n : it.bags.batch;
    add_chunks(chunks, static_cast<std::int32_t>(i), units, none ? 4096 : bag_grain(units));
    for (std::size_t g = 0; g < it.repeats->ranges.size(); ++g) {
      const std::int64_t u = it.repeats->ranges[g].size();
      if (u == 0) continue;
      TableBatchScratch::Chunk c;
      c.item = static_cast<std::int32_t>(i);
      c.repeated = true;
      c.range = static_cast<std::int32_t>(g);
      c.hi = u;
      chunks.push_back(c);
    }
  }
  for_each_chunk(chunks, [&](const TableBatchScratch::Chunk& c) {
    const auto i = static_cast<std::size_t>(c.item);
    const TableBatchItem& it = items[i];
    if (c.repeated) {
      const UniqueView v = view_of(it.repeats->ranges[static_cast<std::size_t>(c.range)]);
      rows[i](it.table, it.bags, it.pooling, v, it.bag_of, it.grads, it.step, c.lo, c.hi);
    } else {
      once[i](it.table, it.bags, it.pooling, it.repeats->repeated.data(), it.grads, it.step, c.lo, c.hi);
    }
  });
}

void reduce_unique_grads(const BagsView& bags, Pooling pooling, UniqueView unique, const std::int32_t* bag_of,
                         const float* grads, std::int32_t dim, float* out) {
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, unique.size, 128),
                    [&](const tbb::blocked_range<std::int64_t>& r) {
                      const std::int64_t p_end = unique.offsets[r.end()];
                      for (std::int64_t u = r.begin(); u < r.end(); ++u)
                        reduce_one<0, float>(bags, pooling, unique, bag_of, grads, dim, u, p_end, out + u * dim);
                    });
}

}  // namespace strata
