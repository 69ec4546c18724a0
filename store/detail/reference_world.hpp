#pragma once
// What the reference store (store/reference.cpp) also is: how many ranks' shards of its dynamic tables it holds side by
// side (open_reference_world). No checkpoint format holds those shards as one store (format 4 is one index per table,
// format 5 one file per rank of a world), so Store::save and load refuse a reference of a world with a dynamic table
// (store/io/checkpoint.cpp). Private to the store library.

namespace strata::detail {

class ReferenceWorld {
 public:
  virtual ~ReferenceWorld() = default;
  /// open_reference_world's `world` (1: open_reference_store).
  virtual int reference_world() const noexcept = 0;
};

}  // namespace strata::detail
