#pragma once
// Helpers the machine probes share (the sequential read probe in workload.cpp, the gather and
// update probes in gather_probe.cpp): a buffer laid out as the store lays out its host tables,
// and clocks around work done by several threads at once.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace strata::bench {

struct FreeDeleter {
  void operator()(void* p) const noexcept { std::free(p); }
};

/// `bytes` of uninitialised memory aligned to 2 MiB and advised for transparent huge pages (as the
/// store's host tables are; a hint whose failure is harmless); null when it cannot be allocated.
inline std::unique_ptr<void, FreeDeleter> alloc_huge_buffer(std::size_t bytes) {
  constexpr std::size_t kAlign = std::size_t{2} << 20;  // 2 MiB: lets the kernel use huge pages
  const std::size_t alloc_bytes = (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  std::unique_ptr<void, FreeDeleter> mem(std::aligned_alloc(kAlign, alloc_bytes));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (mem) (void)madvise(mem.get(), alloc_bytes, MADV_HUGEPAGE);
#endif
  return mem;
}

/// Runs fn(thread_index) on `threads` threads started before the clock and released together;
/// returns the seconds from release until all have finished.
template <typename Fn>
double timed_parallel(int threads, Fn fn) {
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1, std::memory_order_acq_rel);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      fn(t);
    });
  }
  while (ready.load(std::memory_order_acquire) < threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Runs fn(begin, end) over [0, n) in ranges of about `grain` items on `arena`'s threads, with
/// oneTBB's work stealing (as the host kernels run: persistent workers, tasks balanced between
/// them, so one slow core does not hold up a statically split pass); returns the seconds it took.
template <typename Fn>
double timed_tbb(tbb::task_arena& arena, std::int64_t n, std::int64_t grain, Fn fn) {
  const auto t0 = std::chrono::steady_clock::now();
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, std::max<std::int64_t>(1, grain)),
                      [&](const tbb::blocked_range<std::int64_t>& r) { fn(r.begin(), r.end()); });
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace strata::bench
