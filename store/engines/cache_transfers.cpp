#include "store/engines/cache_transfers.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>

namespace strata::detail {

using gpu::Staging;

namespace {

// Runs fn(i) for every i in [0, n) on oneTBB threads of `arena` (the store's fill arena, on its
// home node), from a host task, whose thread (an emu stream's, or CUDA's callback thread) joins it:
// isolated, so that while the stream's thread waits for the loop it takes none of the arena's other
// work (which could free memory, refused on a stream's thread: gpu/device.hpp host_task). Not the
// store's own arena: its calling thread holds a slot there while it waits for this stream.
template <class Fn>
void for_each_row(tbb::task_arena& arena, std::size_t n, const Fn& fn) {
  arena.execute([&] {
    tbb::this_task_arena::isolate([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 256), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t i = r.begin(); i < r.end(); ++i) fn(i);
      });
    });
  });
}

}  // namespace

void CacheTransfers::add_table(int table, HostTable t) { host_.emplace(table, HostTableOps(std::move(t))); }

Status CacheTransfers::map_tables() {
  for (auto& [t, ops] : host_) {
    const Status m = mapped_.add(dev_, t, ops.table().ref());
    if (!m.is_ok()) return m.with_context("table '" + ops.table().spec().name + "'");
  }
  return Status::ok();
}

float** CacheTransfers::stage_rows(Staging& st, const Pool& pool, const std::vector<cache::Transfer>& rows) const {
  auto p = st.mirrored<float*>(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i)
    p.host[i] = mapped_.row(pool.tables[static_cast<std::size_t>(rows[i].table)], rows[i].row);
  return p.dev;
}

