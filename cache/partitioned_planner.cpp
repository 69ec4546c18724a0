#include "cache/partitioned_planner.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <optional>

namespace strata::cache {

namespace {
// Partition s's share of `n` (n / S, the first n % S partitions one more).
std::int64_t share(std::int64_t n, std::size_t s, std::size_t partitions) {
  const auto S = static_cast<std::int64_t>(partitions);
  return n / S + (static_cast<std::int64_t>(s) < n % S ? 1 : 0);
}

// Appends `from` to `to` with slots moved up by `offset`. Field by field into place: a copy of a
// Transfer adjusted on the stack and pushed stalls on store forwarding (measured: most of a
// 2-partition commit's serial part).
void append_offset(const std::vector<Transfer>& from, Key offset, std::vector<Transfer>& to) {
  std::size_t k = to.size();
  to.resize(k + from.size());
  for (const Transfer& t : from) {
    Transfer& d = to[k++];
    d.slot = t.slot + offset;
    d.table = t.table;
    d.row = t.row;
  }
}

}  // namespace

void PartitionedPlanner::append_global(const std::vector<Transfer>& from, std::size_t s,
                                       std::vector<Transfer>& to) const {
  std::size_t k = to.size();
  to.resize(k + from.size());
  for (const Transfer& t : from) {
    Transfer& d = to[k++];
    d.slot = global_slot(s, t.slot);
    d.table = t.table;
    d.row = t.row;
  }
}

namespace {
// Runs fn(s) for every partition, in parallel when there are several.
template <class Fn>
void for_each_partition(std::size_t partitions, const Fn& fn) {
  if (partitions == 1) {
    fn(std::size_t{0});
    return;
  }
  tbb::parallel_for(std::size_t{0}, partitions, [&](std::size_t s) { fn(s); });
}
}  // namespace

Status PartitionedPlanner::validate(const CachePlannerOptions& options, int partitions) {
  if (partitions < 1)
    return Status::invalid_argument("slot pool " + options.name + ": planner partitions " + std::to_string(partitions) +
                                    " must be >= 1");
  if (options.tables.size() > (std::size_t{1} << 16))
    return Status::invalid_argument("slot pool " + options.name + ": " + std::to_string(options.tables.size()) +
                                    " tables share it, more than the 65536 a pool's cache keys can tell apart");
  const std::int64_t largest = (options.slots + partitions - 1) / partitions;
  if (largest > kMaxPartitionSlots)
    return Status::invalid_argument(
        "slot pool " + options.name + ": " + std::to_string(options.slots) + " rows in " + std::to_string(partitions) +
        " planner partitions puts " + std::to_string(largest) + " in a partition, more than the " +
        std::to_string(kMaxPartitionSlots) + " one can hold; use at least " +
        std::to_string((options.slots + kMaxPartitionSlots - 1) / kMaxPartitionSlots) + " planner partitions");
  if (options.slots < partitions)
    return Status::invalid_argument(
        "slot pool " + options.name + ": " + std::to_string(options.slots) + " rows cannot be split into " +
        std::to_string(partitions) +
        " planner partitions (each needs at least one row); use fewer partitions or a larger cache");
  for (const PoolTable& t : options.tables)
    if (t.cap > 0 && t.cap < partitions)
      return Status::invalid_argument(
          "table '" + t.name + "': a cache cap of " + std::to_string(t.cap) + " rows cannot be split into " +
          std::to_string(partitions) +
          " planner partitions (each needs at least one row); use fewer partitions or a larger cap");
  return Status::ok();
}

PartitionedPlanner::PartitionedPlanner(const CachePlannerOptions& options, int partitions) : opt_(options) {
  STRATA_CHECK(validate(options, partitions).is_ok());
  const auto S = static_cast<std::size_t>(partitions);
  window_keys_.resize(S);
  std::int64_t offset = 0;
  for (std::size_t s = 0; s < S; ++s) {
    CachePlannerOptions o = options;
    o.slots = share(options.slots, s, S);
    if (options.half_life > 0) o.half_life = std::max<std::int64_t>(1, options.half_life / partitions);
    for (PoolTable& t : o.tables)
      if (t.cap > 0) t.cap = share(t.cap, s, S);
    if (S > 1) o.name = options.name + " partition " + std::to_string(s) + " of " + std::to_string(S);
    offset_.push_back(offset);
    offset += o.slots;
    partitions_.push_back(std::make_unique<CachePlanner>(std::move(o)));
  }
}

void PartitionedPlanner::split(const std::vector<FeatureKeys>& features, std::size_t s, std::vector<UniqueKeys>& keys,
                               std::vector<std::vector<std::uint32_t>>* rows) const {
  const std::size_t F = features.size();
  keys.resize(F);
  if (rows) rows->resize(F);
  for (std::size_t i = 0; i < F; ++i) {
    const std::vector<Key>& all = features[i].unique->keys;
    const std::size_t n = all.size();
    // Branch-free (a row's partition is as good as random): every row is written, the count moves on
    // only for this partition's.
    std::vector<Key>& mine = keys[i].keys;
    mine.resize(n);
    std::uint32_t* at = nullptr;
    if (rows) {
      (*rows)[i].resize(n);
      at = (*rows)[i].data();
    }
    const int table = features[i].table;
    std::size_t m = 0;
    for (std::size_t u = 0; u < n; ++u) {
      const Key k = all[u];
      mine[m] = k;
      if (at) at[m] = static_cast<std::uint32_t>(u);
      m += partition_of(detail::KeyMap::hash(CachePlanner::cache_key(table, k))) == s;
    }
    mine.resize(m);
    if (rows) (*rows)[i].resize(m);
  }
}

std::vector<FeatureKeys> PartitionedPlanner::partition_features(const std::vector<FeatureKeys>& features,
                                                                const std::vector<UniqueKeys>& keys) const {
  std::vector<FeatureKeys> out(features.size());
  for (std::size_t i = 0; i < features.size(); ++i) out[i] = {features[i].table, &keys[i]};
  return out;
}

void PartitionedPlanner::window_push(std::int64_t seq, const std::vector<FeatureKeys>& features) {
  if (opt_.policy != Policy::kLookahead) return;  // only lookahead has a window
  if (partitions_.size() == 1) return partitions_[0]->window_push(seq, features);
  for_each_partition(partitions_.size(), [&](std::size_t s) {
    split(features, s, window_keys_[s], nullptr);
    partitions_[s]->window_push(seq, partition_features(features, window_keys_[s]));
  });
}

void PartitionedPlanner::window_drop(std::int64_t seq, const std::vector<FeatureKeys>& features) {
  if (opt_.policy != Policy::kLookahead) return;
  if (partitions_.size() == 1) return partitions_[0]->window_drop(seq, features);
  for_each_partition(partitions_.size(), [&](std::size_t s) {
    split(features, s, window_keys_[s], nullptr);
    partitions_[s]->window_drop(seq, partition_features(features, window_keys_[s]));
  });
}

Result<PartitionedProbe> PartitionedPlanner::probe(std::int64_t seq, const std::vector<FeatureKeys>& features,
                                                   bool bypass) const {
  PartitionedProbe p;
  p.seq = seq;
  const std::size_t S = partitions_.size();
  if (S > 1) {
    p.keys.resize(S);
    p.rows.resize(S);
  }
  std::vector<std::optional<Result<PoolProbe>>> found(S);
  for_each_partition(S, [&](std::size_t s) {
    if (S == 1) {
      found[s].emplace(partitions_[s]->probe(seq, features, bypass));
      return;
    }
    // Each partition picks its rows out of the batch itself: no serial split before the fork.
    split(features, s, p.keys[s], &p.rows[s]);
    found[s].emplace(partitions_[s]->probe(seq, partition_features(features, p.keys[s]), bypass));
  });
  p.partitions.reserve(S);
  std::int64_t overflow = 0;
  for (std::size_t s = 0; s < S; ++s) {
    if (!found[s]->is_ok()) return found[s]->status();
    p.partitions.push_back(std::move(*found[s]).value());
    overflow = std::max(overflow, p.partitions.back().overflow_records);
    p.overflow = p.overflow || p.partitions.back().overflow;
    for (const auto& f : p.partitions.back().found)
      for (const std::int64_t slot : f) p.misses += slot < 0;
  }
  p.overflow_records = S == 1 ? overflow : overflow * static_cast<std::int64_t>(S);  // global_slot
  return p;
}

PartitionedPlan PartitionedPlanner::commit(PartitionedProbe probe) {
  const std::size_t S = partitions_.size();
  PartitionedPlan plan;
  if (S == 1) {
    static_cast<PoolPlan&>(plan) = partitions_[0]->commit(std::move(probe.partitions[0]));
    return plan;
  }
  plan.seq = probe.seq;
  plan.partitions.resize(S);
  for_each_partition(
      S, [&](std::size_t s) { plan.partitions[s] = partitions_[s]->commit(std::move(probe.partitions[s])); });
  // Global slot numbers, each feature's rows back in their order, the lists partition by partition. After
  // the fork, not in it: the partitions' rows interleave, so their writes would share cache lines.
  const std::size_t F = probe.rows[0].size();
  plan.unique_slots.resize(F);
  for (std::size_t i = 0; i < F; ++i) {
    std::size_t n = 0;
    for (std::size_t s = 0; s < S; ++s) n += probe.rows[s][i].size();
    plan.unique_slots[i].resize(n);
  }
  for (std::size_t s = 0; s < S; ++s) {
    const PoolPlan& sp = plan.partitions[s];
    const Key off = offset_[s];
    for (std::size_t i = 0; i < F; ++i) {
      const std::vector<std::uint32_t>& rows = probe.rows[s][i];
      const Key* local = sp.unique_slots[i].data();
      Key* out = plan.unique_slots[i].data();
      if (sp.overflow.empty()) {
        for (std::size_t j = 0; j < rows.size(); ++j) out[rows[j]] = local[j] + off;
      } else {
        for (std::size_t j = 0; j < rows.size(); ++j) out[rows[j]] = global_slot(s, local[j]);
      }
    }
    append_offset(sp.writebacks, off, plan.writebacks);
    if (sp.overflow.empty()) {
      append_offset(sp.fills, off, plan.fills);
    } else {
      append_global(sp.fills, s, plan.fills);
      append_global(sp.overflow, s, plan.overflow);
    }
    plan.hits += sp.hits;
    plan.misses += sp.misses;
  }
  return plan;
}

void PartitionedPlanner::retire(const PartitionedPlan& plan, bool updated) {
  if (partitions_.size() == 1) return partitions_[0]->retire(plan, updated);
  for_each_partition(partitions_.size(), [&](std::size_t s) { partitions_[s]->retire(plan.partitions[s], updated); });
}

std::vector<Transfer> PartitionedPlanner::dirty() const {
  std::vector<Transfer> out;
  for (std::size_t s = 0; s < partitions_.size(); ++s) append_offset(partitions_[s]->dirty(), offset_[s], out);
  return out;
}

void PartitionedPlanner::mark_clean(const std::vector<Transfer>& rows) {
  if (partitions_.size() == 1) return partitions_[0]->mark_clean(rows);
  std::vector<std::vector<Transfer>> local(partitions_.size());
  for (const Transfer& t : rows) {
    // The partition owning the slot: the last whose first slot is at or below it.
    const auto s =
        static_cast<std::size_t>(std::upper_bound(offset_.begin(), offset_.end(), t.slot) - offset_.begin() - 1);
    local[s].push_back({t.slot - offset_[s], t.table, t.row});
  }
  for (std::size_t s = 0; s < partitions_.size(); ++s) partitions_[s]->mark_clean(local[s]);
}

void PartitionedPlanner::invalidate_table(int table) {
  for (auto& partition : partitions_) partition->invalidate_table(table);
}

void PartitionedPlanner::drop_rows(int table, const std::vector<Key>& rows) {
  std::vector<std::vector<Key>> of(partitions_.size());
  for (const Key row : rows) of[partition_of(detail::KeyMap::hash(CachePlanner::cache_key(table, row)))].push_back(row);
  for (std::size_t s = 0; s < partitions_.size(); ++s)
    if (!of[s].empty()) partitions_[s]->drop_rows(table, of[s]);
}

std::int64_t PartitionedPlanner::resident() const noexcept {
  std::int64_t n = 0;
  for (const auto& partition : partitions_) n += partition->resident();
  return n;
}

std::int64_t PartitionedPlanner::pinned() const noexcept {
  std::int64_t n = 0;
  for (const auto& partition : partitions_) n += partition->pinned();
  return n;
}

std::int64_t PartitionedPlanner::overflow_rows() const noexcept {
  std::int64_t n = 0;
  for (const auto& partition : partitions_) n += partition->overflow_rows();
  return n;
}

std::int64_t PartitionedPlanner::rows_beyond(const std::vector<FeatureKeys>& features) const {
  const std::size_t S = partitions_.size();
  // rows[s][f]: rows of feature f that hash to partition s (S = 1: every row, no hashing).
  std::vector<std::vector<std::int64_t>> rows(S, std::vector<std::int64_t>(features.size(), 0));
  for (std::size_t f = 0; f < features.size(); ++f) {
    const UniqueKeys& u = *features[f].unique;
    if (S == 1) {
      rows[0][f] = u.size();
      continue;
    }
    for (Key k : u.keys) ++rows[partition_of(detail::KeyMap::hash(CachePlanner::cache_key(features[f].table, k)))][f];
  }
  std::int64_t beyond = 0;
  for (std::size_t s = 0; s < S; ++s) {
    const CachePlannerOptions& so = partitions_[s]->options();
    std::int64_t total = 0, cacheable = 0;  // each table's rows within its cap
    for (std::size_t f = 0; f < features.size(); ++f) {
      total += rows[s][f];
      const PoolTable& pt = so.tables[static_cast<std::size_t>(features[f].table)];
      cacheable += pt.cap > 0 ? std::min(rows[s][f], pt.cap) : rows[s][f];
    }
    beyond += total - std::min(cacheable, so.slots);
  }
  return beyond;
}

std::int64_t PartitionedPlanner::slot_of(int table, Key row) const noexcept {
  const std::size_t s = partition_of(detail::KeyMap::hash(CachePlanner::cache_key(table, row)));
  const std::int64_t slot = partitions_[s]->slot_of(table, row);
  return slot < 0 ? -1 : slot + offset_[s];
}

CacheStats PartitionedPlanner::table_stats(int table) const {
  CacheStats st;
  for (const auto& partition : partitions_) st += partition->table_stats(table);
  return st;
}

CacheStats PartitionedPlanner::pool_stats() const {
  CacheStats st;
  for (const auto& partition : partitions_) st += partition->pool_stats();
  return st;
}

}  // namespace strata::cache
