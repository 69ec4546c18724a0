#include "cache/cache_pool.hpp"

#include <algorithm>
#include <limits>

namespace strata::cache {

CacheStats& CacheStats::operator+=(const CacheStats& o) noexcept {
  accesses += o.accesses;
  hits += o.hits;
  misses += o.misses;
  evictions += o.evictions;
  writebacks += o.writebacks;
  bytes_filled += o.bytes_filled;
  bytes_written_back += o.bytes_written_back;
  return *this;
}

CacheStats& CacheStats::operator-=(const CacheStats& o) noexcept {
  accesses -= o.accesses;
  hits -= o.hits;
  misses -= o.misses;
  evictions -= o.evictions;
  writebacks -= o.writebacks;
  bytes_filled -= o.bytes_filled;
  bytes_written_back -= o.bytes_written_back;
  return *this;
}

CachePool::CachePool(CachePoolOptions options)
    : opt_(std::move(options)),
      index_(opt_.slots),
      slots_(static_cast<std::size_t>(opt_.slots)),
      heaps_(opt_.tables.size()),
      table_count_(opt_.tables.size(), 0),
      table_pinned_(opt_.tables.size(), 0),
      stats_(opt_.tables.size()) {
  free_.reserve(static_cast<std::size_t>(opt_.slots));
  // Popped from the back: slot 0 is used first.
  for (std::int64_t s = opt_.slots - 1; s >= 0; --s) free_.push_back(s);
}

namespace {
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

std::string table_list(const CachePoolOptions& opt, const std::vector<std::int64_t>& per_table) {
  std::string s;
  for (std::size_t t = 0; t < per_table.size(); ++t) {
    if (per_table[t] == 0) continue;
    if (!s.empty()) s += ", ";
    s += "'" + opt.tables[t].name + "': " + std::to_string(per_table[t]);
  }
  return s;
}
}  // namespace

std::int64_t CachePool::next_use(std::uint64_t key) const noexcept {
  auto it = future_.find(key);
  return it == future_.end() || it->second.empty() ? kNever : it->second.front();
}

std::uint64_t CachePool::score_of(const Slot& s) const noexcept {
  switch (opt_.policy) {
    case Policy::kLru:
      return s.last;
    case Policy::kLfu:
      return (std::uint64_t{std::min<std::uint32_t>(s.freq, (1u << 23) - 1)} << 40) | (s.last & ((std::uint64_t{1} << 40) - 1));
    case Policy::kLookahead: {
      // Rows used again within the window rank above every other row, sooner use higher (Belady
      // within the window). Rows with no use in the window fall back to LFU order (uses, then
      // recency), so stale rows leave first instead of ties going to the lowest slot.
      const std::int64_t nu = next_use(s.key);
      if (nu == kNever)
        return (std::uint64_t{std::min<std::uint32_t>(s.freq, (1u << 22) - 1)} << 40) | (s.last & ((std::uint64_t{1} << 40) - 1));
      const std::uint64_t soon = (std::uint64_t{1} << 43) - 1 - static_cast<std::uint64_t>(std::min<std::int64_t>(nu, (std::int64_t{1} << 43) - 2));
      return (std::uint64_t{1} << 63) | (soon << 20) | std::min<std::uint32_t>(s.freq, (1u << 20) - 1);
    }
  }
  return 0;
}

void CachePool::make_evictable(std::int64_t slot) {
  Slot& s = slots_[static_cast<std::size_t>(slot)];
  s.score = score_of(s);
  heaps_[static_cast<std::size_t>(s.table)].push({s.score, slot});
  ++heap_entries_;
  maybe_compact();
}

// Drops stale entries (slot emptied, reused by another table, pinned, or rescored) from the top.
bool CachePool::clean_top(MinHeap& h) {
  while (!h.empty()) {
    const HeapEntry& e = h.top();
    const Slot& s = slots_[static_cast<std::size_t>(e.slot)];
    const bool valid = s.key != detail::KeyMap::kEmpty && s.pins == 0 && s.score == e.score &&
                       &heaps_[static_cast<std::size_t>(s.table)] == &h;
    if (valid) return true;
    h.pop();
    --heap_entries_;
  }
  return false;
}

void CachePool::maybe_compact() {
  if (heap_entries_ <= 4 * opt_.slots + 1024) return;
  for (auto& h : heaps_) h = MinHeap();
  heap_entries_ = 0;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.key == detail::KeyMap::kEmpty || s.pins > 0) continue;
    heaps_[static_cast<std::size_t>(s.table)].push({s.score, static_cast<std::int64_t>(i)});
    ++heap_entries_;
  }
}

