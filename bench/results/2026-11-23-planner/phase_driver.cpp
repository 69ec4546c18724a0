// Throwaway driver of this session: times window_push, probe, commit and retire of the planner
// separately. Usage: phase_driver POLICY(0 lru, 1 lfu, 2 lookahead) CACHE_FRACTION [WINDOW=4].
// Build against a default build tree (from the repository root):
//   B=build/default; g++ -std=c++17 -O2 -march=native -I. bench/results/2026-11-23-planner/phase_driver.cpp \
//     $B/bench/libstrata_bench_lib.a $B/cache/libstrata_cache.a $B/host/libstrata_host.a $B/core/libstrata_core.a \
//     -ltbb -lhwloc -ljemalloc -lpthread -o /tmp/phase_driver   (add -DBEFORE_3EFE866 for older trees)
#include <chrono>
#include <cstdio>
#include "bench/workload.hpp"
#include "cache/cache_pool.hpp"
#include "host/dedup.hpp"
using namespace strata;
int main(int argc, char** argv) {
  int pol = atoi(argv[1]); double frac = atof(argv[2]);
  const int64_t rows = 1000000, bags = 4096, bag = 8; const int NB = 256; const int K = argc > 3 ? atoi(argv[3]) : 4;
  auto s = bench::KeySampler::create("zipf:1.05", rows, 42);
  std::vector<std::vector<Key>> raw(NB); std::vector<UniqueKeys> u(NB);
  for (int i = 0; i < NB; ++i) { raw[i].resize(bags*bag); s.value().fill(raw[i].data(), bags*bag); u[i] = dedup_keys(raw[i].data(), bags*bag); }
  cache::CachePoolOptions o; o.slots = int64_t(frac*rows); o.policy = (cache::Policy)pol; o.record_bytes=256;
#ifndef BEFORE_3EFE866
  o.window = K + 1;  // CachePoolOptions::window (3efe866 and later)
#endif
  o.name="b"; o.tables={{"t",0}};
  cache::CachePool pool(o);
  auto fk = [&](int64_t q){ return std::vector<cache::FeatureKeys>{{0,&u[q%NB]}}; };
  int64_t pushed = 0, seq = 0;
  for (; pushed < K; ++pushed) pool.window_push(pushed, fk(pushed));
  double t[4] = {0,0,0,0}; int64_t uniq = 0;
  using C = std::chrono::steady_clock;
  for (int it = 0; it < 256*8; ++it) {
    auto a = C::now(); pool.window_push(pushed, fk(pushed)); ++pushed;
    auto b = C::now(); auto pr = pool.probe(seq, fk(seq));
    auto c = C::now(); auto plan = pool.commit(std::move(pr).value());
    auto d = C::now(); pool.retire(plan, true);
    auto e = C::now();
    if (it >= 256) { t[0]+= (b-a).count(); t[1]+=(c-b).count(); t[2]+=(d-c).count(); t[3]+=(e-d).count(); uniq += u[seq%NB].size(); }
    ++seq;
  }
  double n = 256*7; double tot = (t[0]+t[1]+t[2]+t[3])/n/1e3;
  printf("pol %d frac %.2f: push %.0f probe %.0f commit %.0f retire %.0f us; total %.0f us; %.2f M/s\n", pol, frac, t[0]/n/1e3, t[1]/n/1e3, t[2]/n/1e3, t[3]/n/1e3, tot, uniq/n/tot);
}
