#include "gpu/kernels/host_grid.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "gpu/kernels/bodies.hpp"

namespace strata::gpu::kernels {
namespace {

// Warps per task: enough to amortise scheduling; the items of a launch are bags, rows or records.
constexpr std::int64_t kGrain = 16;

template <class Item>
void for_items(std::int64_t items, std::int64_t grain, Item item) {
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, items, grain), [&](const tbb::blocked_range<std::int64_t>& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i) item(i);
  });
}

}  // namespace

void run_gather(const GatherArgs& a) {
  const HostWarp w;
  if (a.source.dtype != DType::kF32) {  // the cuda backend's gather_half_kernel: any source
    with_half_elem(a.source.dtype, [&](auto row) {
      for_items(a.begin[a.count], kGrain, [&](std::int64_t i) { gather_item<true, true, decltype(row)>(w, a, i); });
    });
  } else if (a.source.parts > 1) {
    for_items(a.begin[a.count], kGrain, [&](std::int64_t i) { gather_item<true, false, float>(w, a, i); });
  } else if (a.source.overflow) {  // the cuda backend's gather_overflow_kernel
    for_items(a.begin[a.count], kGrain, [&](std::int64_t i) { gather_item<false, true, float>(w, a, i); });
  } else {
    for_items(a.begin[a.count], kGrain, [&](std::int64_t i) { gather_item<false, false, float>(w, a, i); });
  }
}

namespace {
// The hot rows' segments (UpdateArgs::partials), which the row items of the same launch read: the
// cuda backend's hot_segment_kernel, before the launch's other kernel. Most items of a feature
// with few hot rows end after their search, so a task takes several.
void run_segments(const UpdateArgs& a) {
  const HostWarp w;
  for_items(a.segment_items(), 4, [&](std::int64_t i) { hot_segment_item(w, a, i); });
}
}  // namespace

void run_update(const UpdateArgs& a) {
  run_segments(a);
  const HostWarp w;
  const std::int64_t items = a.begin[a.count];
  if (a.dtype != DType::kF32 || a.state_dtype != DType::kF32) {  // the cuda backend's update_half_kernel
    with_half_elems(a.dtype, a.state_dtype, [&](auto row, auto state) {
      for_items(items, kGrain, [&](std::int64_t i) { update_item<true, decltype(row), decltype(state)>(w, a, i); });
    });
  } else if (a.overflow) {  // the cuda backend's update_overflow_kernel
    for_items(items, kGrain, [&](std::int64_t i) { update_item<true, float, float>(w, a, i); });
  } else {
    for_items(items, kGrain, [&](std::int64_t i) { update_item<false, float, float>(w, a, i); });
  }
}

void run_reduce(const UpdateArgs& a) {
  run_segments(a);
  const HostWarp w;
  for_items(a.begin[a.count], kGrain, [&](std::int64_t i) { reduce_item(w, a, i); });
}

void run_records(const RecordArgs& a, bool unpack) {
  const HostWarp w;
  if (unpack) {
    for_items(a.n, 64, [&](std::int64_t i) { unpack_record(w, a, i); });
  } else {
    for_items(a.n, 64, [&](std::int64_t i) { pack_record(w, a, i); });
  }
}

void run_host_records(const HostRecordArgs& a, bool to_host) {
  const HostWarp w;
  for_items(a.n, 64, [&](std::int64_t i) { move_host_record(w, a, i, to_host); });
}

void run_init(const InitArgs& a) {
  const HostWarp w;
  for_items(a.n, 64, [&](std::int64_t i) { init_record(w, a, i); });
}

void run_nonfinite(const FiniteArgs& a) {
  const HostWarp w;
  for_items(a.begin[a.count], 4, [&](std::int64_t i) { count_nonfinite_chunk(w, a, i); });
  for (int f = 0; f < a.count; ++f) sum_nonfinite(w, a, f);
}

}  // namespace strata::gpu::kernels