// Moves up to kTransferProbeRows random rows of the pool's tables into its empty slots and back,
// both ways (interleaved, five times each), and says whether the zero-copy kernels took less time
// (the medians of fill + write-back). Which way wins depends on the record size, so each pool
// decides for itself. Slots are free while the store opens and write-backs write
// back the bytes just read, so the probe changes no row; its staging is freed before the store
// opens (too little device memory for it: staged). Its bytes show in the link counters.
Result<bool> CacheTransfers::zero_copy_is_faster(gpu::StreamView s, const Pool& pool) {
  // Distinct rows (no two slots write one row back), spread over each table by a stride walk
  // from a random start: row start + j * step (mod rows), step coprime with rows.
  const std::int64_t tables = static_cast<std::int64_t>(pool.tables.size());
  std::vector<cache::Transfer> rows;
  std::mt19937_64 rng(12345);
  for (std::int64_t local = 0; local < tables; ++local) {
    const std::int64_t table_rows = host_.at(pool.tables[static_cast<std::size_t>(local)]).table().rows();
    const std::int64_t want =
        std::min(table_rows, (std::min(kTransferProbeRows, pool.view.slots) + tables - 1) / tables);
    std::int64_t step = 7919 % table_rows + 1;
    while (std::gcd(step, table_rows) != 1) ++step;
    const std::int64_t start = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(table_rows));
    for (std::int64_t j = 0; j < want && static_cast<std::int64_t>(rows.size()) < pool.view.slots; ++j)
      rows.push_back(
          {static_cast<Key>(rows.size()), static_cast<int>(local), static_cast<Key>((start + j * step) % table_rows)});
  }
  const std::int64_t n = static_cast<std::int64_t>(rows.size());
  const std::size_t rec = static_cast<std::size_t>(pool.view.stride);
  STRATA_ASSIGN_OR_RETURN(Staging st, Staging::create(dev_));
  if (!st.reserve(Staging::bytes_for<Key>(rows.size()) + Staging::bytes_for<float*>(rows.size()),
                  Staging::bytes_for<float>(rows.size() * rec), Staging::bytes_for<float>(rows.size() * rec))
           .is_ok())
    return false;
  auto slots = st.mirrored<Key>(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) slots.host[i] = rows[i].slot;
  float** mapped = stage_rows(st, pool, rows);
  float* host = st.host_only<float>(rows.size() * rec);
  float* dev = st.dev_only<float>(rows.size() * rec);
  st.upload(s);
  STRATA_RETURN_IF_ERROR(dev_.synchronize(s));
  std::vector<double> staged, zero;
  for (int rep = 0; rep < 5; ++rep) {
    for (bool z : {false, true}) {
      const auto t0 = std::chrono::steady_clock::now();
      // As the engine moves rows: fills into the slots, write-backs packed then sent home.
      if (z) {
        dev_.records_from_host(s, pool.view, slots.dev, n, mapped);
      } else {
        stage_in(s, pool, rows, host, dev);
        dev_.unpack_records(s, pool.view, slots.dev, n, dev);
      }
      dev_.pack_records(s, pool.view, slots.dev, n, dev);
      send_home(s, pool, rows, dev, host, z ? mapped : nullptr);
      STRATA_RETURN_IF_ERROR(dev_.synchronize(s));
      (z ? zero : staged).push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::sort(staged.begin(), staged.end());
  std::sort(zero.begin(), zero.end());
  return zero[zero.size() / 2] < staged[staged.size() / 2];
}

void CacheTransfers::send_home(gpu::StreamView s, const Pool& pool, std::vector<cache::Transfer> rows, const float* dev,
                               float* host, float** mapped) {
  const std::int64_t W = static_cast<std::int64_t>(rows.size());
  if (mapped) {
    gpu::SlotPool packed{const_cast<float*>(dev), W, pool.view.stride, pool.view.dim, pool.view.state_dim};
    packed.dtype = pool.view.dtype;
    packed.state_dtype = pool.view.state_dtype;
    dev_.records_to_host(s, packed, nullptr, W, mapped);
    count_host(pool, rows, true);
    return;
  }
  const std::size_t rec = static_cast<std::size_t>(pool.view.stride);
  dev_.copy_d2h(s, host, dev, static_cast<std::size_t>(W) * rec * sizeof(float));
  const std::size_t bytes = static_cast<std::size_t>(pool.view.row_bytes());
  // Counted at issue, as the device counts its own work, so that a snapshot of the counters
  // never depends on how far the write-back stream has run.
  count_host(pool, rows, true);
  // The task owns the list: a discarded batch may be destroyed before the task runs.
  dev_.host_task(s, [this, &pool, rows = std::move(rows), host, rec, bytes] {
    for_each_row(fills_, rows.size(), [&](std::size_t i) {
      HostTable& t = host_.at(pool.tables[static_cast<std::size_t>(rows[i].table)]).table();
      std::memcpy(t.row(rows[i].row), host + i * rec, bytes);
    });
  });
}

void CacheTransfers::count_host(const Pool& pool, const std::vector<cache::Transfer>& rows, bool write) {
  const std::size_t bytes = static_cast<std::size_t>(pool.view.row_bytes());
  gpu::NodeBytes per_node;
  for (const cache::Transfer& x : rows)
    per_node.add(host_.at(pool.tables[static_cast<std::size_t>(x.table)]).table().node_of(x.row), bytes);
  if (write) {
    dev_.counters().add_host_writes(per_node);
  } else {
    dev_.counters().add_host_reads(per_node);
  }
}

void CacheTransfers::stage_in(gpu::StreamView s, const Pool& pool, const std::vector<cache::Transfer>& fills,
                              float* host, float* dev) {
  const std::size_t rec = static_cast<std::size_t>(pool.view.stride);
  const std::size_t bytes = static_cast<std::size_t>(pool.view.row_bytes());
  count_host(pool, fills, false);  // at issue (send_home)
  // The task owns a copy of the list: a discarded batch may be destroyed before the task runs.
  dev_.host_task(s, [this, &pool, rows = fills, host, rec, bytes] {
    for_each_row(fills_, rows.size(), [&](std::size_t i) {
      const cache::Transfer& x = rows[i];
      const HostTable& t = host_.at(pool.tables[static_cast<std::size_t>(x.table)]).table();
      std::memcpy(host + i * rec, t.row(x.row), bytes);
    });
  });
  dev_.copy_h2d(s, dev, host, fills.size() * rec * sizeof(float));
}

}  // namespace strata::detail
