#pragma once
// Sharded-store equivalence, shared by the thread-rank test (local communicator) and the process
// test (mpirun): every rank trains on its own part of each global batch through a sharded store,
// and checks its outputs and the final tables against the single-rank reference trained on the
// whole global batch (ranks' bags concatenated in rank order).
//
// Sums of gradients reach a row from several ranks in rank order, while the reference sums them
// in position order: the same numbers added in a different order, so with more than one rank
// results are compared within a tolerance (for half-size tables, also a few units in the last place
// of their dtype: a sum that differs in its last fp32 bit can round to the neighbouring half value;
// for half-size outputs, of the output dtype too: each output is such a sum rounded once); with one
// rank they must be bit-exact. Each rank takes, step by step in turn, host views, device views and
// both in one call (alternating by feature), and draws a synchronous or stream-ordered step
// (device_views.hpp: run_step), so the sharded engine's device pooling and gradient path and its
// host-view path are both held to the reference, under thread ranks and under mpirun; no output is
// written past its view's bytes (guard bytes after each).

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dispatch/communicator.hpp"
#include "store/store.hpp"
#include "tests/store/device_views.hpp"
#include "tests/store/half_tables.hpp"

namespace strata::testing {

struct ShardCase {
  int world = 1;
  int type = -1;       ///< dispatch::ShardingType, or -1: a random type per table
  int placement = -1;  ///< Placement::kGpu or kHybrid, or -1: random per table
  std::uint64_t seed = 1;
  int steps = 4;
  /// hybrid caches hold the unique rows of one global batch, not two: with a batch submitted ahead,
  /// plans meet rows pinned by the batch in flight and are deferred (CacheStats::deferred)
  bool tight = false;
  /// hybrid caches of 1..10 rows against batches of hundreds of rows: rows bypass the caches
  /// (CacheStats::bypassed)
  bool tiny = false;
  /// batches of hundreds to thousands of bags over tables of 1..8 rows: rows used thousands of
  /// times a batch (the device kernels' hot rows, summed segment by segment)
  bool hot = false;
  /// tables of bf16, fp16 or fp32 rows, bf16 optimizer state where the optimizer allows it,
  /// stochastic rounding or not (always, where an element is half, in row and column shards of
  /// several ranks), outputs and gradients of bf16, fp16 or fp32 (the first table's half), three
  /// tables (issue 31)
  bool half = false;
  /// tables looked up by two or three features each, of their own poolings (issue 35)
  bool features = false;
  /// each rank gives some features' keys and offsets as int32 (issue 35)
  bool int32 = false;
  /// accept_nonfinite_gradients: no finiteness check, whose host wait for the caller's stream would
  /// hide a missing stream wait of the engine's (stream-ordered device gradients)
  bool accept = false;
};

inline std::string case_name(const ShardCase& c) {
  const char* types[] = {"replicated", "table", "row", "column"};
  std::ostringstream o;
  o << "n" << c.world << "_" << (c.type < 0 ? "mixed" : types[c.type]) << "_"
    << (c.placement < 0                                    ? "mixed"
        : c.placement == static_cast<int>(Placement::kGpu) ? "gpu"
                                                           : "hybrid")
    << (c.tight ? "_tight" : "") << (c.tiny ? "_tiny" : "") << (c.hot ? "_hot" : "") << (c.half ? "_half" : "")
    << (c.features ? "_features" : "") << (c.int32 ? "_int32" : "") << (c.accept ? "_accept" : "") << "_s" << c.seed;
  return o.str();
}

/// Tables of every shape the dispatch must handle: uneven shards, tables smaller than the world,
/// every pooling and optimizer (row-wise adagrad only where the rows are not split by column).
inline StoreConfig sharded_config(const ShardCase& c) {
  std::mt19937_64 rng(c.seed * 7919 + static_cast<std::uint64_t>(c.world));
  StoreConfig cfg;
  cfg.threads = 1;
  cfg.fake_numa_nodes = 1;
  cfg.huge_pages = false;
  cfg.device.backend = BackendChoice::kEmu;
  cfg.device.capacity = 64 << 20;
  cfg.accept_nonfinite_gradients = c.accept;
  if (c.accept) cfg.device.emu_max_delay_us = 50;  // the caller's stream late: a missing wait reads NaN
  cfg.cache.policy = static_cast<cache::Policy>(rng() % 3);
  cfg.cache.lookahead = cfg.cache.policy == cache::Policy::kLookahead ? 1 : 0;
  const int dims[] = {4, 5, 8, 13, 16};
  const int drawn = 1 + static_cast<int>(rng() % 3);
  const int tables = c.half ? 3 : drawn;  // half: three tables, outputs of several dtypes in each call
  for (int t = 0; t < tables; ++t) {
    TableConfig tc;
    tc.spec.name = "t" + std::to_string(t);
    tc.spec.rows =
        rng() % 5 == 0 ? 1 + static_cast<std::int64_t>(rng() % 3) : 20 + static_cast<std::int64_t>(rng() % 300);
    tc.spec.dim = dims[rng() % 5];
    tc.spec.pooling = static_cast<Pooling>(rng() % 3);
    tc.spec.init.bound = 0.5f;
    tc.spec.init.seed = rng() % 1000;
    const int type = c.type >= 0 ? c.type : static_cast<int>(rng() % 4);
    tc.sharding.type = static_cast<dispatch::ShardingType>(type);
    if (tc.sharding.type == dispatch::ShardingType::kTable && rng() % 2)
      tc.sharding.owner = static_cast<int>(rng() % static_cast<std::uint64_t>(c.world));
    do {
      tc.spec.optimizer.kind = static_cast<OptimizerKind>(rng() % 4);
    } while (tc.sharding.type == dispatch::ShardingType::kColumn &&
             tc.spec.optimizer.kind == OptimizerKind::kRowwiseAdagrad && c.world > 1);
    tc.spec.optimizer.learning_rate = 0.05f;
    tc.spec.optimizer.weight_decay = (rng() % 2) ? 0.01f : 0.0f;
    tc.spec.optimizer.initial_accumulator = 0.1f;
    tc.placement =
        c.placement >= 0 ? static_cast<Placement>(c.placement) : (rng() % 2 ? Placement::kGpu : Placement::kHybrid);
    if (tc.placement == Placement::kHybrid)
      tc.cache.rows = 48 + static_cast<std::int64_t>(rng() % 64);  // small: evictions
    cfg.tables.push_back(tc);
  }
  if (c.tiny) {  // a generator of its own, so that the other cases stay as they were
    std::mt19937_64 tiny(c.seed * 613 + static_cast<std::uint64_t>(c.world));
    for (auto& tc : cfg.tables) {
      tc.spec.rows = 200 + static_cast<std::int64_t>(tiny() % 400);
      if (tc.placement == Placement::kHybrid) tc.cache.rows = 1 + static_cast<std::int64_t>(tiny() % 10);
    }
  }
  if (c.hot) {
    std::mt19937_64 hot(c.seed * 389 + static_cast<std::uint64_t>(c.world));
    for (auto& tc : cfg.tables) {
      tc.spec.rows = 1 + static_cast<std::int64_t>(hot() % 8);
      if (tc.placement == Placement::kHybrid) tc.cache.rows = tc.spec.rows;
    }
  }
  if (c.half) {
    std::mt19937_64 half(c.seed * 97 + static_cast<std::uint64_t>(c.world));
    for (auto& tc : cfg.tables) {
      random_dtypes(half, tc.spec);
      // Row and column shards of several ranks round stochastically wherever an element is half:
      // their rounding bits must come from the whole table's rows and columns (shard offsets).
      const bool split = c.world > 1 && (tc.sharding.type == dispatch::ShardingType::kRow ||
                                         tc.sharding.type == dispatch::ShardingType::kColumn);
      if (split) tc.spec.stochastic_rounding = tc.spec.dtype != DType::kF32 || tc.spec.state_dtype != DType::kF32;
    }
    // Outputs and gradients (a generator of their own, so that the element types above stay as they were).
    std::mt19937_64 outs(c.seed * 53 + static_cast<std::uint64_t>(c.world));
    for (std::size_t t = 0; t < cfg.tables.size(); ++t)
      cfg.tables[t].spec.output_dtype =
          t == 0 ? (outs() % 2 ? DType::kBF16 : DType::kF16) : static_cast<DType>(outs() % 3);
  }
  if (c.features) {
    std::mt19937_64 features(c.seed * 113 + static_cast<std::uint64_t>(c.world));
    random_features(features, cfg);
  }
  return cfg;
}

/// The relative precision of elements of `d` where results of several ranks may round apart: its
/// unit roundoff (2^-8 bf16, 2^-11 fp16: two of them are at least one unit in the last place of a
/// value); 0 for fp32.
inline float unit_roundoff(DType d) { return d == DType::kBF16 ? 0x1p-8f : d == DType::kF16 ? 0x1p-11f : 0.0f; }
/// The smallest subnormal of `d` (the spacing of its values near zero); 0 for fp32.
inline float smallest_subnormal(DType d) { return d == DType::kBF16 ? 0x1p-133f : d == DType::kF16 ? 0x1p-24f : 0.0f; }
/// The larger unit roundoff of a table's weights and state: its outputs' (sums of a few weights).
inline float half_ulp(const TableSpec& spec) {
  return std::max(unit_roundoff(spec.dtype), unit_roundoff(spec.state_dtype));
}

/// `n` fp32 values as a view of elements of `d` holds them: themselves (fp32), or rounded to nearest
/// and packed two to a float into the buffer's first half (the rest zero).
inline std::vector<float> packed(DType d, const float* v, std::size_t n) {
  std::vector<float> out(v, v + n);
  if (d == DType::kF32) return out;
  std::vector<std::uint16_t> bits(n);
  for (std::size_t k = 0; k < n; ++k) bits[k] = narrow(d, v[k], false, 0);
  std::fill(out.begin(), out.end(), 0.0f);
  if (n) std::memcpy(out.data(), bits.data(), n * sizeof(std::uint16_t));
  return out;
}
/// Elements [at, at + n) of a view of elements of `d` at `p`, widened to fp32.
inline std::vector<float> elements(DType d, const float* p, std::size_t at, std::size_t n) {
  if (d == DType::kF32) return std::vector<float>(p + at, p + at + n);
  std::vector<float> out(n);
  for (std::size_t k = 0; k < n; ++k) {
    std::uint16_t h;
    std::memcpy(&h, reinterpret_cast<const unsigned char*>(p) + 2 * (at + k), sizeof h);
    out[k] = widen(d, h);
  }
  return out;
}

/// One global batch: a local batch per rank (some empty, some missing tables, keys that may all
/// live on other ranks, duplicates), its concatenation, and gradients for the concatenation.
struct GlobalStep {
  std::vector<KeyBatch> local;      ///< per rank
  std::vector<std::int64_t> sizes;  ///< bags of each rank (a rank without a table has empty bags there)
  KeyBatch global;
  std::vector<std::vector<float>> global_grads;  ///< per global feature
};

/// The spec a feature is served with (its table's, pooled as the feature).
inline TableSpec spec_of(const StoreConfig& c, const std::string& name) {
  const TableSpec s = feature_spec(c, name);
  if (s.name.empty()) std::abort();
  return s;
}

inline GlobalStep make_step(const ShardCase& c, const StoreConfig& cfg, int step) {
  std::mt19937_64 rng(c.seed * 1000003 + static_cast<std::uint64_t>(step) * 7 + static_cast<std::uint64_t>(c.world));
  GlobalStep g;
  g.local.resize(static_cast<std::size_t>(c.world));
  std::vector<std::int64_t>& sizes = g.sizes;
  for (int r = 0; r < c.world; ++r)
    sizes.push_back(c.hot            ? 500 * (1 + static_cast<std::int64_t>(rng() % 6))
                    : rng() % 5 == 0 ? 0
                                     : (c.tiny ? 80 : 1) + static_cast<std::int64_t>(rng() % (c.tiny ? 80 : 6)));
  for (const auto& t : cfg.tables)
    for (const std::string& name : feature_names(t)) {
      JaggedKeys all;
      all.table = name;
      all.offsets.push_back(0);
      const bool weighted = rng() % 3 == 0;
      for (int r = 0; r < c.world; ++r) {
        const bool has = rng() % 4 != 0;
        // Keys of this rank: sometimes only keys that live on one other rank (row sharding).
        const int only = c.world > 1 && rng() % 3 == 0 ? static_cast<int>((r + 1) % c.world) : -1;
        JaggedKeys mine;
        mine.table = name;
        mine.offsets.push_back(0);
        for (std::int64_t b = 0; b < sizes[static_cast<std::size_t>(r)]; ++b) {
          const int len = has ? static_cast<int>(rng() % 5) : 0;
          for (int i = 0; i < len; ++i) {
            Key k = static_cast<Key>(
                rng() % static_cast<std::uint64_t>(std::min<std::int64_t>(t.spec.rows, rng() % 2 ? 7 : t.spec.rows)));
            if (only >= 0 && t.spec.rows > c.world)
              k = (k / c.world) * c.world + only < t.spec.rows ? (k / c.world) * c.world + only : only;
            const float w = static_cast<float>(rng() % 1000) / 500.0f;
            mine.keys.push_back(k);
            all.keys.push_back(k);
            if (weighted) {
              mine.weights.push_back(w);
              all.weights.push_back(w);
            }
          }
          mine.offsets.push_back(static_cast<std::int64_t>(mine.keys.size()));
          all.offsets.push_back(static_cast<std::int64_t>(all.keys.size()));
        }
        if (has) g.local[static_cast<std::size_t>(r)].features.push_back(std::move(mine));
      }
      g.global.features.push_back(std::move(all));
    }
  for (const auto& f : g.global.features) {
    const TableSpec& spec = spec_of(cfg, f.table);
    std::vector<float> grad(static_cast<std::size_t>(output_rows(f, spec.pooling) * spec.dim));
    for (float& x : grad) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.0f;
    g.global_grads.push_back(std::move(grad));
  }
  return g;
}

/// Rank r's slice of a global feature's output (or gradient): its bags (pooled) or its keys
/// (pooling none), as (first row, rows).
inline std::pair<std::int64_t, std::int64_t> slice_of(const GlobalStep& g, const StoreConfig& cfg, std::size_t gf,
                                                      int r) {
  const std::vector<std::int64_t>& sizes = g.sizes;
  const JaggedKeys& all = g.global.features[gf];
  const TableSpec& spec = spec_of(cfg, all.table);
  std::int64_t bag0 = 0;
  for (int q = 0; q < r; ++q) bag0 += sizes[static_cast<std::size_t>(q)];
  const std::int64_t bags = sizes[static_cast<std::size_t>(r)];
  if (spec.pooling != Pooling::kNone) return {bag0, bags};
  return {all.offsets[static_cast<std::size_t>(bag0)],
          all.offsets[static_cast<std::size_t>(bag0 + bags)] - all.offsets[static_cast<std::size_t>(bag0)]};
}

/// An output within the tolerance of several ranks (or bit-exact): `ulp` is half_ulp of the table,
/// whose rounded weights may differ by a unit, and an output is the sum of a few such weights.
inline bool close(float a, float b, bool exact, float ulp = 0.0f) {
  if (exact) return a == b || (std::isnan(a) && std::isnan(b));
  return std::fabs(a - b) <= 1e-5f + 1e-4f * std::fabs(b) + ulp * (8.0f + 4.0f * std::fabs(b));
}

/// A stored element of type `d` within the tolerance of several ranks (or bit-exact): fp32's (sums
/// in another order), plus one unit in the last place of the value (two unit roundoffs of it) and
/// the smallest subnormal, as one rounding apart moves a half element; fp32 elements get fp32's.
inline bool close_element(float a, float b, bool exact, DType d) {
  if (exact) return a == b || (std::isnan(a) && std::isnan(b));
  return std::fabs(a - b) <=
         1e-5f + 1e-4f * std::fabs(b) + 2.0f * unit_roundoff(d) * std::fabs(b) + smallest_subnormal(d);
}

/// Half elements of the final tables that differ from the reference's at all, and those the
/// reference changed (from their initial values): with several ranks only the few rounded apart may
/// differ (rounding bits of the wrong rows or columns move about half of the changed elements
/// rounded stochastically).
struct HalfDiffs {
  std::int64_t differ = 0;
  std::int64_t changed = 0;
};

/// Guard words after each output view of a rank beyond as many as the view's, and the byte they
/// hold (no call may write them).
constexpr std::size_t kGuardWords = 2;
constexpr unsigned char kGuardByte = 0xa5;

/// Runs the case on rank `rank` of `comm`'s world; returns "" or the first mismatches found.
/// `trace` (when given) gets every output this rank read and the final tables it read back, in
/// order, so that two worlds can be compared bit for bit.
inline std::string run_sharded_rank(const ShardCase& c, std::shared_ptr<dispatch::Communicator> comm,
                                    std::vector<float>* trace = nullptr) {
  const int r = comm->rank();
  StoreConfig cfg = sharded_config(c);
  std::vector<GlobalStep> steps;
  for (int s = 0; s < c.steps; ++s) steps.push_back(make_step(c, cfg, s));
  if (c.tight) {
    for (auto& t : cfg.tables) {
      if (t.placement != Placement::kHybrid) continue;
      std::int64_t most = 1;  // unique rows of the table in one global batch: any rank's shard holds at most these
      for (const auto& g : steps)
        for (const auto& f : g.global.features)
          if (f.table == t.spec.name)
            most = std::max<std::int64_t>(
                most, static_cast<std::int64_t>(std::set<Key>(f.keys.begin(), f.keys.end()).size()));
      t.cache.rows = most;
    }
  }
  std::ostringstream err;
  auto opened = Store::open(cfg, comm);
  if (!opened) return "rank " + std::to_string(r) + ": open: " + opened.status().to_string();
  Store& store = *opened.value();
  StoreConfig ref_cfg = cfg;
  for (auto& t : ref_cfg.tables) {
    t.placement = Placement::kCpu;
    t.cache = {};
    t.sharding = {};
  }
  auto ref_open = open_reference_store(ref_cfg);
  if (!ref_open) return "reference: " + ref_open.status().to_string();
  Store& ref = *ref_open.value();
  auto trainer_stream = store.device()->create_stream();
  if (!trainer_stream) return "rank " + std::to_string(r) + ": trainer stream: " + trainer_stream.status().to_string();
  const gpu::Stream trainer = std::move(trainer_stream).value();
  const bool exact = c.world == 1;
  int reported = 0;
  const auto check = [&](const std::string& what, const float* got, const float* want, std::size_t n, float ulp) {
    for (std::size_t i = 0; i < n && reported < 5; ++i)
      if (!close(got[i], want[i], exact, ulp)) {
        err << "rank " << r << ": " << what << "[" << i << "] = " << got[i] << ", reference " << want[i] << "\n";
        ++reported;
      }
  };
  HalfDiffs half_diffs;
  // `initial` (or nullptr): the reference's elements before the first step, to count half_diffs.
  const auto check_elements = [&](const std::string& what, const float* got, const float* want, std::size_t n, DType d,
                                  const float* initial) {
    const auto same = [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); };
    for (std::size_t i = 0; i < n; ++i) {
      if (!close_element(got[i], want[i], exact, d) && reported < 5) {
        err << "rank " << r << ": " << what << "[" << i << "] = " << got[i] << ", reference " << want[i] << "\n";
        ++reported;
      }
      if (d != DType::kF32 && initial) {
        half_diffs.differ += !same(got[i], want[i]);
        half_diffs.changed += !same(want[i], initial[i]);
      }
    }
  };
  const auto fail = [&](const std::string& what, const Status& s) {
    if (!s.is_ok()) err << "rank " << r << ": " << what << ": " << s.to_string() << "\n";
    return !s.is_ok();
  };

