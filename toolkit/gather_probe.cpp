#include "toolkit/gather_probe.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include <tbb/task_arena.h>

#include "core/line_prefetch.hpp"
#include "core/simd.hpp"
#include "toolkit/probe_util.hpp"

namespace strata::bench {
namespace {

// Prefetch distances tried, in keys ahead; the probe keeps the one with the highest median. The
// best distance depends on the row size and the memory system (host/kernels.cpp measured 32-96
// rows into L2 as best for 512-byte rows on the 2-core VM), so the limit is not tied to one guess.
constexpr int kDistances[] = {24, 48, 96};
// The update loop also prefetches each record for writing this many rows ahead (host/kernels.cpp:
// L2 far ahead plus prefetchw a few rows ahead was the fastest pair for its update pass).
constexpr int kWriteAhead = 8;
// Rows per task of the update loop, as the host kernels' update pass (tasks of 128 unique rows).
constexpr std::int64_t kUpdateGrain = 128;

// Bags per task of the gather loop: the host kernels' grain (host/kernels.cpp bag_grain), large
// enough to amortise scheduling, small enough to balance the threads.
std::int64_t bag_grain(std::int64_t bags) { return std::max<std::int64_t>(8, std::min<std::int64_t>(256, bags / 64)); }

struct Pass {
  const float* table;
  std::int64_t stride;  // floats
  std::int32_t dim;
  const GatherProbeBatch* batch;
  float* out;  // bags x dim
  int ahead;
};

// Pools bags [b0, b1) of rows of kVecs registers, the bag's sum in registers, stored once.
template <int kVecs>
void pool_vec(const Pass& p, std::int64_t b0, std::int64_t b1) {
  constexpr std::int32_t dim = kVecs * simd::kFloats;
  const std::int64_t* off = p.batch->offsets.data();
  const std::int64_t* rows = p.batch->rows.data();
  const std::int64_t j_end = off[b1];
  const auto row = [&](std::int64_t j) { return p.table + rows[j] * p.stride; };
  for (std::int64_t j = off[b0]; j < std::min(j_end, off[b0] + p.ahead); ++j) prefetch_row(row(j), dim);
  for (std::int64_t b = b0; b < b1; ++b) {
    simd::Floats acc[kVecs];
#pragma GCC unroll 16
    for (int c = 0; c < kVecs; ++c) acc[c] = simd::Floats{};
    for (std::int64_t j = off[b]; j < off[b + 1]; ++j) {
      if (j + p.ahead < j_end) prefetch_row(row(j + p.ahead), dim);
      const float* r = row(j);
#pragma GCC unroll 16
      for (int c = 0; c < kVecs; ++c) {
        simd::Floats v;
        std::memcpy(&v, r + simd::kFloats * c, sizeof v);
        acc[c] += v;
      }
    }
    // One register at a time: copying the whole array at once made GCC 12 keep it on the stack
    // (a load, add and store per register and key, at half the speed of the host kernel).
    float* o = p.out + b * dim;
#pragma GCC unroll 16
    for (int c = 0; c < kVecs; ++c) std::memcpy(o + simd::kFloats * c, &acc[c], sizeof acc[c]);
  }
}

// Any dim: the bag's sum in its (L1-resident) output row.
void pool_any(const Pass& p, std::int64_t b0, std::int64_t b1) {
  const std::int64_t* off = p.batch->offsets.data();
  const std::int64_t* rows = p.batch->rows.data();
  const std::int64_t j_end = off[b1];
  const std::int32_t dim = p.dim;
  const auto row = [&](std::int64_t j) { return p.table + rows[j] * p.stride; };
  for (std::int64_t j = off[b0]; j < std::min(j_end, off[b0] + p.ahead); ++j) prefetch_row(row(j), dim);
  for (std::int64_t b = b0; b < b1; ++b) {
    float* o = p.out + b * dim;
    std::fill(o, o + dim, 0.0f);
    for (std::int64_t j = off[b]; j < off[b + 1]; ++j) {
      if (j + p.ahead < j_end) prefetch_row(row(j + p.ahead), dim);
      const float* r = row(j);
      for (std::int32_t d = 0; d < dim; ++d) o[d] += r[d];
    }
  }
}

using PoolFn = void (*)(const Pass&, std::int64_t, std::int64_t);

// pool_vec for rows of 1..16 registers (dims up to 256 floats with AVX-512, 128 with AVX2),
// pool_any otherwise.
template <int... V>
PoolFn pool_for(std::int32_t dim, std::integer_sequence<int, V...>) {
  PoolFn fn = pool_any;
  ((dim == (V + 1) * simd::kFloats ? (fn = pool_vec<V + 1>, 0) : 0), ...);
  return fn;
}

// One update pass: rows[u] for u in a task's range, each record read, a scaled gradient (held in
// L1, the same for every row) subtracted, and written back.
struct UpdatePass {
  float* table;
  std::int64_t stride;  // floats
  std::int32_t floats;  // record floats updated
  const std::int64_t* rows;
  const float* grad;  // floats entries
  int ahead;
};

template <int kVecs>
void update_vec(const UpdatePass& p, std::int64_t u0, std::int64_t u1) {
  constexpr std::int32_t floats = kVecs * simd::kFloats;
  const auto rec = [&](std::int64_t u) { return p.table + p.rows[u] * p.stride; };
  simd::Floats g[kVecs];
#pragma GCC unroll 16
  for (int c = 0; c < kVecs; ++c) std::memcpy(&g[c], p.grad + simd::kFloats * c, sizeof g[c]);
  for (std::int64_t u = u0; u < u1; ++u) {
    if (u + p.ahead < u1) prefetch_row(rec(u + p.ahead), floats);
    if (u + kWriteAhead < u1) prefetch_row<Into::kWrite>(rec(u + kWriteAhead), floats);
    float* r = rec(u);
#pragma GCC unroll 16
    for (int c = 0; c < kVecs; ++c) {
      simd::Floats v;
      std::memcpy(&v, r + simd::kFloats * c, sizeof v);
      v -= 0.01f * g[c];
      std::memcpy(r + simd::kFloats * c, &v, sizeof v);
    }
  }
}

void update_any(const UpdatePass& p, std::int64_t u0, std::int64_t u1) {
  const std::int32_t floats = p.floats;
  const auto rec = [&](std::int64_t u) { return p.table + p.rows[u] * p.stride; };
  for (std::int64_t u = u0; u < u1; ++u) {
    if (u + p.ahead < u1) prefetch_row(rec(u + p.ahead), floats);
    if (u + kWriteAhead < u1) prefetch_row<Into::kWrite>(rec(u + kWriteAhead), floats);
    float* r = rec(u);
    for (std::int32_t d = 0; d < floats; ++d) r[d] -= 0.01f * p.grad[d];
  }
}

using UpdateFn = void (*)(const UpdatePass&, std::int64_t, std::int64_t);

template <int... V>
UpdateFn update_for(std::int32_t floats, std::integer_sequence<int, V...>) {
  UpdateFn fn = update_any;
  ((floats == (V + 1) * simd::kFloats ? (fn = update_vec<V + 1>, 0) : 0), ...);
  return fn;
}

// A probe table of rows x stride floats laid out as the store's host tables, filled by `threads`
// threads (first touch places the pages as the store's first touch would).
Result<std::unique_ptr<void, FreeDeleter>> probe_table(const char* probe, std::int64_t rows, std::int64_t stride,
                                                       int threads) {
  const std::int64_t floats = rows * stride;
  auto mem = alloc_huge_buffer(static_cast<std::size_t>(floats) * sizeof(float));
  if (!mem)
    return Status::resource_exhausted(std::string(probe) + " probe: cannot allocate a table of " +
                                      std::to_string(rows) + " rows x " + std::to_string(stride) + " floats");
  auto* table = static_cast<float*>(mem.get());
  const std::int64_t per = (floats + threads - 1) / threads;
  (void)timed_parallel(threads, [&](int t) {
    const std::int64_t lo = std::min(floats, per * t), hi = std::min(floats, lo + per);
    for (std::int64_t i = lo; i < hi; ++i) table[i] = static_cast<float>(i & 7) * 0.125f;
  });
  return mem;
}

Status check(const GatherProbeSpec& spec, const std::vector<GatherProbeBatch>& batches, int repetitions) {
  const auto bad = [](const std::string& what) { return Status::invalid_argument("gather probe: " + what); };
  if (spec.dim <= 0) return bad("dim " + std::to_string(spec.dim) + " (expected > 0)");
  if (spec.stride < spec.dim)
    return bad("stride " + std::to_string(spec.stride) + " (expected >= dim " + std::to_string(spec.dim) + ")");
  if (spec.table_rows <= 0) return bad("table_rows " + std::to_string(spec.table_rows) + " (expected > 0)");
  if (spec.threads <= 0) return bad("threads " + std::to_string(spec.threads) + " (expected > 0)");
  if (repetitions <= 0) return bad("repetitions " + std::to_string(repetitions) + " (expected > 0)");
  if (batches.empty()) return bad("no batches (expected at least one)");
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const GatherProbeBatch& b = batches[i];
    const std::string who = "batch " + std::to_string(i) + ": ";
    const auto n = static_cast<std::int64_t>(b.rows.size());
    if (b.offsets.size() < 2 || b.offsets.front() != 0 || b.offsets.back() != n)
      return bad(who + "offsets must hold at least one bag, start at 0 and end at the row count " + std::to_string(n));
    for (std::size_t k = 1; k < b.offsets.size(); ++k)
      if (b.offsets[k] < b.offsets[k - 1]) return bad(who + "offsets decrease at bag " + std::to_string(k - 1));
    for (const std::int64_t r : b.rows)
      if (r < 0 || r >= spec.table_rows)
        return bad(who + "row " + std::to_string(r) + " outside [0, " + std::to_string(spec.table_rows) + ")");
  }
  return Status::ok();
}

Status check_update(const UpdateProbeSpec& spec, const std::vector<std::vector<std::int64_t>>& passes,
                    int repetitions) {
  const auto bad = [](const std::string& what) { return Status::invalid_argument("update probe: " + what); };
  if (spec.record_floats <= 0) return bad("record_floats " + std::to_string(spec.record_floats) + " (expected > 0)");
  if (spec.stride < spec.record_floats)
    return bad("stride " + std::to_string(spec.stride) + " (expected >= record_floats " +
               std::to_string(spec.record_floats) + ")");
  if (spec.table_rows <= 0) return bad("table_rows " + std::to_string(spec.table_rows) + " (expected > 0)");
  if (spec.threads <= 0) return bad("threads " + std::to_string(spec.threads) + " (expected > 0)");
  if (repetitions <= 0) return bad("repetitions " + std::to_string(repetitions) + " (expected > 0)");
  if (passes.empty()) return bad("no passes (expected at least one)");
  for (std::size_t i = 0; i < passes.size(); ++i) {
    if (passes[i].empty()) return bad("pass " + std::to_string(i) + " has no rows (expected at least one)");
    for (const std::int64_t r : passes[i])
      if (r < 0 || r >= spec.table_rows)
        return bad("pass " + std::to_string(i) + ": row " + std::to_string(r) + " outside [0, " +
                   std::to_string(spec.table_rows) + ")");
  }
  return Status::ok();
}

}  // namespace

