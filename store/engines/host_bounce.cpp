#include "store/engines/host_bounce.hpp"

namespace strata::detail {
namespace {
constexpr std::size_t kAlign = 64;
std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
template <class View>
std::size_t view_bytes(const View& v) {
  return static_cast<std::size_t>(v.rows * v.cols * element_bytes(v.dtype));  // of the table's output_dtype
}
}  // namespace

HostBounce::~HostBounce() {
  if (stream_) (void)dev_.synchronize(stream_.view());
}

template <class View>
std::size_t HostBounce::scratch_bytes(const std::vector<View>& views, const std::vector<bool>& bounce) const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < views.size(); ++i)
    if (bounce[i]) n += aligned(view_bytes(views[i]));
  return n;
}

Status HostBounce::reserve(std::size_t bytes) {
  if (!stream_) {
    // All or none: a stream without its events would be recorded into empty on the next call.
    STRATA_ASSIGN_OR_RETURN(gpu::Stream stream, dev_.create_stream());
    STRATA_ASSIGN_OR_RETURN(gpu::Event done0, dev_.create_event());
    STRATA_ASSIGN_OR_RETURN(gpu::Event done1, dev_.create_event());
    stream_ = std::move(stream);
    slots_[0].done = std::move(done0);
    slots_[1].done = std::move(done1);
  }
  Slot& slot = slots_[1 - cur_];
  STRATA_RETURN_IF_ERROR(dev_.synchronize(slot.done.view()));
  if (slot.scratch.bytes() < bytes) {
    slot.scratch = gpu::PinnedBuffer();
    STRATA_ASSIGN_OR_RETURN(slot.scratch, dev_.allocate_pinned(2 * bytes));
  }
  cur_ = 1 - cur_;
  return Status::ok();
}

Result<std::vector<MatrixView>> HostBounce::host_outputs(const std::vector<MatrixView>& views,
                                                         const std::vector<bool>& bounce) {
  STRATA_RETURN_IF_ERROR(reserve(scratch_bytes(views, bounce)));
  std::vector<MatrixView> host = views;
  char* at = slots_[cur_].scratch.as<char>();
  for (std::size_t i = 0; i < views.size(); ++i) {
    if (!bounce[i]) continue;
    host[i] =
        MatrixView{reinterpret_cast<float*>(at), views[i].rows, views[i].cols, MemorySpace::kHost, views[i].dtype};
    at += aligned(view_bytes(views[i]));
  }
  return host;
}

Status HostBounce::copy_outputs(const std::vector<MatrixView>& views, const std::vector<MatrixView>& host,
                                const std::vector<bool>& bounce, const CallOrder& order) {
  const gpu::StreamView s = stream_.view();
  if (order.after.state()) dev_.wait(s, order.after);
  for (std::size_t i = 0; i < views.size(); ++i)
    if (bounce[i]) dev_.copy_h2d(s, views[i].data, host[i].data, view_bytes(views[i]));
  const gpu::EventView done = slots_[cur_].done.view();
  dev_.record(done, s);
  if (!order.caller.state()) return dev_.synchronize(done);
  dev_.wait(order.caller, done);
  return dev_.status();
}

Result<std::vector<ConstMatrixView>> HostBounce::host_gradients(const std::vector<ConstMatrixView>& grads,
                                                                const std::vector<bool>& bounce,
                                                                const CallOrder& order) {
  STRATA_RETURN_IF_ERROR(reserve(scratch_bytes(grads, bounce)));
  const gpu::StreamView s = stream_.view();
  if (order.after.state()) dev_.wait(s, order.after);
  std::vector<ConstMatrixView> host = grads;
  char* at = slots_[cur_].scratch.as<char>();
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!bounce[i]) continue;
    float* to = reinterpret_cast<float*>(at);
    dev_.copy_d2h(s, to, grads[i].data, view_bytes(grads[i]));
    host[i] = ConstMatrixView{to, grads[i].rows, grads[i].cols, MemorySpace::kHost, grads[i].dtype};
    at += aligned(view_bytes(grads[i]));
  }
  const gpu::EventView done = slots_[cur_].done.view();
  dev_.record(done, s);
  STRATA_RETURN_IF_ERROR(dev_.synchronize(done));
  return host;
}

}  // namespace strata::detail
