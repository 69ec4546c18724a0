#include "store/engines/detail/mapped_rows.hpp"

namespace strata::detail {

Status MappedRows::add(gpu::Device& device, int table, const RowRef& ref) {
  std::vector<float*> bases;
  for (std::int32_t p = 0; p < ref.parts; ++p) {
    STRATA_ASSIGN_OR_RETURN(float* mapped, device.device_address(ref.bases[p]));
    bases.push_back(mapped);
  }
  std::vector<float*>& kept = bases_[table] = std::move(bases);
  RowRef mapped = ref;
  mapped.bases = kept.data();  // the vector's buffer does not move with the map's rehashing
  refs_[table] = mapped;
  return Status::ok();
}

}  // namespace strata::detail
