#pragma once
// The one CUDA device guard of Strata, shared by the cuda backend (gpu/cuda/cuda_device.cpp) and
// the nccl communicator (dispatch/nccl_communicator.cpp): Strata never changes which device, and
// which context, the calling thread has current. Each operation that needs its device makes that
// device's primary context current for its duration and then restores whatever the thread had
// before, no context included (XLA's ScopedActivateContext does the same). Working on contexts
// rather than with cudaSetDevice matters twice: restoring with cudaSetDevice(previous) would
// create a context on the previous device (CUDA 12 and later initialize the primary context in
// cudaSetDevice), costing hundreds of MB of a GPU the process never used, and it would replace a
// context the caller made current through the driver API by the primary one.
//
// The driver functions are reached through the runtime (cudaGetDriverEntryPoint*), so nothing
// links libcuda. The runtime API uses whatever context is current, so runtime calls made inside a
// DeviceScope go to its device. Host-compilable (no nvcc); needs <cuda.h> for the types only.

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <utility>

#include "core/status.hpp"

#if !defined(CUDART_VERSION) || CUDART_VERSION < 12000
#error "Strata's CUDA backend needs CUDA 12.0 or later (cudaInitDevice, cudaGetDriverEntryPoint's CUDA 12 forms)"
#endif

namespace strata::gpu::cuda_detail {

/// The primary context of CUDA device `ordinal` (the context of the runtime API, and so of
/// PyTorch, on that device), retained while this lives (cuDevicePrimaryCtxRetain/Release; retaining
/// initializes it when nothing has yet). retain() also has the runtime initialize the device
/// (cudaInitDevice), so that the runtime holds the context too and it outlives every Strata
/// object: a store closed and reopened finds the runtime's state of that context valid. Move-only.
class PrimaryContext {
 public:
  /// Internal naming the driver call when the driver cannot be reached or refuses the ordinal.
  static Result<PrimaryContext> retain(int ordinal);

  PrimaryContext() = default;
  PrimaryContext(PrimaryContext&& o) noexcept { swap(o); }
  PrimaryContext& operator=(PrimaryContext&& o) noexcept {
    PrimaryContext t(std::move(o));
    swap(t);
    return *this;
  }
  ~PrimaryContext();

  CUcontext get() const noexcept { return ctx_; }
  int ordinal() const noexcept { return ordinal_; }

 private:
  void swap(PrimaryContext& o) noexcept {
    std::swap(ctx_, o.ctx_);
    std::swap(ordinal_, o.ordinal_);
    std::swap(device_, o.device_);
  }
  CUcontext ctx_ = nullptr;
  int ordinal_ = -1;
  CUdevice device_ = 0;
};

/// Makes `ctx` current on the calling thread for the scope, and on exit makes current again what
/// was current before (the same context, or none). When `ctx` is current already it costs one
/// cuCtxGetCurrent (a thread-local read in the driver) and changes nothing; otherwise it adds two
/// cuCtxSetCurrent calls (in and out). Not movable.
class DeviceScope {
 public:
  explicit DeviceScope(CUcontext ctx) noexcept;
  explicit DeviceScope(const PrimaryContext& c) noexcept : DeviceScope(c.get()) {}
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  /// Whether `ctx` is current, so that runtime calls in this scope go to its device.
  bool ok() const noexcept { return error_ == nullptr; }
  /// Why not (Internal naming the driver call and its error); ok while ok().
  Status status() const;

 private:
  CUcontext previous_ = nullptr;
  bool changed_ = false;
  const char* error_ = nullptr;  // the failed driver call
  int code_ = 0;                 // its CUresult
};

/// The context current on the calling thread (nullptr: none), as cuCtxGetCurrent says.
Result<CUcontext> current_context();

/// The context `stream` belongs to (cuStreamGetCtx; for the legacy default stream, the context
/// current on the calling thread). InvalidArgument when the driver reports the handle invalid; a
/// pointer that is no stream handle at all (never one, or destroyed) is undefined behaviour in the
/// driver, which may not detect it.
Result<CUcontext> stream_context(cudaStream_t stream);

/// The CUDA device of `ctx` (the ordinal of this process's runtime), asked without making `ctx`
/// current (cuCtxGetDevice with a context, CUDA 13); Unavailable on drivers that lack it.
Result<int> context_device(CUcontext ctx);

}  // namespace strata::gpu::cuda_detail
