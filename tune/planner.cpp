#include "tune/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include "tune/shard_traces.hpp"
#include "tune/text.hpp"

namespace strata::tune {
namespace {

bool several(const PlanOptions& o) { return o.cost.ranks > 1; }

// The tables' specs as a plan sets them (TableSpec::dtype), in input order.
using Specs = std::vector<TableSpec>;

// The input's specs with PlanOptions::dtype applied (--dtype auto starts from these too).
Specs plan_specs(const TuneInput& input, const PlanOptions& o) {
  Specs specs;
  for (const TableTrace& t : input.tables) {
    specs.push_back(t.spec);
    if (o.dtype) specs.back().dtype = *o.dtype;
  }
  return specs;
}

// The placement a table leaves the GPU to first: cpu (one rank), hybrid with its smallest cache
// (several ranks).
Placement off_placement(const PlanOptions& o) { return several(o) ? Placement::kHybrid : Placement::kCpu; }

// The load of table t (mean distinct rows per step: with `exact_distinct`, else every key counted
// as distinct, before the curves); several ranks: the worst shard's distinct rows per step and
// most of one step (exact from the shard traces).
TableLoad load_of(const TuneInput& input, std::size_t t, const ShardInputs& shards, bool exact_distinct) {
  const TableTrace& tr = input.tables[t];
  TableLoad l;
  l.keys = tr.keys_per_step();
  l.bags = tr.bags_per_step();
  l.distinct = exact_distinct ? tr.distinct_per_step() : l.keys;
  l.max_keys = tr.max_keys;
  for (const std::int64_t b : tr.step_bags) l.max_bags = std::max(l.max_bags, b);
  l.max_distinct = tr.max_distinct;
  if (tr.features.size() > 1) {  // served as the plan lists them, each with the table's pooling
    TableConfig tc;
    tc.spec = tr.spec;
    for (const std::string& f : tr.features) tc.features.push_back({f, std::nullopt});
    l.features = static_cast<int>(tr.features.size());
    for (std::int64_t b = 0; b < static_cast<std::int64_t>(tr.step_bags.size()); ++b) {
      const std::int64_t rows = step_feature_rows(tr, tc, b);
      l.feature_rows += static_cast<double>(rows) / static_cast<double>(tr.step_bags.size());
      l.max_feature_rows = std::max(l.max_feature_rows, rows);
    }
  }
  if (t < shards.traces.size()) {
    for (const TableTrace& s : shards.traces[t]) {
      l.shard_distinct = std::max(l.shard_distinct, s.distinct_per_step());
      l.shard_max_distinct = std::max(l.shard_max_distinct, s.max_distinct);
    }
    l.shard_max_served = max_served(tr, static_cast<int>(shards.traces[t].size()), input.sample_rate);
  }
  return l;
}

std::vector<TableLoad> loads_of(const TuneInput& input, const ShardInputs& shards, bool exact_distinct) {
  std::vector<TableLoad> loads;
  for (std::size_t t = 0; t < input.tables.size(); ++t) loads.push_back(load_of(input, t, shards, exact_distinct));
  return loads;
}

// The loads a plan prices: exact distinct rows, the most of one step from the curves.
std::vector<TableLoad> plan_loads(const TuneInput& input, const std::vector<HitCurve>& curves,
                                  const ShardInputs& shards) {
  std::vector<TableLoad> loads = loads_of(input, shards, true);
  for (std::size_t t = 0; t < loads.size(); ++t) loads[t].max_distinct = curves[t].min_rows;
  return loads;
}

// The smallest hybrid cache of a table (rows per rank): one world step of its fullest shard.
std::int64_t smallest_cache(const TableLoad& l) { return std::max<std::int64_t>(1, l.shard_max_distinct); }

// Memory of each table as gpu and in its least-HBM placement off the GPU (off_placement).
struct Split {
  std::vector<double> gpu_hbm, gpu_host, off_hbm, off_host;
};

Result<Split> split_of(const Specs& specs, const std::vector<TableLoad>& loads, const PlanOptions& o) {
  Split s;
  for (std::size_t t = 0; t < specs.size(); ++t) {
    const TableSpec& spec = specs[t];
    STRATA_ASSIGN_OR_RETURN(const TableCost g, table_cost(spec, loads[t], Placement::kGpu, 0, 0, o.cost));
    STRATA_ASSIGN_OR_RETURN(const TableCost c,
                            table_cost(spec, loads[t], off_placement(o), smallest_cache(loads[t]), 0, o.cost));
    s.gpu_hbm.push_back(g.hbm_bytes);
    s.gpu_host.push_back(g.host_bytes);
    s.off_hbm.push_back(c.hbm_bytes);
    s.off_host.push_back(c.host_bytes);
  }
  return s;
}

// Tables coldest first: fewest distinct rows per step per byte of HBM as gpu, the larger first on ties, then by name.
std::vector<std::size_t> coldest_first(const TuneInput& input, const std::vector<TableLoad>& loads, const Split& s) {
  std::vector<std::size_t> order(input.tables.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double ha = loads[a].distinct / s.gpu_hbm[a], hb = loads[b].distinct / s.gpu_hbm[b];
    if (ha != hb) return ha < hb;
    if (s.gpu_hbm[a] != s.gpu_hbm[b]) return s.gpu_hbm[a] > s.gpu_hbm[b];
    return input.tables[a].spec.name < input.tables[b].spec.name;
  });
  return order;
}

// The fewest coldest tables that leave the GPU so both budgets hold (-1: none), and the smallest
// feasible budgets for the message when there is none.
struct Cut {
  int leave = -1;
  double min_host_for_hbm = 0;  // smallest host budget with the given HBM budget
  double min_hbm_for_host = 0;  // smallest HBM budget with the given host budget
};

Cut find_cut(const std::vector<std::size_t>& order, const Split& s, const PlanOptions& o) {
  Cut cut;
  const std::size_t n = order.size();
  double hbm = std::accumulate(s.gpu_hbm.begin(), s.gpu_hbm.end(), 0.0);
  double host = std::accumulate(s.gpu_host.begin(), s.gpu_host.end(), 0.0);
  cut.min_host_for_hbm = -1;
  cut.min_hbm_for_host = -1;
  const auto lower = [](double& best, double v) { best = best < 0 ? v : std::min(best, v); };
  for (std::size_t k = 0;; ++k) {
    if (hbm <= o.hbm_budget_bytes) lower(cut.min_host_for_hbm, host);
    if (host <= o.host_budget_bytes) lower(cut.min_hbm_for_host, hbm);
    if (cut.leave < 0 && hbm <= o.hbm_budget_bytes && host <= o.host_budget_bytes) cut.leave = static_cast<int>(k);
    if (k == n) break;
    hbm += s.off_hbm[order[k]] - s.gpu_hbm[order[k]];
    host += s.off_host[order[k]] - s.gpu_host[order[k]];
  }
  return cut;
}

// A smallest feasible budget, or "none" when no budget of that kind suffices with the other one.
std::string budget_text(double bytes) { return bytes < 0 ? std::string("none") : bytes_text(bytes); }

Status infeasible(const Cut& cut, const PlanOptions& o, std::size_t tables) {
  const std::string per = several(o) ? " per rank" : "";
  const std::string over = several(o) ? " over " + std::to_string(o.cost.ranks) + " ranks (gpu or hybrid, " : " (";
  return Status::invalid_argument(
      "budgets too small: --hbm-budget " + bytes_text(o.hbm_budget_bytes) + per + " and --host-budget " +
      bytes_text(o.host_budget_bytes) + per + " hold no placement of the " + std::to_string(tables) + " tables" + over +
      "coldest off the GPU first); smallest feasible" + per + ": --host-budget " + budget_text(cut.min_host_for_hbm) +
      " with this HBM budget, or --hbm-budget " + budget_text(cut.min_hbm_for_host) + " with this host budget");
}

Status check_options(const PlanOptions& o) {
  if (!(o.hbm_budget_bytes >= 0) || !std::isfinite(o.hbm_budget_bytes))
    return Status::invalid_argument("--hbm-budget " + bytes_text(o.hbm_budget_bytes) + " (expected >= 0)");
  if (!(o.host_budget_bytes >= 0) || !std::isfinite(o.host_budget_bytes))
    return Status::invalid_argument("--host-budget " + bytes_text(o.host_budget_bytes) + " (expected >= 0)");
  if (o.cost.max_in_flight < 1)
    return Status::invalid_argument("--max-in-flight " + std::to_string(o.cost.max_in_flight) + " (expected >= 1)");
  if (o.cost.ranks < 1) return Status::invalid_argument("--ranks " + std::to_string(o.cost.ranks) + " (expected >= 1)");
  return Status::ok();
}

// Several ranks need every table's shards: traces (and curves when `curves`), one per rank.
Status check_shards(const TuneInput& input, const PlanOptions& o, const ShardInputs& shards, bool curves) {
  if (!several(o)) return Status::ok();
  const std::size_t n = input.tables.size(), r = static_cast<std::size_t>(o.cost.ranks);
  bool ok = shards.traces.size() == n && (!curves || shards.curves.size() == n);
  for (std::size_t t = 0; ok && t < n; ++t)
    ok = shards.traces[t].size() == r && (!curves || shards.curves[t].size() == r);
  if (ok) return Status::ok();
  return Status::invalid_argument("plan over " + std::to_string(r) + " ranks: expected the shards of each of the " +
                                  std::to_string(n) + " tables over every rank (shard_traces" +
                                  (curves ? " and their curves)" : ")"));
}

// One option of a table that left the GPU.
struct Option {
  Placement placement;
  std::int64_t cache_rows = 0;
  double hit_rate = -1;
  TableCost cost;
};

struct Evaluation {
  double objective = 0;
  double hbm = 0, host = 0;
  ModelledStep step;
};

// Where a plan puts each rank's host tier (its config's `numa`): the store's default, on the GPU's
// node wherever the store has a device (a table other than cpu).
constexpr NumaPolicy kPlanNuma = NumaPolicy::kAuto;

// The model options of a plan over `ranks` ranks whose store has a device or not.
ModelOptions plan_model(const HardwareProfile& profile, int ranks, bool has_device) {
  return model_options(profile, ranks, kPlanNuma, has_device);
}

// The objective of a modelled step: its time plus 1% of the serial sum (rule 3).
double objective(const ModelledStep& step) { return step.step_s + 0.01 * step.serial_s; }

Evaluation evaluate(const std::vector<const TableCost*>& costs, const HardwareProfile& profile,
                    const ModelOptions& model) {
  Evaluation e;
  StepBytes total;
  for (const TableCost* c : costs) {
    add_bytes(total, c->bytes);
    e.hbm += c->hbm_bytes;
    e.host += c->host_bytes;
  }
  e.step = model_step(profile, total, model);
  e.objective = objective(e.step);
  return e;
}

// The LRU hit rate of a hybrid cache of `rows` rows per rank: its worst shard's.
double shard_hit_rate(const std::vector<HitCurve>& shards, std::int64_t rows) {
  double h = 1.0;
  bool any = false;
  for (const HitCurve& c : shards)
    if (c.rows > 0) {
      h = std::min(h, c.hit_rate(rows));
      any = true;
    }
  return any ? h : 0.0;
}

// The cache options of a table: one rank, a cache of the table's rows (`curves[t]`); several
// ranks, a cache per rank of its shard (the shards' curves, the worst shard's hit rate).
struct CacheCurve {
  const HitCurve* whole = nullptr;
  const std::vector<HitCurve>* shards = nullptr;
  std::int64_t min_rows = 1;  ///< the smallest cache
  std::int64_t rows = 1;      ///< rows a cache is set against (the table, or the largest shard)
  std::int64_t knee = 1;      ///< where the LRU rate stops rising
  double hit_rate(std::int64_t r) const { return shards ? shard_hit_rate(*shards, r) : whole->hit_rate(r); }
};

CacheCurve cache_curve(std::size_t t, const TableSpec& spec, const TableLoad& load, const std::vector<HitCurve>& curves,
                       const ShardInputs& shards, const PlanOptions& o) {
  CacheCurve c;
  if (!several(o)) {
    c.whole = &curves[t];
    c.min_rows = std::max<std::int64_t>(1, curves[t].min_rows);
    c.rows = spec.rows;
    c.knee = curves[t].saturation_rows();
    return c;
  }
  c.shards = &shards.curves[t];
  c.min_rows = smallest_cache(load);
  c.rows = 1;
  c.knee = 1;
  for (const HitCurve& s : shards.curves[t]) {
    c.rows = std::max(c.rows, s.rows);
    c.knee = std::max(c.knee, s.saturation_rows());
  }
  return c;
}

std::vector<std::int64_t> cache_grid(const CacheCurve& c, int count) {
  const std::int64_t lo = c.min_rows, hi = std::max(lo, c.rows);
  std::vector<std::int64_t> sizes = log_sizes(lo, hi, count);
  const std::int64_t knee = std::clamp(c.knee, lo, hi);
  if (std::find(sizes.begin(), sizes.end(), knee) == sizes.end()) {
    sizes.push_back(knee);
    std::sort(sizes.begin(), sizes.end());
  }
  return sizes;
}

// The uniform modes, for comparison: one rank gpu, cached, offload, cpu; several ranks gpu and
// hybrid (sharded row-wise).
Result<std::vector<UniformMode>> uniform_modes(const Specs& specs, const std::vector<CacheCurve>& caches,
                                               const std::vector<TableLoad>& loads, const HardwareProfile& profile,
                                               const PlanOptions& o) {
  std::vector<UniformMode> out;
  const auto fill = [&](UniformMode& m, const std::vector<TableCost>& costs) {
    std::vector<const TableCost*> p;
    p.reserve(costs.size());
    for (const auto& c : costs) p.push_back(&c);
    const Evaluation e = evaluate(p, profile, plan_model(profile, o.cost.ranks, m.mode != to_string(Placement::kCpu)));
    m.step = e.step;
    m.hbm_bytes = e.hbm;
    m.host_bytes = e.host;
    m.fits = e.hbm <= o.hbm_budget_bytes && e.host <= o.host_budget_bytes;
    if (!m.fits && m.note.empty())
      m.note = "needs " + bytes_text(e.hbm) + " HBM and " + bytes_text(e.host) + " host memory";
  };
  std::vector<Placement> whole{Placement::kGpu};
  if (!several(o)) whole = {Placement::kGpu, Placement::kOffload, Placement::kCpu};
  for (const Placement p : whole) {
    UniformMode m;
    m.mode = to_string(p);
    std::vector<TableCost> costs;
    for (std::size_t t = 0; t < specs.size(); ++t) {
      STRATA_ASSIGN_OR_RETURN(TableCost c, table_cost(specs[t], loads[t], p, 0, 0, o.cost));
      costs.push_back(std::move(c));
    }
    fill(m, costs);
    out.push_back(std::move(m));
  }
  // cached (hybrid): every table's cache the same fraction of its rows (of its shard), the largest of
  // a few that fits.
  const Placement cached = several(o) ? Placement::kHybrid : Placement::kCached;
  UniformMode best;
  best.mode = to_string(cached);
  for (const double f : {1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001}) {
    UniformMode m;
    m.mode = to_string(cached);
    std::vector<TableCost> costs;
    for (std::size_t t = 0; t < specs.size(); ++t) {
      const CacheCurve& cc = caches[t];
      const std::int64_t rows = std::min(
          cc.rows, std::max<std::int64_t>(
                       {1, cc.min_rows, static_cast<std::int64_t>(std::ceil(f * static_cast<double>(cc.rows)))}));
      STRATA_ASSIGN_OR_RETURN(TableCost c, table_cost(specs[t], loads[t], cached, rows, cc.hit_rate(rows), o.cost));
      costs.push_back(std::move(c));
    }
    fill(m, costs);
    m.note = "caches of " + percent_text(f) + " of each table's rows" + (several(o) ? " (of each rank's shard)" : "");
    best = m;
    if (m.fits) break;
  }
  if (!best.fits)
    best.note += ": " + bytes_text(best.hbm_bytes) + " HBM and " + bytes_text(best.host_bytes) + " host even so";
  out.insert(out.begin() + 1, std::move(best));
  return out;
}

// Every table's options. One rank: [0] gpu, [1] offload, [2] cpu, then cached sizes below its
// rows. Several ranks: [0] gpu, [1] hybrid with the smallest cache, then hybrid sizes below the
// largest shard's rows. kOffOpt: the least HBM (where tables that leave the GPU start).
constexpr std::size_t kGpuOpt = 0, kOffloadOpt = 1, kCpuOpt = 2;

// The placements make_plan chooses among, and what it knows of each table.
struct PlanSpace {
  Specs specs;                               // per table, as planned
  std::vector<std::vector<Option>> options;  // per table
  std::vector<CacheCurve> caches;            // per table
  std::vector<TableLoad> loads;              // per table
  std::size_t off_opt = kCpuOpt;             // the option of least HBM
  const HardwareProfile* profile = nullptr;
  const PlanOptions* o = nullptr;

