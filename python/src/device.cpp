#include "python/src/device.hpp"

#include <pybind11/numpy.h>

#include <cstring>

#include "python/src/arrays.hpp"
#include "python/src/process_group.hpp"

namespace strata::python {
namespace {

std::string hex(std::uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// A destructor's release of `object` (a buffer or stream of `device`), then of `device` (and its
// store, when this was the last holder after Store.close()), with the GIL released as by every
// store call (held once the interpreter is finalizing: without_gil); nothing for an object moved from.
template <typename T>
void release_device(std::shared_ptr<gpu::Device>& device, T& object) noexcept {
  if (!device) return;
  try {
    without_gil([&device, &object] {
      object = T();
      device.reset();
    });
  } catch (...) {  // a destructor reports nothing
  }
}

// Memory of a store's device, (rows, cols) float32, C-contiguous.
class PyDeviceArray {
 public:
  PyDeviceArray(std::shared_ptr<gpu::Device> device, gpu::DeviceBuffer buffer, std::int64_t rows, std::int64_t cols)
      : device_(std::move(device)), buffer_(std::move(buffer)), rows_(rows), cols_(cols) {}
  PyDeviceArray(PyDeviceArray&&) = default;
  PyDeviceArray& operator=(PyDeviceArray&&) = delete;
  ~PyDeviceArray() { release_device(device_, buffer_); }

  std::uintptr_t ptr() const noexcept { return reinterpret_cast<std::uintptr_t>(buffer_.data()); }
  py::tuple shape() const { return py::make_tuple(rows_, cols_); }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(rows_ * cols_) * sizeof(float); }

  // Version 3 of the CUDA Array Interface: C-contiguous (strides None), writable, no stream to
  // wait for (every write through Strata is ordered by the caller's stream or waited for).
  py::dict interface() const {
    py::dict d;
    d["shape"] = shape();
    d["typestr"] = "<f4";
    d["data"] = py::make_tuple(bytes() ? ptr() : 0, false);
    d["strides"] = py::none();
    d["version"] = 3;
    return d;
  }

  void copy_from(py::handle src, py::handle stream) {
    auto a = to_float_matrix(src, "copy_from: source");
    if (a.shape(0) != rows_ || a.shape(1) != cols_)
      throw py::value_error("copy_from: source has shape (" + std::to_string(a.shape(0)) + ", " +
                            std::to_string(a.shape(1)) + ") (expected (" + std::to_string(rows_) + ", " +
                            std::to_string(cols_) + "), the device array's)");
    copy(parse_stream(stream), const_cast<float*>(a.data()), true);
  }

  py::array_t<float> to_numpy(py::handle stream) {
    py::array_t<float> out({rows_, cols_});
    copy(parse_stream(stream), out.mutable_data(), false);
    return out;
  }

 private:
  // One synchronous copy through pinned staging memory (as the device requires of its host side),
  // on `arg`'s stream (after the work queued there) or the device's default stream.
  void copy(const StreamArg& arg, float* host, bool h2d) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = [&]() -> Status {
        if (bytes() == 0) return Status::ok();
        gpu::Stream holder;
        StreamArg a = arg;
        if (!a.given) a.given = a.native = true;  // handle 0: the device's default stream
        const char* op = h2d ? "copy_from" : "to_numpy";
        STRATA_ASSIGN_OR_RETURN(gpu::StreamView s, resolve_stream(*device_, a, holder, op));
        if (!device_->owns(s))
          return Status::invalid_argument(std::string(op) + ": the stream belongs to another device (expected a " +
                                          "stream of the array's device, " + device_->info().name + ")");
        STRATA_ASSIGN_OR_RETURN(gpu::PinnedBuffer staging, device_->allocate_pinned(bytes()));
        if (h2d) {
          std::memcpy(staging.data(), host, bytes());
          device_->copy_h2d(s, buffer_.data(), staging.data(), bytes());
        } else {
          device_->copy_d2h(s, staging.data(), buffer_.data(), bytes());
        }
        STRATA_RETURN_IF_ERROR(device_->synchronize(s));
        if (!h2d) std::memcpy(host, staging.data(), bytes());
        return Status::ok();
      }();
    }
    throw_if_error(st);
  }

  std::shared_ptr<gpu::Device> device_;  // the store's (declared first: the buffer goes before it)
  gpu::DeviceBuffer buffer_;
  std::int64_t rows_, cols_;
};

void require_device(const std::shared_ptr<gpu::Device>& device, const char* what) {
  if (!device.get())
    throw std::runtime_error(std::string(what) +
                             ": this store has no device (its tables are all 'cpu'; a store has a device when it "
                             "has a gpu, cached, offload or hybrid table)");
}

}  // namespace

