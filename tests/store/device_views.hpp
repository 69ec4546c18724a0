#pragma once
// Trainer-side helpers for outputs and gradients in device memory (Store::device()): device
// buffers shaped like a batch's Buffers, moved through pinned staging as a trainer's own copies
// would be, and one training step with host or device views, synchronous or on a stream.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gpu/device.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata::testing {

/// Device memory for the outputs or gradients of one batch, with pinned staging of the same size
/// and pinned NaN to overwrite it with (poison). Each buffer holds exactly its view's bytes (a half
/// view's elements are half-size), so a copy past the end of a view is refused by the emu device.
struct DeviceViews {
  std::vector<gpu::DeviceBuffer> mem;
  std::vector<gpu::PinnedBuffer> pinned, nan;
  std::vector<MatrixView> views;
  std::vector<ConstMatrixView> cviews;
};

/// Bytes of view i of `d`: its elements of its dtype.
inline std::size_t view_bytes(const DeviceViews& d, std::size_t i) {
  return static_cast<std::size_t>(d.views[i].rows * d.views[i].cols * element_bytes(d.views[i].dtype));
}

/// Device buffers shaped like the views of `like` (make_buffers; of their dtypes), on `dev`.
inline DeviceViews make_device_views(gpu::Device& dev, const Buffers& like) {
  DeviceViews d;
  for (std::size_t i = 0; i < like.views.size(); ++i) {
    const MatrixView& v = like.views[i];
    const std::size_t n = static_cast<std::size_t>(v.rows * v.cols);
    const std::size_t bytes = n * static_cast<std::size_t>(element_bytes(v.dtype));
    auto mem = dev.allocate(bytes);
    auto pin = dev.allocate_pinned(bytes);
    auto nan = dev.allocate_pinned(bytes);
    EXPECT_TRUE(mem.is_ok() && pin.is_ok() && nan.is_ok());
    d.mem.push_back(std::move(mem).value());
    d.pinned.push_back(std::move(pin).value());
    d.nan.push_back(std::move(nan).value());
    for (std::size_t k = 0; k < n; ++k) {  // NaN of the view's dtype in every element
      if (v.dtype == DType::kF32) {
        d.nan.back().as<float>()[k] = std::numeric_limits<float>::quiet_NaN();
      } else {
        const std::uint16_t nan16 = 0x7fff;  // bf16 and fp16: all exponent bits, a nonzero mantissa
        std::memcpy(static_cast<unsigned char*>(d.nan.back().data()) + 2 * k, &nan16, sizeof nan16);
      }
    }
    d.views.push_back({d.mem.back().as<float>(), v.rows, v.cols, MemorySpace::kDevice, v.dtype});
    d.cviews.push_back({d.mem.back().as<float>(), v.rows, v.cols, MemorySpace::kDevice, v.dtype});
  }
  return d;
}

/// Queues on `s` the copy of `from` into the device buffers (not waited for).
inline void upload(gpu::Device& dev, gpu::StreamView s, const Buffers& from, DeviceViews& to) {
  for (std::size_t i = 0; i < from.data.size(); ++i) {
    const std::size_t bytes = view_bytes(to, i);
    if (!bytes) continue;
    std::memcpy(to.pinned[i].data(), from.data[i].data(), bytes);
    dev.copy_h2d(s, to.mem[i].data(), to.pinned[i].data(), bytes);
  }
}

/// Queues on `s` an overwrite of every device buffer with NaN (a trainer reusing its buffers).
inline void poison(gpu::Device& dev, gpu::StreamView s, DeviceViews& d) {
  for (std::size_t i = 0; i < d.mem.size(); ++i) {
    if (d.mem[i].bytes()) dev.copy_h2d(s, d.mem[i].data(), d.nan[i].data(), d.mem[i].bytes());
  }
}