  // The costs of the tables in the options `p`.
  std::vector<const TableCost*> costs_of(const std::vector<std::size_t>& p) const {
    std::vector<const TableCost*> c(p.size());
    for (std::size_t t = 0; t < p.size(); ++t) c[t] = &options[t][p[t]].cost;
    return c;
  }
  Evaluation evaluate_pick(const std::vector<std::size_t>& p) const {
    bool has_device = false;
    for (std::size_t t = 0; t < p.size(); ++t) has_device |= options[t][p[t]].placement != Placement::kCpu;
    return evaluate(costs_of(p), *profile, plan_model(*profile, o->cost.ranks, has_device));
  }
  bool fits(const Evaluation& e) const { return e.hbm <= o->hbm_budget_bytes && e.host <= o->host_budget_bytes; }
};

// Fills `space.options` and `space.caches` for every table of `input`.
Status add_options(const TuneInput& input, const std::vector<HitCurve>& curves, const ShardInputs& shards,
                   PlanSpace& space) {
  const PlanOptions& o = *space.o;
  const std::size_t n = input.tables.size();
  const Placement cached = several(o) ? Placement::kHybrid : Placement::kCached;
  const std::vector<TableLoad>& loads = space.loads;
  std::vector<std::vector<Option>>& options = space.options;
  std::vector<CacheCurve>& caches = space.caches;
  options.resize(n);
  for (std::size_t t = 0; t < n; ++t) {
    const TableSpec& spec = space.specs[t];
    caches.push_back(cache_curve(t, spec, loads[t], curves, shards, o));
    const CacheCurve& cc = caches.back();
    if (several(o)) {
      STRATA_ASSIGN_OR_RETURN(TableCost g, table_cost(spec, loads[t], Placement::kGpu, 0, 0, o.cost));
      options[t].push_back({Placement::kGpu, 0, -1, std::move(g)});
      const double h = cc.hit_rate(cc.min_rows);
      STRATA_ASSIGN_OR_RETURN(TableCost c, table_cost(spec, loads[t], cached, cc.min_rows, h, o.cost));
      options[t].push_back({cached, cc.min_rows, h, std::move(c)});
    } else {
      for (const Placement p : {Placement::kGpu, Placement::kOffload, Placement::kCpu}) {
        STRATA_ASSIGN_OR_RETURN(TableCost c, table_cost(spec, loads[t], p, 0, 0, o.cost));
        options[t].push_back({p, 0, -1, std::move(c)});
      }
    }
    for (const std::int64_t rows : cache_grid(cc, o.cache_sizes)) {
      if (rows >= cc.rows) continue;  // a cache of every row: gpu does it with less
      if (several(o) && rows == cc.min_rows) continue;
      const double h = cc.hit_rate(rows);
      STRATA_ASSIGN_OR_RETURN(TableCost c, table_cost(spec, loads[t], cached, rows, h, o.cost));
      options[t].push_back({cached, rows, h, std::move(c)});
    }
  }
  return Status::ok();
}

// Greedy moves of the `movable` tables from `pick`: the move that lowers the objective most per
// byte of HBM it adds (moves adding none first), while one within the budgets lowers it.
Evaluation search(const PlanSpace& space, std::vector<std::size_t>& pick, const std::vector<bool>& movable) {
  const std::size_t n = pick.size();
  const std::vector<std::vector<Option>>& options = space.options;
  Evaluation cur = space.evaluate_pick(pick);
  for (int iteration = 0; iteration < 100000; ++iteration) {
    double best_score = 0;
    bool best_free = false;
    std::size_t best_t = 0, best_i = 0;
    Evaluation best_eval;
    for (std::size_t t = 0; t < n; ++t) {
      if (!movable[t]) continue;
      for (std::size_t i = 0; i < options[t].size(); ++i) {
        if (i == pick[t]) continue;
        std::vector<std::size_t> p = pick;
        p[t] = i;
        const Evaluation e = space.evaluate_pick(p);
        if (!space.fits(e)) continue;
        const double gain = cur.objective - e.objective;
        if (gain <= cur.objective * 1e-9) continue;
        const double added = e.hbm - cur.hbm;
        const bool free = added <= 0;
        const double score = free ? gain : gain / added;
        if ((free && !best_free) || (free == best_free && score > best_score)) {
          best_score = score;
          best_free = free;
          best_t = t;
          best_i = i;
          best_eval = e;
        }
      }
    }
    if (best_score <= 0) break;
    pick[best_t] = best_i;
    cur = best_eval;
  }
  return cur;
}

// Whether two tables are identical for the plan: the same rows, dim, optimizer and element types as
// planned, and the same keys step by step (so the same curves, loads and costs in every option).
bool identical(const TableTrace& a, const TableSpec& as, const TableTrace& b, const TableSpec& bs) {
  return as.rows == bs.rows && as.dim == bs.dim && as.optimizer.kind == bs.optimizer.kind && as.dtype == bs.dtype &&
         as.state_dtype == bs.state_dtype && as.output_dtype == bs.output_dtype && a.step_bags == b.step_bags &&
         a.feature_keys == b.feature_keys && a.keys.batch_offsets == b.keys.batch_offsets && a.keys.keys == b.keys.keys;
}

// The groups of two or more identical tables, each in input order.
std::vector<std::vector<std::size_t>> identical_groups(const TuneInput& input, const Specs& specs) {
  std::vector<std::vector<std::size_t>> groups;
  std::vector<bool> grouped(input.tables.size(), false);
  for (std::size_t t = 0; t < input.tables.size(); ++t) {
    if (grouped[t]) continue;
    std::vector<std::size_t> g{t};
    for (std::size_t u = t + 1; u < input.tables.size(); ++u)
      if (!grouped[u] && identical(input.tables[t], specs[t], input.tables[u], specs[u])) {
        grouped[u] = true;
        g.push_back(u);
      }
    if (g.size() > 1) groups.push_back(std::move(g));
  }
  return groups;
}

// Identical tables get the same option where that fits both budgets and the step is no slower
// (the best such, the earliest member's on a tie). Where none does (the budget holds the better
// option for some of them only: the greedy search gave it to the first in input order), each
// member's `notes` entry says so, with what each alike placement would do.
void place_alike(const TuneInput& input, const PlanSpace& space, const std::vector<std::size_t>& group,
                 std::vector<std::size_t>& pick, Evaluation& cur, std::vector<std::string>& notes) {
  std::vector<std::size_t> choices;
  for (const std::size_t t : group)
    if (std::find(choices.begin(), choices.end(), pick[t]) == choices.end()) choices.push_back(pick[t]);
  if (choices.size() < 2) return;
  std::vector<std::size_t> best_pick;
  Evaluation best;
  std::string tried;
  for (const std::size_t choice : choices) {
    std::vector<std::size_t> p = pick;
    for (const std::size_t t : group) p[t] = choice;
    const Evaluation e = space.evaluate_pick(p);
    const Option& opt = space.options[group.front()][choice];
    std::string what = to_string(opt.placement);
    if (opt.placement == Placement::kCached || opt.placement == Placement::kHybrid)
      what += " (" + std::to_string(opt.cache_rows) + " rows)";
    tried += (tried.empty() ? "" : ", ") + std::string("every one ") + what + ": " +
             (space.fits(e) ? "step " + ms_text(e.step.step_s) : std::string("does not fit the budgets"));
    if (!space.fits(e) || e.objective > cur.objective * (1 + 1e-9)) continue;
    if (best_pick.empty() || e.objective < best.objective) {
      best_pick = std::move(p);
      best = e;
    }
  }
  if (!best_pick.empty()) {
    pick = std::move(best_pick);
    cur = best;
    return;
  }
  std::string names;
  for (const std::size_t t : group) names += (names.empty() ? "" : ", ") + input.tables[t].spec.name;
  for (const std::size_t t : group)
    notes[t] = "; a tie: " + names + " are identical (same rows, dim, optimizer and keys) but not placed alike, as " +
               tried + " against " + ms_text(cur.step.step_s) +
               " as planned (the search takes equal tables in input order: the first got the budget's better "
               "placement)";
}

// Why table `t` is where the plan puts it (and, cached with sampled keys, Belady's estimate).
Status explain(const TuneInput& input, const std::vector<HitCurve>& curves, const PlanSpace& space, const Split& split,
               const Cut& cut, const std::vector<int>& heat_rank, const std::vector<std::size_t>& pick,
               const Evaluation& cur, std::size_t t, TablePlan& tp) {
  const PlanOptions& o = *space.o;
  const std::size_t n = pick.size();
  const std::vector<TableLoad>& loads = space.loads;
  const std::vector<CacheCurve>& caches = space.caches;
  const std::vector<std::vector<Option>>& options = space.options;
  const Option& opt = options[t][pick[t]];
  const TableSpec& spec = space.specs[t];
  const double all_gpu = std::accumulate(split.gpu_hbm.begin(), split.gpu_hbm.end(), 0.0);
  const std::string sharded = several(o) ? " sharded row-wise over " + std::to_string(o.cost.ranks) + " ranks" : "";
  const std::string per = several(o) ? " per rank" : "";
  const std::size_t kOffOpt = space.off_opt;
  char heat[160];
  std::snprintf(heat, sizeof heat, "%.3g distinct rows per step per GB of HBM as gpu, %d of %zu by heat, coldest first",
                loads[t].distinct / split.gpu_hbm[t] * 1e9, heat_rank[t] + 1, n);
  // The modelled step with this table in option i instead, for the comparison.
  const auto step_with = [&](std::size_t i) {
    std::vector<std::size_t> p = pick;
    p[t] = i;
    return space.evaluate_pick(p).step.step_s;
  };
  if (cut.leave == 0) {
    tp.why = "every table fits in HBM" + sharded + " (" + bytes_text(all_gpu) + per + " of the " +
             bytes_text(o.hbm_budget_bytes) + per + " budget)";
  } else if (opt.placement == Placement::kGpu) {
    tp.why = "in HBM" + sharded + ": hot (" + heat + "); the budget's bytes lower the step most here";
  } else {
    tp.why = "off the GPU: the HBM budget" + per + " does not hold every table" + sharded + ", and this one is cold (" +
             std::string(heat) + ", " + bytes_text(split.gpu_hbm[t]) + per + " as gpu); ";
    if (opt.placement == Placement::kHybrid) {
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "hybrid: each rank caches %lld rows of its shard of %lld (%.3g%%): LRU hit rate %s (the worst "
                    "rank's); step %s against %s with the smallest cache (%lld rows)",
                    static_cast<long long>(opt.cache_rows), static_cast<long long>(caches[t].rows),
                    100.0 * static_cast<double>(opt.cache_rows) / static_cast<double>(caches[t].rows),
                    percent_text(opt.hit_rate).c_str(), ms_text(cur.step.step_s).c_str(),
                    ms_text(step_with(kOffOpt)).c_str(), static_cast<long long>(caches[t].min_rows));
      tp.why += buf;
    } else if (opt.placement == Placement::kCached) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "cached %lld rows (%.3g%% of its rows): LRU hit rate %s; step %s against %s as offload",
                    static_cast<long long>(opt.cache_rows),
                    100.0 * static_cast<double>(opt.cache_rows) / static_cast<double>(spec.rows),
                    percent_text(opt.hit_rate).c_str(), ms_text(cur.step.step_s).c_str(),
                    ms_text(step_with(kOffloadOpt)).c_str());
      tp.why += buf;
      // Sampled keys: Belady's estimate at the rescaled size, where that holds every sampled step.
      const double rate = curves[t].sample_rate;
      const std::int64_t at = rate < 1.0 ? std::llround(static_cast<double>(opt.cache_rows) * rate) : opt.cache_rows;
      auto b = cache::belady_hits(input.tables[t].keys, at);
      if (!b && rate >= 1.0) return b.status();
      tp.belady = b ? b->hit_rate() : -1.0;
    } else {
      const std::size_t other = pick[t] == kOffloadOpt ? kCpuOpt : kOffloadOpt;
      tp.why += std::string(to_string(opt.placement)) + ": step " + ms_text(cur.step.step_s) + " against " +
                ms_text(step_with(other)) + " as " + to_string(options[t][other].placement) +
                "; no cache size within the HBM left pays more";
    }
  }
  return Status::ok();
}

