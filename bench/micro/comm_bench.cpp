// Micro-benchmark of the `local` communicator: an all-to-all among N thread ranks (each rank sends
// `message` bytes to every rank, itself included) against one memcpy of the same total bytes
// (N * N * message) on one thread, measured in the same binary. bytes_per_second is that total
// over wall time. At the end a table gives, per configuration, both rates and their ratio (the
// median of the repetitions when --benchmark_repetitions is given, else the single run).
// The target of issue 4: ratio >= 0.5 for messages of 1 MiB and more.
//
//   strata-micro-comm --benchmark_repetitions=5

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dispatch/local_communicator.hpp"

namespace strata::dispatch {
namespace {

// Buffers of one rank, touched once so that page faults stay out of the timing.
struct RankBuffers {
  std::vector<char> send, recv;
  std::vector<std::int64_t> counts, displs;
  RankBuffers(int n, std::int64_t message)
      : send(static_cast<std::size_t>(n * message), 1),
        recv(static_cast<std::size_t>(n * message), 0),
        counts(n, message),
        displs(n) {
    for (int r = 0; r < n; ++r) displs[r] = r * message;
  }
  Status exchange(Communicator& c) {
    return c.all_to_all_v(send.data(), counts.data(), displs.data(), recv.data(), counts.data(), displs.data());
  }
};

void BM_LocalAllToAll(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const std::int64_t message = state.range(1);
  auto comms = make_local_group(n).value();
  std::vector<RankBuffers> buffers;
  for (int r = 0; r < n; ++r) buffers.emplace_back(n, message);
  // Rank 0 is the benchmark's thread; the others run the same number of calls on their own threads
  // (the state loop runs exactly max_iterations times), plus the same warm-up call.
  const benchmark::IterationCount iterations = state.max_iterations;
  std::atomic<bool> failed{false};
  std::vector<std::thread> peers;
  for (int r = 1; r < n; ++r) {
    peers.emplace_back([&, r] {
      for (benchmark::IterationCount i = 0; i <= iterations; ++i) {
        if (!buffers[r].exchange(*comms[r]).is_ok()) {
          failed = true;
          return;
        }
      }
    });
  }
  Status s = buffers[0].exchange(*comms[0]);  // warm-up
  for (auto _ : state) {
    if (s.is_ok()) s = buffers[0].exchange(*comms[0]);
  }
  for (auto& t : peers) t.join();
  if (!s.is_ok() || failed) state.SkipWithError(("all_to_all_v failed: " + s.to_string()).c_str());
  state.SetBytesProcessed(state.iterations() * n * n * message);
  state.counters["ranks"] = n;
}

void BM_Memcpy(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const std::int64_t total = n * n * state.range(1);
  std::vector<char> from(static_cast<std::size_t>(total), 1), to(static_cast<std::size_t>(total), 0);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), static_cast<std::size_t>(total));
    benchmark::DoNotOptimize(to.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * total);
  state.counters["ranks"] = n;
}

void configurations(benchmark::internal::Benchmark* b) {
  for (int n : {2, 4}) {
    for (std::int64_t message = 64 << 10; message <= (16 << 20); message *= 4) b->Args({n, message});
  }
  b->ArgNames({"ranks", "message"})->UseRealTime();
}

BENCHMARK(BM_LocalAllToAll)->Apply(configurations);
BENCHMARK(BM_Memcpy)->Apply(configurations);

// The console output, plus a table of all-to-all vs memcpy at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  // Colours only on a terminal (the library's own --benchmark_color applies to its default
  // reporter, not to this one).
  RatioReporter() : ConsoleReporter(::isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
      if (!median && !single) continue;
      auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      int ranks = 0;
      long long message = 0;
      if (std::sscanf(run.run_name.args.c_str(), "ranks:%d/message:%lld", &ranks, &message) != 2) continue;
      rates_[{ranks, message}][run.run_name.function_name] = it->second.value;
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\nlocal all-to-all vs one memcpy of the same bytes (median of the repetitions, or the single run)\n");
    std::printf("%5s %10s %12s %16s %14s %7s\n", "ranks", "message", "total bytes", "all-to-all GiB/s", "memcpy GiB/s",
                "ratio");
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    for (const auto& [key, by_name] : rates_) {
      auto a = by_name.find("BM_LocalAllToAll");
      auto m = by_name.find("BM_Memcpy");
      if (a == by_name.end() || m == by_name.end()) continue;
      const long long total = static_cast<long long>(key.first) * key.first * key.second;
      std::printf("%5d %9lldK %11lldK %16.2f %14.2f %7.2f\n", key.first, key.second >> 10, total >> 10,
                  a->second / kGiB, m->second / kGiB, a->second / m->second);
    }
  }

 private:
  std::map<std::pair<int, long long>, std::map<std::string, double>>
      rates_;  // (ranks, message) -> benchmark -> bytes/s
};

}  // namespace
}  // namespace strata::dispatch

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  strata::dispatch::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
