#pragma once
// The kernels of the device layer, written once: nvcc compiles them into the `cuda` backend's
// kernels (gpu/cuda/kernels.cu) and the host compiler into the CPU grid that the `emu` backend runs
// (gpu/kernels/host_grid.cpp). The execution model is simt.hpp's.
//
// Results equal the CPU kernels of host/kernels.cpp and the reference bit for bit, so every sum
// runs in their order: a lane owns a column and walks the bag's keys in ascending order from 0.0f;
// a row's gradient is summed in segments of kGradSegment uses (core/row_math.hpp), each from 0.0f
// in ascending position order, the segments then added left to right. The per-element math is
// core/row_math.hpp's; nvcc gets -fmad=false and keeps IEEE division and square root, as the host
// build uses -ffp-contract=off.
//
// Layout: a warp per work item (a group of output rows, a unique slot, a record, a segment of a
// hot row), lanes over columns; a lane keeps kColsPerLane columns of a chunk in registers, columns
// cb + k * lanes + lane so that each row read is coalesced. A row used more than kHotUses times in
// a batch is split: a segment launch sums each of its segments in a warp of its own into a partial
// sum in device scratch, and the row's warp adds the partials in segment order, so a hot row is
// not one warp's serial tail.
//
// Half-size rows (core/half.hpp): the row and state element types are template parameters (Elem:
// float, Bf16 or F16; SElem: float or Bf16), so an fp32 table's kernels are the code they were.
// Elements are widened to fp32 where they are read (load_elem), all math is fp32, and an update
// stores each weight and state element rounded once (store_elem: core/row_math.hpp's Rounding,
// the bits of (table, global row, step, salt, global column)), as the CPU kernels and the
// reference do.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/row_math.hpp"
#include "core/status.hpp"
#include "gpu/kernels/launch_args.hpp"
#include "gpu/kernels/simt.hpp"

