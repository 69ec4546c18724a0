#pragma once
// DynamicSpec: a dynamic table's options. Its keys are any int64, a row is created for a key on first use in
// training, up to its capacity (TableSpec::rows); the rules: store/detail/dynamic_keys.hpp.

#include <cstdint>

namespace strata {

/// Which unpinned row a dynamic table evicts when it is full.
enum class Eviction { kLru = 0, kLfu = 1 };

/// What a key without a row reads.
enum class Unseen { kInitial = 0, kZeros = 1 };

/// A dynamic table's options (its capacity is TableSpec::rows).
struct DynamicSpec {
  std::int64_t admit_after = 1;        ///< uses before a key gets a row, in [1, kMaxAdmitAfter]
  Eviction eviction = Eviction::kLru;  ///< when full
  std::int64_t evict_after_steps = 0;  ///< TTL in clock ticks (0: none), in [0, 2^62)
  Unseen unseen = Unseen::kInitial;    ///< what a key without a row reads
};

/// Largest capacity of a dynamic table: its rows are 32-bit, one more held for keys without a row.
inline constexpr std::int64_t kMaxDynamicCapacity = (std::int64_t{1} << 31) - 2;

/// Largest DynamicSpec::admit_after (the admission sketch's counters are 16-bit).
inline constexpr std::int64_t kMaxAdmitAfter = 65535;

}  // namespace strata
