#pragma once
// The device addresses of host tables' records, for the zero-copy paths (the device reads or
// writes host rows itself: cache fills and write-backs, offload lookups). A table's parts (NUMA
// nodes) are mapped once, when the engine opens; a row's address is then RowRef arithmetic.

#include <unordered_map>
#include <vector>

#include "core/status.hpp"
#include "gpu/device.hpp"
#include "host/row_ref.hpp"

namespace strata::detail {

class MappedRows {
 public:
  MappedRows() = default;
  // Moves keep the part vectors' buffers, which refs_ points into; a copy would not.
  MappedRows(MappedRows&&) = default;
  MappedRows& operator=(MappedRows&&) = default;
  MappedRows(const MappedRows&) = delete;
  MappedRows& operator=(const MappedRows&) = delete;

  /// Maps every part of table `table` (whose host view is `ref`; its memory must be registered
  /// through the device's pinner). The device's error when it cannot; nothing changes then.
  Status add(gpu::Device& device, int table, const RowRef& ref);
  /// Device address of the record of row `row` of `table` (added before).
  float* row(int table, Key row) const { return refs_.at(table).row(row); }

 private:
  std::unordered_map<int, std::vector<float*>> bases_;  // device address of each part
  std::unordered_map<int, RowRef> refs_;                // the tables' RowRefs over bases_
};

}  // namespace strata::detail