  const auto submit = [&](int s) {
    const GlobalStep& g = steps[static_cast<std::size_t>(s)];
    KeyBatch local = g.local[static_cast<std::size_t>(r)];
    std::mt19937_64 narrow(c.seed * 7 + static_cast<std::uint64_t>(s) * 31 + static_cast<std::uint64_t>(r));
    if (c.int32) local = with_int32(narrow, std::move(local));
    return !fail("submit " + std::to_string(s), store.submit(s, local)) &&
           !fail("reference submit", ref.submit(s, g.global));
  };
  std::vector<std::vector<float>> initial;  // the reference's tables before the first step: weights, state of each
  for (std::size_t t = 0; t < cfg.tables.size(); ++t) {
    const TableSpec& spec = cfg.tables[t].spec;
    initial.emplace_back(static_cast<std::size_t>(spec.rows * spec.dim));
    initial.emplace_back(static_cast<std::size_t>(spec.rows * optimizer_state_dim(spec.optimizer.kind, spec.dim)));
    if (fail("reference read_rows", ref.read_rows(static_cast<int>(t), 0, spec.rows, initial[2 * t].data(),
                                                  initial[2 * t + 1].empty() ? nullptr : initial[2 * t + 1].data())))
      return err.str();
  }
  if (!submit(0)) return err.str();
  for (int s = 0; s < c.steps; ++s) {
    if (s + 1 < c.steps && !submit(s + 1)) return err.str();
    const GlobalStep& g = steps[static_cast<std::size_t>(s)];
    const KeyBatch& mine = g.local[static_cast<std::size_t>(r)];
    // Reference on the global batch.
    std::vector<std::vector<float>> ref_out;
    std::vector<MatrixView> ref_views;
    for (const auto& f : g.global.features) {
      const TableSpec& spec = spec_of(cfg, f.table);
      ref_out.emplace_back(static_cast<std::size_t>(output_rows(f, spec.pooling) * spec.dim));
    }
    for (std::size_t i = 0; i < ref_out.size(); ++i) {
      const TableSpec& spec = spec_of(cfg, g.global.features[i].table);
      ref_views.push_back({ref_out[i].data(), static_cast<std::int64_t>(ref_out[i].size()) / spec.dim, spec.dim,
                           MemorySpace::kHost, spec.output_dtype});
    }
    if (fail("reference forward", ref.forward(s, ref_views))) return err.str();
    // This rank's part: its outputs, and its slice of the global gradients. Each output buffer holds
    // its view's bytes (of the output dtype), then as many guard bytes and kGuardWords more, which no
    // call may write.
    Buffers out, grads;
    std::vector<std::size_t> global_feature, out_bytes;
    for (const auto& f : mine.features) {
      std::size_t gf = 0;
      while (g.global.features[gf].table != f.table) ++gf;
      global_feature.push_back(gf);
      const TableSpec& spec = spec_of(cfg, f.table);
      const auto [row0, rows] = slice_of(g, cfg, gf, r);
      out_bytes.push_back(static_cast<std::size_t>(rows * spec.dim * element_bytes(spec.output_dtype)));
      out.data.emplace_back(2 * ((out_bytes.back() + 3) / 4) + kGuardWords);
      std::memset(out.data.back().data(), kGuardByte, out.data.back().size() * sizeof(float));
      out.views.push_back({out.data.back().data(), rows, spec.dim, MemorySpace::kHost, spec.output_dtype});
      const float* slice = g.global_grads[gf].data() + row0 * spec.dim;
      grads.data.push_back(packed(spec.output_dtype, slice, static_cast<std::size_t>(rows * spec.dim)));
      grads.views.push_back({grads.data.back().data(), rows, spec.dim, MemorySpace::kHost, spec.output_dtype});
      grads.cviews.push_back({grads.data.back().data(), rows, spec.dim, MemorySpace::kHost, spec.output_dtype});
    }
    // Each rank takes, step by step in turn, host views, host and device views alternating in one
    // call (the first feature's a host one), device views, and both alternating again (the first a
    // device one); it draws a synchronous or stream-ordered step (ranks may differ: each is its own
    // trainer).
    std::mt19937_64 draw(c.seed * 1000003 + static_cast<std::uint64_t>(s) * 131 + static_cast<std::uint64_t>(r));
    const std::uint64_t views = (c.seed + static_cast<std::uint64_t>(s + r)) % 4;
    StepMode mode;
    mode.device = views != 0;
    if (draw() % 2 == 0) mode.stream = trainer.view();
    if (views % 2 == 1)
      for (std::size_t i = 0; i < mine.features.size(); ++i) mode.on_device.push_back((i + views / 2) % 2 == 1);
    if (fail("step " + std::to_string(s) +
                 (!mode.device             ? " (host views"
                  : mode.on_device.empty() ? " (device views"
                                           : " (mixed views") +
                 (mode.ordered() ? ", stream-ordered)" : ", synchronous)"),
             run_step(store, s, grads, out, mode)))
      return err.str();
    for (std::size_t i = 0; i < mine.features.size(); ++i) {
      const std::size_t gf = global_feature[i];
      const TableSpec& spec = spec_of(cfg, mine.features[i].table);
      const auto [row0, rows] = slice_of(g, cfg, gf, r);
      const DType od = spec.output_dtype;
      const std::size_t n = static_cast<std::size_t>(rows * spec.dim);
      check("step " + std::to_string(s) + " output of " + spec.name, elements(od, out.data[i].data(), 0, n).data(),
            elements(od, ref_out[gf].data(), static_cast<std::size_t>(row0 * spec.dim), n).data(), n,
            std::max(half_ulp(spec), unit_roundoff(od)));
      const auto* bytes = reinterpret_cast<const unsigned char*>(out.data[i].data());
      for (std::size_t k = out_bytes[i]; k < out.data[i].size() * sizeof(float); ++k)
        if (bytes[k] != kGuardByte) {
          err << "rank " << r << ": step " << s << ": the output of " << spec.name << " (" << out_bytes[i]
              << " bytes of " << to_string(od) << ") was written past its end, at byte " << k << "\n";
          break;
        }
      if (trace) trace->insert(trace->end(), out.data[i].begin(), out.data[i].end());
    }
    std::vector<ConstMatrixView> ref_grads;
    std::vector<std::vector<float>> ref_grad_data;
    for (std::size_t i = 0; i < g.global.features.size(); ++i)
      ref_grad_data.push_back(packed(ref_views[i].dtype, g.global_grads[i].data(), g.global_grads[i].size()));
    for (std::size_t i = 0; i < g.global.features.size(); ++i)
      ref_grads.push_back(
          {ref_grad_data[i].data(), ref_views[i].rows, ref_views[i].cols, MemorySpace::kHost, ref_views[i].dtype});
    if (fail("reference backward", ref.backward(s, ref_grads))) return err.str();
  }
  // A checkpoint of the sharded store (save and load are collectives into one directory that every rank shares,
  // named by rank 0's pid: mpi ranks are processes), then a reset of every row, then the checkpoint loaded back.
  std::int64_t pid0 = ::getpid();
  if (fail("broadcast of rank 0's pid", comm->broadcast(&pid0, sizeof pid0, 0))) return err.str();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("strata_sharded_" + std::to_string(pid0) + "_" + case_name(c)))
          .string();
  if (fail("save", store.save(dir))) return err.str();
  for (std::size_t t = 0; t < cfg.tables.size(); ++t) {
    const TableSpec& spec = cfg.tables[t].spec;
    const std::vector<float> zeros(static_cast<std::size_t>(spec.rows * spec.dim), 0.0f);
    if (fail("write_rows", store.write_rows(static_cast<int>(t), 0, spec.rows, zeros.data(), nullptr)))
      return err.str();
  }
  if (fail("load", store.load(dir))) return err.str();
  if (fail("barrier after load", comm->barrier())) return err.str();
  if (r == 0) std::filesystem::remove_all(dir);
  if (c.tiny && c.world == 1) {  // one rank serves every row: its caches must have been bypassed
    std::int64_t bypassed = 0;
    for (const auto& [name, st] : store.stats().cache) bypassed += st.bypassed;
    if (bypassed == 0) err << "rank 0: no row bypassed the caches of 1..10 rows\n";
  }
  // Final tables (read_rows is collective: every rank reads every table).
  for (std::size_t t = 0; t < cfg.tables.size(); ++t) {
    const TableSpec& spec = cfg.tables[t].spec;
    half_diffs = {};
    const std::int32_t sd = optimizer_state_dim(spec.optimizer.kind, spec.dim);
    // A part of the table first (ranges that start and end inside shards), then all of it.
    for (const auto& [row0, n] : {std::make_pair(spec.rows / 3, spec.rows - spec.rows / 3 - spec.rows / 4),
                                  std::make_pair(std::int64_t{0}, spec.rows)}) {
      std::vector<float> w(static_cast<std::size_t>(n * spec.dim)), st(static_cast<std::size_t>(n * sd)), rw(w.size()),
          rst(st.size());
      if (fail("read_rows " + spec.name,
               store.read_rows(static_cast<int>(t), row0, n, w.data(), sd ? st.data() : nullptr)))
        return err.str();
      if (fail("reference read_rows",
               ref.read_rows(static_cast<int>(t), row0, n, rw.data(), sd ? rst.data() : nullptr)))
        return err.str();
      const bool whole = n == spec.rows;
      check_elements("weights of " + spec.name + " from row " + std::to_string(row0), w.data(), rw.data(), w.size(),
                     spec.dtype, whole ? initial[2 * t].data() : nullptr);
      check_elements("state of " + spec.name + " from row " + std::to_string(row0), st.data(), rst.data(), st.size(),
                     spec.state_dtype, whole ? initial[2 * t + 1].data() : nullptr);
      if (trace) {
        trace->insert(trace->end(), w.begin(), w.end());
        trace->insert(trace->end(), st.begin(), st.end());
      }
    }
    // More than one and 5% (none differed in the cases of this suite).
    if (half_diffs.differ > 1 && half_diffs.differ * 20 > half_diffs.changed)
      err << "rank " << r << ": " << half_diffs.differ << " half elements of " << spec.name << " differ from the "
          << "reference's, of " << half_diffs.changed << " it changed (rounding bits of the wrong rows or columns?)\n";
  }
  return err.str();
}

}  // namespace strata::testing