void CachePool::window_push(std::int64_t seq, const std::vector<FeatureKeys>& features) {
  if (opt_.policy != Policy::kLookahead) return;
  for (const auto& f : features) {
    for (Key row : f.unique->keys) {
      const std::uint64_t ck = cache_key(f.table, row);
      auto& uses = future_[ck];
      const bool was_unused = uses.empty();
      uses.push_back(seq);
      if (!was_unused) continue;
      // A resident, evictable row that just gained a next use must be rescored.
      const std::int64_t slot = index_.find(ck);
      if (slot >= 0 && slots_[static_cast<std::size_t>(slot)].pins == 0) make_evictable(slot);
    }
  }
}

void CachePool::window_drop(std::int64_t seq, const std::vector<FeatureKeys>& features) {
  if (opt_.policy != Policy::kLookahead) return;
  for (const auto& f : features) {
    for (Key row : f.unique->keys) {
      const std::uint64_t ck = cache_key(f.table, row);
      auto it = future_.find(ck);
      if (it == future_.end()) continue;
      auto& uses = it->second;
      const bool was_next = !uses.empty() && uses.front() == seq;
      uses.erase(std::remove(uses.begin(), uses.end(), seq), uses.end());
      if (uses.empty()) future_.erase(it);
      const std::int64_t slot = index_.find(ck);
      if (was_next && slot >= 0 && slots_[static_cast<std::size_t>(slot)].pins == 0) make_evictable(slot);
    }
  }
}

Result<PoolProbe> CachePool::probe(std::int64_t seq, const std::vector<FeatureKeys>& features) const {
  PoolProbe p;
  p.seq = seq;
  p.features = features;
  p.found.resize(features.size());
  const std::size_t T = opt_.tables.size();
  std::vector<std::int64_t> unique(T, 0), misses(T, 0), hits_unpinned(T, 0);
  for (std::size_t i = 0; i < features.size(); ++i) {
    const FeatureKeys& f = features[i];
    const std::size_t t = static_cast<std::size_t>(f.table);
    auto& found = p.found[i];
    found.resize(f.unique->keys.size());
    for (std::size_t u = 0; u < f.unique->keys.size(); ++u) {
      const std::int64_t slot = index_.find(cache_key(f.table, f.unique->keys[u]));
      found[u] = slot;
      if (slot < 0) {
        ++misses[t];
      } else if (slots_[static_cast<std::size_t>(slot)].pins == 0) {
        ++hits_unpinned[t];
      }
    }
    unique[t] += static_cast<std::int64_t>(f.unique->keys.size());
  }
  std::int64_t total_unique = 0, total_misses = 0, total_hits_unpinned = 0;
  for (std::size_t t = 0; t < T; ++t) {
    total_unique += unique[t];
    total_misses += misses[t];
    total_hits_unpinned += hits_unpinned[t];
    const std::int64_t cap = opt_.tables[t].cap;
    if (cap <= 0) continue;
    if (unique[t] > cap)
      return Status::resource_exhausted("table '" + opt_.tables[t].name + "': batch " + std::to_string(seq) + " has " +
                                        std::to_string(unique[t]) + " unique rows but the table's cache cap is " +
                                        std::to_string(cap) + " slots");
    if (misses[t] > cap - table_pinned_[t] - hits_unpinned[t])
      return Status::resource_exhausted("table '" + opt_.tables[t].name + "': batch " + std::to_string(seq) + " needs " +
                                        std::to_string(misses[t]) + " new slots but only " +
                                        std::to_string(cap - table_pinned_[t] - hits_unpinned[t]) + " of its cap of " +
                                        std::to_string(cap) + " are not pinned by batches in flight");
  }
  if (total_unique > opt_.slots)
    return Status::resource_exhausted("cache pool " + opt_.name + ": batch " + std::to_string(seq) + " has " +
                                      std::to_string(total_unique) + " unique rows (" + table_list(opt_, unique) +
                                      ") but the cache holds only " + std::to_string(opt_.slots) + " rows");
  const std::int64_t evictable = opt_.slots - pinned_total_ - total_hits_unpinned;
  if (total_misses > evictable)
    return Status::resource_exhausted("cache pool " + opt_.name + ": batch " + std::to_string(seq) + " needs " +
                                      std::to_string(total_misses) + " new slots but only " + std::to_string(evictable) +
                                      " of " + std::to_string(opt_.slots) + " are free or evictable (" +
                                      std::to_string(pinned_total_) +
                                      " pinned by batches in flight); raise the cache capacity or keep fewer batches in flight");
  return p;
}