// Rules 1-4 with the tables' specs `specs` (input order); the arguments checked by make_plan.
Result<Plan> plan_at(const TuneInput& input, const Specs& specs, const std::vector<HitCurve>& curves,
                     const HardwareProfile& profile, const PlanOptions& o, const ShardInputs& shards) {
  const std::size_t n = input.tables.size();
  const int N = o.cost.ranks;
  PlanSpace space;
  space.specs = specs;
  space.o = &o;
  space.profile = &profile;
  space.loads = plan_loads(input, curves, shards);
  STRATA_ASSIGN_OR_RETURN(const Split split, split_of(specs, space.loads, o));
  const std::vector<std::size_t> order = coldest_first(input, space.loads, split);
  const Cut cut = find_cut(order, split, o);
  if (cut.leave < 0) return infeasible(cut, o, n);
  space.off_opt = several(o) ? 1 : kCpuOpt;
  const std::size_t kOffOpt = space.off_opt;
  std::vector<int> heat_rank(n, 0);  // 0: the coldest table
  for (std::size_t k = 0; k < n; ++k) heat_rank[order[k]] = static_cast<int>(k);
  STRATA_RETURN_IF_ERROR(add_options(input, curves, shards, space));

  // A: the coldest tables leave (rule 2) to their least-HBM placement, and only they move. B:
  // every table starts there and every table moves (HBM bought where it pays most). The better of
  // the two, A on a tie.
  std::vector<std::size_t> pick(n, kGpuOpt);
  std::vector<bool> left(n, false);
  for (int k = 0; k < cut.leave; ++k) {
    left[order[static_cast<std::size_t>(k)]] = true;
    pick[order[static_cast<std::size_t>(k)]] = kOffOpt;
  }
  Evaluation cur = space.evaluate_pick(pick);
  if (!space.fits(cur)) return infeasible(cut, o, n);
  if (cut.leave > 0) {
    cur = search(space, pick, left);
    std::vector<std::size_t> all_off(n, kOffOpt);
    if (space.fits(space.evaluate_pick(all_off))) {
      const Evaluation b = search(space, all_off, std::vector<bool>(n, true));
      if (b.objective < cur.objective) {
        pick = all_off;
        cur = b;
      }
    }
  }

  // Identical tables placed alike where that costs nothing; else their why says so.
  std::vector<std::string> tie_notes(n);
  for (const std::vector<std::size_t>& group : identical_groups(input, specs))
    place_alike(input, space, group, pick, cur, tie_notes);

  Plan plan;
  plan.ranks = N;
  plan.step = cur.step;
  plan.hbm_bytes = cur.hbm;
  plan.host_bytes = cur.host;
  plan.exchange_bytes = cur.step.links[static_cast<int>(Link::kAllToAll)].bytes;
  plan.config.threads = o.cost.threads;
  plan.config.numa = kPlanNuma;
  plan.config.cache.policy = cache::Policy::kLru;
  plan.config.cache.max_in_flight = o.cost.max_in_flight;
  for (std::size_t t = 0; t < n; ++t) {
    const Option& opt = space.options[t][pick[t]];
    const TableSpec& spec = specs[t];
    TablePlan tp;
    tp.name = spec.name;
    tp.placement = opt.placement;
    tp.cache_rows = opt.cache_rows;
    tp.hit_rate = opt.hit_rate;
    tp.load = space.loads[t];
    tp.cost = opt.cost;
    STRATA_RETURN_IF_ERROR(explain(input, curves, space, split, cut, heat_rank, pick, cur, t, tp));
    tp.why += tie_notes[t];
    TableConfig tc;
    tc.spec = spec;
    tc.placement = opt.placement;
    for (const std::string& f : input.tables[t].features) tc.features.push_back({f, std::nullopt});
    if (opt.placement == Placement::kCached || opt.placement == Placement::kHybrid) {
      tc.cache.rows = opt.cache_rows;
      tc.cache.cap = true;
    }
    if (several(o)) tc.sharding = {dispatch::ShardingType::kRow, -1};
    plan.config.tables.push_back(std::move(tc));
    plan.tables.push_back(std::move(tp));
  }
  STRATA_RETURN_IF_ERROR(validate(plan.config));
  STRATA_ASSIGN_OR_RETURN(plan.uniform, uniform_modes(specs, space.caches, space.loads, profile, o));
  return plan;
}