/// Copies the device views into `to` on `s` and waits for `s`; with `only`, just the views it marks.
inline Status download(gpu::Device& dev, gpu::StreamView s, DeviceViews& from, Buffers& to,
                       const std::vector<bool>* only = nullptr) {
  const auto wanted = [&](std::size_t i) { return view_bytes(from, i) && (!only || (*only)[i]); };
  for (std::size_t i = 0; i < to.data.size(); ++i)
    if (wanted(i)) dev.copy_d2h(s, from.pinned[i].data(), from.mem[i].data(), view_bytes(from, i));
  STRATA_RETURN_IF_ERROR(dev.synchronize(s));
  for (std::size_t i = 0; i < to.data.size(); ++i)
    if (wanted(i)) std::memcpy(to.data[i].data(), from.pinned[i].data(), view_bytes(from, i));
  return Status::ok();
}

/// How a step passes its outputs and gradients.
struct StepMode {
  bool device = false;             ///< views of Store::device() memory (else host)
  gpu::StreamView stream;          ///< stream-ordered calls on it (else synchronous)
  DeviceViews* outputs = nullptr;  ///< device buffers of the step's shapes to reuse (else made for it)
  DeviceViews* grads = nullptr;
  gpu::StreamView copies;  ///< the trainer's stream for its copies in synchronous steps (else made for it)
  /// With `device`, when not empty: per feature, whether its views are device ones (else host ones:
  /// host and device views in one call).
  std::vector<bool> on_device;
  bool ordered() const noexcept { return stream.state() != nullptr; }
};

/// forward and backward of batch `id` on `store`, the outputs coming back into `out` (make_buffers
/// of the batch). With device views on a stream, the step queues a trainer's work around the
/// calls without any host sync: its output buffers overwritten with NaN before forward, its
/// gradient buffers overwritten with NaN and then the gradients uploaded before backward (a
/// gradient read before the upload lands is NaN), and the gradient buffers overwritten with NaN
/// right after it, which must not reach the update.
inline Status run_step(Store& store, std::int64_t id, const Buffers& grads, Buffers& out, const StepMode& m) {
  if (!m.device) {
    STRATA_RETURN_IF_ERROR(m.ordered() ? store.forward(id, out.views, m.stream) : store.forward(id, out.views));
    return m.ordered() ? store.backward(id, grads.cviews, m.stream) : store.backward(id, grads.cviews);
  }
  gpu::Device& dev = *store.device();
  DeviceViews made_o, made_g;
  DeviceViews& o = m.outputs ? *m.outputs : (made_o = make_device_views(dev, out));
  DeviceViews& g = m.grads ? *m.grads : (made_g = make_device_views(dev, grads));
  const std::vector<bool>* only = m.on_device.empty() ? nullptr : &m.on_device;
  std::vector<MatrixView> ov = o.views;
  std::vector<ConstMatrixView> gv = g.cviews;
  for (std::size_t i = 0; only && i < ov.size(); ++i)
    if (!(*only)[i]) {
      ov[i] = out.views[i];
      gv[i] = grads.cviews[i];
    }
  if (m.ordered()) {
    poison(dev, m.stream, o);  // the store's lookups must run after this
    STRATA_RETURN_IF_ERROR(store.forward(id, ov, m.stream));
    STRATA_RETURN_IF_ERROR(download(dev, m.stream, o, out, only));
    poison(dev, m.stream, g);
    upload(dev, m.stream, grads, g);
    STRATA_RETURN_IF_ERROR(store.backward(id, gv, m.stream));
    poison(dev, m.stream, g);          // must run after the updates read the gradients
    return dev.synchronize(m.stream);  // the buffers may die after this
  }
  gpu::Stream own;
  gpu::StreamView copies = m.copies;
  if (!copies.state()) {
    STRATA_ASSIGN_OR_RETURN(own, dev.create_stream());
    copies = own.view();
  }
  STRATA_RETURN_IF_ERROR(store.forward(id, ov));
  STRATA_RETURN_IF_ERROR(download(dev, copies, o, out, only));
  upload(dev, copies, grads, g);
  STRATA_RETURN_IF_ERROR(dev.synchronize(copies));
  return store.backward(id, gv);
}

}  // namespace strata::testing
