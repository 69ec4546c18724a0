#include "bench/bench_probes.hpp"

#include <algorithm>
#include <unordered_set>

#include "core/record_layout.hpp"
#include "host/host_table.hpp"
#include "toolkit/workload.hpp"

namespace strata::bench {
namespace {

/// Largest gather-probe table: a workload's tables of one dim beyond this are folded into it (row
/// indices taken modulo its rows). 2 GiB is far beyond any last-level cache, and filling it takes
/// about half a second on two cores.
constexpr std::int64_t kMaxGatherProbeBytes = std::int64_t{2} << 30;
/// Timed passes of the gather probe per prefetch distance, one batch each (the first ones of the
/// run, distinct); odd, so that the median is one pass.
constexpr int kGatherProbePasses = 9;

// The bags of `batch` over the tables of `plan`'s dim, as rows of the probe table.
GatherProbeBatch probe_rows(const Options& o, const GatherProbePlan& plan, const KeyBatch& batch) {
  GatherProbeBatch pb;
  pb.offsets.push_back(0);
  for (const JaggedKeys& f : batch.features) {
    const auto base = plan.base.find(table_of(o, f.table));
    if (base == plan.base.end()) continue;
    for (std::size_t i = 1; i < f.offsets.size(); ++i)
      pb.offsets.push_back(static_cast<std::int64_t>(pb.rows.size()) + f.offsets[i]);
    for (const Key k : f.keys) pb.rows.push_back(plan.folded ? (base->second + k) % plan.rows : base->second + k);
  }
  return pb;
}

}  // namespace

std::vector<GatherProbePlan> gather_probe_plans(const Options& o) {
  const auto kind = parse_optimizer(o.optimizer);
  const auto dtype = parse_dtype(o.dtype), state_dtype = parse_dtype(o.state_dtype);
  std::vector<GatherProbePlan> plans;
  for (const TableShape& t : workload_tables(o.workload)) {
    auto it = std::find_if(plans.begin(), plans.end(), [&](const GatherProbePlan& p) { return p.dim == t.dim; });
    if (it == plans.end()) {
      GatherProbePlan p;
      p.dim = t.dim;
      const RecordShape shape{t.dim, dtype ? *dtype : DType::kF32, kind ? optimizer_state_dim(*kind, t.dim) : 0,
                              state_dtype ? *state_dtype : DType::kF32};
      p.row_floats = static_cast<std::int32_t>(row_words(shape));
      p.record_floats = static_cast<std::int32_t>(row_words(shape) + state_words(shape));
      p.stride = record_words(shape);
      it = plans.insert(plans.end(), p);
    }
    it->base[t.name] = it->rows;
    it->rows += t.rows;
  }
  for (GatherProbePlan& p : plans) {
    const std::int64_t most = std::max<std::int64_t>(1, kMaxGatherProbeBytes / (p.stride * 4));
    if (p.rows > most) {
      p.rows = most;
      p.folded = true;
    }
  }
  return plans;
}

Result<std::vector<GatherLimit>> measure_gather_limits(const Options& o, const std::vector<KeyBatch>& batches,
                                                       int threads) {
  std::vector<GatherLimit> limits;
  const bool uniform = o.workload.dist == "uniform" && o.trace_file.empty() && o.criteo_file.empty();
  for (const GatherProbePlan& plan : gather_probe_plans(o)) {
    std::vector<GatherProbeBatch> own, rnd;
    STRATA_ASSIGN_OR_RETURN(KeySampler sampler, KeySampler::create("uniform", plan.rows, o.workload.seed ^ 0x5eedull));
    const std::size_t n = std::min<std::size_t>(batches.size(), kGatherProbePasses);
    for (std::size_t b = 0; b < n; ++b) {
      GatherProbeBatch pb = probe_rows(o, plan, batches[b]);
      if (!uniform) {
        GatherProbeBatch u{pb.offsets, std::vector<std::int64_t>(pb.rows.size())};
        sampler.fill(u.rows.data(), static_cast<std::int64_t>(u.rows.size()));
        rnd.push_back(std::move(u));
      }
      own.push_back(std::move(pb));
    }
    const GatherProbeSpec spec{plan.row_floats, plan.stride, plan.rows, threads};
    STRATA_ASSIGN_OR_RETURN(GatherProbeResult r, measure_gather_limit(spec, own, kGatherProbePasses));
    limits.push_back({r, plan.dim, "workload", plan.folded});
    if (!uniform) {
      STRATA_ASSIGN_OR_RETURN(GatherProbeResult u, measure_gather_limit(spec, rnd, kGatherProbePasses));
      limits.push_back({u, plan.dim, "uniform", plan.folded});
    }
  }
  return limits;
}

Result<std::vector<UpdateFloor>> measure_update_floors(const Options& o, const std::vector<KeyBatch>& batches,
                                                       int threads) {
  std::vector<UpdateFloor> floors;
  for (const GatherProbePlan& plan : gather_probe_plans(o)) {
    std::vector<std::vector<std::int64_t>> passes;
    double distinct = 0;
    const std::size_t n = std::min<std::size_t>(batches.size(), kGatherProbePasses);
    for (std::size_t b = 0; b < n; ++b) {
      const GatherProbeBatch pb = probe_rows(o, plan, batches[b]);
      std::unordered_set<std::int64_t> seen(pb.rows.size());
      std::vector<std::int64_t> rows;
      for (const std::int64_t r : pb.rows)
        if (seen.insert(r).second) rows.push_back(r);
      distinct += static_cast<double>(rows.size());
      if (!rows.empty()) passes.push_back(std::move(rows));
    }
    if (passes.empty()) continue;
    const UpdateProbeSpec spec{plan.record_floats, plan.stride, plan.rows, threads};
    STRATA_ASSIGN_OR_RETURN(UpdateProbeResult r, measure_update_limit(spec, passes, kGatherProbePasses));
    floors.push_back({r, plan.dim, distinct / static_cast<double>(n)});
  }
  return floors;
}

json update_floors_json(const std::vector<UpdateFloor>& floors) {
  json a = json::array();
  for (const UpdateFloor& u : floors)
    a.push_back({{"dim", u.dim},
                 {"record_bytes", u.probe.record_bytes},
                 {"table_rows", u.probe.table_rows},
                 {"table_bytes", u.probe.table_bytes},
                 {"threads", u.probe.threads},
                 {"passes", u.probe.repetitions},
                 {"statistic", "median"},
                 {"prefetch_distance", u.probe.prefetch_distance},
                 {"distinct_rows_per_batch", u.distinct_rows_per_batch},
                 {"rows_per_s", u.probe.rows_per_s},
                 {"gb_per_s", u.probe.gb_per_s},
                 {"best_rows_per_s", u.probe.best_rows_per_s}});
  return a;
}

// The forward rate, in lookups/s, of a step that reads each key's row at the probe's rate for its
// dim: keys / sum over dims of (keys of that dim / limit of that dim), on the first batch (every
// batch has the same shape). 0 when a dim has no limit of kind `keys`.
double step_gather_limit(const Options& o, const std::vector<GatherLimit>& limits, const KeyBatch& batch,
                         const std::string& keys) {
  std::map<std::string, int> dim_of;
  for (const TableShape& t : workload_tables(o.workload)) dim_of[t.name] = t.dim;
  double total = 0, seconds = 0;
  for (const JaggedKeys& f : batch.features) {
    const int dim = dim_of[table_of(o, f.table)];
    const auto l = std::find_if(limits.begin(), limits.end(),
                                [&](const GatherLimit& g) { return g.dim == dim && g.keys == keys; });
    if (l == limits.end() || l->probe.lookups_per_s <= 0) return 0;
    total += static_cast<double>(f.keys.size());
    seconds += static_cast<double>(f.keys.size()) / l->probe.lookups_per_s;
  }
  return seconds > 0 ? total / seconds : 0;
}

// The floor of a training step in seconds: every key's row gathered at its dim's gather limit
// (keys "workload", on the first batch) plus every distinct row of a batch updated once at its
// dim's update floor. 0 when a dim has no measurement.
double step_floor_s(const Options& o, const std::vector<GatherLimit>& limits, const std::vector<UpdateFloor>& floors,
                    const KeyBatch& batch) {
  const double lookups = static_cast<double>(batch.total_keys());
  const double gather = step_gather_limit(o, limits, batch, "workload");
  if (gather <= 0 || floors.empty()) return 0;
  double seconds = lookups / gather;
  for (const GatherProbePlan& plan : gather_probe_plans(o)) {
    const auto f = std::find_if(floors.begin(), floors.end(), [&](const UpdateFloor& u) { return u.dim == plan.dim; });
    if (f == floors.end() || f->probe.rows_per_s <= 0) return 0;
    seconds += f->distinct_rows_per_batch / f->probe.rows_per_s;
  }
  return seconds;
}

json gather_limits_json(const std::vector<GatherLimit>& limits) {
  json a = json::array();
  for (const GatherLimit& g : limits)
    a.push_back({{"dim", g.dim},
                 {"row_bytes", g.probe.row_bytes},
                 {"keys", g.keys},
                 {"table_rows", g.probe.table_rows},
                 {"table_bytes", g.probe.table_bytes},
                 {"folded", g.folded},
                 {"threads", g.probe.threads},
                 {"passes", g.probe.repetitions},
                 {"statistic", "median"},
                 {"prefetch_distance", g.probe.prefetch_distance},
                 {"lookups_per_s", g.probe.lookups_per_s},
                 {"gb_per_s", g.probe.gb_per_s},
                 {"best_lookups_per_s", g.probe.best_lookups_per_s}});
  return a;
}

}  // namespace strata::bench