Result<GatherProbeResult> measure_gather_limit(const GatherProbeSpec& spec,
                                               const std::vector<GatherProbeBatch>& batches, int repetitions) {
  STRATA_RETURN_IF_ERROR(check(spec, batches, repetitions));
  const std::int64_t floats = spec.table_rows * spec.stride;
  STRATA_ASSIGN_OR_RETURN(auto mem, probe_table("gather", spec.table_rows, spec.stride, spec.threads));
  auto* table = static_cast<float*>(mem.get());
  std::int64_t max_bags = 0;
  for (const auto& b : batches) max_bags = std::max(max_bags, static_cast<std::int64_t>(b.offsets.size()) - 1);
  std::vector<float> out(static_cast<std::size_t>(max_bags * spec.dim));
  const PoolFn pool = pool_for(spec.dim, std::make_integer_sequence<int, 16>{});

  GatherProbeResult r;
  r.dim = spec.dim;
  r.row_bytes = std::int64_t{4} * spec.dim;
  r.table_rows = spec.table_rows;
  r.table_bytes = floats * 4;
  r.threads = spec.threads;
  r.repetitions = repetitions;
  tbb::task_arena arena(spec.threads);
  for (const int ahead : kDistances) {
    std::vector<double> rates;
    // One untimed pass first: faults in the output, warms the code and starts the workers.
    for (int i = -1; i < repetitions; ++i) {
      const GatherProbeBatch& batch = batches[static_cast<std::size_t>(std::max(i, 0)) % batches.size()];
      const std::int64_t bags = static_cast<std::int64_t>(batch.offsets.size()) - 1;
      const Pass p{table, spec.stride, spec.dim, &batch, out.data(), ahead};
      const double s =
          timed_tbb(arena, bags, bag_grain(bags), [&](std::int64_t b0, std::int64_t b1) { pool(p, b0, b1); });
      if (i >= 0) rates.push_back(static_cast<double>(batch.rows.size()) / s);
    }
    std::sort(rates.begin(), rates.end());
    const double median = rates[rates.size() / 2];
    if (median > r.lookups_per_s) {
      r.lookups_per_s = median;
      r.best_lookups_per_s = rates.back();
      r.prefetch_distance = ahead;
    }
  }
  r.gb_per_s = r.lookups_per_s * static_cast<double>(r.row_bytes) / 1e9;
  return r;
}

