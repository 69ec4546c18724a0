#include "host/kernels.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace strata {

namespace {

// Rows ahead of the current one that are prefetched. Measured on the 2-core VM: 8 or 16 rows and
// the T0 or T2 hint all give the same throughput (the gather is bandwidth-bound there); kept at 16.
constexpr std::int64_t kPrefetchDistance = 16;
// Gradient rows (mostly in L3) prefetched ahead in backward.
constexpr std::int64_t kGradPrefetch = 8;

inline void prefetch_row(const float* p, std::int32_t dim) {
  const char* c = reinterpret_cast<const char*>(p);
  const std::int64_t bytes = std::int64_t{dim} * 4;
  for (std::int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 1);
}

inline void prefetch_row_rw(const float* p, std::int64_t floats) {
  const char* c = reinterpret_cast<const char*>(p);
  for (std::int64_t off = 0; off < floats * 4; off += 64) __builtin_prefetch(c + off, 1, 3);
}

// Bags per task: large enough to amortise scheduling, small enough to balance two cores.
std::int64_t bag_grain(std::int64_t batch) { return std::max<std::int64_t>(8, std::min<std::int64_t>(256, batch / 64)); }

}  // namespace

void gather_pool(RowRef t, const BagsView& bags, Pooling pooling, float* out) {
  const std::int32_t dim = t.dim;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, bags.batch, bag_grain(bags.batch)),
                    [&](const tbb::blocked_range<std::int64_t>& r) {
                      const std::int64_t j_end = bags.offsets[r.end()];
                      for (std::int64_t j = bags.offsets[r.begin()]; j < std::min(j_end, bags.offsets[r.begin()] + kPrefetchDistance); ++j)
                        prefetch_row(t.row(bags.keys[j]), dim);
                      for (std::int64_t b = r.begin(); b < r.end(); ++b) {
                        float* o = out + b * dim;
                        std::memset(o, 0, sizeof(float) * (dim));
                        const std::int64_t lo = bags.offsets[b], hi = bags.offsets[b + 1];
                        for (std::int64_t j = lo; j < hi; ++j) {
                          if (j + kPrefetchDistance < j_end) prefetch_row(t.row(bags.keys[j + kPrefetchDistance]), dim);
                          const float* row = t.row(bags.keys[j]);
                          if (bags.weights) {
                            row_axpy(o, row, bags.weights[j], dim);
                          } else {
                            row_add(o, row, dim);
                          }
                        }
                        if (pooling == Pooling::kMean && hi > lo) row_scale(o, bag_scale(pooling, hi - lo), dim);
                      }
                    });
}

void gather_rows(RowRef t, const Key* keys, const float* weights, std::int64_t n, float* out) {
  const std::int32_t dim = t.dim;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, 256), [&](const tbb::blocked_range<std::int64_t>& r) {
    for (std::int64_t j = r.begin(); j < std::min(r.end(), r.begin() + kPrefetchDistance); ++j) prefetch_row(t.row(keys[j]), dim);
    for (std::int64_t j = r.begin(); j < r.end(); ++j) {
      if (j + kPrefetchDistance < r.end()) prefetch_row(t.row(keys[j + kPrefetchDistance]), dim);
      const float* row = t.row(keys[j]);
      float* o = out + j * dim;
      if (weights) {
        const float w = weights[j];
        for (std::int32_t c = 0; c < dim; ++c) o[c] = w * row[c];
      } else {
        std::memcpy(o, row, sizeof(float) * (dim));
      }
    }
  });
}

namespace {

// acc = sum over the uses of unique row u of its gradient contributions, in ascending position
// order (the one reduction every mode shares, so results are bit-exact between modes).
inline void reduce_one(const BagsView& bags, Pooling pooling, const UniqueView& unique, const std::int32_t* bag_of,
                       const float* grads, std::int32_t dim, std::int64_t u, std::int64_t p_end, float* acc) {
  std::fill(acc, acc + dim, 0.0f);
  for (std::int64_t p = unique.offsets[u]; p < unique.offsets[u + 1]; ++p) {
    // Gradient rows are read in a random order from a buffer larger than L2: prefetch them too.
    if (p + kGradPrefetch < p_end) {
      const std::int64_t jp = unique.positions[p + kGradPrefetch];
      prefetch_row(grads + (pooling == Pooling::kNone ? jp : bag_of[jp]) * dim, dim);
    }
    const std::int64_t j = unique.positions[p];
    if (pooling == Pooling::kNone) {
      row_axpy(acc, grads + j * dim, grad_scale(pooling, 1, bags.weights, j), dim);
    } else {
      const std::int64_t b = bag_of[j];
      const float s = grad_scale(pooling, bags.offsets[b + 1] - bags.offsets[b], bags.weights, j);
      row_axpy(acc, grads + b * dim, s, dim);
    }
  }
}

}  // namespace

void backward_update(RowRef t, const BagsView& bags, Pooling pooling, UniqueView unique,
                     const std::int32_t* bag_of, const float* grads, const OptimizerStep& step) {
  const std::int32_t dim = t.dim;
  const std::int64_t rec = dim + t.state_dim;
  const std::int64_t U = unique.size;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, U, 128), [&](const tbb::blocked_range<std::int64_t>& r) {
    std::vector<float> acc(static_cast<std::size_t>(dim));
    const std::int64_t p_end = unique.offsets[r.end()];
    for (std::int64_t u = r.begin(); u < std::min(r.end(), r.begin() + kPrefetchDistance); ++u)
      prefetch_row_rw(t.row(unique.keys[u]), rec);
    for (std::int64_t u = r.begin(); u < r.end(); ++u) {
      if (u + kPrefetchDistance < r.end()) prefetch_row_rw(t.row(unique.keys[u + kPrefetchDistance]), rec);
      reduce_one(bags, pooling, unique, bag_of, grads, dim, u, p_end, acc.data());
      float* w = t.row(unique.keys[u]);
      apply_optimizer(step, w, w + dim, acc.data(), dim);
    }
  });
}

void reduce_unique_grads(const BagsView& bags, Pooling pooling, UniqueView unique, const std::int32_t* bag_of,
                         const float* grads, std::int32_t dim, float* out) {
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, unique.size, 128), [&](const tbb::blocked_range<std::int64_t>& r) {
    const std::int64_t p_end = unique.offsets[r.end()];
    for (std::int64_t u = r.begin(); u < r.end(); ++u) reduce_one(bags, pooling, unique, bag_of, grads, dim, u, p_end, out + u * dim);
  });
}

}  // namespace strata
