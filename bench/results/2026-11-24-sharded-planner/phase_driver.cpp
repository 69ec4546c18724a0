// Driver of this session: times window_push, probe, commit and retire of a cache::ShardedPool.
// Usage: phase_driver POLICY(0 lru, 1 lfu, 2 lookahead) CACHE_FRACTION SHARDS. Build against a
// default build tree (from the repository root):
//   B=build/default; g++ -std=c++17 -O2 -march=native -I. bench/results/2026-11-24-sharded-planner/phase_driver.cpp \
//     $B/bench/libstrata_bench_lib.a $B/cache/libstrata_cache.a $B/gpu/libstrata_gpu.a $B/host/libstrata_host.a \
//     $B/core/libstrata_core.a -ltbb -lhwloc -ljemalloc -lpthread -o /tmp/phase_driver
// (with the CUDA backend built, add -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt).
#include <chrono>
#include <cstdio>
#include "bench/workload.hpp"
#include "cache/sharded_pool.hpp"
#include "host/dedup.hpp"
using namespace strata;
int main(int argc, char** argv) {
  int pol = atoi(argv[1]); double frac = atof(argv[2]); int S = atoi(argv[3]);
  const int64_t rows = 1000000, bags = 4096, bag = 8; const int NB = 256; const int K = 4;
  auto s = bench::KeySampler::create("zipf:1.05", rows, 42);
  std::vector<std::vector<Key>> raw(NB); std::vector<UniqueKeys> u(NB);
  for (int i = 0; i < NB; ++i) { raw[i].resize(bags*bag); s.value().fill(raw[i].data(), bags*bag); u[i] = dedup_keys(raw[i].data(), bags*bag); }
  cache::CachePoolOptions o; o.slots = int64_t(frac*rows); o.policy = (cache::Policy)pol; o.record_bytes=256; o.window = K+1;
  o.name="b"; o.tables={{"t",0}};
  cache::ShardedPool pool(o, S);
  auto fk = [&](int64_t q){ return std::vector<cache::FeatureKeys>{{0,&u[q%NB]}}; };
  int64_t pushed = 0, seq = 0;
  for (; pushed < K; ++pushed) pool.window_push(pushed, fk(pushed));
  double t[4] = {0,0,0,0};
  using C = std::chrono::steady_clock;
  int N = 256*6;
  for (int it = 0; it < N; ++it) {
    auto a = C::now(); pool.window_push(pushed, fk(pushed)); ++pushed;
    auto b = C::now(); auto p = pool.probe(seq, fk(seq));
    auto c = C::now(); auto plan = pool.commit(std::move(p).value());
    auto d = C::now(); pool.retire(plan, true);
    auto e = C::now(); ++seq;
    if (it >= 256) { t[0] += std::chrono::duration<double,std::micro>(b-a).count(); t[1] += std::chrono::duration<double,std::micro>(c-b).count();
      t[2] += std::chrono::duration<double,std::micro>(d-c).count(); t[3] += std::chrono::duration<double,std::micro>(e-d).count(); }
  }
  int n = N - 256;
  printf("S=%d push %.0f probe %.0f commit %.0f retire %.0f total %.0f us\n", S, t[0]/n, t[1]/n, t[2]/n, t[3]/n, (t[0]+t[1]+t[2]+t[3])/n);
}
