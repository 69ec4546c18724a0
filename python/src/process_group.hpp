#pragma once
// A Strata world over a torch.distributed ProcessGroup: a dispatch::Transport (the byte mover under
// dispatch::TransportCommunicator, dispatch/transport_communicator.hpp) that calls the pure-Python
// strata._process_group.ProcessGroupTransport, which drives the group's allgather, alltoall_base
// and broadcast (the Python ProcessGroup API, the same from torch 1.13 to 2.x; docs/architecture.md
// says why not c10d from C++).
//
// Threads and the GIL: the communicator calls its Transport on the thread of the Strata call, which
// released the GIL before it took the store's mutex (module.cpp: PyStore::call); each operation
// takes the GIL again for its Python call (torch's Work.wait drops it while blocked), so the order
// is always store mutex -> GIL. Once the interpreter is finalizing, every operation fails at once
// ("the interpreter is shutting down") without touching Python: a store destroyed at exit discards
// its batches without a collective.
//
// Errors: the Python object reports a timeout or a peer that left (kUnavailable: "timed out after N
// ms ...", "a peer left the process group ..."), anything else kInternal. A KeyboardInterrupt or
// SystemExit raised inside an operation is kept in the Interrupt shared with the store
// (kInternal "interrupted") and raised again by the Strata call once it returned (raise_if_any).
// host memory: the Python object's uint8 CPU tensors (grown 2x, kept alive by it).
//
// Device buffers: takes_device() is true for CUDA buffers of the group's NCCL GPU (a group whose
// backend has nccl: "nccl" or "cpu:gloo,cuda:nccl"; the object's cuda_device, torch's current
// device when it was made), which the Python side wraps as CUDA tensors in place and moves with
// NCCL (synchronizing torch's current stream before it returns); so rows and gradients of a `gpu`
// store with device views stay on the GPU. Every other device space is staged through host memory
// by the communicator: the emulated device's always (its addresses are tagged, so host code,
// gloo's threads included, cannot dereference them: gpu/detail/emu_device.cpp), CUDA buffers over
// gloo or of another GPU. The CUDA path needs a GPU and a torch with NCCL: CI runs neither.

#include <pybind11/pybind11.h>

#include <exception>
#include <memory>
#include <string>

#include "dispatch/transport_communicator.hpp"

namespace strata::python {

namespace py = pybind11;

/// A KeyboardInterrupt or SystemExit caught inside a transport operation, to be raised again by the
/// Python call that ran it. Touched with the GIL held only.
struct Interrupt {
  std::exception_ptr error;
  /// Raises the kept exception (and forgets it); returns when there is none.
  void raise_if_any();
};

/// True once the interpreter is finalizing: a thread that takes the GIL then may be ended by
/// CPython (pthread_exit), so destructors neither release nor take it from then on.
bool finalizing() noexcept;

/// Runs `f` with the GIL released (held by the caller), or held once the interpreter is finalizing
/// (releasing it would mean taking it back).
template <class F>
void without_gil(F&& f) {
  if (finalizing()) {
    f();
    return;
  }
  py::gil_scoped_release nogil;
  f();
}

/// What Store.world reports and the transport is made of.
struct ProcessGroupWorld {
  std::unique_ptr<dispatch::Transport> transport;
  py::dict info;  ///< {"rank", "size", "kind": "torch", "backend"}
};

/// A Transport over `process_group` (a torch.distributed.ProcessGroup; TypeError otherwise) with
/// `timeout` (None: torch's default_pg_timeout; seconds or a datetime.timedelta; TypeError or
/// ValueError otherwise). Called with the GIL held; imports torch.
ProcessGroupWorld make_process_group_world(py::handle process_group, py::handle timeout,
                                           const std::shared_ptr<Interrupt>& interrupt);

}  // namespace strata::python
