// The CUDA device guard (device_scope.hpp) and the current-device query of gpu/current_device.hpp.

#include "gpu/cuda/device_scope.hpp"

#include <cinttypes>
#include <cstdio>
#include <string>

#include "gpu/cuda/cuda_try.hpp"
#include "gpu/current_device.hpp"

namespace strata::gpu {
namespace cuda_detail {
namespace {

// The driver functions the guard needs, looked up once through the runtime (no libcuda link).
// Each is asked for in its CUDA 12.0 form, which every later driver keeps; ctx_device_of (the
// CUDA 13.0 cuCtxGetDevice, which names the context) is optional.
struct Driver {
  CUresult(CUDAAPI* init)(unsigned int) = nullptr;
  CUresult(CUDAAPI* device_get)(CUdevice*, int) = nullptr;
  CUresult(CUDAAPI* primary_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult(CUDAAPI* primary_release)(CUdevice) = nullptr;
  CUresult(CUDAAPI* ctx_get_current)(CUcontext*) = nullptr;
  CUresult(CUDAAPI* ctx_set_current)(CUcontext) = nullptr;
  CUresult(CUDAAPI* stream_get_ctx)(CUstream, CUcontext*) = nullptr;
  CUresult(CUDAAPI* ctx_device_of)(CUdevice*, CUcontext) = nullptr;  // nullptr before CUDA 13 drivers
  const char* missing = nullptr;  // the first function the runtime could not give, or "cuInit"
  cudaError_t error = cudaSuccess;
  CUresult init_error = CUDA_SUCCESS;  // when cuInit failed

  // The function `name` in its form of CUDA `version`; nullptr when the driver has none.
  static void* lookup(const char* name, int version, cudaError_t& e) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    e = call_quietly([&] {
      return cudaGetDriverEntryPointByVersion(name, &p, static_cast<unsigned>(version), cudaEnableDefault, &q);
    });
#else
    (void)version;  // only 12.0 forms are asked for before 12.5
    e = call_quietly([&] { return cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &q); });
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
      return nullptr;
    }
    return p;
  }
  template <class F>
  void find(const char* name, F& fn) {
    if (missing) return;
    void* p = lookup(name, 12000, error);
    if (!p) {
      missing = name;
      return;
    }
    fn = reinterpret_cast<F>(p);
  }
};

const Driver& driver() {
  static const Driver d = [] {
    Driver x;
    x.find("cuInit", x.init);
    x.find("cuDeviceGet", x.device_get);
    x.find("cuDevicePrimaryCtxRetain", x.primary_retain);
    x.find("cuDevicePrimaryCtxRelease", x.primary_release);
    x.find("cuCtxGetCurrent", x.ctx_get_current);
    x.find("cuCtxSetCurrent", x.ctx_set_current);
    x.find("cuStreamGetCtx", x.stream_get_ctx);
#if CUDART_VERSION >= 13000
    cudaError_t ignored = cudaSuccess;
    x.ctx_device_of = reinterpret_cast<decltype(x.ctx_device_of)>(Driver::lookup("cuCtxGetDevice", 13000, ignored));
#endif
    if (!x.missing) {
      x.init_error = x.init(0);
      if (x.init_error != CUDA_SUCCESS) x.missing = "cuInit";
    }
    return x;
  }();
  return d;
}

Status driver_missing(const Driver& d) {
  if (d.init_error != CUDA_SUCCESS)
    return Status::internal("cuInit(0) failed: CUDA driver error " + std::to_string(static_cast<int>(d.init_error)) +
                            "; is the NVIDIA driver loaded and a GPU visible?");
  return Status::internal(std::string("CUDA driver function ") + d.missing +
                          " is not available through the runtime (cudaGetDriverEntryPoint: " +
                          cudaGetErrorName(d.error) + "); is the NVIDIA driver installed and recent enough?");
}

Status driver_status(CUresult r, const char* call) {
  return Status::internal(std::string(call) + " failed: CUDA driver error " + std::to_string(static_cast<int>(r)));
}

}  // namespace

