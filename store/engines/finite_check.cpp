#include "store/engines/finite_check.hpp"

#include "gpu/kernels/launch_args.hpp"
#include "store/detail/batch_checks.hpp"

namespace strata::detail {

FiniteCheck::~FiniteCheck() {
  if (stream_) (void)dev_.synchronize(stream_.view());
}

Status FiniteCheck::check(std::int64_t batch_id, const KeyBatch& batch, const std::vector<int>& tables,
                          const StoreConfig& config, const std::vector<ConstMatrixView>& grads, gpu::EventView after) {
  if (config.accept_nonfinite_gradients) return Status::ok();
  std::vector<gpu::FloatRange> ranges;
  std::vector<std::size_t> feature;  // of each range
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].space != MemorySpace::kDevice || grads[i].rows * grads[i].cols == 0) continue;
    ranges.push_back({grads[i].data, grads[i].rows * grads[i].cols, grads[i].dtype});
    feature.push_back(i);
  }
  if (ranges.empty()) return Status::ok();
  if (!stream_) {
    // Both or neither: a stream without its event would be recorded into empty on the next call.
    STRATA_ASSIGN_OR_RETURN(gpu::Stream stream, dev_.create_stream());
    STRATA_ASSIGN_OR_RETURN(gpu::Event done, dev_.create_event());
    stream_ = std::move(stream);
    done_ = std::move(done);
  }
  // Every earlier check was waited for: the scratch is free.
  const std::size_t partials = static_cast<std::size_t>(gpu::kernels::finite_partials(ranges));
  const std::size_t need = (partials + ranges.size()) * sizeof(std::int64_t);
  if (counts_.bytes() < need) {
    counts_ = gpu::DeviceBuffer();
    STRATA_ASSIGN_OR_RETURN(counts_, dev_.allocate(2 * need));
  }
  const std::size_t totals_bytes = ranges.size() * sizeof(std::int64_t);
  if (host_totals_.bytes() < totals_bytes) {
    host_totals_ = gpu::PinnedBuffer();
    STRATA_ASSIGN_OR_RETURN(host_totals_, dev_.allocate_pinned(2 * totals_bytes));
  }
  const gpu::StreamView s = stream_.view();
  if (after.state()) dev_.wait(s, after);
  std::int64_t* totals = counts_.as<std::int64_t>() + partials;
  dev_.count_nonfinite(s, ranges, counts_.as<std::int64_t>(), totals);
  dev_.copy_d2h(s, host_totals_.data(), totals, totals_bytes);
  dev_.record(done_.view(), s);
  STRATA_RETURN_IF_ERROR(dev_.synchronize(done_.view()));
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    if (host_totals_.as<std::int64_t>()[r] == 0) continue;
    // The error path: bring this view to the host to name the first bag and column.
    const std::size_t i = feature[r];
    const std::size_t bytes = static_cast<std::size_t>(ranges[r].n * element_bytes(ranges[r].dtype));
    STRATA_ASSIGN_OR_RETURN(gpu::PinnedBuffer copy, dev_.allocate_pinned(bytes));
    dev_.copy_d2h(s, copy.data(), ranges[r].data, bytes);
    STRATA_RETURN_IF_ERROR(dev_.synchronize(s));
    STRATA_RETURN_IF_ERROR(nonfinite_gradient(
        batch_id, batch, tables, config, i,
        ConstMatrixView{copy.as<float>(), grads[i].rows, grads[i].cols, MemorySpace::kHost, grads[i].dtype}));
    // The device counted some, the copy holds none: the view changed while the store read it (the
    // caller's work was not ordered before the call). Still a refusal: the count is what was seen.
    return Status::invalid_argument(
        "batch " + std::to_string(batch_id) + ": " + std::to_string(host_totals_.as<std::int64_t>()[r]) +
        " NaN or Inf values counted on the device in the gradient of feature " + std::to_string(i) + " (table '" +
        config.tables[static_cast<std::size_t>(tables[i])].spec.name +
        "'), none in its copy made after the count: the view was written while backward read it (expected "
        "finite gradients, unchanged until the call's work is done)");
  }
  return Status::ok();
}

}  // namespace strata::detail
