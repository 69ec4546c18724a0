#include "store/io/detail/reshard.hpp"

#include "store/store.hpp"

namespace strata::detail {

Box whole_box(std::int64_t rows, std::int32_t dim) {
  Box b;
  b.rows = rows;
  b.cols = dim;
  return b;
}

Box box_of(const ShardInfo&) { return Box{}; }
Box box_of(const dispatch::ShardLayout&, int) { return Box{}; }
std::string describe(const Box&) { return {}; }
std::pair<std::int64_t, std::int64_t> local_range(const Box&, std::int64_t, std::int64_t) { return {0, 0}; }

Status check_tiling(const std::string&, std::int64_t, std::int32_t, const std::vector<Box>&,
                    const std::vector<std::string>&) {
  return Status::ok();
}

Result<TablePlan> plan_table(const TableSpec&, const dispatch::ShardingPlan&, int, int, std::vector<Box>) {
  return Status::internal("plan_table is not implemented yet (world checkpoints, issue 34)");
}

std::int64_t record_floats(OptimizerKind kind, std::int32_t cols) {
  return std::int64_t{cols} + optimizer_state_dim(kind, cols);
}

std::int64_t span_bytes(const TablePlan&, int, int, std::int64_t, std::int64_t) { return 0; }
void pack_span(const TablePlan&, int, std::int64_t, std::int64_t, const std::vector<const float*>&, float*,
               const std::vector<std::int64_t>&) {}
void unpack_span(const TablePlan&, int, std::int64_t, std::int64_t, const float*, const std::vector<std::int64_t>&,
                 float*, float*) {}

}  // namespace strata::detail
