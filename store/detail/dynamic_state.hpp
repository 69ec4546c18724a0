#pragma once
// DynamicState: the whole state of a dynamic table (core/dynamic_spec.hpp) that its next decisions read: the rows in
// use with their keys, last uses and counts in the eviction tie order, the clock, the admission sketch, and each row's
// weights and optimizer state. What a checkpoint saves of a dynamic table (store/io/detail/dynamic_piece.hpp) and
// Store::write_keys writes, through DynamicAccess.

#include <cstdint>
#include <vector>

#include "core/status.hpp"
#include "host/key_index.hpp"

namespace strata::detail {

struct DynamicState {
  std::int64_t clock = 0;                ///< KeyIndex::clock()
  std::vector<KeyIndex::Entry> entries;  ///< KeyIndex::entries(): the row touched earliest first
  std::vector<std::uint8_t> sketch;      ///< KeyIndex::sketch_state() (empty: admit_after <= 1, or a zeroed sketch)
  std::vector<float> weights;            ///< (entries, dim) fp32, entry by entry
  std::vector<float> state;              ///< (entries, optimizer_state_dim) fp32
};

/// What every Store of this library also is (StoreImpl, the reference store; a dynamic_cast finds it), kept out of
/// store/store.hpp: a dynamic table's whole state, for checkpoints and Store::write_keys. write_dynamic's `in` is
/// checked by the caller (KeyIndex::restore's rules, values its element types hold) and no batch is in flight; it
/// returns the engine's errors (its keys then changed, its rows partly written).
class DynamicAccess {
 public:
  virtual ~DynamicAccess() = default;
  virtual Status read_dynamic(int table, DynamicState& out) = 0;
  virtual Status write_dynamic(int table, const DynamicState& in) = 0;
};

}  // namespace strata::detail