// Rule 5 (--dtype auto).

// A table's outcome in a plan: gpu, a cache of so many rows (cached, hybrid), offload or cpu.
std::string outcome_text(const TablePlan& t) {
  if (t.placement != Placement::kCached && t.placement != Placement::kHybrid) return to_string(t.placement);
  return std::string(to_string(t.placement)) + " " + std::to_string(t.cache_rows) +
         (t.placement == Placement::kHybrid ? " rows per rank" : " rows");
}

// Whether `b` gives its table more of the GPU than `a`: gpu where `a` is not, or a cache of more
// rows (offload and cpu hold none).
bool more_of_the_gpu(const TablePlan& b, const TablePlan& a) {
  const auto rows = [](const TablePlan& t) -> std::int64_t {
    if (t.placement == Placement::kGpu) return std::numeric_limits<std::int64_t>::max();
    return t.placement == Placement::kCached || t.placement == Placement::kHybrid ? t.cache_rows : 0;
  };
  return rows(b) > rows(a);
}

// Why table t of `plan` has bf16 rows: its outcome at fp32 (`at32`: outcome_text in the plan at
// fp32; empty where no placement of the tables fits with it at fp32), its HBM as gpu at both sizes
// against the budget, and its memory in its placement at both sizes (table_cost of each spec).
Result<std::string> bf16_note(const Plan& plan, const std::string& at32, const TableSpec& spec32, std::size_t t,
                              const PlanOptions& o) {
  const TablePlan& tp = plan.tables[t];
  const TableSpec& spec16 = plan.config.tables[t].spec;
  STRATA_ASSIGN_OR_RETURN(const TableCost gpu32, table_cost(spec32, tp.load, Placement::kGpu, 0, 0, o.cost));
  STRATA_ASSIGN_OR_RETURN(const TableCost gpu16, table_cost(spec16, tp.load, Placement::kGpu, 0, 0, o.cost));
  STRATA_ASSIGN_OR_RETURN(const TableCost same32,
                          table_cost(spec32, tp.load, tp.placement, tp.cache_rows, std::max(0.0, tp.hit_rate), o.cost));
  const std::string per = several(o) ? " per rank" : "";
  const std::string fp32 = at32.empty() ? "with it at fp32 no placement of the tables fits the budgets (HBM " +
                                              bytes_text(o.hbm_budget_bytes) + per + ", host " +
                                              bytes_text(o.host_budget_bytes) + per + ")"
                                        : "at fp32 the plan makes it " + at32;
  return "; bf16 (--dtype auto): " + fp32 + "; as gpu it needs " + bytes_text(gpu32.hbm_bytes) + per +
         " of HBM at fp32 and " + bytes_text(gpu16.hbm_bytes) + " at bf16, the HBM budget is " +
         bytes_text(o.hbm_budget_bytes) + per + " (" + bytes_text(plan.hbm_bytes - tp.cost.hbm_bytes) +
         " of it for the other tables here); at bf16 it is " + outcome_text(tp) + ": " + bytes_text(tp.cost.hbm_bytes) +
         " of HBM and " + bytes_text(tp.cost.host_bytes) + " of host memory (at fp32 " + bytes_text(same32.hbm_bytes) +
         " and " + bytes_text(same32.host_bytes) + ")";
}

