#include "bench/gather_probe.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "bench/probe_util.hpp"
#include "core/prefetch.hpp"
#include "core/simd.hpp"

namespace strata::bench {
namespace {

// Prefetch distances tried, in keys ahead; the probe keeps the one with the highest median. The
// best distance depends on the row size and the memory system (host/kernels.cpp measured 32-96
// rows into L2 as best for 512-byte rows on the 2-core VM), so the limit is not tied to one guess.
constexpr int kDistances[] = {24, 48, 96};

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

}  // namespace

Result<GatherProbeResult> measure_gather_limit(const GatherProbeSpec& spec,
                                               const std::vector<GatherProbeBatch>& batches, int repetitions) {
  STRATA_RETURN_IF_ERROR(check(spec, batches, repetitions));
  const std::int64_t floats = spec.table_rows * spec.stride;
  const auto mem = alloc_huge_buffer(static_cast<std::size_t>(floats) * sizeof(float));
  if (!mem)
    return Status::resource_exhausted("gather probe: cannot allocate a table of " + std::to_string(spec.table_rows) +
                                      " rows x " + std::to_string(spec.stride) + " floats");
  auto* table = static_cast<float*>(mem.get());
  // Filled by the pooling threads (first touch places the pages as the store's first touch would).
  const std::int64_t per = (floats + spec.threads - 1) / spec.threads;
  (void)timed_parallel(spec.threads, [&](int t) {
    const std::int64_t lo = std::min(floats, per * t), hi = std::min(floats, lo + per);
    for (std::int64_t i = lo; i < hi; ++i) table[i] = static_cast<float>(i & 7) * 0.125f;
  });
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
  for (const int ahead : kDistances) {
    std::vector<double> rates;
    // One untimed pass first: faults in the output and warms the code.
    for (int i = -1; i < repetitions; ++i) {
      const GatherProbeBatch& batch = batches[static_cast<std::size_t>(std::max(i, 0)) % batches.size()];
      const std::int64_t bags = static_cast<std::int64_t>(batch.offsets.size()) - 1;
      const Pass p{table, spec.stride, spec.dim, &batch, out.data(), ahead};
      const double s = timed_parallel(spec.threads, [&](int t) {
        const std::int64_t b0 = bags * t / spec.threads, b1 = bags * (t + 1) / spec.threads;
        if (b1 > b0) pool(p, b0, b1);
      });
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

}  // namespace strata::bench
