#include "cache/analysis.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>

namespace strata::cache {

namespace {

// Counts over positions 0..n-1 with point updates and prefix sums, both O(log n).
class Fenwick {
 public:
  explicit Fenwick(std::int64_t n) : tree_(static_cast<std::size_t>(n) + 1, 0) {}

  void add(std::int64_t pos, std::int64_t delta) {
    for (std::size_t i = static_cast<std::size_t>(pos) + 1; i < tree_.size(); i += i & (~i + 1)) tree_[i] += delta;
  }
  // Sets positions [0, count) to 1 and the rest to 0, in O(n).
  void assign_ones(std::int64_t count) {
    std::fill(tree_.begin(), tree_.end(), 0);
    for (std::size_t i = 1; i < tree_.size(); ++i) {
      if (static_cast<std::int64_t>(i) <= count) tree_[i] += 1;
      const std::size_t parent = i + (i & (~i + 1));
      if (parent < tree_.size()) tree_[parent] += tree_[i];
    }
  }
  // Sum over positions [0, pos]; 0 for pos < 0.
  std::int64_t prefix(std::int64_t pos) const {
    std::int64_t s = 0;
    for (std::size_t i = static_cast<std::size_t>(pos + 1); i > 0; i -= i & (~i + 1)) s += tree_[i];
    return s;
  }

