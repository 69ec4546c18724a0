// Micro-benchmarks of the CPU kernels: gather-pool and the fused backward update on a table much
// larger than the caches, uniform random keys. Items are lookups; bytes are row bytes touched.

#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>

#include "host/host_table.hpp"
#include "host/kernels.hpp"

namespace strata {
namespace {

constexpr std::int64_t kRows = 1 << 21;  // 2M rows: 1 GiB at dim 128
constexpr std::int64_t kBatch = 4096;
constexpr int kBag = 32;

struct Fixture {
  HostTable table;
  std::vector<std::int64_t> offsets;
  std::vector<Key> keys;
  std::vector<float> out, grads;
  UniqueKeys unique;
  std::vector<std::int32_t> bag_of;
};

Fixture& fixture(int dim) {
  static std::map<int, std::unique_ptr<Fixture>> cache;
  auto& f = cache[dim];
  if (f) return *f;
  TableSpec spec;
  spec.name = "micro";
  spec.rows = kRows;
  spec.dim = dim;
  static Topology topo = std::move(Topology::discover()).value();
  f = std::make_unique<Fixture>(Fixture{std::move(HostTable::create(topo, spec, {})).value(), {}, {}, {}, {}, {}, {}});
  std::mt19937_64 rng(1);
  f->offsets.push_back(0);
  for (std::int64_t b = 0; b < kBatch; ++b) {
    for (int i = 0; i < kBag; ++i) f->keys.push_back(static_cast<Key>(rng() % kRows));
    f->offsets.push_back(static_cast<std::int64_t>(f->keys.size()));
  }
  f->out.resize(static_cast<std::size_t>(kBatch * dim));
  f->grads.assign(f->out.size(), 0.001f);
  f->unique = dedup_keys(f->keys.data(), static_cast<std::int64_t>(f->keys.size()));
  f->bag_of = bag_of_positions(f->offsets.data(), kBatch);
  return *f;
}

void BM_GatherPoolSum(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  Fixture& f = fixture(dim);
  BagsView bags{f.offsets.data(), kBatch, f.keys.data(), nullptr};
  for (auto _ : state) {
    gather_pool(f.table.ref(), bags, Pooling::kSum, f.out.data());
    benchmark::DoNotOptimize(f.out.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(f.keys.size()));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(f.keys.size()) * dim * 4);
}
BENCHMARK(BM_GatherPoolSum)->Arg(32)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();

// Dedup of a batch's keys with reused memory, as the store does: arg 0 first-use order (one
// thread), arg 1 any order (the parallel path, on the default arena).
void BM_DedupKeys(benchmark::State& state) {
  Fixture& f = fixture(128);
  const DedupOrder order = state.range(0) ? DedupOrder::kAny : DedupOrder::kFirstUse;
  UniqueKeys u;
  DedupScratch scratch;
  for (auto _ : state) {
    dedup_keys(f.keys.data(), static_cast<std::int64_t>(f.keys.size()), u, scratch, order);
    benchmark::DoNotOptimize(u.keys.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(f.keys.size()));
  state.SetLabel(state.range(0) ? "any order" : "first-use order");
}
BENCHMARK(BM_DedupKeys)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_BackwardUpdateSgd(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  Fixture& f = fixture(dim);
  BagsView bags{f.offsets.data(), kBatch, f.keys.data(), nullptr};
  OptimizerSpec opt;
  const OptimizerStep step = make_optimizer_step(opt, 1);
  for (auto _ : state) {
    backward_update(f.table.ref(), bags, Pooling::kSum, view_of(f.unique), f.bag_of.data(), f.grads.data(), step);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(f.keys.size()));
  // Each unique row is read and written once.
  state.SetBytesProcessed(state.iterations() * f.unique.size() * dim * 4 * 2);
}
BENCHMARK(BM_BackwardUpdateSgd)->Arg(32)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace strata