std::int64_t CachePool::take_victim(int table) {
  const std::size_t t = static_cast<std::size_t>(table);
  const std::int64_t cap = opt_.tables[t].cap;
  const bool capped = cap > 0 && table_count_[t] >= cap;
  if (!capped && !free_.empty()) {
    const std::int64_t s = free_.back();
    free_.pop_back();
    return s;
  }
  MinHeap* best = nullptr;
  if (capped) {
    if (clean_top(heaps_[t])) best = &heaps_[t];
  } else {
    for (auto& h : heaps_) {
      if (!clean_top(h)) continue;
      if (!best || best->top().score > h.top().score) best = &h;
    }
  }
  STRATA_CHECK(best != nullptr);  // probe() guaranteed room
  const std::int64_t slot = best->top().slot;
  best->pop();
  --heap_entries_;
  return slot;
}

PoolPlan CachePool::commit(PoolProbe probe) {
  PoolPlan plan;
  plan.seq = probe.seq;
  plan.unique_slots.resize(probe.features.size());
  auto pin = [&](Slot& s) {
    if (s.pins++ == 0) {
      ++pinned_total_;
      ++table_pinned_[static_cast<std::size_t>(s.table)];
    }
  };
  auto consume_window = [&](std::uint64_t ck) {
    if (opt_.policy != Policy::kLookahead) return;
    auto it = future_.find(ck);
    if (it == future_.end()) return;
    auto& uses = it->second;
    auto pos = std::find(uses.begin(), uses.end(), probe.seq);
    if (pos != uses.end()) uses.erase(pos);
    if (uses.empty()) future_.erase(it);
  };
  // Recency follows the order of first use within the batch (features in order, rows in first-use
  // order), for hits and misses alike, although hits are processed first.
  std::vector<std::uint64_t> tick_base(probe.features.size());
  for (std::size_t i = 0; i < probe.features.size(); ++i) {
    tick_base[i] = tick_;
    tick_ += probe.features[i].unique->keys.size();
  }
  // Hits first, so that no victim chosen for a miss is a row this batch uses.
  for (std::size_t i = 0; i < probe.features.size(); ++i) {
    const FeatureKeys& f = probe.features[i];
    auto& us = plan.unique_slots[i];
    us.assign(f.unique->keys.size(), -1);
    CacheStats& st = stats_[static_cast<std::size_t>(f.table)];
    for (std::size_t u = 0; u < us.size(); ++u) {
      ++st.accesses;
      const std::int64_t slot = probe.found[i][u];
      if (slot < 0) continue;
      Slot& s = slots_[static_cast<std::size_t>(slot)];
      pin(s);
      ++s.freq;
      s.last = tick_base[i] + u + 1;
      us[u] = slot;
      ++st.hits;
      ++plan.hits;
      consume_window(s.key);
    }
  }
  for (std::size_t i = 0; i < probe.features.size(); ++i) {
    const FeatureKeys& f = probe.features[i];
    auto& us = plan.unique_slots[i];
    CacheStats& st = stats_[static_cast<std::size_t>(f.table)];
    for (std::size_t u = 0; u < us.size(); ++u) {
      if (us[u] >= 0) continue;
      const std::int64_t slot = take_victim(f.table);
      Slot& s = slots_[static_cast<std::size_t>(slot)];
      if (s.key != detail::KeyMap::kEmpty) {
        CacheStats& vs = stats_[static_cast<std::size_t>(s.table)];
        ++vs.evictions;
        if (s.dirty) {
          plan.writebacks.push_back({slot, s.table, static_cast<Key>(s.key & ((std::uint64_t{1} << 48) - 1))});
          ++vs.writebacks;
          vs.bytes_written_back += opt_.record_bytes;
        }
        index_.erase(s.key);
        --table_count_[static_cast<std::size_t>(s.table)];
        --resident_;
      }
      const Key row = f.unique->keys[u];
      s = Slot();
      s.key = cache_key(f.table, row);
      s.table = f.table;
      s.freq = 1;
      s.last = tick_base[i] + u + 1;
      index_.insert(s.key, slot);
      ++table_count_[static_cast<std::size_t>(f.table)];
      ++resident_;
      pin(s);
      us[u] = slot;
      plan.fills.push_back({slot, f.table, row});
      ++st.misses;
      ++plan.misses;
      st.bytes_filled += opt_.record_bytes;
      consume_window(s.key);
    }
  }
  return plan;
}