 private:
  std::vector<std::int64_t> tree_;
};

// The trace with keys renumbered densely (0.. distinct-1, in order of first use) and, in the
// per-batch distinct model, each batch's repeated keys dropped (first occurrences kept, in order).
struct DenseTrace {
  std::vector<std::int64_t> ids;      // (accesses) dense key ids
  std::vector<std::int64_t> offsets;  // (batches + 1) into ids; empty in the per-access model
  std::int64_t distinct_keys = 0;
  std::int64_t widest_batch = -1;      // first batch with the most distinct keys (-1: no batches)
  std::int64_t widest_batch_keys = 0;  // its distinct key count
};

DenseTrace make_dense(const KeyTrace& trace, PerBatch per_batch) {
  DenseTrace d;
  std::unordered_map<std::uint64_t, std::int64_t> id_of;
  id_of.reserve(trace.keys.size());
  auto dense_id = [&](std::uint64_t key) {
    const auto [it, inserted] = id_of.try_emplace(key, static_cast<std::int64_t>(id_of.size()));
    return it->second;
  };
  if (per_batch == PerBatch::kEveryAccess) {
    d.ids.reserve(trace.keys.size());
    for (const std::uint64_t k : trace.keys) d.ids.push_back(dense_id(k));
    d.distinct_keys = static_cast<std::int64_t>(id_of.size());
    return d;
  }
  // last_batch[id]: the last batch that used the key, to drop repeats within a batch in O(1).
  std::vector<std::int64_t> last_batch;
  d.ids.reserve(trace.keys.size());
  d.offsets.reserve(trace.batch_offsets.size());
  d.offsets.push_back(0);
  for (std::int64_t b = 0; b < trace.num_batches(); ++b) {
    for (std::int64_t i = trace.batch_offsets[b]; i < trace.batch_offsets[b + 1]; ++i) {
      const std::int64_t id = dense_id(trace.keys[static_cast<std::size_t>(i)]);
      if (id == static_cast<std::int64_t>(last_batch.size())) last_batch.push_back(-1);
      if (last_batch[id] == b) continue;
      last_batch[id] = b;
      d.ids.push_back(id);
    }
    d.offsets.push_back(static_cast<std::int64_t>(d.ids.size()));
    const std::int64_t width = d.offsets[b + 1] - d.offsets[b];
    if (d.widest_batch < 0 || width > d.widest_batch_keys) {
      d.widest_batch = b;
      d.widest_batch_keys = width;
    }
  }
  d.distinct_keys = static_cast<std::int64_t>(id_of.size());
  return d;
}

}  // namespace

Status validate_cache_key(int table, Key row) {
  if (table < 0 || table >= kMaxCacheTables)
    return Status::out_of_range("cache key: table " + std::to_string(table) + " out of range [0, " +
                                std::to_string(kMaxCacheTables) + ")");
  if (row < 0 || row >= kMaxCacheRows)
    return Status::out_of_range("cache key: table " + std::to_string(table) + ": row " + std::to_string(row) +
                                " out of range [0, " + std::to_string(kMaxCacheRows) + ")");
  return Status::ok();
}

std::uint64_t cache_key(int table, Key row) {
  const Status s = validate_cache_key(table, row);
  if (!s.is_ok()) {
    std::fprintf(stderr, "strata: cache_key: %s\n", s.message().c_str());
    std::abort();
  }
  return (static_cast<std::uint64_t>(table) << kCacheKeyRowBits) | static_cast<std::uint64_t>(row);
}

Status validate(const KeyTrace& trace) {
  const auto& off = trace.batch_offsets;
  if (off.empty()) {
    if (trace.keys.empty()) return Status::ok();
    return Status::invalid_argument("key trace: batch_offsets are empty but there are " +
                                    std::to_string(trace.keys.size()) + " keys (expected batches+1 offsets)");
  }
  if (off.front() != 0)
    return Status::invalid_argument("key trace: batch_offsets[0] is " + std::to_string(off.front()) + " (expected 0)");
  for (std::size_t b = 1; b < off.size(); ++b) {
    if (off[b] < off[b - 1])
      return Status::invalid_argument("key trace: batch_offsets are not monotone: batch_offsets[" + std::to_string(b) +
                                      "] = " + std::to_string(off[b]) + " < batch_offsets[" + std::to_string(b - 1) +
                                      "] = " + std::to_string(off[b - 1]));
  }
  if (off.back() != trace.num_keys())
    return Status::invalid_argument("key trace: batch_offsets end at " + std::to_string(off.back()) +
                                    " (expected the key count " + std::to_string(trace.num_keys()) + ")");
  return Status::ok();
}

std::int64_t LruCurve::hits_at(std::int64_t capacity) const {
  STRATA_CHECK(capacity >= 0);
  const std::int64_t c = std::min(capacity, max_stack_distance());
  return cumulative_hits_[static_cast<std::size_t>(c)];
}

double LruCurve::hit_rate_at(std::int64_t capacity) const {
  return accesses_ == 0 ? 0.0 : static_cast<double>(hits_at(capacity)) / static_cast<double>(accesses_);
}

Result<LruCurve> lru_curve(const KeyTrace& trace, PerBatch per_batch) {
  STRATA_RETURN_IF_ERROR(validate(trace));
  const DenseTrace d = make_dense(trace, per_batch);
  const std::int64_t n = static_cast<std::int64_t>(d.ids.size());
  const bool every_access = per_batch == PerBatch::kEveryAccess;
  // In the per-access model each access is its own "batch" of one.
  const std::int64_t groups = every_access ? n : static_cast<std::int64_t>(d.offsets.size()) - 1;

  // Accesses are numbered by slots in time order; marks has a 1 at the slot of each key's latest
  // access, so the keys used since slot p and before slot s are counted by marks over (p, s). The
  // slots are compacted (live ones renumbered in order, dead ones dropped) whenever they run out,
  // so the tree stays about twice the distinct key count instead of one entry per access: small
  // enough to stay in cache, which is most of the speed on long traces.
  const std::int64_t capacity = std::max<std::int64_t>(2 * d.distinct_keys, 2);
  Fenwick marks(capacity);
  std::vector<std::int64_t> id_at(static_cast<std::size_t>(capacity), -1);        // slot -> key id
  std::vector<std::int64_t> last(static_cast<std::size_t>(d.distinct_keys), -1);  // key id -> slot
  std::int64_t next_slot = 0;
  const auto compact = [&] {
    std::int64_t live = 0;
    for (std::int64_t s = 0; s < next_slot; ++s) {
      const std::int64_t id = id_at[static_cast<std::size_t>(s)];
      if (id < 0 || last[static_cast<std::size_t>(id)] != s) continue;
      id_at[static_cast<std::size_t>(live)] = id;
      last[static_cast<std::size_t>(id)] = live++;
    }
    std::fill(id_at.begin() + live, id_at.begin() + next_slot, -1);
    marks.assign_ones(live);
    next_slot = live;
  };
  // Distances are in [1, distinct_keys].
  std::vector<std::int64_t> histogram(static_cast<std::size_t>(d.distinct_keys) + 1, 0);
  std::int64_t max_distance = 0;
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t begin = every_access ? g : d.offsets[g];
    const std::int64_t end = every_access ? g + 1 : d.offsets[g + 1];
    // A group's keys are distinct, so it needs at most distinct_keys <= capacity / 2 slots.
    if (next_slot + (end - begin) > capacity) compact();
    // All distances of a batch are measured at its start, before any of its keys moves up: moving
    // one key of the batch first would wrongly shorten the distance of another.
    const std::int64_t before_batch = marks.prefix(next_slot - 1);
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t p = last[static_cast<std::size_t>(d.ids[i])];
      if (p < 0) continue;  // compulsory miss
      const std::int64_t distance = before_batch - marks.prefix(p) + 1;
      ++histogram[static_cast<std::size_t>(distance)];
      max_distance = std::max(max_distance, distance);
    }
    for (std::int64_t i = begin; i < end; ++i) {
      std::int64_t& p = last[static_cast<std::size_t>(d.ids[i])];
      if (p >= 0) marks.add(p, -1);
      marks.add(next_slot, +1);
      id_at[static_cast<std::size_t>(next_slot)] = d.ids[i];
      p = next_slot++;
    }
  }

  LruCurve curve;
  curve.per_batch_ = per_batch;
  curve.accesses_ = n;
  curve.distinct_keys_ = d.distinct_keys;
  curve.min_capacity_ = every_access ? 0 : d.widest_batch_keys;
  histogram.resize(static_cast<std::size_t>(max_distance) + 1);
  curve.cumulative_hits_.assign(histogram.size(), 0);
  for (std::size_t c = 1; c < histogram.size(); ++c)
    curve.cumulative_hits_[c] = curve.cumulative_hits_[c - 1] + histogram[c];
  curve.histogram_ = std::move(histogram);
  return curve;
}

