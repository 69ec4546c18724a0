#include "cache/cache_planner.hpp"

#include <algorithm>
#include <limits>

namespace strata::cache {

namespace {
// lookahead: the half-life of the frequency sketch, and the ticks of recency one frequency level
// is worth in the eviction order (a quarter doubling of the decayed count: half_life / 4).
std::uint64_t half_life(const CachePlannerOptions& o) {
  return static_cast<std::uint64_t>(
      std::max<std::int64_t>(1, o.half_life > 0 ? o.half_life : kDefaultHalfLifeSlots * o.slots));
}
std::uint64_t level_step(const CachePlannerOptions& o) {
  if (o.policy != Policy::kLookahead) return 0;
  return std::max<std::uint64_t>(1, half_life(o) / detail::FrequencySketch::kLevelsPerDoubling);
}
}  // namespace

CachePlanner::CachePlanner(CachePlannerOptions options)
    : opt_(std::move(options)),
      index_(opt_.slots),
      slots_(static_cast<std::size_t>(opt_.slots)),
      version_(static_cast<std::size_t>(opt_.slots), 0),
      order_(opt_.slots, level_step(opt_)),
      table_(opt_.tables.size()),
      window_(opt_.window > 0 ? opt_.window : 64),
      sketch_(opt_.policy == Policy::kLookahead ? opt_.slots : 0, half_life(opt_)) {
  STRATA_CHECK(opt_.slots >= 0 && opt_.slots <= (std::int64_t{1} << 30));  // slots are 32-bit inside
  STRATA_CHECK(opt_.tables.size() <= (std::size_t{1} << 16));              // tables are 16-bit in cache keys
  for (const PoolTable& t : opt_.tables) any_cap_ = any_cap_ || t.cap > 0;
  table_order_.reserve(opt_.tables.size());
  for (const PoolTable& t : opt_.tables)
    table_order_.emplace_back(t.cap > 0 ? std::min(t.cap, opt_.slots) : 0, level_step(opt_));
  free_.reserve(static_cast<std::size_t>(opt_.slots));
  // Popped from the back: slot 0 is used first.
  for (std::int64_t s = opt_.slots - 1; s >= 0; --s) free_.push_back(s);
}

namespace {
std::string table_list(const CachePlannerOptions& opt, const std::vector<std::int64_t>& per_table) {
  std::string s;
  for (std::size_t t = 0; t < per_table.size(); ++t) {
    if (per_table[t] == 0) continue;
    if (!s.empty()) s += ", ";
    s += "'" + opt.tables[t].name + "': " + std::to_string(per_table[t]);
  }
  return s;
}

// Some loops over a batch's rows go block by block (commit's hits, retire, window_push's rows new
// to the window): a first pass over a block starts loading what the rows will touch (hash entries,
// slot records, queue tails), a second pass (if any) what those point to, and the last pass does
// the work on lines already in cache. The random accesses of a block are independent, so they
// overlap instead of each waiting on memory in turn. The others (probe, commit's misses,
// window_push's window entries) pipeline their loads a fixed distance ahead instead: measured
// faster there, and slower in retire and commit's hits (BM_PlanBatch).
constexpr std::size_t kBlock = 64;
}  // namespace

const CachePlanner::Slot CachePlanner::kFreeSlot{};

// Pins a resident slot; a slot leaving the eviction order gets a new version (its entries go stale).
inline void CachePlanner::pin(Slot& s, std::int64_t slot) {
  if (s.state++ % Slot::kDirty == 0) {  // no pins before
    ++version_[static_cast<std::size_t>(slot)];
    ++pinned_total_;
    ++table_[s.table()].pinned;
  }
}

// Queues an unpinned resident slot by its current rank (cache/policy.hpp), in the pool's order and
// in its table's when the table has a cap. Any entry queued before goes stale.
void CachePlanner::enter_order(std::int64_t slot) {
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  const std::uint32_t version = ++version_[static_cast<std::size_t>(slot)];
  const auto slot32 = static_cast<std::int32_t>(slot);
  const std::size_t table = s.table();
  detail::EvictionOrder* table_order = opt_.tables[table].cap > 0 ? &table_order_[table] : nullptr;
  if (opt_.policy == Policy::kLookahead && s.next_use != detail::WindowMap::kNone) {
    // Rows used again within the window rank above every other row, sooner use higher (Belady
    // within the window), then more uses.
    const std::uint32_t uses = std::min<std::uint32_t>(s.freq & kUsesMask, (1u << 20) - 1);
    order_.push_windowed(s.next_use, uses, static_cast<std::int32_t>(table), slot32, version);
    if (table_order) table_order->push_windowed(s.next_use, uses, static_cast<std::int32_t>(table), slot32, version);
  } else {
    // lru: by last use. lfu: by uses, then last use (so stale rows leave first instead of ties
    // going to the lowest slot). lookahead rows with no use in the window: by last use plus what
    // their recent frequency is worth (the order is aged, see eviction_order.hpp). The tick is
    // compared in full (the packed score this replaced kept 40 bits of it, which wrapped after
    // 2^40 uses).
    const std::uint32_t bucket = ranked_bucket(s);
    order_.push_ranked(bucket, s.last, slot32, version);
    if (table_order) table_order->push_ranked(bucket, s.last, slot32, version);
  }
  order_.maybe_compact(version_.data());
  if (table_order) table_order->maybe_compact(version_.data());
}

void CachePlanner::window_push(std::int64_t seq, const std::vector<FeatureKeys>& features) {
  if (opt_.policy != Policy::kLookahead) return;
  const auto record = [this](std::int32_t slot) { return &slots_[static_cast<std::size_t>(slot)]; };
  constexpr std::size_t kAhead = 16, kRing = 32;  // the ring holds rows u .. u + kAhead
  std::uint64_t hash[kRing];
  for (const auto& f : features) {
    const Key* keys = f.unique->keys.data();
    const std::size_t n = f.unique->keys.size();
    // A pipeline over the rows: the window entry of row u + kAhead starts loading while row u is
    // pushed. Rows that had no use in the window are kept (their index chunk loading) for the
    // pass below.
    const auto hash_ahead = [&](std::size_t u) {
      hash[u % kRing] = detail::KeyMap::hash(cache_key(f.table, keys[u]));
      window_.prefetch_line(hash[u % kRing]);
    };
    for (std::size_t u = 0; u < std::min(n, kAhead); ++u) hash_ahead(u);
    first_.clear();
    for (std::size_t u = 0; u < n; ++u) {
      if (u + kAhead < n) hash_ahead(u + kAhead);
      const std::uint64_t h = hash[u % kRing];
      if (!window_.push(cache_key(f.table, keys[u]), h, seq)) continue;
      first_.push_back({h, static_cast<std::uint32_t>(u)});
      index_.prefetch_line(h);
    }
    // A resident row that just gained a next use ranks anew (now, or when it is unpinned).
    const std::size_t nf = first_.size();
    for (std::size_t b = 0; b < nf; b += kBlock) {
      const std::size_t e = std::min(nf, b + kBlock);
      for (std::size_t j = b; j < e; ++j) index_.prefetch_record_line(first_[j].hash, record);
      for (std::size_t j = b; j < e; ++j) {
        const std::int64_t slot = index_.find(cache_key(f.table, keys[first_[j].u]), first_[j].hash, key_of());
        if (slot < 0) continue;
        Slot& s = slots_[static_cast<std::size_t>(slot)];
        s.next_use = seq;
        if (s.pins() == 0) enter_order(slot);
      }
    }
  }
}

void CachePlanner::window_drop(std::int64_t seq, const std::vector<FeatureKeys>& features) {
  if (opt_.policy != Policy::kLookahead) return;
  for (const auto& f : features) {
    for (Key row : f.unique->keys) {
      const std::uint64_t ck = cache_key(f.table, row);
      const std::uint64_t h = detail::KeyMap::hash(ck);
      const detail::WindowMap::Dropped d = window_.drop(ck, h, seq);
      if (!d.was_front) continue;
      const std::int64_t slot = index_.find(ck, h, key_of());
      if (slot < 0) continue;
      Slot& s = slots_[static_cast<std::size_t>(slot)];
      s.next_use = d.front;
      if (s.pins() == 0) enter_order(slot);
    }
  }
}

Result<PoolProbe> CachePlanner::probe(std::int64_t seq, const std::vector<FeatureKeys>& features, bool bypass) const {
  PoolProbe p;
  p.seq = seq;
  p.features = features;
  p.found.resize(features.size());
  const std::size_t T = opt_.tables.size();
  // unique: rows that are not in overflow slots (those need no cache slot).
  std::vector<std::int64_t> unique(T, 0), misses(T, 0), hits_unpinned(T, 0);
  const bool any_overflow = !overflow_index_.empty();
  const auto record = [this](std::int32_t slot) { return &slots_[static_cast<std::size_t>(slot)]; };
  constexpr std::size_t kChunkAhead = 24, kRecordAhead = 12, kRing = 32;
  std::uint64_t hash[kRing];
  for (std::size_t i = 0; i < features.size(); ++i) {
    const FeatureKeys& f = features[i];
    const std::size_t t = static_cast<std::size_t>(f.table);
    const Key* keys = f.unique->keys.data();
    const std::size_t n = f.unique->keys.size();
    auto& found = p.found[i];
    found.resize(n);
    std::int64_t m = 0, h = 0, o = 0;
    // A pipeline over the rows: the index chunk of row u + kChunkAhead and the record of row
    // u + kRecordAhead (whose chunk has arrived by then) start loading while row u is looked up
    // (BM_PlanBatch 2-7% faster than blocks of 64 rows with each stage a burst of loads).
    const auto hash_of = [&](std::size_t u) { return detail::KeyMap::hash(cache_key(f.table, keys[u])); };
    for (std::size_t u = 0; u < std::min(n, kChunkAhead); ++u) {
      hash[u % kRing] = hash_of(u);
      index_.prefetch_line(hash[u % kRing]);
    }
    for (std::size_t u = 0; u < std::min(n, kRecordAhead); ++u) index_.prefetch_record_line(hash[u % kRing], record);
    for (std::size_t u = 0; u < n; ++u) {
      if (u + kChunkAhead < n) {
        hash[(u + kChunkAhead) % kRing] = hash_of(u + kChunkAhead);
        index_.prefetch_line(hash[(u + kChunkAhead) % kRing]);
      }
      if (u + kRecordAhead < n) index_.prefetch_record_line(hash[(u + kRecordAhead) % kRing], record);
      const std::int64_t slot = index_.find(cache_key(f.table, keys[u]), hash[u % kRing], key_of());
      found[u] = slot;
      // Branch-free counting: hits and misses interleave unpredictably.
      const bool hit = slot >= 0;
      const Slot& s = hit ? slots_[static_cast<std::size_t>(slot)] : kFreeSlot;
      m += !hit;
      h += static_cast<std::int64_t>(hit) & static_cast<std::int64_t>(s.pins() == 0);
      if (__builtin_expect(!hit && any_overflow, 0)) {  // a row a batch in flight bypassed?
        const std::int64_t over = overflow_slot_of(cache_key(f.table, keys[u]));
        if (over >= 0) {
          found[u] = over;
          --m;
          ++o;
        }
      }
    }
    misses[t] += m;
    hits_unpinned[t] += h;
    unique[t] += static_cast<std::int64_t>(n) - o;
    p.overflow = p.overflow || o > 0;
  }
  p.overflow_records = static_cast<std::int64_t>(overflow_.size());
  if (bypass) {
    bypass_misses(p, misses, hits_unpinned);
    return p;
  }
  std::int64_t total_unique = 0, total_misses = 0, total_hits_unpinned = 0;
  for (std::size_t t = 0; t < T; ++t) {
    total_unique += unique[t];
    total_misses += misses[t];
    total_hits_unpinned += hits_unpinned[t];
    const std::int64_t cap = opt_.tables[t].cap;
    if (cap <= 0) continue;
    if (unique[t] > cap)
      return Status::resource_exhausted("table '" + opt_.tables[t].name + "' in slot pool " + opt_.name +
                                        ": the batch has " + std::to_string(unique[t]) +
                                        " unique rows but the table's cache cap is " + std::to_string(cap) + " slots");
    if (misses[t] > cap - table_[t].pinned - hits_unpinned[t])
      return Status::resource_exhausted("table '" + opt_.tables[t].name + "' in slot pool " + opt_.name +
                                        ": the batch needs " + std::to_string(misses[t]) + " new slots but only " +
                                        std::to_string(cap - table_[t].pinned - hits_unpinned[t]) + " of its cap of " +
                                        std::to_string(cap) + " are not pinned by batches in flight");
  }
  if (total_unique > opt_.slots)
    return Status::resource_exhausted("slot pool " + opt_.name + ": the batch has " + std::to_string(total_unique) +
                                      " unique rows (" + table_list(opt_, unique) + ") but the cache holds only " +
                                      std::to_string(opt_.slots) + " rows");
  const std::int64_t evictable = opt_.slots - pinned_total_ - total_hits_unpinned;
  if (total_misses > evictable)
    return Status::resource_exhausted(
        "slot pool " + opt_.name + ": the batch needs " + std::to_string(total_misses) + " new slots but only " +
        std::to_string(evictable) + " of " + std::to_string(opt_.slots) + " are free or evictable (" +
        std::to_string(pinned_total_) +
        " pinned by batches in flight); raise the cache capacity or keep fewer batches in flight");
  return p;
}

// The misses beyond the room the probe's checks below demand (each table's cap, the free and
// evictable slots) become kBypass, in feature and row order: the first misses fill the room.
void CachePlanner::bypass_misses(PoolProbe& p, const std::vector<std::int64_t>& misses,
                                 const std::vector<std::int64_t>& hits_unpinned) const {
  const std::size_t T = opt_.tables.size();
  std::int64_t total_misses = 0, total_hits_unpinned = 0;
  std::vector<std::int64_t> room(T, std::numeric_limits<std::int64_t>::max());
  bool fits = true;
  for (std::size_t t = 0; t < T; ++t) {
    total_misses += misses[t];
    total_hits_unpinned += hits_unpinned[t];
    const std::int64_t cap = opt_.tables[t].cap;
    if (cap <= 0) continue;
    room[t] = std::max<std::int64_t>(0, cap - table_[t].pinned - hits_unpinned[t]);
    fits = fits && misses[t] <= room[t];
  }
  std::int64_t pool_room = std::max<std::int64_t>(0, opt_.slots - pinned_total_ - total_hits_unpinned);
  if (fits && total_misses <= pool_room) return;
  std::int64_t bypassed = 0;
  for (std::size_t i = 0; i < p.features.size(); ++i) {
    std::int64_t& table_room = room[static_cast<std::size_t>(p.features[i].table)];
    for (std::int64_t& slot : p.found[i]) {
      if (slot != PoolProbe::kMiss) continue;
      if (table_room > 0 && pool_room > 0) {
        --table_room;
        --pool_room;
      } else {
        slot = PoolProbe::kBypass;
        ++bypassed;
      }
    }
  }
  p.overflow = true;
  p.overflow_records += std::max<std::int64_t>(0, bypassed - static_cast<std::int64_t>(overflow_free_.size()));
}

std::int64_t CachePlanner::take_victim(int table) {
  const std::size_t t = static_cast<std::size_t>(table);
  const std::int64_t cap = opt_.tables[t].cap;
  const bool capped = cap > 0 && table_[t].count >= cap;
  std::int64_t slot;
  if (!capped && !free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = (capped ? table_order_[t] : order_).min(version_.data());
    STRATA_CHECK(slot >= 0);                     // probe() guaranteed room
    ++version_[static_cast<std::size_t>(slot)];  // leaves the order
    if (any_cap_) --table_[slots_[static_cast<std::size_t>(slot)].table()].count;
  }
  // Counted now, so that the next choice sees the counts as they will be (they matter only to
  // tables with a cap, and are kept only when there is one).
  if (any_cap_) ++table_[t].count;
  return slot;
}

PoolPlan CachePlanner::commit(PoolProbe probe) {
  PoolPlan plan;
  plan.seq = probe.seq;
  plan.unique_slots.resize(probe.features.size());
  const bool lookahead = opt_.policy == Policy::kLookahead;
  // Recency follows the order of first use within the batch (features in order, rows in first-use
  // order), for hits and misses alike, although hits are processed first.
  std::vector<std::uint64_t> tick_base(probe.features.size());
  if (lookahead) sketch_.start(tick_);  // every use of the batch weighs as at its first tick
  for (std::size_t i = 0; i < probe.features.size(); ++i) {
    tick_base[i] = tick_;
    tick_ += probe.features[i].unique->keys.size();
  }
  // Hits first, so that no victim chosen for a miss is a row this batch uses. The rows of each
  // feature are split into hits and misses without branching (they interleave unpredictably).
  misses_.clear();
  for (std::size_t i = 0; i < probe.features.size(); ++i) {
    const FeatureKeys& f = probe.features[i];
    const Key* keys = f.unique->keys.data();
    // The plan's slots start as the probe's (misses are filled in below): taken over, not copied.
    plan.unique_slots[i] = std::move(probe.found[i]);
    const std::int64_t* found = plan.unique_slots[i].data();
    const std::size_t n = f.unique->keys.size();
    const std::size_t m0 = misses_.size();
    misses_.resize(m0 + n);
    hit_rows_.resize(n);
    std::size_t nm = 0, nh = 0;
    // Rows in overflow slots (or bypassed: kBypass) are neither: commit_overflow's, below.
    for (std::size_t u = 0; u < n; ++u) {
      const bool miss = found[u] == PoolProbe::kMiss;
      const bool hit = static_cast<std::uint64_t>(found[u]) < static_cast<std::uint64_t>(opt_.slots);
      Miss& m = misses_[m0 + nm];
      m.key = cache_key(f.table, keys[u]);
      m.feature = static_cast<std::uint32_t>(i);
      m.u = static_cast<std::uint32_t>(u);
      nm += miss;
      hit_rows_[nh] = static_cast<std::uint32_t>(u);
      nh += hit;
    }
    misses_.resize(m0 + nm);
    for (std::size_t b = 0; b < nh; b += kBlock) {
      const std::size_t e = std::min(nh, b + kBlock);
      for (std::size_t j = b; j < e; ++j) {
        const auto slot = static_cast<std::size_t>(found[hit_rows_[j]]);
        __builtin_prefetch(&slots_[slot]);
        __builtin_prefetch(&version_[slot]);
        if (lookahead) {
          const std::uint64_t h = detail::KeyMap::hash(cache_key(f.table, keys[hit_rows_[j]]));
          window_.prefetch_consume_lines(h);
          sketch_.prefetch_line(h);
        }
      }
      for (std::size_t j = b; j < e; ++j) {
        const std::uint32_t u = hit_rows_[j];
        const std::int64_t slot = found[u];
        Slot& s = slots_[static_cast<std::size_t>(slot)];
        pin(s, slot);
        s.last = tick_base[i] + u + 1;
        if (lookahead) {
          const std::uint64_t h = detail::KeyMap::hash(s.key);
          s.next_use = window_.consume(s.key, h, probe.seq);
          const std::uint32_t uses = s.freq & kUsesMask;
          s.freq = sketch_.add(h) << 24 | (uses + (uses < kUsesMask));
        } else {
          ++s.freq;
        }
      }
    }
    CacheStats& st = table_[static_cast<std::size_t>(f.table)].stats;
    st.accesses += static_cast<std::int64_t>(n);
    st.hits += static_cast<std::int64_t>(nh);
    plan.hits += static_cast<std::int64_t>(nh);
  }
  // Victims, in miss order. The choice depends only on the eviction order, the free list and the
  // per-table counts, so it is made before any victim's record is touched; the records, the index
  // and the window are then updated in a pipeline.
  for (Miss& m : misses_) m.slot = take_victim(static_cast<int>(m.key >> 48));
  const std::size_t M = misses_.size();
  plan.fills.resize(M);
  plan.writebacks.reserve(M);
  // A pipeline over the misses: the victim record of miss j + kRecordAhead, then (its old key
  // known) the index chunks of the keys leaving and arriving, and the window, of miss
  // j + kChunkAhead start loading while miss j is applied.
  constexpr std::size_t kRecordAhead = 16, kChunkAhead = 8, kRing = 16;
  std::uint64_t old_hash[kRing], new_hash[kRing];
  const auto victim = [&](std::size_t j) -> Slot& { return slots_[static_cast<std::size_t>(misses_[j].slot)]; };
  const auto hash_ahead = [&](std::size_t j) {
    const std::uint64_t old_key = victim(j).key;
    old_hash[j % kRing] = detail::KeyMap::hash(old_key);
    new_hash[j % kRing] = detail::KeyMap::hash(misses_[j].key);
    if (old_key != detail::KeyMap::kEmpty) index_.prefetch_line(old_hash[j % kRing]);
    index_.prefetch_line(new_hash[j % kRing]);
    if (lookahead) {
      window_.prefetch_consume_lines(new_hash[j % kRing]);
      sketch_.prefetch_line(new_hash[j % kRing]);
    }
  };
  for (std::size_t j = 0; j < std::min(M, kRecordAhead); ++j) __builtin_prefetch(&victim(j));
  for (std::size_t j = 0; j < std::min(M, kChunkAhead); ++j) hash_ahead(j);
  for (std::size_t j = 0; j < M; ++j) {
    if (j + kRecordAhead < M) {
      __builtin_prefetch(&victim(j + kRecordAhead));
      __builtin_prefetch(&version_[static_cast<std::size_t>(misses_[j + kRecordAhead].slot)]);
    }
    if (j + kChunkAhead < M) hash_ahead(j + kChunkAhead);
    const Miss& m = misses_[j];
    Slot& s = slots_[static_cast<std::size_t>(m.slot)];
    if (s.key != detail::KeyMap::kEmpty) {
      CacheStats& vs = table_[s.table()].stats;
      ++vs.evictions;
      if (s.dirty()) {
        Transfer& wb = plan.writebacks.emplace_back();  // fields in place: no store-forwarding stall
        wb.slot = m.slot;
        wb.table = static_cast<int>(s.table());
        wb.row = row_of(s.key);
        ++vs.writebacks;
        vs.bytes_written_back += opt_.record_bytes;
      }
      index_.erase(old_hash[j % kRing], m.slot);
      --resident_;
    }
    const int t = static_cast<int>(m.key >> 48);
    s.key = m.key;
    s.last = tick_base[m.feature] + m.u + 1;
    s.freq = 1;
    s.state = 0;
    index_.insert(new_hash[j % kRing], m.slot);
    ++resident_;
    pin(s, m.slot);
    plan.unique_slots[m.feature][m.u] = m.slot;
    Transfer& fill = plan.fills[j];
    fill.slot = m.slot;
    fill.table = t;
    fill.row = row_of(m.key);
    CacheStats& st = table_[static_cast<std::size_t>(t)].stats;
    ++st.misses;
    st.bytes_filled += opt_.record_bytes;
    if (lookahead) {
      s.next_use = window_.consume(m.key, new_hash[j % kRing], probe.seq);
      s.freq = sketch_.add(new_hash[j % kRing]) << 24 | 1;
    }
  }
  plan.misses = static_cast<std::int64_t>(M);
  if (probe.overflow) commit_overflow(probe, plan);
  if (lookahead) {
    order_.retire_window(probe.seq, version_.data());
    for (std::size_t t = 0; t < table_order_.size(); ++t)
      if (opt_.tables[t].cap > 0) table_order_[t].retire_window(probe.seq, version_.data());
  }
  return plan;
}

// commit()'s rows outside the cache: pins the overflow rows of batches in flight, gives each
// bypassed miss an overflow slot (filled as the other misses are), and lists them all for the
// write-back after the backward. They use up their window entries as cached rows do.
void CachePlanner::commit_overflow(PoolProbe& probe, PoolPlan& plan) {
  const bool lookahead = opt_.policy == Policy::kLookahead;
  for (std::size_t i = 0; i < probe.features.size(); ++i) {
    const FeatureKeys& f = probe.features[i];
    const Key* keys = f.unique->keys.data();
    CacheStats& st = table_[static_cast<std::size_t>(f.table)].stats;
    std::vector<Key>& slots = plan.unique_slots[i];
    for (std::size_t u = 0; u < slots.size(); ++u) {
      Key& slot = slots[u];
      if (slot != PoolProbe::kBypass && slot < opt_.slots) continue;
      const std::uint64_t key = cache_key(f.table, keys[u]);
      if (slot == PoolProbe::kBypass) {
        std::int64_t o;
        if (overflow_free_.empty()) {
          o = static_cast<std::int64_t>(overflow_.size());
          overflow_.emplace_back();
        } else {
          o = overflow_free_.back();
          overflow_free_.pop_back();
        }
        overflow_[static_cast<std::size_t>(o)].key = key;
        overflow_index_.emplace(key, o);
        slot = opt_.slots + o;
        plan.fills.push_back({slot, f.table, keys[u]});
        ++plan.misses;
        ++st.misses;
        st.bytes_filled += opt_.record_bytes;
      } else {
        ++plan.hits;
        ++st.hits;
      }
      ++overflow_[static_cast<std::size_t>(slot - opt_.slots)].pins;
      plan.overflow.push_back({slot, f.table, keys[u]});
      ++st.bypassed;
      if (lookahead) {
        const std::uint64_t h = detail::KeyMap::hash(key);
        (void)window_.consume(key, h, probe.seq);
        (void)sketch_.add(h);
      }
    }
  }
}

void CachePlanner::retire(const PoolPlan& plan, bool updated) {
  if (!plan.overflow.empty()) return retire_slow(plan, updated);
  const bool ranked_by_uses = opt_.policy != Policy::kLru;
  for (const auto& us : plan.unique_slots) {
    const std::size_t n = us.size();
    for (std::size_t b = 0; b < n; b += kBlock) {
      const std::size_t e = std::min(n, b + kBlock);
      // Records; then (lfu, lookahead) the tails of the queues the slots will join.
      for (std::size_t u = b; u < e; ++u) {
        __builtin_prefetch(&slots_[static_cast<std::size_t>(us[u])]);
        __builtin_prefetch(&version_[static_cast<std::size_t>(us[u])]);
      }
      if (ranked_by_uses)
        for (std::size_t u = b; u < e; ++u)
          order_.prefetch_ranked_line(ranked_bucket(slots_[static_cast<std::size_t>(us[u])]));
      for (std::size_t u = b; u < e; ++u) {
        const Key slot = us[u];
        Slot& s = slots_[static_cast<std::size_t>(slot)];
        if (updated) s.state |= Slot::kDirty;
        if (--s.state % Slot::kDirty == 0) {  // the last pin
          --pinned_total_;
          --table_[s.table()].pinned;
          enter_order(slot);
        }
      }
    }
  }
}

// retire() of a plan with overflow rows: slot by slot, without the pipeline.
void CachePlanner::retire_slow(const PoolPlan& plan, bool updated) {
  for (const auto& us : plan.unique_slots) {
    for (const Key slot : us) {
      if (slot >= opt_.slots) continue;  // below
      Slot& s = slots_[static_cast<std::size_t>(slot)];
      if (updated) s.state |= Slot::kDirty;
      if (--s.state % Slot::kDirty == 0) {  // the last pin
        --pinned_total_;
        --table_[s.table()].pinned;
        enter_order(slot);
      }
    }
  }
  for (const Transfer& t : plan.overflow) {
    if (updated) {  // the executor writes it back after the backward
      CacheStats& st = table_[static_cast<std::size_t>(t.table)].stats;
      ++st.writebacks;
      st.bytes_written_back += opt_.record_bytes;
    }
    const std::int64_t o = t.slot - opt_.slots;
    OverflowSlot& s = overflow_[static_cast<std::size_t>(o)];
    STRATA_CHECK(s.key == cache_key(t.table, t.row) && s.pins > 0);
    if (--s.pins > 0) continue;
    overflow_index_.erase(s.key);
    s = OverflowSlot();
    overflow_free_.push_back(o);
  }
  if (overflow_index_.empty()) {  // numbers start again from the first overflow slot
    overflow_.clear();
    overflow_free_.clear();
  }
}

std::vector<Transfer> CachePlanner::dirty() const {
  std::vector<Transfer> out;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.key == detail::KeyMap::kEmpty || !s.dirty()) continue;
    out.push_back({static_cast<Key>(i), static_cast<int>(s.table()), row_of(s.key)});
  }
  return out;
}

