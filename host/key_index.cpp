#include "host/key_index.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <new>
#include <string>

#include "core/row_math.hpp"

namespace strata {
namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::uint32_t kPinMax = std::numeric_limits<std::uint32_t>::max();
// Seed of the index's own hash (independent of the sketch's).
constexpr std::uint64_t kIndexSeed = 0x9E6C63D0676A9A99ull;
// Keys handled ahead of the current one whose cache lines are prefetched (pin counts, records, slots of admissions).
constexpr std::size_t kAhead = 32;
// Keys ahead of the one probed whose home slots are prefetched: a probe is a few instructions, so a miss needs more
// keys in flight to be hidden.
constexpr std::size_t kSlotsAhead = 32;

enum Kind : std::uint8_t { kHit = 0, kAdmitted = 1, kRejected = 2 };

std::int64_t sat_add(std::int64_t a, std::int64_t b) { return a > kInt64Max - b ? kInt64Max : a + b; }

void prefetch(const void* p) { __builtin_prefetch(p); }

}  // namespace

// ---- FreeRows ---------------------------------------------------------------------------------

KeyIndex::FreeRows::FreeRows(std::int64_t n) {
  std::int64_t size = n;
  do {
    const std::int64_t words = (size + 63) / 64;
    levels_.emplace_back(static_cast<std::size_t>(words), 0);
    size = words;
  } while (size > 1);
  for (std::int64_t i = 0; i < n; ++i) set(i);
}

void KeyIndex::FreeRows::set(std::int64_t i) {
  for (auto& level : levels_) {
    std::uint64_t& word = level[static_cast<std::size_t>(i >> 6)];
    const bool was_empty = word == 0;
    word |= std::uint64_t{1} << (i & 63);
    if (!was_empty) return;
    i >>= 6;
  }
}

void KeyIndex::FreeRows::clear(std::int64_t i) {
  for (auto& level : levels_) {
    std::uint64_t& word = level[static_cast<std::size_t>(i >> 6)];
    word &= ~(std::uint64_t{1} << (i & 63));
    if (word != 0) return;
    i >>= 6;
  }
}

bool KeyIndex::FreeRows::test(std::int64_t i) const {
  return ((levels_[0][static_cast<std::size_t>(i >> 6)] >> (i & 63)) & 1) != 0;
}

std::int64_t KeyIndex::FreeRows::lowest() const {
  if (levels_.back()[0] == 0) return kNone;
  std::int64_t i = 0;
  for (auto level = levels_.rbegin(); level != levels_.rend(); ++level) {
    i = i * 64 + __builtin_ctzll((*level)[static_cast<std::size_t>(i)]);
  }
  return i;
}

std::int64_t KeyIndex::FreeRows::bytes() const noexcept {
  std::int64_t total = 0;
  for (const auto& level : levels_) total += static_cast<std::int64_t>(level.capacity() * sizeof(std::uint64_t));
  return total;
}

// ---- KeyIndex ---------------------------------------------------------------------------------

void* KeyIndex::allocate_bytes(std::size_t bytes) {
  // Cache-line aligned (Meta's 32-byte records never straddle two lines), huge-page aligned from 2 MiB on.
  constexpr std::size_t kLine = 64;
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  void* p = nullptr;
  if (posix_memalign(&p, bytes < kHuge ? kLine : kHuge, bytes == 0 ? 1 : bytes) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= kHuge) (void)madvise(p, bytes, MADV_HUGEPAGE);  // advisory: ignore failure
#endif
  return p;
}

void KeyIndex::free_bytes(void* p, std::size_t /*bytes*/) noexcept { std::free(p); }

KeyIndex::KeyIndex(std::int64_t capacity, const DynamicSpec& spec)
    : capacity_(capacity), spec_(spec), free_(capacity), sketched_(spec.admit_after > 1) {
  STRATA_CHECK(capacity >= 1 && capacity <= kMaxDynamicCapacity);
  const std::int64_t slots = std::max<std::int64_t>(capacity + 1, (capacity * 5 + 3) / 4);
  slots_.assign(static_cast<std::size_t>(slots), Slot{0, kNil});
  meta_.resize(static_cast<std::size_t>(capacity));
  pins_.assign(static_cast<std::size_t>(capacity), 0);
  if (spec.eviction == Eviction::kLfu) lfu_.assign(static_cast<std::size_t>(capacity), Links{kNil, kNil});
  if (sketched_) sketch_ = AdmissionSketch(capacity);
}