// What the budgets' error adds where nothing fits even with every fp32 table at bf16.
constexpr const char* kAllHalf = " (with every fp32 table at bf16: --dtype auto)";

// Where no placement fits with every table at its configured dtype: the fewest fp32 tables at bf16
// with which one does (rules 1-2), those that save the most memory first (their HBM as gpu and host
// records off the GPU); `half` marks them (none where one fits as configured). None such: the
// budgets' error at every fp32 table bf16.
Status fewest_half(const TuneInput& input, const Specs& base, const std::vector<TableLoad>& loads, const PlanOptions& o,
                   std::vector<bool>& half) {
  Specs all = base;
  for (TableSpec& spec : all)
    if (spec.dtype == DType::kF32) spec.dtype = DType::kBF16;
  STRATA_ASSIGN_OR_RETURN(const Split s32, split_of(base, loads, o));
  STRATA_ASSIGN_OR_RETURN(const Split s16, split_of(all, loads, o));
  const auto saving = [&](std::size_t t) {
    return s32.gpu_hbm[t] - s16.gpu_hbm[t] + s32.off_host[t] - s16.off_host[t];
  };
  std::vector<std::size_t> order;
  for (std::size_t t = 0; t < base.size(); ++t)
    if (base[t].dtype == DType::kF32) order.push_back(t);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return saving(a) > saving(b); });
  Specs specs = base;
  Cut cut = find_cut(coldest_first(input, loads, s32), s32, o);
  if (cut.leave >= 0) return Status::ok();
  for (const std::size_t t : order) {
    half[t] = true;
    specs[t].dtype = DType::kBF16;
    STRATA_ASSIGN_OR_RETURN(const Split s, split_of(specs, loads, o));
    cut = find_cut(coldest_first(input, loads, s), s, o);
    if (cut.leave >= 0) return Status::ok();
  }
  const Status st = infeasible(cut, o, base.size());
  return Status::invalid_argument(st.message() + kAllHalf);
}