Result<UpdateProbeResult> measure_update_limit(const UpdateProbeSpec& spec,
                                               const std::vector<std::vector<std::int64_t>>& passes, int repetitions) {
  STRATA_RETURN_IF_ERROR(check_update(spec, passes, repetitions));
  STRATA_ASSIGN_OR_RETURN(auto mem, probe_table("update", spec.table_rows, spec.stride, spec.threads));
  const std::vector<float> grad(static_cast<std::size_t>(spec.record_floats), 0.5f);
  const UpdateFn update = update_for(spec.record_floats, std::make_integer_sequence<int, 16>{});

  UpdateProbeResult r;
  r.record_floats = spec.record_floats;
  r.record_bytes = std::int64_t{4} * spec.record_floats;
  r.table_rows = spec.table_rows;
  r.table_bytes = spec.table_rows * spec.stride * 4;
  r.threads = spec.threads;
  r.repetitions = repetitions;
  tbb::task_arena arena(spec.threads);
  for (const int ahead : kDistances) {
    std::vector<double> rates;
    for (int i = -1; i < repetitions; ++i) {  // one untimed pass first, as the gather probe
      const std::vector<std::int64_t>& rows = passes[static_cast<std::size_t>(std::max(i, 0)) % passes.size()];
      const UpdatePass p{
          static_cast<float*>(mem.get()), spec.stride, spec.record_floats, rows.data(), grad.data(), ahead};
      const auto n = static_cast<std::int64_t>(rows.size());
      const double s = timed_tbb(arena, n, kUpdateGrain, [&](std::int64_t u0, std::int64_t u1) { update(p, u0, u1); });
      if (i >= 0) rates.push_back(static_cast<double>(n) / s);
    }
    std::sort(rates.begin(), rates.end());
    const double median = rates[rates.size() / 2];
    if (median > r.rows_per_s) {
      r.rows_per_s = median;
      r.best_rows_per_s = rates.back();
      r.prefetch_distance = ahead;
    }
  }
  r.gb_per_s = r.rows_per_s * static_cast<double>(r.record_bytes) * 2 / 1e9;
  return r;
}

}  // namespace strata::bench
