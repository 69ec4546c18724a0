"""The byte mover under a Strata world over a ``torch.distributed`` ProcessGroup (internal).

``strata.Store(config, process_group=pg)`` makes this process one rank of a world over ``pg``: the
C++ ``TransportCommunicator`` (dispatch/transport_communicator.hpp) does everything a Strata
communicator promises (argument checks, the header all-gather that keeps the ranks in step, the
verdicts, the counters, device staging) and moves its bytes through a C++ ``Transport``
(python/src/process_group.hpp), which calls the :class:`ProcessGroupTransport` below with the GIL
taken, on the thread of the Strata call. This object only moves bytes; it judges nothing.

The protocol with the C++ side (python/src/process_group.cpp):

* ``rank``, ``size``, ``local_rank``, ``device``, ``cuda_device``, ``backend``: fixed for the object's
  life.
* ``host_stage(send_bytes, recv_bytes)`` -> ``(send_ptr, recv_ptr)``: the addresses of this
  object's own uint8 CPU tensors of at least that many bytes (grown 2x, never shrunk), valid until
  the next ``host_stage`` call. The C++ side writes the send bytes there before an operation and
  reads the received bytes after it returned.
* ``all_gather(nbytes)``, ``all_to_all(send_splits, recv_splits)``, ``broadcast(nbytes, root)``:
  one operation on the stage, then a wait for it up to the timeout (:func:`_wait`: it polls, so
  that Ctrl-C interrupts it). Each returns None when done, or a pair
  ``(kind, text)`` when it failed: kind ``"timeout"`` or ``"peer_left"`` (the C++ side makes them
  kUnavailable) or ``"error"`` (kInternal). KeyboardInterrupt and SystemExit are not caught here:
  the C++ side keeps them and raises them again when the Strata call returns.

Torch ops (the Python ProcessGroup API, the same from torch 1.13 to 2.x; ranks are the group's):
all_gather is ``pg.allgather([[views]], [send])`` (gloo in 1.13 has no ``_allgather_base``),
all_to_all ``pg.alltoall_base(recv, send, recv_splits, send_splits)`` on uint8 tensors, broadcast
``pg.broadcast([t], BroadcastOptions(rootRank=root))``. Host bytes travel in CPU tensors for a group
with a CPU backend (gloo, ``cpu:gloo,cuda:nccl``, mpi, ...); a pure NCCL group gets them copied
through a tensor on this rank's GPU (``torch.cuda.current_device()``).

Device buffers (the direct path): a group that has NCCL (``nccl``, or a mixed
``cpu:gloo,cuda:nccl`` whose CUDA tensors go to NCCL) takes CUDA buffers of its own GPU
(``cuda_device``, ``torch.cuda.current_device()`` when the object is made): the C++ side then
calls ``all_gather_device(nbytes, send_ptr, recv_ptr)``, ``all_to_all_device(send_splits,
recv_splits, send_ptr, recv_ptr)`` and ``broadcast_device(nbytes, root, ptr)`` with the caller's
device pointers (already ready: the communicator waited for the caller's stream), which are
wrapped as CUDA uint8 tensors (:class:`_CudaBytes`, a ``__cuda_array_interface__`` given to
``torch.as_tensor``: no copy), moved by the collective, waited for, and then torch's current stream
of that device is synchronized, so the received bytes are in place when the call returns. Rows and
gradients then stay on the GPU: only keys and plan metadata cross PCIe. The C++ side stages every
other device buffer through host memory: CUDA buffers of another GPU or of a group without NCCL
(gloo), and the emulated device's always, because its device addresses are tagged so that host
code (gloo's threads included) cannot dereference them (gpu/detail/emu_device.cpp: only the emu
backend's own stream work sees through the tag). The CUDA path cannot run without a GPU and a torch
with NCCL (CI has neither): it is kept small and checked by the tests only as far as a CPU allows
(which groups take device buffers, the array interface it builds).

An operation abandoned at its timeout (or interrupted) may still be running in the process group:
its tensors are kept in ``_pending`` (never the caller's memory for a host operation; a device
operation's are the caller's CUDA buffers, which an abandoned NCCL operation may still write, as
with the ``nccl`` communicator, until torch's NCCL watchdog aborts it), and the world is broken from
then on (the C++ communicator never calls this object again).

The tensors given to the group outlive every operation: a tensor that Python drops while a worker
thread of the group (gloo's) still holds its operation is released last by that thread, which must
then take the GIL; if the interpreter is finalizing by then, CPython ends the thread inside
``~TensorImpl`` (noexcept) and the process aborts ("terminate called without an active
exception"). So each completed operation's Work and tensors stay in a module-level ring of the last
``_KEEP`` operations (evicted only by later ones, long after the worker let go), an abandoned
operation's are never freed (``_pending``, moved to ``_abandoned`` when the object goes), and
neither container is freed at exit.
"""