void CachePlanner::mark_clean(const std::vector<Transfer>& rows) {
  for (const Transfer& t : rows) {
    Slot& s = slots_[static_cast<std::size_t>(t.slot)];
    STRATA_CHECK(s.key == cache_key(t.table, t.row));  // still the row dirty() listed
    if (!s.dirty()) continue;
    s.state &= ~Slot::kDirty;
    CacheStats& st = table_[s.table()].stats;
    ++st.writebacks;
    st.bytes_written_back += opt_.record_bytes;
  }
}

void CachePlanner::invalidate_table(int table) {
  STRATA_CHECK(overflow_index_.empty());  // no batch in flight
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.key == detail::KeyMap::kEmpty || s.table() != static_cast<std::size_t>(table)) continue;
    STRATA_CHECK(s.state == 0);  // neither pinned nor dirty
    index_.erase(detail::KeyMap::hash(s.key), static_cast<std::int64_t>(i));
    s = Slot();
    ++version_[i];  // leaves the order
    free_.push_back(static_cast<std::int64_t>(i));
    --resident_;
  }
  table_[static_cast<std::size_t>(table)].count = 0;
}

void CachePlanner::drop_rows(int table, const std::vector<Key>& rows) {
  for (const Key row : rows) {
    const std::uint64_t ck = cache_key(table, row);
    const std::uint64_t h = detail::KeyMap::hash(ck);
    STRATA_CHECK(overflow_slot_of(ck) < 0);  // an overflow row is used by a batch in flight
    const std::int64_t i = index_.find(ck, h, key_of());
    if (i < 0) continue;
    Slot& s = slots_[static_cast<std::size_t>(i)];
    STRATA_CHECK(s.pins() == 0);
    index_.erase(h, i);
    s = Slot();
    ++version_[static_cast<std::size_t>(i)];  // leaves the order
    free_.push_back(i);
    --resident_;
    if (any_cap_) --table_[static_cast<std::size_t>(table)].count;
  }
}

std::int64_t CachePlanner::slot_of(int table, Key row) const noexcept {
  const std::uint64_t ck = cache_key(table, row);
  return index_.find(ck, detail::KeyMap::hash(ck), key_of());
}

CacheStats CachePlanner::pool_stats() const {
  CacheStats s;
  for (const auto& t : table_) s += t.stats;
  return s;
}

void expand_slots(const UniqueKeys& u, const std::vector<Key>& unique_slots, Key* out) {
  for (std::size_t i = 0; i < unique_slots.size(); ++i)
    for (std::int64_t p = u.offsets[i]; p < u.offsets[i + 1]; ++p)
      out[u.positions[static_cast<std::size_t>(p)]] = unique_slots[i];
}

}  // namespace strata::cache
