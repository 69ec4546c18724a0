#include "python/src/process_group.hpp"

#include <Python.h>

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "gpu/device.hpp"

namespace strata::python {

bool finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

namespace {

Status shutting_down() { return Status::failed_precondition("the interpreter is shutting down"); }

class PyTransport final : public dispatch::Transport {
 public:
  PyTransport(py::object impl, std::shared_ptr<Interrupt> interrupt)
      : impl_(std::move(impl)),
        interrupt_(std::move(interrupt)),
        rank_(impl_.attr("rank").cast<int>()),
        size_(impl_.attr("size").cast<int>()),
        local_rank_(impl_.attr("local_rank").cast<int>()),
        device_(impl_.attr("device").cast<int>()),
        cuda_device_(impl_.attr("cuda_device").cast<int>()),
        timeout_(impl_.attr("timeout_ms").cast<std::int64_t>()) {}

  ~PyTransport() override {
    if (finalizing()) {
      impl_.release();  // the interpreter is going: leave the object to it
      return;
    }
    try {
      py::gil_scoped_acquire gil;
      impl_ = py::object();
    } catch (...) {  // a destructor reports nothing
    }
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  int local_rank() const noexcept override { return local_rank_; }
  int device() const noexcept override { return device_; }
  std::chrono::milliseconds timeout() const noexcept override { return timeout_; }
  const char* kind() const noexcept override { return "torch"; }
  // CUDA buffers of the group's NCCL GPU go to NCCL in place; every other device space (emu: its
  // tagged addresses are not host memory; CUDA without NCCL or of another GPU) is staged.
  bool takes_device(const dispatch::BufferSpace& space) const noexcept override {
    return cuda_device_ >= 0 && space.on_device() && space.device->info().backend == gpu::Backend::kCuda &&
           space.device->info().ordinal == cuda_device_;
  }

  Result<dispatch::HostStage> host_stage(std::int64_t send_bytes, std::int64_t recv_bytes) override {
    dispatch::HostStage stage;
    Status s = run("host_stage", [&] {
      py::tuple ptrs = impl_.attr("host_stage")(send_bytes, recv_bytes);
      stage.send = reinterpret_cast<void*>(ptrs[0].cast<std::uintptr_t>());
      stage.recv = reinterpret_cast<void*>(ptrs[1].cast<std::uintptr_t>());
      return Status::ok();
    });
    if (!s.is_ok()) {
      if (s.code() == StatusCode::kInternal && s.message() != "interrupted")
        return Status::resource_exhausted(s.message());
      return s;
    }
    return stage;
  }

  Status all_gather(std::int64_t bytes, const dispatch::DeviceBuffers* dev) override {
    if (dev) {
      return run("all_gather", [&] {
        return verdict(impl_.attr("all_gather_device")(bytes, address(dev->send), address(dev->recv)));
      });
    }
    return run("all_gather", [&] { return verdict(impl_.attr("all_gather")(bytes)); });
  }

  Status all_to_all(const std::int64_t* send_splits, const std::int64_t* recv_splits,
                    const dispatch::DeviceBuffers* dev) override {
    return run("all_to_all", [&] {
      py::list send, recv;
      for (int r = 0; r < size_; ++r) {
        send.append(send_splits[r]);
        recv.append(recv_splits[r]);
      }
      if (dev) {
        return verdict(impl_.attr("all_to_all_device")(send, recv, address(dev->send), address(dev->recv)));
      }
      return verdict(impl_.attr("all_to_all")(send, recv));
    });
  }

  Status broadcast(std::int64_t bytes, int root, const dispatch::DeviceBuffers* dev) override {
    if (dev) {
      return run("broadcast", [&] { return verdict(impl_.attr("broadcast_device")(bytes, root, address(dev->recv))); });
    }
    return run("broadcast", [&] { return verdict(impl_.attr("broadcast")(bytes, root)); });
  }

 private:
  static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  // The Python object's answer: None, or (kind, text).
  static Status verdict(const py::object& r) {
    if (r.is_none()) return Status::ok();
    py::tuple t = r;
    const std::string kind = t[0].cast<std::string>(), text = t[1].cast<std::string>();
    if (kind == "timeout" || kind == "peer_left") return Status::unavailable(text);
    return Status::internal(text);
  }

  // `f` with the GIL held; a Python exception becomes a Status (an interrupt is kept in interrupt_).
  template <typename F>
  Status run(const char* op, F&& f) {
    if (finalizing()) return shutting_down();
    py::gil_scoped_acquire gil;
    try {
      return f();
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) {
        if (!interrupt_->error) interrupt_->error = std::current_exception();
        return Status::internal("interrupted");
      }
      return Status::internal(std::string("the torch transport's ") + op + " raised " + e.what());
    } catch (const std::exception& e) {
      return Status::internal(std::string("the torch transport's ") + op + ": " + e.what());
    }
  }

  py::object impl_;
  std::shared_ptr<Interrupt> interrupt_;
  int rank_, size_, local_rank_, device_;
  int cuda_device_;  // the GPU whose buffers takes_device() accepts (the group's NCCL), -1: none
  std::chrono::milliseconds timeout_;
};

}  // namespace

void Interrupt::raise_if_any() {
  if (!error) return;
  std::exception_ptr e = std::move(error);
  error = nullptr;
  std::rethrow_exception(e);
}

ProcessGroupWorld make_process_group_world(py::handle process_group, py::handle timeout,
                                           const std::shared_ptr<Interrupt>& interrupt) {
  py::object impl = py::module_::import("strata._process_group").attr("make_transport")(process_group, timeout);
  ProcessGroupWorld w;
  w.info["rank"] = impl.attr("rank");
  w.info["size"] = impl.attr("size");
  w.info["kind"] = "torch";
  w.info["backend"] = impl.attr("backend");
  w.transport = std::make_unique<PyTransport>(std::move(impl), interrupt);
  return w;
}

}  // namespace strata::python