std::uint32_t KeyIndex::key_hash(Key key) noexcept {
  return static_cast<std::uint32_t>(mix64(static_cast<std::uint64_t>(key) ^ kIndexSeed) >> 32);
}

std::uint64_t KeyIndex::home(std::uint32_t hash) const noexcept {
  return (static_cast<std::uint64_t>(hash) * slots_.size()) >> 32;
}

std::int64_t KeyIndex::find_slot(Key key, std::uint32_t hash) const {
  for (std::uint64_t s = home(hash);; s = next_slot(s)) {
    const Slot& slot = slots_[s];
    if (slot.row == kNil) return kNone;
    if (slot.hash == hash && meta_[slot.row].key == key) return static_cast<std::int64_t>(s);
  }
}

void KeyIndex::insert_slot(Key key, std::uint32_t hash, std::uint32_t row) {
  std::uint64_t s = home(hash);
  for (; slots_[s].row != kNil; s = next_slot(s)) {
    // A key given twice to one train() (a broken precondition) would get two rows.
    STRATA_CHECK(slots_[s].hash != hash || meta_[slots_[s].row].key != key);
  }
  slots_[s] = Slot{hash, row};
}

void KeyIndex::erase_slot(std::int64_t slot) {
  // Backward shift: an entry further on moves into the hole when its home is at or before it.
  auto hole = static_cast<std::uint64_t>(slot);
  for (std::uint64_t j = next_slot(hole); slots_[j].row != kNil; j = next_slot(j)) {
    const std::uint64_t h = home(slots_[j].hash);
    const bool moves = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
    if (moves) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].row = kNil;
}

void KeyIndex::lookup(const std::vector<Key>& keys, std::vector<std::int64_t>& rows) {
  checked_ = false;  // hashes_ is about to hold other keys' hashes
  decided_ = false;
  const std::size_t n = keys.size();
  hashes_.resize(n);
  rows.resize(n);
  for (std::size_t i = 0; i < n; ++i) hashes_[i] = key_hash(keys[i]);
  for (std::size_t i = 0; i < std::min(kSlotsAhead, n); ++i) prefetch(&slots_[home(hashes_[i])]);
  // First pass: the first slot whose hash bits match (or none); its row's record is prefetched.
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kSlotsAhead < n) prefetch(&slots_[home(hashes_[i + kSlotsAhead])]);
    std::uint64_t s = home(hashes_[i]);
    while (slots_[s].row != kNil && slots_[s].hash != hashes_[i]) s = next_slot(s);
    if (slots_[s].row == kNil) {
      rows[i] = kNone;
    } else {
      rows[i] = static_cast<std::int64_t>(s);
      prefetch(&meta_[slots_[s].row]);
    }
  }
  // Second pass: the key confirms the candidate, else the probe goes on. The found row's pin count (which the
  // decision reads next) is prefetched.
  for (std::size_t i = 0; i < n; ++i) {
    if (rows[i] == kNone) continue;
    const Slot& slot = slots_[static_cast<std::size_t>(rows[i])];
    if (meta_[slot.row].key == keys[i]) {
      rows[i] = slot.row;
    } else {
      const std::int64_t s = find_slot(keys[i], hashes_[i]);
      rows[i] = s == kNone ? kNone : std::int64_t{slots_[static_cast<std::size_t>(s)].row};
    }
    if (rows[i] != kNone) prefetch(&pins_[static_cast<std::size_t>(rows[i])]);
  }
}

void KeyIndex::lru_unlink(std::uint32_t row) {
  Meta& m = meta_[row];
  (m.prev == kNil ? lru_head_ : meta_[m.prev].next) = m.next;
  (m.next == kNil ? lru_tail_ : meta_[m.next].prev) = m.prev;
}

void KeyIndex::lru_append(std::uint32_t row) {
  Meta& m = meta_[row];
  m.prev = lru_tail_;
  m.next = kNil;
  (lru_tail_ == kNil ? lru_head_ : meta_[lru_tail_].next) = row;
  lru_tail_ = row;
}