// Rule 5. The start: the tables at their configured dtypes, or, where no placement fits so, the
// fewest at bf16 with which one does (fewest_half). Then the fp32 tables the start's plan keeps off
// the GPU are planned at bf16; one whose bf16 gets it no more of the GPU than it has in the start's
// plan goes back to fp32, and the others are planned again, until none goes back. The plan with
// them stands where it is modelled no slower than the start's.
Result<Plan> plan_auto(const TuneInput& input, const std::vector<HitCurve>& curves, const HardwareProfile& profile,
                       const PlanOptions& o, const ShardInputs& shards) {
  const Specs configured = plan_specs(input, o);
  const std::size_t n = configured.size();
  std::vector<bool> forced(n, false);  // at bf16 because no placement fits without
  Specs base = configured;
  Result<Plan> start = plan_at(input, base, curves, profile, o, shards);
  if (!start) {
    const Status fit = fewest_half(input, configured, plan_loads(input, curves, shards), o, forced);
    if (!fit.is_ok()) return fit;
    if (std::find(forced.begin(), forced.end(), true) == forced.end()) return start.status();  // not the budgets
    for (std::size_t t = 0; t < n; ++t)
      if (forced[t]) base[t].dtype = DType::kBF16;
    start = plan_at(input, base, curves, profile, o, shards);
    if (!start) return start.status();
  }
  std::vector<bool> half(n, false);
  for (std::size_t t = 0; t < n; ++t)
    half[t] = base[t].dtype == DType::kF32 && start->tables[t].placement != Placement::kGpu;
  std::vector<std::string> notes(n);
  std::optional<Plan> mixed;
  while (std::find(half.begin(), half.end(), true) != half.end()) {
    Specs specs = base;
    for (std::size_t t = 0; t < n; ++t)
      if (half[t]) specs[t].dtype = DType::kBF16;
    Result<Plan> p = plan_at(input, specs, curves, profile, o, shards);
    if (!p) {  // (less memory than a plan that fits: not expected)
      for (std::size_t t = 0; t < n; ++t)
        if (half[t]) notes[t] = "; fp32 (--dtype auto): no plan with it at bf16 (" + p.status().message() + ")";
      break;
    }
    bool back = false;
    for (std::size_t t = 0; t < n; ++t)
      if (half[t] && !more_of_the_gpu(p->tables[t], start->tables[t])) {
        half[t] = false;
        back = true;
        notes[t] = "; fp32 (--dtype auto): at bf16 it would be " + outcome_text(p->tables[t]) + ", at fp32 it is " +
                   outcome_text(start->tables[t]) +
                   " (bf16 only where it puts a table on the GPU or gives it a larger cache)";
      }
    if (!back) {
      mixed = std::move(p).value();
      break;
    }
  }
  if (mixed && objective(mixed->step) > objective(start->step)) {
    for (std::size_t t = 0; t < n; ++t)
      if (half[t])
        notes[t] = "; fp32 (--dtype auto): the plan with bf16 rows for it is modelled slower (" +
                   ms_text(mixed->step.step_s) + " a step against " + ms_text(start->step.step_s) + " at fp32)";
    mixed.reset();
  }
  std::vector<std::string> at_start(n);
  for (std::size_t t = 0; t < n; ++t) at_start[t] = forced[t] ? "" : outcome_text(start->tables[t]);
  Plan plan = mixed ? std::move(*mixed) : std::move(start).value();
  for (std::size_t t = 0; t < n; ++t) {
    if (configured[t].dtype != DType::kF32) continue;  // half as configured
    if (plan.config.tables[t].spec.dtype != DType::kF32) {
      STRATA_ASSIGN_OR_RETURN(notes[t], bf16_note(plan, at_start[t], configured[t], t, o));
    } else if (notes[t].empty()) {
      notes[t] = "; fp32 (--dtype auto): the plan at fp32 puts it on the GPU (bf16 only for a table it keeps off)";
    }
    plan.tables[t].why += notes[t];
  }
  return plan;
}

}  // namespace

