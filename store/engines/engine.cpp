#include "store/engines/engine.hpp"

#include <algorithm>
#include <utility>

namespace strata::detail {

Status Engine::read_rows_at(int table, const TableSpec& spec, const std::vector<std::int64_t>& rows, float* weights,
                            float* state) {
  constexpr std::size_t kRunRows = 4096;  // a run's buffers: at most this many rows
  const auto dim = static_cast<std::size_t>(spec.dim);
  const std::size_t sd = state ? static_cast<std::size_t>(optimizer_state_dim(spec.optimizer.kind, spec.dim)) : 0;
  const std::size_t n = rows.size();
  std::vector<std::pair<std::int64_t, std::size_t>> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = {rows[i], i};
  std::sort(order.begin(), order.end());
  std::vector<float> w, s;
  for (std::size_t a = 0, b = 0; a < n; a = b) {
    for (b = a + 1; b < n && b - a < kRunRows && order[b].first == order[b - 1].first + 1;) ++b;
    w.resize((b - a) * dim);
    s.resize((b - a) * sd);
    STRATA_RETURN_IF_ERROR(
        read_rows(table, order[a].first, static_cast<std::int64_t>(b - a), w.data(), sd ? s.data() : nullptr));
    for (std::size_t j = a; j < b; ++j) {
      std::copy_n(w.data() + (j - a) * dim, dim, weights + order[j].second * dim);
      std::copy_n(s.data() + (j - a) * sd, sd, state + order[j].second * sd);
    }
  }
  return Status::ok();
}

}  // namespace strata::detail