void KeyIndex::lfu_unlink(std::uint32_t row) {
  const std::int64_t count = meta_[row].count;
  const auto bucket = buckets_.find(count);
  if (bucket->second == row) {
    const std::uint32_t prev = lfu_[row].prev;
    if (prev != kNil && meta_[prev].count == count) {
      bucket->second = prev;
    } else {
      buckets_.erase(bucket);
    }
  }
  Links& l = lfu_[row];
  (l.prev == kNil ? lfu_head_ : lfu_[l.prev].next) = l.next;
  (l.next == kNil ? lfu_tail_ : lfu_[l.next].prev) = l.prev;
}

void KeyIndex::lfu_insert(std::uint32_t row) {
  const std::int64_t count = meta_[row].count;
  auto bucket = buckets_.lower_bound(count);
  std::uint32_t after = kNil;  // the row it follows (kNil: the head)
  if (bucket != buckets_.end() && bucket->first == count) {
    after = bucket->second;
    bucket->second = row;
  } else {
    if (bucket != buckets_.begin()) after = std::prev(bucket)->second;
    buckets_.emplace_hint(bucket, count, row);
  }
  Links& l = lfu_[row];
  l.prev = after;
  l.next = after == kNil ? lfu_head_ : lfu_[after].next;
  (l.prev == kNil ? lfu_head_ : lfu_[l.prev].next) = row;
  (l.next == kNil ? lfu_tail_ : lfu_[l.next].prev) = row;
}

void KeyIndex::remove_row(std::uint32_t row, std::uint32_t hash) {
  erase_slot(find_slot(meta_[row].key, hash));
  lru_unlink(row);
  if (!lfu_.empty()) lfu_unlink(row);
  free_.set(row);
  --size_;
}

void KeyIndex::pin(std::uint32_t row) {
  STRATA_CHECK(pins_[row] < kPinMax);  // 2^32 - 1 batches in flight holding one row: pins leaked
  if (pins_[row]++ == 0) ++pinned_rows_;
}

bool KeyIndex::admits(Key key, std::int64_t uses) const {
  STRATA_CHECK(uses >= 1);
  return !sketched_ || uses >= spec_.admit_after - static_cast<std::int64_t>(sketch_.estimate(key));
}

Status KeyIndex::room(std::int64_t admitted, std::int64_t hits_pinned_now) const {
  const std::int64_t free_rows = capacity_ - size_;
  const std::int64_t pinned = pinned_rows_ + hits_pinned_now;
  const std::int64_t evictable = size_ - pinned;
  if (admitted <= free_rows + evictable) return Status::ok();
  return Status::resource_exhausted("dynamic table full: " + std::to_string(admitted) + " new keys need rows, " +
                                    std::to_string(free_rows) + " free, " + std::to_string(evictable) + " evictable, " +
                                    std::to_string(pinned) + " pinned (by batches in flight and this one), capacity " +
                                    std::to_string(capacity_));
}

void KeyIndex::decide(const std::vector<Key>& keys, const std::vector<std::int64_t>& uses,
                      const std::vector<std::int64_t>& rows) {
  const std::size_t n = keys.size();
  kinds_.resize(n);
  decided_admitted_ = 0;
  decided_hits_pinned_now_ = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kAhead < n && rows[i + kAhead] != kNone) prefetch(&pins_[static_cast<std::size_t>(rows[i + kAhead])]);
    if (rows[i] != kNone) {
      kinds_[i] = kHit;
      if (pins_[static_cast<std::size_t>(rows[i])] == 0) ++decided_hits_pinned_now_;
    } else {
      const bool admit = admits(keys[i], uses[i]);
      kinds_[i] = admit ? kAdmitted : kRejected;
      decided_admitted_ += admit ? 1 : 0;
    }
  }
  decided_ = true;
}

Status KeyIndex::check(const std::vector<Key>& keys, const std::vector<std::int64_t>& uses) {
  STRATA_CHECK(keys.size() == uses.size());
  lookup(keys, checked_rows_);  // batched and prefetched; kept for the train() that follows
  checked_keys_ = keys;
  checked_uses_ = uses;
  checked_ = true;
  decide(keys, uses, checked_rows_);  // kept too, while no pin changes (release() forgets it)
  return room(decided_admitted_, decided_hits_pinned_now_);
}