Result<Extremes> memory_extremes(const TuneInput& input, const PlanOptions& options, const ShardInputs& shards) {
  STRATA_RETURN_IF_ERROR(check_shards(input, options, shards, false));
  STRATA_ASSIGN_OR_RETURN(const Split s, split_of(plan_specs(input, options), loads_of(input, shards, false), options));
  Extremes e;
  e.all_gpu_hbm = std::accumulate(s.gpu_hbm.begin(), s.gpu_hbm.end(), 0.0);
  e.all_host = std::accumulate(s.off_host.begin(), s.off_host.end(), 0.0);
  return e;
}

Status check_budgets(const TuneInput& input, const PlanOptions& options, const ShardInputs& shards) {
  STRATA_RETURN_IF_ERROR(check_options(options));
  STRATA_RETURN_IF_ERROR(check_shards(input, options, shards, false));
  const std::vector<TableLoad> loads = loads_of(input, shards, false);
  // --dtype auto: whether some placement fits with every fp32 table at bf16 (the least memory).
  Specs specs = plan_specs(input, options);
  if (options.auto_dtype)
    for (TableSpec& s : specs)
      if (s.dtype == DType::kF32) s.dtype = DType::kBF16;
  STRATA_ASSIGN_OR_RETURN(const Split s, split_of(specs, loads, options));
  const Cut cut = find_cut(coldest_first(input, loads, s), s, options);
  if (cut.leave >= 0) return Status::ok();
  Status st = infeasible(cut, options, input.tables.size());
  if (!options.auto_dtype) return st;
  return Status::invalid_argument(st.message() + kAllHalf);
}

Status set_plan_dtype(const std::string& text, PlanOptions& options) {
  options.dtype.reset();
  options.auto_dtype = text == "auto";
  if (options.auto_dtype) return Status::ok();
  auto d = parse_dtype(text);
  if (!d) return Status::invalid_argument("--dtype: '" + text + "' is not a dtype (expected auto, fp32, bf16 or fp16)");
  options.dtype = *d;
  return Status::ok();
}

Result<Plan> make_plan(const TuneInput& input, const std::vector<HitCurve>& curves, const HardwareProfile& profile,
                       const PlanOptions& o, const ShardInputs& shards) {
  STRATA_RETURN_IF_ERROR(check_options(o));
  STRATA_RETURN_IF_ERROR(validate(profile));
  if (curves.size() != input.tables.size())
    return Status::invalid_argument("plan: " + std::to_string(curves.size()) + " curves for " +
                                    std::to_string(input.tables.size()) + " tables (expected one per table)");
  STRATA_RETURN_IF_ERROR(check_shards(input, o, shards, true));
  if (o.auto_dtype) return plan_auto(input, curves, profile, o, shards);
  return plan_at(input, plan_specs(input, o), curves, profile, o, shards);
}

}  // namespace strata::tune