Result<PrimaryContext> PrimaryContext::retain(int ordinal) {
  const Driver& d = driver();
  if (d.missing) return driver_missing(d);
  PrimaryContext c;
  CUresult r = d.device_get(&c.device_, ordinal);
  if (r != CUDA_SUCCESS) return driver_status(r, "cuDeviceGet").with_context("CUDA device " + std::to_string(ordinal));
  r = d.primary_retain(&c.ctx_, c.device_);
  if (r != CUDA_SUCCESS)
    return driver_status(r, "cuDevicePrimaryCtxRetain").with_context("CUDA device " + std::to_string(ordinal));
  c.ordinal_ = ordinal;
  // The runtime's own hold of the context (kept until cudaDeviceReset or exit; makes nothing
  // current). Without it Strata could be the context's only holder, and the release when the last
  // store closes would destroy it under the static runtime's per-context state: a store opened
  // later would meet a stale runtime.
  STRATA_CUDA_TRY(cudaInitDevice(ordinal, 0, 0));
  return c;
}

PrimaryContext::~PrimaryContext() {
  if (ctx_) (void)driver().primary_release(device_);
}

DeviceScope::DeviceScope(CUcontext ctx) noexcept {
  const Driver& d = driver();
  if (d.missing) {
    error_ = d.missing;
    return;
  }
  if (!ctx) {
    error_ = "DeviceScope(nullptr context)";
    return;
  }
  CUresult r = d.ctx_get_current(&previous_);
  if (r != CUDA_SUCCESS) {
    error_ = "cuCtxGetCurrent";
    code_ = static_cast<int>(r);
    return;
  }
  if (previous_ == ctx) return;
  r = d.ctx_set_current(ctx);
  if (r != CUDA_SUCCESS) {
    error_ = "cuCtxSetCurrent";
    code_ = static_cast<int>(r);
    return;
  }
  changed_ = true;
}

DeviceScope::~DeviceScope() {
  if (!changed_) return;
  const Driver& d = driver();
  if (!d.missing) (void)d.ctx_set_current(previous_);  // always true when changed_ (the constructor checked)
}

Status DeviceScope::status() const {
  if (ok()) return Status::ok();
  const Driver& d = driver();
  if (d.missing && error_ == d.missing) return driver_missing(d);
  return Status::internal(std::string("CUDA device scope: ") + error_ + " failed (CUDA driver error " +
                          std::to_string(code_) + ")");
}

Result<CUcontext> current_context() {
  const Driver& d = driver();
  if (d.missing) return driver_missing(d);
  CUcontext ctx = nullptr;
  const CUresult r = d.ctx_get_current(&ctx);
  if (r != CUDA_SUCCESS) return driver_status(r, "cuCtxGetCurrent");
  return ctx;
}

Result<CUcontext> stream_context(cudaStream_t stream) {
  const Driver& d = driver();
  if (d.missing) return driver_missing(d);
  CUcontext ctx = nullptr;
  const CUresult r = d.stream_get_ctx(reinterpret_cast<CUstream>(stream), &ctx);
  if (r != CUDA_SUCCESS) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%" PRIxPTR, reinterpret_cast<std::uintptr_t>(stream));
    return Status::invalid_argument(std::string("CUDA stream ") + buf +
                                    " is not a live stream (cuStreamGetCtx: CUDA driver error " +
                                    std::to_string(static_cast<int>(r)) + ")");
  }
  return ctx;
}

Result<int> context_device(CUcontext ctx) {
  const Driver& d = driver();
  if (d.missing) return driver_missing(d);
  // Never by making `ctx` current (cuCtxGetDevice of CUDA 12): that is not allowed for a context
  // current on another thread (green contexts).
  if (!d.ctx_device_of)
    return Status::unavailable(
        "this CUDA driver cannot name the device of a context without making it current "
        "(cuCtxGetDevice with a context needs CUDA 13)");
  CUdevice dev = 0;
  CUresult r = d.ctx_device_of(&dev, ctx);
  if (r != CUDA_SUCCESS) return driver_status(r, "cuCtxGetDevice(&device, ctx)");
  // A CUdevice is a handle: find the runtime ordinal that names it.
  int count = 0;
  STRATA_CUDA_TRY(cudaGetDeviceCount(&count));
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice candidate = 0;
    r = d.device_get(&candidate, ordinal);
    if (r != CUDA_SUCCESS) return driver_status(r, "cuDeviceGet");
    if (candidate == dev) return ordinal;
  }
  return Status::not_found("the CUDA device of a context is not among the " + std::to_string(count) +
                           " visible ones (CUDA_VISIBLE_DEVICES)");
}

}  // namespace cuda_detail

Result<int> cuda_current_device() {
  int device = 0;
  STRATA_CUDA_TRY(cudaGetDevice(&device));
  return device;
}

}  // namespace strata::gpu