import collections
import ctypes
import datetime
import math
import numbers
import os
import re

__all__ = ["ProcessGroupTransport", "agree_values", "make_transport", "timeout_of"]

_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_PEER_LEFT = re.compile(r"connection (closed|reset) by peer|broken pipe|connection refused", re.IGNORECASE)
_MS = re.compile(r"(\d+)\s*ms")


# The tensors given to a process group outlive the operation (see the module's doc): the last _KEEP
# operations of every transport (and agree_values), evicted by later ones once long complete, and
# every operation abandoned at a failure, freed never. Both containers are leaked on purpose (an
# extra reference), so that not even the module's teardown at interpreter exit frees them.
_KEEP = 8
_recent = collections.deque(maxlen=_KEEP)  # (work, tensors) of the last completed operations
_abandoned = []  # (work, tensors) of the operations of closed transports abandoned at a failure
for _kept in (_recent, _abandoned):
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_kept))
del _kept


def _keep(work, tensors):
    """Keeps a completed operation's ``work`` and ``tensors`` until _KEEP later operations evicted it."""
    _recent.append((work, tensors))


_MIN_TIMEOUT = datetime.timedelta(milliseconds=1)
_MAX_TIMEOUT = datetime.timedelta(days=365)


def timeout_of(timeout):
    """``timeout`` (None: torch.distributed's default_pg_timeout; seconds as an int or float, or a
    datetime.timedelta, from 1 ms to 365 days) as a timedelta; TypeError or ValueError naming it
    otherwise (under 1 ms torch would read as no timeout at all)."""
    if timeout is None:
        import torch.distributed as dist
        return dist.default_pg_timeout
    expected = (f"expected seconds from {_MIN_TIMEOUT.total_seconds():g} to {_MAX_TIMEOUT.total_seconds():.0f} "
                "(365 days), or a datetime.timedelta in that range")
    if isinstance(timeout, datetime.timedelta):
        if not _MIN_TIMEOUT <= timeout <= _MAX_TIMEOUT:
            raise ValueError(f"timeout {timeout!r} ({expected})")
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout is a {type(timeout).__name__} (expected None, seconds as an int or float, or a "
                        "datetime.timedelta)")
    try:
        seconds = float(timeout)
    except OverflowError:  # an int no double holds
        seconds = math.inf
    if not _MIN_TIMEOUT.total_seconds() <= seconds <= _MAX_TIMEOUT.total_seconds():  # NaN included
        raise ValueError(f"timeout {timeout!r} ({expected})")
    return datetime.timedelta(seconds=seconds)


def _wait(work, timeout):
    """Waits for ``work`` (a torch Work) up to ``timeout`` (a timedelta), raising its own error if it
    failed, TimeoutError if it did not complete in time. It polls ``is_completed`` between short
    sleeps (50 us growing to 1 ms: a completion is noticed at most 1 ms late) rather than blocking in ``Work.wait``, so that a signal (Ctrl-C:
    KeyboardInterrupt) interrupts the wait for a peer that does not arrive."""
    import time
    deadline = time.monotonic() + timeout.total_seconds()
    delay = 5e-5
    while not work.is_completed():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the operation did not complete within the timeout")
        time.sleep(min(delay, left))
        delay = min(2 * delay, 0.001)
    work.wait()  # completed: returns, or raises the operation's error


