#pragma once
// The device side of strata._strata: a store's streams (Store.stream()) and device arrays
// (Store.device_array()), and the `stream=` argument of forward/backward. A device array is
// memory of the store's device exposing __cuda_array_interface__, so that CuPy, Numba and torch
// (on CUDA) can view it, and the store takes it as a device view; on the emulated device its
// address is an emu device address, which nothing may dereference on the host: copy_from and
// to_numpy copy through the device. Both hold their store (its device) alive: a shared_ptr to the
// device that owns the store (the aliasing constructor), so that one outliving Store.close() keeps
// the store's memory until it goes (module.cpp: PyStore::close).

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include "gpu/device.hpp"

namespace strata::python {

namespace py = pybind11;

/// A stream created on a store's device (Store.stream()). Destroying it waits for its work (with
/// the GIL released), then lets go of the device (of the store, when this was its last holder).
class PyStream {
 public:
  PyStream(std::shared_ptr<gpu::Device> device, gpu::Stream s) : device_(std::move(device)), stream_(std::move(s)) {}
  PyStream(PyStream&&) = default;
  PyStream& operator=(PyStream&&) = delete;
  ~PyStream();
  gpu::StreamView view() const noexcept { return stream_.view(); }

 private:
  std::shared_ptr<gpu::Device> device_;  // the store's (declared first: the stream goes before it)
  gpu::Stream stream_;
};

/// The `stream=` of forward/backward, parsed with the GIL held: none, a PyStream's view, or a
/// native handle (an int, or an object's `cuda_stream` (torch.cuda.Stream) or `ptr` (CuPy)) that
/// resolve() wraps on the store's device.
struct StreamArg {
  bool given = false;         ///< false: stream=None (the synchronous call)
  gpu::StreamView view;       ///< a PyStream's
  bool native = false;        ///< a handle to wrap
  std::uintptr_t handle = 0;  ///< the handle (0: the device's default stream)
};
StreamArg parse_stream(py::handle stream);
/// A stream of `device` for `arg` (given): the PyStream's view, or `holder` = wrap_stream(handle).
/// Run with the GIL released. A handle the device refuses is its InvalidArgument, prefixed by `who`.
Result<gpu::StreamView> resolve_stream(gpu::Device& device, const StreamArg& arg, gpu::Stream& holder,
                                       const std::string& who);

/// Registers Stream and DeviceArray (their Python types; Store.stream() and Store.device_array()
/// construct them).
void register_device_types(py::module_& m);
/// Store.stream() and Store.device_array(shape) of a store whose device is `device` (a pointer that
/// owns the store; a null pointer: the store has none, a RuntimeError naming why). The object holds it.
py::object make_stream(const std::shared_ptr<gpu::Device>& device);
py::object make_device_array(const std::shared_ptr<gpu::Device>& device, std::int64_t rows, std::int64_t cols);
/// Store.device: None, or {"backend", "name", "ordinal", "capacity"}.
py::object device_info(const gpu::Device* device);

}  // namespace strata::python