Status KeyIndex::train(const std::vector<Key>& keys, const std::vector<std::int64_t>& uses,
                       std::vector<std::int64_t>& rows, std::vector<std::pair<std::int64_t, Key>>& created) {
  STRATA_CHECK(keys.size() == uses.size());
  const std::size_t n = keys.size();
  created.clear();
  if (checked_ && keys == checked_keys_) {
    // check() looked them up (and left their hashes in hashes_); nothing changed since. With the same uses and no
    // release since, its decision stands too.
    rows.swap(checked_rows_);
    if (!decided_ || uses != checked_uses_) decide(keys, uses, rows);
  } else {
    lookup(keys, rows);
    decide(keys, uses, rows);
  }
  checked_ = false;
  decided_ = false;
  // The decision (kinds_), made without changing anything: hits, admissions (estimates from before this batch).
  const std::int64_t admitted = decided_admitted_;
  if (Status fits = room(admitted, decided_hits_pinned_now_); !fits.is_ok()) {
    rows.assign(n, kNone);
    return fits;
  }

  const std::int64_t now = ++clock_;
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kAhead < n && kinds_[i + kAhead] == kHit) prefetch(&pins_[static_cast<std::size_t>(rows[i + kAhead])]);
    if (kinds_[i] == kHit) pin(static_cast<std::uint32_t>(rows[i]));
  }
  // TTL: the rows past it are a prefix of the LRU list (last uses do not decrease along it).
  if (spec_.evict_after_steps > 0) {
    for (std::uint32_t r = lru_head_; r != kNil && now - meta_[r].last_use > spec_.evict_after_steps;) {
      const std::uint32_t next = meta_[r].next;
      if (pins_[r] == 0) {
        remove_row(r, key_hash(meta_[r].key));
        ++counts_.expirations;
      }
      r = next;
    }
  }
  // Admissions in first-use order: the lowest free row, else the first unpinned row in eviction
  // order. The victims are collected first (new rows join the lists only below) so that their
  // slots, and those of the new keys, are prefetched a few admissions ahead.
  const bool lfu = !lfu_.empty();
  admits_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (kinds_[i] == kAdmitted) admits_.push_back(static_cast<std::uint32_t>(i));
  }
  victims_.clear();
  for (std::uint32_t r = lfu ? lfu_head_ : lru_head_;
       static_cast<std::int64_t>(victims_.size()) < admitted - (capacity_ - size_);
       r = lfu ? lfu_[r].next : meta_[r].next) {
    if (pins_[r] == 0) victims_.push_back(Victim{r, key_hash(meta_[r].key)});
  }
  const std::size_t first_eviction = admits_.size() - victims_.size();  // the free rows go first
  const auto prefetch_admission = [&](std::size_t a) {
    if (a >= admits_.size()) return;
    prefetch(&slots_[home(hashes_[admits_[a]])]);
    if (a >= first_eviction) prefetch(&slots_[home(victims_[a - first_eviction].hash)]);
  };
  for (std::size_t a = 0; a < std::min(kAhead, admits_.size()); ++a) prefetch_admission(a);
  std::size_t next_victim = 0;
  for (std::size_t a = 0; a < admits_.size(); ++a) {
    prefetch_admission(a + kAhead);
    const std::uint32_t i = admits_[a];
    std::int64_t row = free_.lowest();
    if (row == kNone) {
      const Victim& victim = victims_[next_victim++];
      remove_row(victim.row, victim.hash);
      ++counts_.evictions;
      row = victim.row;
    }
    free_.clear(row);
    const auto r = static_cast<std::uint32_t>(row);
    meta_[r].key = keys[i];
    insert_slot(keys[i], hashes_[i], r);
    pin(r);
    ++size_;
    ++counts_.admissions;
    rows[i] = row;
    created.emplace_back(row, keys[i]);
  }
  // Touch the batch's rows in first-use order.
  // Prefetched in two stages: a row's record kAhead keys ahead, then, kAhead / 2 ahead, the LRU neighbours a hit
  // unlinks from (read from that record; a few may move before the hit is reached).
  for (std::size_t i = 0; i < std::min(kAhead, n); ++i) {
    if (kinds_[i] != kRejected) prefetch(&meta_[static_cast<std::size_t>(rows[i])]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kAhead < n && kinds_[i + kAhead] != kRejected) prefetch(&meta_[static_cast<std::size_t>(rows[i + kAhead])]);
    if (i + kAhead / 2 < n && kinds_[i + kAhead / 2] == kHit) {
      const Meta& ahead = meta_[static_cast<std::size_t>(rows[i + kAhead / 2])];
      if (ahead.prev != kNil) prefetch(&meta_[ahead.prev]);
      if (ahead.next != kNil) prefetch(&meta_[ahead.next]);
    }
    if (kinds_[i] == kRejected) continue;
    const auto r = static_cast<std::uint32_t>(rows[i]);
    Meta& m = meta_[r];
    if (kinds_[i] == kHit) {
      lru_unlink(r);
      if (lfu) lfu_unlink(r);
      m.count = sat_add(m.count, uses[i]);
    } else {
      m.count = uses[i];
    }
    m.last_use = now;
    lru_append(r);
    if (lfu) lfu_insert(r);
  }
  // The sketch counts the uses of every key that had no row.
  for (std::size_t i = 0; i < n; ++i) {
    if (kinds_[i] == kHit) continue;
    if (kinds_[i] == kRejected) counts_.not_admitted = sat_add(counts_.not_admitted, uses[i]);
    if (sketched_) sketch_.add(keys[i], uses[i]);
  }
  if (sketched_) sketch_.age();
  return Status::ok();
}