def _process_group_types():
    """The classes a process group may be: torch.distributed.ProcessGroup, and from torch 2.0 the
    C++ backends (ProcessGroupGloo(store, rank, size) is one), which have the same operations. ()
    without torch.distributed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return ()
    if not dist.is_available():
        return ()
    from torch._C import _distributed_c10d as c10d
    backend = getattr(c10d, "Backend", None)  # torch >= 2.0 (dist.Backend is the names' enum)
    return (dist.ProcessGroup,) + ((backend,) if isinstance(backend, type) and backend is not dist.Backend else ())


def make_transport(process_group, timeout):
    """A :class:`ProcessGroupTransport` over ``process_group`` (a torch.distributed.ProcessGroup:
    anything else is a TypeError) with ``timeout`` (see :func:`timeout_of`)."""
    pg_types = _process_group_types()
    if not pg_types or not isinstance(process_group, pg_types):
        raise TypeError(f"process_group is a {type(process_group).__name__} (expected None or a "
                        "torch.distributed.ProcessGroup, e.g. torch.distributed.group.WORLD after "
                        "init_process_group" + ("" if pg_types else "; torch.distributed is not available")
                        + ")")
    return ProcessGroupTransport(process_group, timeout_of(timeout))


def _wire_device(backend):
    """The device whose tensors a group of ``backend`` moves host bytes in: None (CPU tensors) for
    a group with a CPU backend, this rank's GPU for a pure NCCL group."""
    nccl_only = "nccl" in backend and "gloo" not in backend and "mpi" not in backend
    if not nccl_only:
        return None
    import torch
    return torch.device("cuda", torch.cuda.current_device())


def _direct_cuda_device(backend):
    """The CUDA ordinal whose buffers a group of ``backend`` moves in place (``nccl``, or a mixed
    group such as ``cpu:gloo,cuda:nccl`` whose CUDA tensors go to NCCL): this rank's current GPU;
    -1 for a group without NCCL (gloo, mpi), whose device buffers the C++ side stages."""
    if "nccl" not in backend:
        return -1
    import torch
    return int(torch.cuda.current_device())


class _CudaBytes:
    """``nbytes`` bytes of CUDA memory at ``ptr`` as an object with a ``__cuda_array_interface__``
    (version 2: no stream, the caller's stream was synchronized before), which ``torch.as_tensor``
    wraps as a uint8 tensor without copying, from torch 1.13 to 2.x. Read-only when ``readonly``."""

    def __init__(self, ptr, nbytes, readonly=False):
        self.__cuda_array_interface__ = {"shape": (int(nbytes),), "typestr": "|u1",
                                         "data": (int(ptr), bool(readonly)), "version": 2, "strides": None}


def _failure(what, e, timeout_ms, backend):
    """(kind, text) of an exception that a torch operation ``what`` raised (see the module's doc)."""
    text = " ".join(str(e).split()) or type(e).__name__
    if len(text) > 400:
        text = text[:400] + "..."
    if _PEER_LEFT.search(text):
        return "peer_left", f"a peer left the process group (its process exited or was killed): torch {what}: {text}"
    if _TIMED_OUT.search(text):
        m = _MS.search(text)
        ms = int(m.group(1)) if m and "waiting" in text else timeout_ms
        return "timeout", (f"timed out after {ms} ms (the process group does not say which ranks did not arrive; "
                           f"torch {what}: {text})")
    return "error", f"torch {what} on the {backend} process group failed: {type(e).__name__}: {text}"