void CachePool::retire(const PoolPlan& plan, bool updated) {
  for (const auto& us : plan.unique_slots) {
    for (Key slot : us) {
      Slot& s = slots_[static_cast<std::size_t>(slot)];
      if (updated) s.dirty = true;
      if (--s.pins == 0) {
        --pinned_total_;
        --table_pinned_[static_cast<std::size_t>(s.table)];
        make_evictable(slot);
      }
    }
  }
}

std::vector<Transfer> CachePool::take_dirty() {
  std::vector<Transfer> out;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.key == detail::KeyMap::kEmpty || !s.dirty) continue;
    out.push_back({static_cast<Key>(i), s.table, static_cast<Key>(s.key & ((std::uint64_t{1} << 48) - 1))});
    s.dirty = false;
    CacheStats& st = stats_[static_cast<std::size_t>(s.table)];
    ++st.writebacks;
    st.bytes_written_back += opt_.record_bytes;
  }
  return out;
}

void CachePool::invalidate_table(int table) {
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.key == detail::KeyMap::kEmpty || s.table != table) continue;
    STRATA_CHECK(s.pins == 0 && !s.dirty);
    index_.erase(s.key);
    s = Slot();
    free_.push_back(static_cast<std::int64_t>(i));
    --resident_;
  }
  table_count_[static_cast<std::size_t>(table)] = 0;
}

std::int64_t CachePool::slot_of(int table, Key row) const noexcept { return index_.find(cache_key(table, row)); }

CacheStats CachePool::pool_stats() const {
  CacheStats s;
  for (const auto& t : stats_) s += t;
  return s;
}

void expand_slots(const UniqueKeys& u, const std::vector<Key>& unique_slots, Key* out) {
  for (std::size_t i = 0; i < unique_slots.size(); ++i)
    for (std::int64_t p = u.offsets[i]; p < u.offsets[i + 1]; ++p) out[u.positions[static_cast<std::size_t>(p)]] = unique_slots[i];
}

}  // namespace strata::cache
