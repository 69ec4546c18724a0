#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "pool.hpp"
#include "bench/workload.hpp"
#include "cache/analysis.hpp"
using namespace strata;
namespace ex = strata::cache::exp;
// usage: exp alpha variant tickfix K policy cap1,cap2.. [batches] [batch] [bag]
int main(int argc, char** argv) {
  double alpha = atof(argv[1]);
  ex::g_variant = atoi(argv[2]);
  ex::g_tickfix = atoi(argv[3]);
  int K = atoi(argv[4]);
  std::string pol = argv[5];
  std::vector<double> caps;
  for (char* p = strtok(argv[6], ","); p; p = strtok(nullptr, ",")) caps.push_back(atof(p));
  long B = argc > 7 ? atol(argv[7]) : 1000, batch = argc > 8 ? atol(argv[8]) : 1024, bag = argc > 9 ? atol(argv[9]) : 8;
  const long rows = 1000000;
  char d[64]; snprintf(d, sizeof d, "zipf:%g", alpha);
  if (argc > 10) snprintf(d, sizeof d, "%s", argv[10]);
  auto s = bench::KeySampler::create(d, rows, 42).value();
  std::vector<UniqueKeys> U(B); std::vector<Key> keys(batch * bag); DedupScratch sc;
  for (long b = 0; b < B; ++b) { s.set_step(b); s.fill(keys.data(), batch * bag); dedup_keys(keys.data(), batch * bag, U[b], sc); }
  long warm = B / 5;
  cache::Policy P = cache::parse_policy(pol).value();
  for (double f : caps) {
    ex::CachePoolOptions o; o.slots = (long)(f * rows + 0.5); o.policy = P; o.name = "x"; o.tables = {{"t", 0}};
    ex::CachePool pool(o);
    auto fk = [&](long b) { return std::vector<ex::FeatureKeys>{{0, &U[b]}}; };
    long pushed = 0, h = 0, a = 0;
    for (long j = 0; j < B; ++j) {
      for (; pushed < B && pushed <= j + K; ++pushed) pool.window_push(pushed, fk(pushed));
      auto pr = pool.probe(j, fk(j));
      if (!pr.is_ok()) { printf("infeasible\n"); return 1; }
      auto plan = pool.commit(std::move(pr).value());
      if (j >= warm) { h += plan.hits; a += plan.hits + plan.misses; }
      pool.retire(plan, true);
    }
    printf("%s alpha %g cap %g%% %s v%d tickfix%d K%d: %.2f%%\n", d, alpha, f * 100, pol.c_str(), ex::g_variant, (int)ex::g_tickfix, K, 100.0 * h / a);
    fflush(stdout);
  }
}