def agree_values(process_group, values, timeout):
    """Every rank's ``values`` (a list of ints that int64 holds, of the same length on every rank),
    in rank order: one all-gather on ``process_group`` itself, outside the Strata store (a
    collective like the trainer's own: every rank must call it at the same point). Used by
    EmbeddingBagCollection.load_state_dict so that a state_dict refused on one rank, or whose step
    or rates differ between ranks, is refused on every rank before any of them writes.
    RuntimeError as a store call's ("timed out after N ms", "a peer left the process group") when
    the group fails."""
    import torch
    timeout = timeout_of(timeout)
    backend = _backend_of(process_group)
    device = _wire_device(backend) or torch.device("cpu")
    mine = torch.tensor([int(v) for v in values], dtype=torch.int64, device=device)
    out = [torch.zeros_like(mine) for _ in range(process_group.size())]
    work = None
    try:
        work = process_group.allgather([out], [mine])
        _wait(work, timeout)
        _keep(work, (mine, out))
    except BaseException as e:
        _abandoned.append((work, (mine, out)))  # the group may still hold them: never freed
        if not isinstance(e, Exception):
            raise
        raise RuntimeError(_failure("allgather", e, int(timeout.total_seconds() * 1000), backend)[1]) from None
    return [[int(v) for v in t.tolist()] for t in out]


def _backend_of(pg):
    import torch.distributed as dist
    try:
        return str(dist.get_backend(pg))
    except Exception:  # a group that torch.distributed did not create (ProcessGroupGloo(...) itself)
        name = getattr(pg, "name", None)
        return str(name()).lower() if callable(name) else "unknown"


