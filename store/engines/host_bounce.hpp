#pragma once
// HostBounce: the one adaptor between device views (MemorySpace::kDevice) and the engines that take
// host views only (`cpu` tables of a store with a device; `offload` and the sharded engine take
// device views themselves, offload_engine.hpp and sharded_engine.hpp). Outputs: the engine writes into pinned
// host scratch, then one H2D copy per view fills the caller's device buffer; gradients: one D2H
// copy per view into the scratch, which the engine reads. The copies run on the adaptor's own
// stream, ordered after the caller's stream (CallOrder::after), and count in the device's link
// counters. The scratch is double-buffered: a call takes the buffer the call before last used, so a
// stream-ordered forward does not wait on the host for the previous call's copies (which wait for
// the caller's stream), only for those of the call before it. Each buffer only grows (to twice a
// request), so a training loop's steady state allocates nothing. Not thread-safe.

#include <cstddef>
#include <vector>

#include "core/key_batch.hpp"
#include "gpu/device.hpp"
#include "store/engines/engine.hpp"

namespace strata::detail {

class HostBounce {
 public:
  explicit HostBounce(gpu::Device& device) : dev_(device) {}
  ~HostBounce();
  HostBounce(const HostBounce&) = delete;
  HostBounce& operator=(const HostBounce&) = delete;

  /// `views` with each view marked in `bounce` replaced by a host view of the scratch (same
  /// shape). Waits for the copies of the call before last, which used the same buffer (a host
  /// sync point on one event); fails only when the scratch cannot grow (nothing changed then).
  Result<std::vector<MatrixView>> host_outputs(const std::vector<MatrixView>& views, const std::vector<bool>& bounce);
  /// After the engines wrote `host` (host_outputs' views): copies each bounced view H2D into
  /// `views`, after `order.after`. `order.caller` waits for the copies; without a caller stream
  /// the host does. The host returns without waiting when there is a caller stream.
  Status copy_outputs(const std::vector<MatrixView>& views, const std::vector<MatrixView>& host,
                      const std::vector<bool>& bounce, const CallOrder& order);
  /// `grads` with each view marked in `bounce` replaced by a host copy of it: D2H after
  /// `order.after`, and the host waits for the copies.
  Result<std::vector<ConstMatrixView>> host_gradients(const std::vector<ConstMatrixView>& grads,
                                                      const std::vector<bool>& bounce, const CallOrder& order);

 private:
  // Switches to the other buffer and makes room in it for `bytes` once its previous copies are
  // done; creates the stream and the events on first use.
  Status reserve(std::size_t bytes);
  template <class View>
  std::size_t scratch_bytes(const std::vector<View>& views, const std::vector<bool>& bounce) const;

  gpu::Device& dev_;
  struct Slot {
    gpu::Event done;  // recorded after the last copies of this buffer
    gpu::PinnedBuffer scratch;
  };
  gpu::Stream stream_;
  Slot slots_[2];
  int cur_ = 0;  // the slot of the current call
};

}  // namespace strata::detail