void KeyIndex::find(const std::vector<Key>& keys, std::vector<std::int64_t>& rows) {
  lookup(keys, rows);
  pin_found(rows, nullptr);
}

void KeyIndex::find(const std::vector<Key>& keys, const std::vector<std::int64_t>& uses,
                    std::vector<std::int64_t>& rows) {
  STRATA_CHECK(keys.size() == uses.size());
  lookup(keys, rows);
  pin_found(rows, &uses);
}

void KeyIndex::pin_found(const std::vector<std::int64_t>& rows, const std::vector<std::int64_t>* uses) {
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] == kNone) {
      counts_.unseen = sat_add(counts_.unseen, uses ? (*uses)[i] : 1);
    } else {
      pin(static_cast<std::uint32_t>(rows[i]));
    }
  }
}

void KeyIndex::release(const std::vector<std::int64_t>& rows) {
  decided_ = false;  // a check()'s count of hit rows pinned by no earlier batch may change
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i + kAhead < rows.size() && rows[i + kAhead] >= 0 && rows[i + kAhead] < capacity_)
      prefetch(&pins_[static_cast<std::size_t>(rows[i + kAhead])]);
    const std::int64_t row = rows[i];
    if (row == kNone) continue;
    STRATA_CHECK(row >= 0 && row < capacity_ && pins_[static_cast<std::size_t>(row)] > 0);
    if (--pins_[static_cast<std::size_t>(row)] == 0) --pinned_rows_;
  }
}

void KeyIndex::forget(const std::vector<std::int64_t>& rows) {
  checked_ = false;
  decided_ = false;
  for (const std::int64_t row : rows) {
    STRATA_CHECK(row >= 0 && row < capacity_ && !free_.test(row) && pins_[static_cast<std::size_t>(row)] == 0);
    const auto r = static_cast<std::uint32_t>(row);
    remove_row(r, key_hash(meta_[r].key));
  }
}

std::int64_t KeyIndex::row_of(Key key) const {
  const std::int64_t s = find_slot(key, key_hash(key));
  return s == kNone ? kNone : std::int64_t{slots_[static_cast<std::size_t>(s)].row};
}

std::int64_t KeyIndex::bytes() const noexcept {
  // A std::map node: the red-black links and colour (32 bytes) and the pair.
  constexpr std::int64_t kMapNode = 32 + sizeof(std::pair<const std::int64_t, std::uint32_t>);
  const auto held = [](const auto& v) { return static_cast<std::int64_t>(v.capacity() * sizeof(v[0])); };
  return static_cast<std::int64_t>(sizeof(*this)) + held(slots_) + held(meta_) + held(pins_) + held(lfu_) +
         static_cast<std::int64_t>(buckets_.size()) * kMapNode + free_.bytes() + sketch_.bytes() + held(hashes_) +
         held(kinds_) + held(admits_) + held(victims_);
}