class ProcessGroupTransport:
    """Moves bytes over a ProcessGroup for the C++ TransportCommunicator (see the module's doc)."""

    def __init__(self, pg, timeout):
        import torch
        import torch.distributed as dist
        self._torch = torch
        self._dist = dist
        self.pg = pg
        self.timeout = timeout
        self.timeout_ms = int(timeout.total_seconds() * 1000)
        self.rank = int(pg.rank())
        self.size = int(pg.size())
        self.backend = _backend_of(pg)
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        # A pure NCCL group moves only CUDA tensors: host bytes go through this rank's GPU.
        self._wire = _wire_device(self.backend)
        self.device = -1 if self._wire is None else self._wire.index
        # The GPU whose buffers the device operations below take (-1: none, the C++ side stages).
        self.cuda_device = _direct_cuda_device(self.backend)
        self._send = torch.empty(0, dtype=torch.uint8)
        self._recv = torch.empty(0, dtype=torch.uint8)
        self._pending = []  # (work, tensors) of operations abandoned at a failure
        self.broken = None  # the first failure's text

    # ---- memory ----
    def _grown(self, t, n):
        if t.numel() >= n:
            return t
        return self._torch.empty(max(n, 2 * t.numel()), dtype=self._torch.uint8)

    def host_stage(self, send_bytes, recv_bytes):
        self._send = self._grown(self._send, send_bytes)
        self._recv = self._grown(self._recv, recv_bytes)
        return (self._send.data_ptr() if send_bytes else 0, self._recv.data_ptr() if recv_bytes else 0)

    def _on_wire(self, t):
        """The tensor the process group moves for host tensor ``t`` (itself, or a copy on the GPU)."""
        return t if self._wire is None else t.to(self._wire)

    # ---- operations ----
    def _run(self, what, start, tensors, copy_back=()):
        """Starts an operation (``start()`` returns its Work), waits for it up to the timeout and
        copies ``copy_back`` pairs (host, wire) back; None, or (kind, text) on failure."""
        work = None
        try:
            work = start()
            _wait(work, self.timeout)
            _keep(work, tensors)
            for host, wire in copy_back:
                if host is not wire:
                    host.copy_(wire)
            return None
        except Exception as e:
            self._pending.append((work, tensors))
            return self._failure(what, e)
        except BaseException:  # KeyboardInterrupt and SystemExit go up to the C++ side
            self._pending.append((work, tensors))
            self.broken = self.broken or f"torch {what} was interrupted"
            raise

    def __del__(self):
        # The group may still hold the tensors of an abandoned operation: never freed.
        _abandoned.extend(getattr(self, "_pending", ()))

    def _failure(self, what, e):
        kind, message = _failure(what, e, self.timeout_ms, self.backend)
        self.broken = self.broken or message
        return kind, message

    def all_gather(self, nbytes):
        send = self._on_wire(self._send[:nbytes])
        recv_host = self._recv[:nbytes * self.size]
        recv = self._on_wire(recv_host) if self._wire is not None else recv_host
        start, tensors = self._all_gather_op(send, recv, nbytes)
        return self._run("allgather", start, tensors, ((recv_host, recv),))

    def all_to_all(self, send_splits, recv_splits):
        send_splits = [int(s) for s in send_splits]
        recv_splits = [int(s) for s in recv_splits]
        send = self._on_wire(self._send[:sum(send_splits)])
        recv_host = self._recv[:sum(recv_splits)]
        recv = self._on_wire(recv_host) if self._wire is not None else recv_host
        start, tensors = self._all_to_all_op(send, recv, send_splits, recv_splits)
        return self._run("alltoall_base", start, tensors, ((recv_host, recv),))

    def broadcast(self, nbytes, root):
        host = self._send[:nbytes] if self.rank == root else self._recv[:nbytes]
        t = self._on_wire(host)
        back = () if self.rank == root else ((host, t),)
        start, tensors = self._broadcast_op(t, root)
        return self._run("broadcast", start, tensors, back)

    # The group's operation on tensors (host or device): (start, the tensors it uses).
    def _all_gather_op(self, send, recv, nbytes):
        views = [recv[r * nbytes:(r + 1) * nbytes] for r in range(self.size)]
        return (lambda: self.pg.allgather([views], [send])), (send, recv, views)

    def _all_to_all_op(self, send, recv, send_splits, recv_splits):
        opts = self._dist.AllToAllOptions()
        return (lambda: self.pg.alltoall_base(recv, send, recv_splits, send_splits, opts)), (send, recv)

    def _broadcast_op(self, t, root):
        opts = self._dist.BroadcastOptions()
        opts.rootRank = root
        return (lambda: self.pg.broadcast([t], opts)), (t,)

    # ---- device operations (the direct path; CUDA with NCCL only, see the module's doc) ----
    def _cuda(self, ptr, nbytes, readonly=False):
        """The caller's device bytes at ``ptr`` as a CUDA uint8 tensor of this object's GPU (no copy)."""
        torch = self._torch
        device = torch.device("cuda", self.cuda_device)
        if nbytes == 0 or ptr == 0:
            return torch.empty(0, dtype=torch.uint8, device=device)
        return torch.as_tensor(_CudaBytes(ptr, nbytes, readonly), device=device)

    def _run_device(self, what, start, tensors):
        """``_run`` for the device operations: after the collective completed, torch's current stream
        of the GPU is synchronized (the received bytes are in place when this returns)."""
        failed = self._run(what, start, tensors)
        if failed is None:
            self._torch.cuda.current_stream(self.cuda_device).synchronize()
        return failed

    def all_gather_device(self, nbytes, send_ptr, recv_ptr):
        send = self._cuda(send_ptr, nbytes, readonly=True)
        recv = self._cuda(recv_ptr, nbytes * self.size)
        return self._run_device("allgather", *self._all_gather_op(send, recv, nbytes))

    def all_to_all_device(self, send_splits, recv_splits, send_ptr, recv_ptr):
        send_splits = [int(s) for s in send_splits]
        recv_splits = [int(s) for s in recv_splits]
        send = self._cuda(send_ptr, sum(send_splits), readonly=True)
        recv = self._cuda(recv_ptr, sum(recv_splits))
        return self._run_device("alltoall_base", *self._all_to_all_op(send, recv, send_splits, recv_splits))

    def broadcast_device(self, nbytes, root, ptr):
        t = self._cuda(ptr, nbytes)
        return self._run_device("broadcast", *self._broadcast_op(t, root))
