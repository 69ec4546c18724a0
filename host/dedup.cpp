#include "host/dedup.hpp"

#include "core/row_math.hpp"

namespace strata {

UniqueKeys dedup_keys(const Key* keys, std::int64_t n) {
  UniqueKeys u;
  DedupScratch scratch;
  dedup_keys(keys, n, u, scratch);
  return u;
}

void dedup_keys(const Key* keys, std::int64_t n, UniqueKeys& u, DedupScratch& scratch) {
  STRATA_CHECK(n >= 0 && n < (std::int64_t{1} << 31));
  u.keys.clear();
  u.offsets.assign(1, 0);
  u.positions.clear();
  if (n == 0) return;
  std::size_t cap = 16;
  while (cap < static_cast<std::size_t>(n) * 2) cap *= 2;
  const std::size_t mask = cap - 1;
  // slot -> unique id + 1 (0 = empty). The key itself is read back from u.keys.
  std::vector<std::int32_t>& slots = scratch.slots;
  slots.assign(cap, 0);
  std::vector<std::int32_t>& uid = scratch.uid;
  uid.resize(static_cast<std::size_t>(n));
  u.keys.reserve(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    const Key k = keys[j];
    std::size_t h = mix64(static_cast<std::uint64_t>(k)) & mask;
    for (;;) {
      const std::int32_t s = slots[h];
      if (s == 0) {
        u.keys.push_back(k);
        slots[h] = static_cast<std::int32_t>(u.keys.size());
        uid[static_cast<std::size_t>(j)] = slots[h] - 1;
        break;
      }
      if (u.keys[static_cast<std::size_t>(s - 1)] == k) {
        uid[static_cast<std::size_t>(j)] = s - 1;
        break;
      }
      h = (h + 1) & mask;
    }
  }
  const std::size_t U = u.keys.size();
  u.offsets.assign(U + 1, 0);
  for (std::int64_t j = 0; j < n; ++j) ++u.offsets[static_cast<std::size_t>(uid[static_cast<std::size_t>(j)]) + 1];
  for (std::size_t i = 0; i < U; ++i) u.offsets[i + 1] += u.offsets[i];
  std::vector<std::int64_t>& cursor = scratch.cursor;
  cursor.assign(u.offsets.begin(), u.offsets.end() - 1);
  u.positions.resize(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    u.positions[static_cast<std::size_t>(cursor[static_cast<std::size_t>(uid[static_cast<std::size_t>(j)])]++)] =
        static_cast<std::int32_t>(j);
  }
}

void bag_of_positions(const std::int64_t* offsets, std::int64_t batch, std::int32_t* bag) {
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t j = offsets[b]; j < offsets[b + 1]; ++j) bag[j] = static_cast<std::int32_t>(b);
  }
}

void bag_of_positions(const std::int64_t* offsets, std::int64_t batch, std::vector<std::int32_t>& bag) {
  bag.resize(static_cast<std::size_t>(batch > 0 ? offsets[batch] : 0));
  bag_of_positions(offsets, batch, bag.data());
}

std::vector<std::int32_t> bag_of_positions(const std::int64_t* offsets, std::int64_t batch) {
  std::vector<std::int32_t> bag;
  bag_of_positions(offsets, batch, bag);
  return bag;
}

}  // namespace strata