namespace strata::gpu::kernels {

/// Element c of a row of Elem whose record starts at `rec`, widened to fp32 (exact). Half elements
/// are read as 16-bit values (memcpy on the host: records are fp32 words, which a uint16_t load
/// may not alias there). Indexes are 32-bit, as the fp32 kernels' were (64-bit ones made ptxas
/// spill in update_kernel).
template <class Elem>
STRATA_SIMT float load_elem(const float* rec, std::int32_t c) {
  if constexpr (std::is_same_v<Elem, float>) {
    return rec[c];
  } else {
#if defined(__CUDA_ARCH__)
    const std::uint16_t h = reinterpret_cast<const std::uint16_t*>(rec)[c];
#else
    std::uint16_t h;
    std::memcpy(&h, reinterpret_cast<const unsigned char*>(rec) + 2 * static_cast<std::int64_t>(c), sizeof h);
#endif
    return widen(Elem::kDType, h);
  }
}

/// Stores the fp32 value v as element at + c of a row of Elem at `rec`: as it is for float, else
/// rounded as `r` says with the bits of column c of the vector keyed `key` (store_weight's rounding;
/// `at`: where the vector starts, adam's v at dim).
template <class Elem>
STRATA_SIMT void store_elem(const Rounding& r, std::uint64_t key, float* rec, std::int32_t c, float v,
                            std::int32_t at = 0) {
  if constexpr (std::is_same_v<Elem, float>) {
    (void)r;
    (void)key;
    rec[at + c] = v;
  } else {
    const std::uint16_t h = narrow(Elem::kDType, v, r.stochastic, r.bits(key, c));
#if defined(__CUDA_ARCH__)
    reinterpret_cast<std::uint16_t*>(rec)[at + c] = h;
#else
    std::memcpy(reinterpret_cast<unsigned char*>(rec) + 2 * (static_cast<std::int64_t>(at) + c), &h, sizeof h);
#endif
  }
}

/// Words that dim elements of Elem take (element_words).
template <class Elem>
STRATA_SIMT std::int64_t elem_words(std::int64_t n) {
  return std::is_same_v<Elem, float> ? n : (n + 1) / 2;
}

/// Element i of a buffer of `dtype` at p (gradients in device memory: FiniteArgs::dtype), widened
/// to fp32 (exact).
STRATA_SIMT float load_activation(const float* p, DType dtype, std::int64_t i) {
  if (dtype == DType::kF32) return p[i];
#if defined(__CUDA_ARCH__)
  const std::uint16_t h = reinterpret_cast<const std::uint16_t*>(p)[i];
#else
  std::uint16_t h;
  std::memcpy(&h, reinterpret_cast<const unsigned char*>(p) + 2 * i, sizeof h);
#endif
  return widen(dtype, h);
}

/// Stores the fp32 value v as element i of an output buffer of `dtype` at p (LookupFeature::out_dtype):
/// rounded to nearest even once where it is half, as the CPU kernels and the reference round outputs.
STRATA_SIMT void store_activation(float* p, DType dtype, std::int64_t i, float v) {
  if (dtype == DType::kF32) {
    p[i] = v;
    return;
  }
  const std::uint16_t h = narrow(dtype, v, false, 0);
#if defined(__CUDA_ARCH__)
  reinterpret_cast<std::uint16_t*>(p)[i] = h;
#else
  std::memcpy(reinterpret_cast<unsigned char*>(p) + 2 * i, &h, sizeof h);
#endif
}

/// Calls fn(Elem{}) with the half element type of `dtype` (Bf16 or F16). Host code: the launchers
/// of both backends choose the half-size rows' instances with it alike. Any other dtype (fp32,
/// which the fp32 kernels serve, or a value out of range) is a programmer error: it aborts rather
/// than launch nothing.
template <class Fn>
inline void with_half_elem(DType dtype, Fn&& fn) {
  if (dtype == DType::kBF16) {
    fn(Bf16{});
  } else {
    STRATA_CHECK(dtype == DType::kF16 && "with_half_elem: the dtype of a half-size launch is bf16 or fp16");
    fn(F16{});
  }
}

/// Calls fn(Elem{}, SElem{}) with the element types of `dtype` (float, Bf16 or F16) and
/// `state_dtype` (float or Bf16) where either is half, so exactly the five half combinations are
/// instantiated. Host code. An all-fp32 record (the fp32 kernels serve it) or a state_dtype other
/// than fp32 and bf16 is a programmer error: it aborts rather than launch nothing or the wrong one.
template <class Fn>
inline void with_half_elems(DType dtype, DType state_dtype, Fn&& fn) {
  STRATA_CHECK((state_dtype == DType::kF32 || state_dtype == DType::kBF16) &&
               "with_half_elems: the state of a half-size launch is fp32 or bf16");
  if (state_dtype != DType::kBF16) {
    with_half_elem(dtype, [&](auto row) { fn(row, float{}); });
  } else if (dtype == DType::kF32) {
    fn(float{}, Bf16{});
  } else {
    with_half_elem(dtype, [&](auto row) { fn(row, Bf16{}); });
  }
}

/// Feature owning work item `item` of a numbering `begin` of `count` features (begin[0] == 0,
/// begin ascending; count <= 16, so a scan is cheap).
STRATA_SIMT int first_owner(const std::int64_t* begin, int count, std::int64_t item) {
  int f = 0;
  while (f + 1 < count && item >= begin[f + 1]) ++f;
  return f;
}
/// Feature owning work item `item` of a launch.
template <class Args>
STRATA_SIMT int feature_of(const Args& a, std::int64_t item) {
  return first_owner(a.begin, a.count, item);
}

/// Record of row r: RowRef::row with the bases held in the launch parameters; kOverflow: a slot
/// pool with an overflow region (SlotPool), whose mapping only those launches pay for. Both: any
/// source, the mapping chosen at run time (the half-size rows' one gather instance per dtype).
template <bool kInterleaved, bool kOverflow = false>
STRATA_SIMT const float* source_row(const RowSource& s, Key r) {
  if (kOverflow && (!kInterleaved || s.overflow))
    return slot_record(s.bases[0], s.overflow, s.first_overflow, s.stride, r);
  if (!kInterleaved || s.parts == 1) return s.bases[0] + r * s.stride;
  const std::int64_t block = r >> s.block_shift;
  const std::int64_t local = ((block / s.parts) << s.block_shift) + (r & ((std::int64_t{1} << s.block_shift) - 1));
  return s.bases[block % s.parts] + local * s.stride;
}

// ---------------------------------------------------------------------------------------------
// Gather: gather_pool (pooled bags) and gather_rows (Pooling::kNone) of host/kernels.cpp.

/// This lane's columns of one chunk of its bag's sum.
struct PoolAcc {
  float v[kColsPerLane];
};

/// The pooled bags of one work item: lane groups of `lanes_per_row` lanes, a bag each. A group
/// loads its bag's indices cooperatively, a chunk of `lanes` at once, one per lane, and hands each
/// to all its lanes with read_group_lane (so the row loads do not wait behind a load of the same
/// index by every lane); the lanes then add the rows, four in flight, each lane its columns (and
/// the key's weight, a broadcast load), in key order from 0.0f (row_axpy / row_add), so the sums
/// are the CPU kernels'. The chunk loop runs to the warp's longest bag (warp-uniform, as the shuffles
/// need); a lane past its bag's end adds nothing.
template <bool kInterleaved, bool kOverflow, bool kWeighted, class Elem, class W>
STRATA_SIMT void pool_bags(const W& w, const GatherArgs& a, const GatherFeatureArgs& f, std::int64_t first) {
  const int lanes = a.lanes_per_row;
  const std::int32_t dim = a.dim;
  typename W::template Reg<std::int64_t> lo, len;
  w.lanes([&](int lane) {
    const std::int64_t i = first + lane / lanes;
    lo[lane] = i < f.outputs ? f.offsets[i] : 0;
    len[lane] = i < f.outputs ? f.offsets[i + 1] - lo[lane] : 0;
  });
  const std::int64_t longest = w.max(len);
  for (std::int32_t cb = 0; cb < dim; cb += lanes * kColsPerLane) {
    typename W::template Reg<PoolAcc> acc;
    w.lanes([&](int lane) {
      STRATA_UNROLL
      for (int k = 0; k < kColsPerLane; ++k) acc[lane].v[k] = 0.0f;
    });
    for (std::int64_t base = 0; base < longest; base += lanes) {
      typename W::template Reg<Key> idx;
      w.lanes([&](int lane) {
        const std::int64_t j = base + lane % lanes;
        idx[lane] = j < len[lane] ? f.rows[lo[lane] + j] : 0;
      });
      const int n = longest - base < lanes ? static_cast<int>(longest - base) : lanes;
      for (int u = 0; u < n; u += 4) {
        // Rows of keys base + u + q of each lane's bag, null past its end (a prefix is live).
        typename W::template Reg<const float*> r[4];
        STRATA_UNROLL
        for (int q = 0; q < 4; ++q) {
          if (u + q >= n) {
            w.lanes([&](int lane) { r[q][lane] = nullptr; });
            continue;
          }
          const typename W::template Reg<Key> key = w.read_group_lane(idx, u + q, lanes);
          w.lanes([&](int lane) {
            r[q][lane] = base + u + q < len[lane] ? source_row<kInterleaved, kOverflow>(a.source, key[lane]) : nullptr;
          });
        }
        w.lanes([&](int lane) {
          const int col = lane % lanes;
          float wt[4] = {1.0f, 1.0f, 1.0f, 1.0f};
          if (kWeighted) {
            STRATA_UNROLL
            for (int q = 0; q < 4; ++q)
              if (r[q][lane]) wt[q] = f.weights[lo[lane] + base + u + q];
          }
          STRATA_UNROLL
          for (int k = 0; k < kColsPerLane; ++k) {
            const std::int32_t c = cb + k * lanes + col;
            if (c >= dim) break;
            STRATA_UNROLL
            for (int q = 0; q < 4; ++q) {
              if (!r[q][lane]) break;
              const float x = load_elem<Elem>(r[q][lane], c);
              acc[lane].v[k] += kWeighted ? wt[q] * x : x;
            }
          }
        });
      }
    }
    w.lanes([&](int lane) {
      const std::int64_t i = first + lane / lanes;
      if (i >= f.outputs) return;
      const int col = lane % lanes;
      const std::int64_t o = i * dim;
      const float s = bag_scale(f.pooling, len[lane]);
      STRATA_UNROLL
      for (int k = 0; k < kColsPerLane; ++k) {
        const std::int32_t c = cb + k * lanes + col;
        if (c >= dim) break;
        store_activation(f.out, f.out_dtype, o + c,
                         f.pooling == Pooling::kMean && len[lane] > 0 ? acc[lane].v[k] * s
                                                                      : acc[lane].v[k]);  // row_scale, once per bag
      }
    });
  }
}

/// One work item of a gather launch: kWarp / lanes_per_row consecutive output rows of one feature.
/// kOverflow: the source is a slot pool with an overflow region (RowSource::overflow); with
/// kInterleaved too, any source (source_row). Elem: the rows' element type (RowSource::dtype).
template <bool kInterleaved, bool kOverflow, class Elem, class W>
STRATA_SIMT void gather_item(const W& w, const GatherArgs& a, std::int64_t item) {
  const int fi = feature_of(a, item);
  const GatherFeatureArgs& f = a.features[fi];
  const int lanes = a.lanes_per_row;
  const std::int64_t first = (item - a.begin[fi]) * (kWarp / lanes);
  const std::int32_t dim = a.dim;
  if (f.pooling != Pooling::kNone) {
    if (f.weights) {
      pool_bags<kInterleaved, kOverflow, true, Elem>(w, a, f, first);
    } else {
      pool_bags<kInterleaved, kOverflow, false, Elem>(w, a, f, first);
    }
    return;
  }
  // gather_rows: o = w * row (a product, not 0 + w * row: the sign of zero must match).
  w.lanes([&](int lane) {
    const std::int64_t i = first + lane / lanes;
    if (i >= f.outputs) return;
    const int col = lane % lanes;
    const std::int64_t o = i * dim;
    const float* row = source_row<kInterleaved, kOverflow>(a.source, f.rows[i]);
    if (f.weights) {
      const float wt = f.weights[i];
      for (std::int32_t c = col; c < dim; c += lanes)
        store_activation(f.out, f.out_dtype, o + c, wt * load_elem<Elem>(row, c));
    } else {
      for (std::int32_t c = col; c < dim; c += lanes)
        store_activation(f.out, f.out_dtype, o + c, load_elem<Elem>(row, c));
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Backward: backward_update of host/kernels.cpp.

/// This lane's kColsPerLane columns of a chunk, in every lane of a warp.
template <class W>
using Cols = typename W::template Reg<float>[kColsPerLane];

/// Use p of a row (a key position, in the order of its uses): the offset of its gradient row in
/// f.grads and its scale (grad_scale): the chain positions -> bag -> offsets/weights.
STRATA_SIMT void use_of(const UpdateFeatureArgs& f, std::int32_t dim, std::int64_t p, std::int64_t& row, float& s) {
  const std::int64_t j = f.positions[p];
  if (f.pooling == Pooling::kNone) {
    s = grad_scale(f.pooling, 1, f.weights, j);
    row = j * dim;
  } else {
    const std::int64_t b = f.bag_of[j];
    s = grad_scale(f.pooling, f.offsets[b + 1] - f.offsets[b], f.weights, j);
    row = b * dim;
  }
}

/// Columns of chunk cb of one segment's gradient: uses [p_lo, p_hi) in ascending order from 0.0f,
/// each scaled (row_axpy). The uses' (gradient row, scale) are computed kWarp at a time, a use per
/// lane, so that their chains of dependent loads run side by side, and handed to every lane
/// (read_lane); the lanes then add the rows, four in flight, each lane its columns.
template <class W>
STRATA_SIMT void segment_sum(const W& w, const UpdateFeatureArgs& f, std::int32_t dim, std::int64_t p_lo,
                             std::int64_t p_hi, std::int32_t cb, Cols<W>& g) {
  w.lanes([&](int lane) {
    STRATA_UNROLL
    for (int k = 0; k < kColsPerLane; ++k) g[k][lane] = 0.0f;
  });
  for (std::int64_t base = p_lo; base < p_hi; base += kWarp) {
    typename W::template Reg<std::int64_t> row;
    typename W::template Reg<float> scale;
    w.lanes([&](int lane) {
      row[lane] = 0;
      scale[lane] = 0.0f;
      if (base + lane < p_hi) use_of(f, dim, base + lane, row[lane], scale[lane]);
    });
    const int n = p_hi - base < kWarp ? static_cast<int>(p_hi - base) : kWarp;
    for (int u = 0; u < n; u += 4) {  // u + 3 < kWarp: lanes of the warp
      const std::int64_t r0 = w.read_lane(row, u), r1 = w.read_lane(row, u + 1), r2 = w.read_lane(row, u + 2),
                         r3 = w.read_lane(row, u + 3);
      const float s0 = w.read_lane(scale, u), s1 = w.read_lane(scale, u + 1), s2 = w.read_lane(scale, u + 2),
                  s3 = w.read_lane(scale, u + 3);
      const int m = n - u;  // uses of these four that are live (a prefix)
      w.lanes([&](int lane) {
        STRATA_UNROLL
        for (int k = 0; k < kColsPerLane; ++k) {
          const std::int32_t c = cb + k * kWarp + lane;
          if (c >= dim) break;
          float x = g[k][lane] + s0 * f.grads[r0 + c];
          if (m > 1) x += s1 * f.grads[r1 + c];
          if (m > 2) x += s2 * f.grads[r2 + c];
          if (m > 3) x += s3 * f.grads[r3 + c];
          g[k][lane] = x;
        }
      });
    }
  }
}

/// A row's uses [p_lo, p_hi) in the key positions of its feature, and for a hot row of a launch
/// with scratch the partial sums of its segments (segment k's at partials + k * dim) that the
/// segment launch wrote.
struct RowUses {
  std::int64_t p_lo, p_hi;
  const float* partials;  ///< nullptr: the row's work item sums its uses itself
};

/// The uses of unique row u of feature fi of a launch.
STRATA_SIMT RowUses row_uses(const UpdateArgs& a, int fi, std::int64_t u) {
  const UpdateFeatureArgs& f = a.features[fi];
  const std::int64_t p_lo = f.unique_offsets[u], p_hi = f.unique_offsets[u + 1];
  const bool split = a.partials && p_hi - p_lo > kHotUses;
  return {p_lo, p_hi, split ? a.partials + (a.seg_begin[fi] + hot_first_partial(p_lo)) * a.dim : nullptr};
}

/// Columns of chunk cb of the row's whole gradient (grad_segments): its segments' sums added left
/// to right, from the partials or each segment summed here.
template <class W>
STRATA_SIMT void row_gradient(const W& w, const UpdateFeatureArgs& f, std::int32_t dim, const RowUses& r,
                              std::int32_t cb, Cols<W>& g) {
  if (r.partials) {
    const std::int64_t segments = (r.p_hi - r.p_lo + kGradSegment - 1) / kGradSegment;
    w.lanes([&](int lane) {
      float v[kColsPerLane];
      STRATA_UNROLL
      for (int k = 0; k < kColsPerLane; ++k) {
        const std::int32_t c = cb + k * kWarp + lane;
        v[k] = c < dim ? r.partials[c] : 0.0f;
      }
      for (std::int64_t s = 1; s < segments; ++s) {
        STRATA_UNROLL
        for (int k = 0; k < kColsPerLane; ++k) {
          const std::int32_t c = cb + k * kWarp + lane;
          if (c < dim) v[k] += r.partials[s * dim + c];
        }
      }
      STRATA_UNROLL
      for (int k = 0; k < kColsPerLane; ++k) g[k][lane] = v[k];
    });
    return;
  }
  segment_sum(w, f, dim, r.p_lo, r.p_lo + kGradSegment < r.p_hi ? r.p_lo + kGradSegment : r.p_hi, cb, g);
  for (std::int64_t s = r.p_lo + kGradSegment; s < r.p_hi; s += kGradSegment) {
    Cols<W> part;
    segment_sum(w, f, dim, s, s + kGradSegment < r.p_hi ? s + kGradSegment : r.p_hi, cb, part);
    w.lanes([&](int lane) {
      STRATA_UNROLL
      for (int k = 0; k < kColsPerLane; ++k) g[k][lane] += part[k][lane];
    });
  }
}

/// The keys of a row's stochastic rounding bits (Rounding::row_key): its weights' and its state
/// vectors' (adam's m and v; adagrad's one). Zero where nothing of the row rounds stochastically.
struct RowKeys {
  std::uint64_t w = 0, s0 = 0, s1 = 0;
};
/// An fp32 record's: none (an empty type passed by value, so the fp32 kernels hold no keys).
struct NoKeys {
  static constexpr std::uint64_t w = 0, s0 = 0, s1 = 0;
};
/// The keys a record of Elem weights and SElem state needs.
template <class Elem, class SElem>
using KeysOf = std::conditional_t<std::is_same_v<Elem, float> && std::is_same_v<SElem, float>, NoKeys, RowKeys>;

/// The rounding keys of unique row u of a feature whose weights are Elem and state SElem.
template <class Elem, class SElem>
STRATA_SIMT KeysOf<Elem, SElem> row_keys(const UpdateFeatureArgs& f, std::int64_t u) {
  KeysOf<Elem, SElem> k;
  (void)f;
  (void)u;
  if constexpr (!std::is_same_v<Elem, float> || !std::is_same_v<SElem, float>) {
    const Rounding& r = f.step.round;
    if (r.stochastic && f.unique_rows) {
      const std::int64_t row = f.unique_rows[u];
      if (!std::is_same_v<Elem, float>) k.w = r.row_key(row, RoundingSalt::kWeights);
      if (!std::is_same_v<SElem, float>) {
        k.s0 = r.row_key(row, RoundingSalt::kState0);
        k.s1 = r.row_key(row, RoundingSalt::kState1);
      }
    }
  }
  return k;
}

/// One column of an element-wise optimizer (sgd, adagrad, adam): apply_optimizer itself on a
/// one-column view, with the column's state gathered (adam keeps m at state[c] and v at
/// state[dim + c]), so the arithmetic is literally the host's. Half elements are widened, stepped
/// in fp32 and stored rounded once; a learning rate of 0 leaves a half weight's bits as they are
/// (as the CPU kernels' fused step).
template <class Elem, class SElem>
STRATA_SIMT void update_column(const OptimizerStep& st, float* w, float* state, std::int32_t dim, std::int32_t c,
                               float g, KeysOf<Elem, SElem> keys) {
  const OptimizerKind kind = st.spec.kind;
  float wc = load_elem<Elem>(w, c);
  float sc[2] = {0.0f, 0.0f};
  if (kind == OptimizerKind::kAdagrad) {
    sc[0] = load_elem<SElem>(state, c);
  } else if (kind == OptimizerKind::kAdam) {
    sc[0] = load_elem<SElem>(state, c);
    sc[1] = load_elem<SElem>(state, dim + c);
  }
  apply_optimizer(st, &wc, sc, &g, 1);
  if (std::is_same_v<Elem, float> || st.spec.learning_rate != 0.0f) store_elem<Elem>(st.round, keys.w, w, c, wc);
  if (kind == OptimizerKind::kAdagrad) {
    store_elem<SElem>(st.round, keys.s0, state, c, sc[0]);
  } else if (kind == OptimizerKind::kAdam) {
    store_elem<SElem>(st.round, keys.s0, state, c, sc[0]);
    // v's bits: its own key, columns counted within the vector (the CPU kernels' step_widened).
    store_elem<SElem>(st.round, keys.s1, state, c, sc[1], dim);
  }
}

/// Row-wise adagrad's step of one unique row (weights of Elem, then its one fp32 state element at
/// `state`), by one warp, in update_row's registers `g`: update_row's second half.
template <class Elem, class Keys, class W>
STRATA_SIMT void rowwise_row(const W& w, const UpdateFeatureArgs& f, std::int32_t dim, const RowUses& r, float* rec,
                             float* state, Keys keys, Cols<W>& g) {
  // Row-wise adagrad needs sum_c g[c]^2 over the whole row, in column order, before any weight
  // changes. Pass 1 computes it (every lane reads the squares in column order and keeps the same
  // running sum); pass 2 applies the step. Rows wider than one chunk recompute their gradient in
  // pass 2 (same order, so the same bits) instead of holding it.
  const OptimizerSpec& o = f.step.spec;
  // Weight decay folded into the gradient, as apply_optimizer does first (skipped when zero, as there).
  auto decay = [&](std::int32_t cb) {
    if (o.weight_decay == 0.0f) return;
    w.lanes([&](int lane) {
      STRATA_UNROLL
      for (int k = 0; k < kColsPerLane; ++k) {
        const std::int32_t c = cb + k * kWarp + lane;
        if (c < dim) g[k][lane] += o.weight_decay * load_elem<Elem>(rec, c);
      }
    });
  };
  float sq = 0.0f;
  for (std::int32_t cb = 0; cb < dim; cb += kChunk) {
    row_gradient(w, f, dim, r, cb, g);
    decay(cb);
    STRATA_UNROLL
    for (int k = 0; k < kColsPerLane; ++k) {
      for (int l = 0; l < kWarp; ++l) {
        const float v = w.read_lane(g[k], l);
        if (cb + k * kWarp + l < dim) sq += v * v;
      }
    }
  }
  // state[0] += sq / dim, read and written by lane 0 only (lanes may run apart on sm_70+).
  typename W::template Reg<float> s0;
  w.lanes([&](int lane) {
    s0[lane] = 0.0f;
    if (lane == 0) {
      float x = state[0];
      x += sq / static_cast<float>(dim);
      state[0] = x;
      s0[lane] = x;
    }
  });
  const float m = o.learning_rate / (std::sqrt(w.read_lane(s0, 0)) + o.eps);
  for (std::int32_t cb = 0; cb < dim; cb += kChunk) {
    if (dim > kChunk) {
      row_gradient(w, f, dim, r, cb, g);
      decay(cb);
    }
    w.lanes([&](int lane) {
      STRATA_UNROLL
      for (int k = 0; k < kColsPerLane; ++k) {
        const std::int32_t c = cb + k * kWarp + lane;
        if (c < dim && o.learning_rate != 0.0f)  // 0 keeps w (apply_optimizer)
          store_elem<Elem>(f.step.round, keys.w, rec, c, load_elem<Elem>(rec, c) - m * g[k][lane]);
      }
    });
  }
}

/// The optimizer step of one unique row (its record `rec`: weights of Elem, then state of SElem;
/// row-wise adagrad's one state element is always fp32), by one warp.
template <class Elem, class SElem, class W>
STRATA_SIMT void update_row(const W& w, const UpdateFeatureArgs& f, std::int32_t dim, const RowUses& r, float* rec,
                            KeysOf<Elem, SElem> keys) {
  Cols<W> g;
  float* state = rec + elem_words<Elem>(dim);
  if (f.step.spec.kind != OptimizerKind::kRowwiseAdagrad) {
    for (std::int32_t cb = 0; cb < dim; cb += kChunk) {
      row_gradient(w, f, dim, r, cb, g);
      w.lanes([&](int lane) {
        STRATA_UNROLL
        for (int k = 0; k < kColsPerLane; ++k) {
          const std::int32_t c = cb + k * kWarp + lane;
          if (c < dim) update_column<Elem, SElem>(f.step, rec, state, dim, c, g[k][lane], keys);
        }
      });
    }
    return;
  }
  // A bf16 state is refused for row-wise adagrad (validate: its one state element stays fp32), so
  // those instances leave its path out.
  if constexpr (std::is_same_v<SElem, float>) rowwise_row<Elem>(w, f, dim, r, rec, state, keys, g);
}

/// The record of unique slot `slot` of a backward launch: kOverflow, through the pool's overflow
/// mapping (UpdateArgs::record); else in the pool, as every launch of a pool without one.
template <bool kOverflow>
STRATA_SIMT float* update_record(const UpdateArgs& a, Key slot) {
  return kOverflow ? a.record(slot) : a.base + slot * a.stride;
}

/// One work item of a backward launch: unique slot `item` (numbered across features). Elem, SElem:
/// the pool's element types (UpdateArgs::dtype, state_dtype).
template <bool kOverflow, class Elem, class SElem, class W>
STRATA_SIMT void update_item(const W& w, const UpdateArgs& a, std::int64_t item) {
  const int fi = feature_of(a, item);
  const UpdateFeatureArgs& f = a.features[fi];
  const std::int64_t u = item - a.begin[fi];
  update_row<Elem, SElem>(w, f, a.dim, row_uses(a, fi, u), update_record<kOverflow>(a, f.unique_slots[u]),
                          row_keys<Elem, SElem>(f, u));
}

/// One work item of a segment launch (before the backward or reduction launch of the same
/// UpdateArgs): partial sum `item`, which is segment k of the hot row whose first partial is the
/// last one at or before it (hot_first_partial; a binary search of the feature's hot list, or of
/// its unique rows), when that row has a k-th segment. Partials no hot row takes are left alone.
template <class W>
STRATA_SIMT void hot_segment_item(const W& w, const UpdateArgs& a, std::int64_t item) {
  const int fi = first_owner(a.seg_begin, a.count, item);
  const UpdateFeatureArgs& f = a.features[fi];
  const std::int64_t i = item - a.seg_begin[fi];
  // lo = the rows whose first partial is at or before i (rows ascend, and so do their first positions).
  std::int64_t lo = 0, hi = a.hot_listed ? a.hot_begin[fi + 1] - a.hot_begin[fi] : a.begin[fi + 1] - a.begin[fi];
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (hot_first_partial(f.unique_offsets[a.hot_listed ? f.hot[mid] : mid]) <= i) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo == 0) return;
  const std::int64_t u = a.hot_listed ? f.hot[lo - 1] : lo - 1;
  const std::int64_t p_lo = f.unique_offsets[u], p_hi = f.unique_offsets[u + 1];
  const std::int64_t first = p_lo + (i - hot_first_partial(p_lo)) * kGradSegment;
  if (p_hi - p_lo <= kHotUses || first >= p_hi) return;
  const std::int64_t last = first + kGradSegment < p_hi ? first + kGradSegment : p_hi;
  float* out = a.partials + item * a.dim;
  for (std::int32_t cb = 0; cb < a.dim; cb += kChunk) {
    Cols<W> g;
    segment_sum(w, f, a.dim, first, last, cb, g);
    w.lanes([&](int lane) {
      STRATA_UNROLL
      for (int k = 0; k < kColsPerLane; ++k) {
        const std::int32_t c = cb + k * kWarp + lane;
        if (c < a.dim) out[c] = g[k][lane];
      }
    });
  }
}

/// One work item of a gradient reduction (Device::reduce_grads): unique row `item`'s summed
/// gradient, as update_item sums it, into the first dim floats of record unique_slots[u].
template <class W>
STRATA_SIMT void reduce_item(const W& w, const UpdateArgs& a, std::int64_t item) {
  const int fi = feature_of(a, item);
  const UpdateFeatureArgs& f = a.features[fi];
  const std::int64_t u = item - a.begin[fi];
  const RowUses r = row_uses(a, fi, u);
  float* out = a.base + f.unique_slots[u] * a.stride;  // sums have no overflow region (Device::reduce_grads)
  for (std::int32_t cb = 0; cb < a.dim; cb += kChunk) {
    Cols<W> g;
    row_gradient(w, f, a.dim, r, cb, g);
    w.lanes([&](int lane) {
      STRATA_UNROLL
      for (int k = 0; k < kColsPerLane; ++k) {
        const std::int32_t c = cb + k * kWarp + lane;
        if (c < a.dim) out[c] = g[k][lane];
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Record moves. Whole records are moved as 32-bit words, so every bit (NaN payloads included) is
// kept.

/// packed[i] = record slots[i] of the pool (its first `width` floats: a column slice, or all). Slots
/// of the pool's overflow region (RecordArgs::record) move as the others do.
template <class W>
STRATA_SIMT void pack_record(const W& w, const RecordArgs& a, std::int64_t i) {
  const std::int64_t width = a.width ? a.width : a.stride;
  const auto* from = reinterpret_cast<const std::uint32_t*>(a.record(a.slots[i]));
  auto* to = reinterpret_cast<std::uint32_t*>(a.packed + i * width);
  w.lanes([&](int lane) {
    for (std::int64_t c = lane; c < width; c += kWarp) to[c] = from[c];
  });
}

/// record slots[i] of the pool (its first `width` floats) = packed[i].
template <class W>
STRATA_SIMT void unpack_record(const W& w, const RecordArgs& a, std::int64_t i) {
  const std::int64_t width = a.width ? a.width : a.stride;
  const auto* from = reinterpret_cast<const std::uint32_t*>(a.packed + i * width);
  auto* to = reinterpret_cast<std::uint32_t*>(a.record(a.slots[i]));
  w.lanes([&](int lane) {
    for (std::int64_t c = lane; c < width; c += kWarp) to[c] = from[c];
  });
}

/// Record slots[i] <-> host record rows[i] (to_host: slot -> host): the words of its weights and
/// state (HostRecordArgs::words).
template <class W>
STRATA_SIMT void move_host_record(const W& w, const HostRecordArgs& a, std::int64_t i, bool to_host) {
  auto* slot = reinterpret_cast<std::uint32_t*>(a.record(i));
  auto* host = reinterpret_cast<std::uint32_t*>(a.rows[i]);
  w.lanes([&](int lane) {
    for (std::int64_t c = lane; c < a.words; c += kWarp) {
      if (to_host) {
        host[c] = slot[c];
      } else {
        slot[c] = host[c];
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Initialization: a table's initial rows written on the device (no host bounce).

/// Record first_slot + i of the pool = the table's initial row and optimizer state (padding zero).
/// Half elements get the fp32 values rounded to nearest, two to a word (the word's low half first,
/// an odd count's last high half zero), as HostTable::reset writes them; the element types are
/// read at run time (a cheap kernel: one instance for every dtype).
template <class W>
STRATA_SIMT void init_record(const W& w, const InitArgs& a, std::int64_t i) {
  float* rec = a.base + (a.first_slot + i) * a.stride;
  const std::int64_t row = a.init.row0 + i * a.init.row_stride;
  const float state = initial_state_value(a.init.optimizer);
  const bool half_rows = a.dtype != DType::kF32, half_state = a.state_dtype != DType::kF32;
  const std::int64_t rw = element_words(a.dim, a.dtype), sw = element_words(a.state_dim, a.state_dtype);
  auto weight = [&](std::int64_t c) {
    return initial_value(a.init.table_seed, row, a.init.col_offset + static_cast<std::int32_t>(c), a.init.bound);
  };
  w.lanes([&](int lane) {
    for (std::int64_t c = lane; c < a.stride; c += kWarp) {
      if (c < rw && !half_rows) {
        rec[c] = weight(c);
      } else if (c < rw) {
        const std::uint32_t lo = narrow(a.dtype, weight(2 * c), false, 0);
        const std::uint32_t hi = 2 * c + 1 < a.dim ? narrow(a.dtype, weight(2 * c + 1), false, 0) : 0u;
        reinterpret_cast<std::uint32_t*>(rec)[c] = lo | (hi << 16);
      } else if (c < rw + sw && !half_state) {
        rec[c] = state;  // init_state
      } else if (c < rw + sw) {
        const std::uint32_t h = narrow(a.state_dtype, state, false, 0);
        const bool pair = 2 * (c - rw) + 1 < a.state_dim;
        reinterpret_cast<std::uint32_t*>(rec)[c] = h | (pair ? h << 16 : 0u);
      } else {
        rec[c] = 0.0f;  // padding
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Finiteness: the NaN and Inf values of gradients in device memory, counted where they live (the
// store refuses such gradients before backward changes anything).

/// Whether x is NaN or +-Inf (x - x is NaN for both, 0 for every finite x; IEEE arithmetic).
STRATA_SIMT bool nonfinite(float x) { return !(x - x == 0.0f); }

/// partial[item] = the non-finite values among chunk `item`'s kFiniteChunk elements (lanes strided).
template <class W>
STRATA_SIMT void count_nonfinite_chunk(const W& w, const FiniteArgs& a, std::int64_t item) {
  const int f = feature_of(a, item);
  const std::int64_t lo = (item - a.begin[f]) * kFiniteChunk;
  const std::int64_t hi = lo + kFiniteChunk < a.n[f] ? lo + kFiniteChunk : a.n[f];
  const float* p = a.data[f];
  typename W::template Reg<std::int64_t> c;
  w.lanes([&](int lane) {
    std::int64_t k = 0;
    for (std::int64_t j = lo + lane; j < hi; j += kWarp) k += nonfinite(load_activation(p, a.dtype[f], j)) ? 1 : 0;
    c[lane] = k;
  });
  const std::int64_t total = w.sum(c);
  w.lanes([&](int lane) {
    if (lane == 0) a.partial[item] = total;
  });
}

/// totals[f] = the sum of feature f's partials (after every chunk of the launch ran).
template <class W>
STRATA_SIMT void sum_nonfinite(const W& w, const FiniteArgs& a, int f) {
  typename W::template Reg<std::int64_t> c;
  w.lanes([&](int lane) {
    std::int64_t k = 0;
    for (std::int64_t j = a.begin[f] + lane; j < a.begin[f + 1]; j += kWarp) k += a.partial[j];
    c[lane] = k;
  });
  const std::int64_t total = w.sum(c);
  w.lanes([&](int lane) {
    if (lane == 0) a.totals[f] = total;
  });
}

}  // namespace strata::gpu::kernels