std::vector<KeyIndex::Entry> KeyIndex::entries() const {
  std::vector<Entry> out;
  out.reserve(static_cast<std::size_t>(size_));
  for (std::uint32_t r = lru_head_; r != kNil; r = meta_[r].next) {
    out.push_back(Entry{meta_[r].key, r, meta_[r].last_use, meta_[r].count});
  }
  return out;
}

std::int64_t KeyIndex::sketch_state_bytes() const noexcept { return sketched_ ? sketch_.state_bytes() : 0; }

std::vector<std::uint8_t> KeyIndex::sketch_state() const {
  return sketched_ ? sketch_.state() : std::vector<std::uint8_t>{};
}

Status KeyIndex::restore(std::int64_t clock, const std::vector<Entry>& entries,
                         const std::vector<std::uint8_t>& sketch) {
  if (pinned_rows_ > 0) {
    return Status::failed_precondition("restore of a dynamic table's index with " + std::to_string(pinned_rows_) +
                                       " rows pinned by batches in flight; expected none");
  }
  if (clock < 0 || clock > kMaxClock)
    return Status::invalid_argument("restore: clock " + std::to_string(clock) + " out of range [0, 2^62]");
  if (static_cast<std::int64_t>(entries.size()) > capacity_) {
    return Status::invalid_argument("restore: " + std::to_string(entries.size()) + " entries, more than the " +
                                    std::to_string(capacity_) + " rows");
  }
  KeyIndex fresh(capacity_, spec_);
  std::int64_t last = 0;  // 0: a row written at clock 0 (Store::write_keys)
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    const std::string what = "restore: entry " + std::to_string(k) + " (key " + std::to_string(e.key) + ", row " +
                             std::to_string(e.row) + "): ";
    if (e.row < 0 || e.row >= capacity_) {
      return Status::invalid_argument(what + "row outside [0, " + std::to_string(capacity_) + ")");
    }
    if (!fresh.free_.test(e.row)) return Status::invalid_argument(what + "row given twice");
    if (e.last_use < last || e.last_use > clock) {
      return Status::invalid_argument(what + "last use " + std::to_string(e.last_use) + " outside [" +
                                      std::to_string(last) + ", " + std::to_string(clock) +
                                      "] (at most the clock, not below the entry before)");
    }
    if (e.count < 1) return Status::invalid_argument(what + "count " + std::to_string(e.count) + " < 1");
    const std::uint32_t hash = key_hash(e.key);
    if (fresh.find_slot(e.key, hash) != kNone) return Status::invalid_argument(what + "key given twice");
    last = e.last_use;
    const auto r = static_cast<std::uint32_t>(e.row);
    fresh.free_.clear(e.row);
    fresh.meta_[r] = Meta{e.key, e.last_use, e.count, kNil, kNil};
    fresh.insert_slot(e.key, hash, r);
    fresh.lru_append(r);
    if (!fresh.lfu_.empty()) fresh.lfu_insert(r);
    ++fresh.size_;
  }
  if (!sketch.empty()) {
    if (static_cast<std::int64_t>(sketch.size()) != sketch_state_bytes()) {
      return Status::invalid_argument("restore: sketch of " + std::to_string(sketch.size()) + " bytes, expected " +
                                      std::to_string(sketch_state_bytes()) +
                                      (sketched_ ? "" : " (admit_after <= 1 keeps no sketch)"));
    }
    // The size is right: only uses added at or past the aging threshold (10 x width) are refused.
    if (!fresh.sketch_.restore_state(sketch)) {
      std::uint64_t added = 0;
      for (int b = 0; b < 8; ++b) added |= std::uint64_t{sketch[static_cast<std::size_t>(b)]} << (8 * b);
      return Status::invalid_argument("restore: sketch's uses added " + std::to_string(added) + " outside [0, " +
                                      std::to_string(10 * sketch_.width()) + ")");
    }
  }
  fresh.clock_ = clock;
  fresh.counts_ = counts_;
  *this = std::move(fresh);
  return Status::ok();
}

}  // namespace strata
