#include "bench/bench_console.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

namespace strata::bench {
namespace {

/// Whether a device name from the results ("emu", "cuda <name>", "none") is the emulated device.
bool emulated(const json& device) { return device.is_string() && device.get<std::string>() == "emu"; }

// The verdict first: the placement to use and why, and which figures are measured and which modelled.
void print_verdict(const json& j) {
  const json& v = j["verdict"];
  std::printf("\nverdict: %s\n", v["headline"].get<std::string>().c_str());
  for (const auto& line : v["lines"]) std::printf("  %s\n", line.get<std::string>().c_str());
}

// Each mode's rates and step times, the phases of its training step and its all-to-all.
void print_rates(const Options& o, const json& j) {
  // The tail column is p99 only when enough timed steps back it; otherwise the maximum, so named.
  const bool p99 = static_cast<std::size_t>(o.steps) >= kStepsForP99;
  const char* tail = p99 ? "p99" : "max";
  const std::string fwd_tail = std::string("fwd ") + tail + " ms", trn_tail = std::string("trn ") + tail + " ms";
  std::printf("\n%-12s %14s %15s %12s %10s %10s %10s %10s %11s\n", "mode", "fwd lookups/s", "train lookups/s",
              "samples/s", "fwd p50 ms", fwd_tail.c_str(), "trn p50 ms", trn_tail.c_str(), "gather GB/s");
  for (const auto& m : j["results"])
    std::printf("%-12s %14.3e %15.3e %12.3e %10.2f %10.2f %10.2f %10.2f %11.2f\n", m["mode"].get<std::string>().c_str(),
                m["forward_lookups_per_s"].get<double>(), m["train_lookups_per_s"].get<double>(),
                m["samples_per_s"].get<double>(), m["forward_step_ms_p50"].get<double>(),
                m[p99 ? "forward_step_ms_p99" : "forward_step_ms_max"].get<double>(),
                m["train_step_ms_p50"].get<double>(), m[p99 ? "train_step_ms_p99" : "train_step_ms_max"].get<double>(),
                m["gather_gbs"].get<double>());
  if (!p99)
    std::printf("(%d timed steps: too few for a 99th percentile, so the slowest step is shown as max)\n", o.steps);
  const auto& res = j["results"];
  if (std::any_of(res.begin(), res.end(), [](const json& m) { return emulated(m["device"]); }))
    std::printf(
        "device modes ran on the EMULATED device (emu, no GPU): their times are this CPU running the GPU kernels' "
        "logic, not a GPU's; compare modes by their bytes per link and the modelled step times below\n");
  for (const auto& m : j["results"]) {
    const json& ph = m["train_phase_ms_p50"];
    std::printf("%-12s training step p50 by phase: submit %.2f ms, forward %.2f ms, backward+optimizer %.2f ms\n",
                m["mode"].get<std::string>().c_str(), ph["submit"].get<double>(), ph["forward"].get<double>(),
                ph["backward"].get<double>());
  }
  for (const auto& m : j["results"]) {
    if (!m.contains("dispatch")) continue;
    const json& d = m["dispatch"];
    std::printf(
        "%-12s all-to-all, rank 0 of %d (%s sharding), per step: %.2f MB sent and received (keys %.2f, rows %.2f, "
        "gradients %.2f), %.2f MB without dedup: dedup cuts %.2fx (batch duplication factor %.2fx); time: exchange "
        "%.2f ms, shard lookups %.2f ms, pooling and gradient sums at the source %.2f ms\n",
        m["mode"].get<std::string>().c_str(), d["ranks"].get<int>(), d["sharding"].get<std::string>().c_str(),
        d["bytes_per_step"]["total"].get<double>() / 1e6, d["bytes_per_step"]["keys"].get<double>() / 1e6,
        d["bytes_per_step"]["rows"].get<double>() / 1e6, d["bytes_per_step"]["grads"].get<double>() / 1e6,
        d["bytes_per_step"]["total_without_dedup"].get<double>() / 1e6, d["dedup_factor"].get<double>(),
        d["batch_duplication_factor"].get<double>(), d["ms_per_step"]["exchange"].get<double>(),
        d["ms_per_step"]["lookup"].get<double>(), d["ms_per_step"]["source"].get<double>());
  }
}

// Each mode's bytes per link and training step, and the plans that waited or rows that bypassed
// the cache.
void print_bytes(const Options& o, const json& j) {
  std::printf("\n%-12s %8s %10s %10s %10s %10s %10s %10s  (MB per training step; trainer on the %s)\n", "mode",
              "hit rate", "H2D", "D2H", "HBM read", "HBM write", "host read", "host write", trainer_name(o.trainer));
  for (const auto& m : j["results"]) {
    const json& b = m["bytes_per_step"];
    char hit[16] = "-";
    if (m["hit_rate"].is_number()) std::snprintf(hit, sizeof hit, "%.1f%%", m["hit_rate"].get<double>() * 100);
    const std::string device = m["device"].get<std::string>();
    std::printf("%-12s %8s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f  %s\n", m["mode"].get<std::string>().c_str(), hit,
                b["h2d"].get<double>() / 1e6, b["d2h"].get<double>() / 1e6, b["hbm_read"].get<double>() / 1e6,
                b["hbm_write"].get<double>() / 1e6, b["host_read"].get<double>() / 1e6,
                b["host_write"].get<double>() / 1e6, device == "none" ? "" : ("device " + device).c_str());
  }
  for (const auto& m : j["results"]) {
    // Plans that did not fit beside the rows pinned by batches in flight wait for them to retire:
    // the run is right, but its prefetch overlapped less than the pipeline allows.
    const json* c = m.contains("cache") ? &m["cache"] : nullptr;
    if (c && c->contains("deferred") && (*c)["deferred"].get<std::int64_t>() > 0)
      std::printf(
          "%-12s %lld table plans waited for batches in flight to retire (the cache is small for --pipeline %d)\n",
          m["mode"].get<std::string>().c_str(), static_cast<long long>((*c)["deferred"].get<std::int64_t>()),
          o.pipeline);
    // Rows that did not fit the cache were read and updated outside it (CacheStats::bypassed).
    if (c && c->contains("bypassed") && (*c)["bypassed"].get<std::int64_t>() > 0)
      std::printf("%-12s %lld (batch, row) lookups bypassed the cache (it is small for the batches)\n",
                  m["mode"].get<std::string>().c_str(), static_cast<long long>((*c)["bypassed"].get<std::int64_t>()));
  }
}

// The machine's limits (read bandwidth, gather limit, update floor) and each mode's fraction of them.
void print_limits(const json& j, const RunRecord& run) {
  std::printf("sequential read bandwidth (same run, %d threads): %.2f GB/s\n", run.probes.threads, run.probes.read_gbs);
  for (const GatherLimit& g : run.probes.gather_limits)
    std::printf(
        "gather limit, dim %d (%lld-byte rows, %s keys, table of %lld rows%s, %d threads): %.3e lookups/s, %.2f GB/s "
        "(median of %d passes, prefetch %d ahead)\n",
        g.dim, static_cast<long long>(g.probe.row_bytes), g.keys.c_str(), static_cast<long long>(g.probe.table_rows),
        g.folded ? ", workload tables folded in" : "", g.probe.threads, g.probe.lookups_per_s, g.probe.gb_per_s,
        g.probe.repetitions, g.probe.prefetch_distance);
  for (const auto& m : j["results"]) {
    if (!m["forward_fraction_of_gather_limit"].is_number()) continue;
    std::printf("%-12s forward at %.0f%% of the gather limit (%.3e lookups/s)", m["mode"].get<std::string>().c_str(),
                100 * m["forward_fraction_of_gather_limit"].get<double>(),
                m["gather_limit_lookups_per_s"].get<double>());
    if (m.contains("forward_fraction_of_uniform_gather_limit") &&
        m["forward_fraction_of_uniform_gather_limit"].is_number())
      std::printf(", %.0f%% of the uniform-random-row limit",
                  100 * m["forward_fraction_of_uniform_gather_limit"].get<double>());
    std::printf("\n");
  }
  for (const UpdateFloor& u : run.probes.update_floors)
    std::printf(
        "update floor, dim %d (%lld-byte records, %.0f distinct rows per batch, %d threads): %.3e rows/s, %.2f GB/s "
        "read and written (median of %d passes, prefetch %d ahead)\n",
        u.dim, static_cast<long long>(u.probe.record_bytes), u.distinct_rows_per_batch, u.probe.threads,
        u.probe.rows_per_s, u.probe.gb_per_s, u.probe.repetitions, u.probe.prefetch_distance);
  for (const auto& m : j["results"]) {
    if (!m["train_fraction_of_step_floor"].is_number()) continue;
    std::printf("%-12s training step at %.0f%% of the step floor (gather + update floors %.2f ms, step p50 %.2f ms)\n",
                m["mode"].get<std::string>().c_str(), 100 * m["train_fraction_of_step_floor"].get<double>(),
                m["train_step_floor_ms"].get<double>(), m["train_step_ms_p50"].get<double>());
  }
}

// Each mode's memory and modelled step time.
void print_memory_and_model(const json& j, const RunRecord& run) {
  std::printf("\n%-12s %12s %12s %12s %12s %12s %12s  (memory; model: per rank on %s)\n", "mode", "peak RSS",
              "RSS at start", "host tables", "peak device", "model HBM", "model host", run.profile.name.c_str());
  for (const auto& m : j["results"]) {
    const bool dev = m["device"].get<std::string>() != "none";
    const bool modelled = m.contains("memory_fit");
    const std::string fit = !modelled ? ""
                            : m["memory_fit"]["fits"].get<bool>()
                                ? "  fits"
                                : "  DOES NOT FIT: " + m["memory_fit"]["why"].get<std::string>();
    std::printf("%-12s %12s %12s %12s %12s %12s %12s%s\n", m["mode"].get<std::string>().c_str(),
                human_bytes(m["peak_host_bytes"].get<double>()).c_str(),
                human_bytes(m["host_rss_start_bytes"].get<double>()).c_str(),
                human_bytes(m["host_table_bytes"].get<double>()).c_str(),
                dev ? human_bytes(m["device_peak_bytes"].get<double>()).c_str() : "-",
                modelled ? human_bytes(m["memory_fit"]["hbm_bytes"].get<double>()).c_str() : "-",
                modelled ? human_bytes(m["memory_fit"]["host_bytes"].get<double>()).c_str() : "-", fit.c_str());
  }
  std::printf(
      "peak RSS: process peak resident memory while the mode ran%s; the emulated device's memory is host "
      "memory and counts in it\n",
      run.results.front().peak_rss_per_mode ? "" : " (not resettable here: peak since the process started)");
  std::printf(
      "model HBM, model host: what one rank of the mode's store takes by the engine model (store/model/table_cost.hpp) "
      "for every table's largest step, against %s HBM (%s) and %s host memory (%s) per rank\n",
      human_bytes(run.budgets.hbm).c_str(), run.budgets.hbm_given ? "--hbm-budget" : "the profile's",
      human_bytes(run.budgets.host).c_str(), run.budgets.host_given ? "--host-budget" : "the profile's");
  std::printf("\nmodelled on %s (byte counts of this run; see docs/bench.md):\n", run.profile.name.c_str());
  for (const auto& m : j["results"]) {
    const bool misfit = m.contains("memory_fit") && !m["memory_fit"]["fits"].get<bool>();
    std::printf("%-12s %8.2f ms  %s%s\n", m["mode"].get<std::string>().c_str(), m["modelled"]["step_ms"].get<double>(),
                m["modelled"]["explanation"].get<std::string>().c_str(),
                misfit ? ("  [does not fit: " + m["memory_fit"]["why"].get<std::string>() + "]").c_str() : "");
  }
}

// The cache sweep: hit rate and throughput against cache size.
void print_sweep(const Options& o, const json& j, const RunRecord& run) {
  if (!run.sweep.empty()) {
    std::printf("\ncache sweep: cached mode, policy %s, same batches (hit rate and throughput against cache size)\n",
                o.policy.c_str());
    std::printf("%9s %12s %10s %8s %14s %15s %10s %10s\n", "fraction", "cache rows", "cache MB", "hit rate",
                "fwd lookups/s", "train lookups/s", "trn p50 ms", "H2D MB");
    for (const auto& p : j["sweep"]) {
      if (!p["skipped"].is_null()) {
        std::printf("%9g  skipped: %s\n", p["cache_fraction"].get<double>(), p["skipped"].get<std::string>().c_str());
        continue;
      }
      std::printf("%9g %12lld %10.1f %7.1f%% %14.3e %15.3e %10.2f %10.2f%s%s\n", p["cache_fraction"].get<double>(),
                  static_cast<long long>(p["cache_rows"].get<std::int64_t>()), p["cache_bytes"].get<double>() / 1e6,
                  p["hit_rate"].get<double>() * 100, p["forward_lookups_per_s"].get<double>(),
                  p["train_lookups_per_s"].get<double>(), p["train_step_ms_p50"].get<double>(),
                  p["bytes_per_step"]["h2d"].get<double>() / 1e6, p["holds_every_touched_row"].get<bool>() ? "  *" : "",
                  p.contains("memory_fit") && !p["memory_fit"]["fits"].get<bool>()
                      ? ("  [does not fit: " + p["memory_fit"]["why"].get<std::string>() + "]").c_str()
                      : "");
    }
    const auto& pts = j["sweep"];
    if (std::any_of(pts.begin(), pts.end(), [](const json& p) { return p["holds_every_touched_row"].get<bool>(); }))
      std::printf(
          "* the cache holds every one of the %lld distinct rows the run touched: its misses are first uses only, so "
          "a larger cache cannot raise the hit rate (run more --steps, or a workload with more distinct rows, to "
          "compare such sizes)\n",
          static_cast<long long>(j["sweep_touched_rows"].get<std::int64_t>()));
  }
}

}  // namespace

void print_console(const Options& o, const json& j, const RunRecord& run) {
  print_verdict(j);
  print_rates(o, j);
  print_bytes(o, j);
  print_limits(j, run);
  print_memory_and_model(j, run);
  print_sweep(o, j, run);
}

}  // namespace strata::bench