Result<BeladyHits> belady_hits(const KeyTrace& trace, std::int64_t capacity) {
  if (capacity < 0)
    return Status::invalid_argument("belady: capacity " + std::to_string(capacity) + " rows (expected >= 0)");
  STRATA_RETURN_IF_ERROR(validate(trace));
  const DenseTrace d = make_dense(trace, PerBatch::kDistinct);
  if (d.widest_batch_keys > capacity) {
    // Name the first batch that does not fit, not only the widest.
    for (std::int64_t b = 0; b + 1 < static_cast<std::int64_t>(d.offsets.size()); ++b) {
      const std::int64_t width = d.offsets[b + 1] - d.offsets[b];
      if (width > capacity)
        return Status::invalid_argument("belady: batch " + std::to_string(b) + " has " + std::to_string(width) +
                                        " distinct keys, more than the capacity " + std::to_string(capacity) +
                                        " rows (every key of a batch must be resident at once)");
    }
  }
  const std::int64_t n = static_cast<std::int64_t>(d.ids.size());
  const std::int64_t batches = static_cast<std::int64_t>(d.offsets.size()) - 1;
  constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

  // next_use[i]: the next batch after access i's batch that uses the same key (ids are distinct
  // within a batch, so one backward sweep suffices).
  std::vector<std::int64_t> next_use(static_cast<std::size_t>(n));
  {
    std::vector<std::int64_t> next_batch(static_cast<std::size_t>(d.distinct_keys), kNever);
    for (std::int64_t b = batches - 1; b >= 0; --b) {
      for (std::int64_t i = d.offsets[b]; i < d.offsets[b + 1]; ++i) {
        next_use[i] = next_batch[d.ids[i]];
        next_batch[d.ids[i]] = b;
      }
    }
  }

  // resident_next[id]: the next use of a resident key, or -1 when it is not resident. The heap
  // holds (next use, id) for resident keys, furthest first; an entry whose next use no longer
  // matches resident_next is stale and skipped (a key's next use only grows while it is resident,
  // and a re-admitted key gets a next use beyond the batch that re-admitted it).
  std::vector<std::int64_t> resident_next(static_cast<std::size_t>(d.distinct_keys), -1);
  std::priority_queue<std::pair<std::int64_t, std::int64_t>> heap;
  std::int64_t resident = 0;
  BeladyHits out;
  out.capacity = capacity;
  out.accesses = n;
  out.compulsory_misses = d.distinct_keys;
  for (std::int64_t b = 0; b < batches; ++b) {
    std::int64_t misses = 0;
    for (std::int64_t i = d.offsets[b]; i < d.offsets[b + 1]; ++i) {
      if (resident_next[d.ids[i]] >= 0) {
        ++out.hits;
      } else {
        ++misses;
      }
    }
    // Resident keys of this batch have next use b, the smallest of any resident key, so the
    // furthest resident key is never one of them while an eviction is needed (the batch fits).
    for (std::int64_t evict = resident + misses - capacity; evict > 0;) {
      STRATA_CHECK(!heap.empty());
      const auto [next, id] = heap.top();
      heap.pop();
      if (resident_next[id] != next) continue;
      STRATA_CHECK(next > b);
      resident_next[id] = -1;
      --resident;
      --evict;
    }
    for (std::int64_t i = d.offsets[b]; i < d.offsets[b + 1]; ++i) {
      const std::int64_t id = d.ids[i];
      if (resident_next[id] < 0) ++resident;
      resident_next[id] = next_use[i];
      heap.emplace(next_use[i], id);
    }
  }
  return out;
}

}  // namespace strata::cache