StreamArg parse_stream(py::handle stream) {
  StreamArg arg;
  if (stream.is_none()) return arg;
  arg.given = true;
  if (py::isinstance<PyStream>(stream)) {
    arg.view = stream.cast<PyStream&>().view();
    return arg;
  }
  py::object handle = py::reinterpret_borrow<py::object>(stream);
  for (const char* attr : {"cuda_stream", "ptr"})  // torch.cuda.Stream, cupy.cuda.Stream
    if (!py::isinstance<py::int_>(handle) && py::hasattr(handle, attr)) handle = handle.attr(attr);
  if (!py::isinstance<py::int_>(handle) || py::isinstance<py::bool_>(handle))
    throw py::type_error("stream is a " + type_name(stream) +
                         " (expected None, a strata Stream (Store.stream()), a CUDA stream handle as an int "
                         "(torch.cuda.current_stream().cuda_stream) or a torch.cuda.Stream)");
  const py::int_ v = handle.cast<py::int_>();
  if (v < py::int_(0) || v > py::int_(UINTPTR_MAX))
    throw py::value_error("stream " + py::repr(v).cast<std::string>() +
                          " (expected a CUDA stream handle: an int from 0 to 2^64 - 1)");
  arg.native = true;
  arg.handle = v.cast<std::uintptr_t>();
  return arg;
}

Result<gpu::StreamView> resolve_stream(gpu::Device& device, const StreamArg& arg, gpu::Stream& holder,
                                       const std::string& who) {
  if (!arg.native) return arg.view;
  Result<gpu::Stream> s = device.wrap_stream(reinterpret_cast<void*>(arg.handle));
  if (!s) return s.status().with_context(who + ": stream=" + hex(arg.handle));
  holder = std::move(s).value();
  return holder.view();
}

PyStream::~PyStream() { release_device(device_, stream_); }

py::object make_stream(const std::shared_ptr<gpu::Device>& device) {
  require_device(device, "Store.stream()");
  Result<gpu::Stream> s = device->create_stream();
  throw_if_error(s.status());
  return py::cast(PyStream(device, std::move(s).value()));
}

py::object make_device_array(const std::shared_ptr<gpu::Device>& device, std::int64_t rows, std::int64_t cols) {
  require_device(device, "Store.device_array()");
  if (rows < 0 || cols < 0)
    throw py::value_error("Store.device_array: shape (" + std::to_string(rows) + ", " + std::to_string(cols) +
                          ") (expected (rows, cols) >= 0)");
  Result<gpu::DeviceBuffer> b = device->allocate(static_cast<std::size_t>(rows * cols) * sizeof(float));
  throw_if_error(b.status());
  return py::cast(PyDeviceArray(device, std::move(b).value(), rows, cols));
}

py::object device_info(const gpu::Device* device) {
  if (!device) return py::none();
  const gpu::DeviceInfo& i = device->info();
  py::dict d;
  d["backend"] = gpu::to_string(i.backend);
  d["name"] = i.name;
  d["ordinal"] = i.ordinal;
  d["capacity"] = i.capacity;
  return d;
}

void register_device_types(py::module_& m) {
  py::class_<PyStream>(m, "Stream", R"(A stream of a store's device (Store.stream()), for stream= of forward and
backward and of DeviceArray's copies. Work on it runs in order; destroying it waits for its work.)")
      .def(
          "synchronize",
          [](PyStream& s) {
            Status st;
            {
              py::gil_scoped_release nogil;
              st = s.view().device()->synchronize(s.view());
            }
            throw_if_error(st);
          },
          "Blocks until the work queued on the stream so far ran; raises the device's error, if any.");
  py::class_<PyDeviceArray>(m, "DeviceArray",
                            R"(A float32 (rows, cols) C-contiguous array in the memory of a store's device
(Store.device_array()), exposing __cuda_array_interface__ (version 3). On the emulated device the
pointer is an emu device address that nothing may dereference on the host: copy with copy_from and
to_numpy, which go through the device.)")
      .def_property_readonly("__cuda_array_interface__", &PyDeviceArray::interface)
      .def_property_readonly("shape", &PyDeviceArray::shape)
      .def_property_readonly("ptr", &PyDeviceArray::ptr)
      .def("copy_from", &PyDeviceArray::copy_from, py::arg("source"), py::arg("stream") = py::none(),
           "Copies a float32 array of the same shape (NumPy or CPU tensor) into device memory, on `stream` after "
           "the work queued there (default: the device's default stream), and waits for the copy.")
      .def("to_numpy", &PyDeviceArray::to_numpy, py::arg("stream") = py::none(),
           "A NumPy copy, read on `stream` after the work queued there (default: the device's default stream; "
           "give the stream a stream-ordered forward wrote on, or synchronize it first).");
}

}  // namespace strata::python
