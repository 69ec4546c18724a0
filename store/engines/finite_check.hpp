#pragma once
// FiniteCheck: the gradients' finiteness check for gradients in device memory. The NaN and Inf
// values of every device view are counted on the device (Device::count_nonfinite: the shared
// kernel source), the counts come back D2H (8 bytes per view), and the host waits for them: it
// must know before backward changes anything. Only a view that holds one is then copied to the
// host, to name the bag and column as the host check does (batch_checks.hpp). The scratch only
// grows, so a training loop's steady state allocates nothing. Not thread-safe.

#include <cstdint>
#include <vector>

#include "core/key_batch.hpp"
#include "gpu/device.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

class FiniteCheck {
 public:
  explicit FiniteCheck(gpu::Device& device) : dev_(device) {}
  ~FiniteCheck();
  FiniteCheck(const FiniteCheck&) = delete;
  FiniteCheck& operator=(const FiniteCheck&) = delete;

  /// Unless config.accept_nonfinite_gradients (then ok at once): counts the NaN and Inf values of
  /// every device view among `grads` (shapes and ranges checked) on the device after `after`
  /// (recorded on the caller's stream; empty: none) and waits for the counts: a host sync point
  /// on the caller's stream up to the gradients. InvalidArgument as check_finite_gradients at the
  /// first view with one.
  Status check(std::int64_t batch_id, const KeyBatch& batch, const std::vector<int>& tables, const StoreConfig& config,
               const std::vector<ConstMatrixView>& grads, gpu::EventView after);

 private:
  gpu::Device& dev_;
  gpu::Stream stream_;
  gpu::Event done_;
  gpu::DeviceBuffer counts_;       // partial counts, then the totals (int64)
  gpu::PinnedBuffer host_totals_;  // the totals, D2H
};

}  // namespace strata::detail
