"""The Python API of a Strata world over a torch.distributed ProcessGroup (issue 33), in one process:
argument errors, a world of one (gloo over a FileStore, world_size 1) through every call, bit for
bit as a store without a group (gpu, hybrid with a small cache and cpu tables on the emu device),
Store.world, shard_info/read_shard/write_shard, the EBC's rank/world_size, state_dict keys,
process_group=False, close(). Then one quick 2-process world (this file run as a worker) whose
forward and backward match a one-rank `cpu` store trained on the concatenated batches, with a
world state_dict's keys, its round trip and a refusal on one rank that every rank reports.
The full multi-process suite is test_world.py."""

import datetime
import gc
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref

import numpy as np
import pytest
import torch
import torch.distributed as dist

import strata
import strata._process_group
import strata.torch as st

BATCH = 4
STEPS = 3


def tables_config(placement, cache_rows=4, sharding=None):
    """Three tables (sum, mean, none pooling; sgd, adagrad, rowwise_adagrad) of one placement on emu."""
    tables = []
    for i, (name, rows, dim, pooling, optimizer) in enumerate(
            [("user", 40, 8, "sum", "adagrad"), ("item", 25, 4, "mean", "sgd"), ("ctx", 12, 3, "none",
                                                                                   "rowwise_adagrad")]):
        t = {"name": name, "rows": rows, "dim": dim, "pooling": pooling, "placement": placement,
             "init": {"bound": 0.1, "seed": 1 + i},
             "optimizer": {"kind": optimizer, "learning_rate": 0.1, "eps": 1e-8}}
        if placement in ("cached", "hybrid"):
            t["cache"] = {"rows": cache_rows}
        if sharding and placement in ("gpu", "hybrid"):
            t["sharding"] = {"type": sharding[i % len(sharding)]}
        tables.append(t)
    c = {"threads": 1, "tables": tables}
    if placement != "cpu":
        c["device"] = {"backend": "emu"}
    return c


def batch_of(rng, rows=(40, 25, 12), batch=BATCH):
    out = {}
    for name, r in zip(("user", "item", "ctx"), rows):
        lengths = rng.integers(0, 4, size=batch).astype(np.int64)
        out[name] = {"keys": rng.integers(0, r, size=int(lengths.sum())).astype(np.int64), "lengths": lengths}
    return out


@pytest.fixture(scope="module")
def pg():
    """The default group: gloo over a FileStore, a world of one (no ports)."""
    fd, path = tempfile.mkstemp(prefix="strata_world_api_")
    os.close(fd)
    os.unlink(path)
    dist.init_process_group("gloo", init_method="file://" + path, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()
    if os.path.exists(path):
        os.unlink(path)


# ---- arguments ----
@pytest.mark.parametrize("bad", [3, "gloo", object(), True])
def test_a_process_group_that_is_not_one_is_a_type_error(bad):
    with pytest.raises(TypeError, match="process_group is a .* \\(expected None or a torch.distributed.ProcessGroup"):
        strata.Store(tables_config("gpu"), process_group=bad)
    with pytest.raises(TypeError, match="process_group is a"):
        st.EmbeddingBagCollection(tables_config("gpu"), process_group=bad)


def test_bad_timeouts_are_refused(pg):
    c = tables_config("gpu")
    for bad in ("10", [1], True):
        with pytest.raises(TypeError, match="timeout is a .* \\(expected None, seconds"):
            strata.Store(c, process_group=pg, timeout=bad)
    for bad in (0, -1, float("nan"), float("inf"), datetime.timedelta(0), datetime.timedelta(seconds=-1)):
        with pytest.raises(ValueError, match="timeout"):
            strata.Store(c, process_group=pg, timeout=bad)
    # Under 1 ms (torch would read it as no timeout) or beyond a year (1e300: OverflowError before).
    for bad in (0.0004, datetime.timedelta(microseconds=999), 1e300, 10 ** 400, 366 * 86400,
                datetime.timedelta(days=366)):
        with pytest.raises(ValueError, match="timeout .* \\(expected .*from 0.001 to 31536000"):
            strata.Store(c, process_group=pg, timeout=bad)
    with pytest.raises(ValueError, match="without a process_group"):
        strata.Store(c, timeout=5)
    # Accepted: seconds (int or float) and timedelta, from 1 ms to 365 days.
    for good in (5, 2.5, datetime.timedelta(seconds=3), 0.001, 365 * 86400, datetime.timedelta(days=365)):
        strata.Store(c, process_group=pg, timeout=good).close()


# ---- a world of one, bit for bit as a store without a group ----
@pytest.mark.parametrize("placement", ["gpu", "hybrid", "cpu"])
def test_world_of_one_store_is_bit_identical(pg, placement):
    c = tables_config(placement)
    alone, world = strata.Store(c), strata.Store(c, process_group=pg, timeout=30)
    assert alone.world is None
    assert world.world == {"rank": 0, "size": 1, "kind": "torch", "backend": "gloo"}
    rng = np.random.default_rng(1)
    for step in range(STEPS):
        batch = batch_of(rng)
        outs = []
        for s in (alone, world):
            s.submit(step, batch)
            outs.append(s.forward(step))
        for a, b in zip(*outs):
            np.testing.assert_array_equal(a, b)
        grads = [rng.normal(size=o.shape).astype(np.float32) for o in outs[0]]
        alone.backward(step, grads)
        world.backward(step, grads)
    for name in ("user", "item", "ctx"):
        for a, b in zip(alone.read_rows(name), world.read_rows(name)):
            np.testing.assert_array_equal(a, b)
        info = world.shard_info(name)
        assert info == world.shard_info(["user", "item", "ctx"].index(name))
        assert info["world"] == 1 and info["rank"] == 0 and info["replicas"] == [0]
        assert info["local_rows"] == info["rows"] and info["local_dim"] == info["dim"]
        w, state = world.read_shard(name, 0, info["local_rows"])
        np.testing.assert_array_equal(w, alone.read_rows(name)[0])
        np.testing.assert_array_equal(state, alone.read_rows(name)[1])
    assert world.step == alone.step == STEPS
    world.close()


def test_shard_calls_round_trip_and_refuse_bad_input(pg):
    s = strata.Store(tables_config("gpu"), process_group=pg)
    alone = strata.Store(tables_config("gpu"))
    assert alone.shard_info("user") == {"type": "replicated", "world": 1, "rank": 0, "rows": 40, "dim": 8,
                                        "local_rows": 40, "row_start": 0, "row_step": 1, "col_offset": 0,
                                        "local_dim": 8, "state_dim": 8, "replicas": [0]}  # adagrad: dim
    w = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)
    state = -np.arange(3 * 8, dtype=np.float32).reshape(3, 8)
    s.write_shard("user", 5, w, state)
    got_w, got_s = s.read_shard("user", 5, 3)
    np.testing.assert_array_equal(got_w, w)
    np.testing.assert_array_equal(got_s, state)
    s.write_shard(0, 5, w + 1)  # weights only: the state stays
    got_w, got_s = s.read_shard(0, 5, 3)
    np.testing.assert_array_equal(got_w, w + 1)
    np.testing.assert_array_equal(got_s, state)
    with pytest.raises(ValueError, match="table 7 \\(expected a table index in \\[0, 3\\)"):
        s.shard_info(7)
    with pytest.raises(ValueError, match="nope"):
        s.shard_info("nope")
    with pytest.raises(TypeError, match="table is a float"):
        s.read_shard(1.0, 0, 1)
    with pytest.raises(ValueError):
        s.read_shard("user", 39, 2)
    with pytest.raises(ValueError, match="shape"):
        s.write_shard("user", 0, np.zeros((2, 7), np.float32))
    s.close()


def test_close_then_a_call_says_store_is_closed(pg):
    for s in (strata.Store(tables_config("gpu"), process_group=pg), strata.Store(tables_config("cpu"))):
        s.submit(0, batch_of(np.random.default_rng(2)))  # a batch in flight: close discards it
        s.close()
        s.close()  # a second close does nothing
        assert repr(s) == "strata.Store(closed)"
        for call in (lambda: s.step, lambda: s.forward(0), lambda: s.shard_info("user"), lambda: s.config,
                     lambda: s.read_rows("user"), lambda: s.stats()):
            with pytest.raises(RuntimeError, match="store is closed"):
                call()


# ---- the transport's failures, as a call sees them ----
# A world of one never calls its transport (nothing crosses between ranks), so these run two ranks
# in two threads of this process: two ProcessGroupGloo over one HashStore.
def two_ranks(fn, seconds=60):
    """fn(rank, pg) on two thread ranks of a fresh gloo world; [(result, exception)] per rank."""
    store = dist.HashStore()
    out = [(None, None), (None, None)]

    def run(rank):
        try:
            pg = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=20))
            out[rank] = (fn(rank, pg), None)
        except BaseException as e:  # KeyboardInterrupt and SystemExit included: the test looks at them
            out[rank] = (None, e)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds)
    assert not any(t.is_alive() for t in threads), f"a thread rank did not finish within {seconds} s"
    return out


def test_two_thread_ranks_train(pg):
    def train(rank, pg):
        s = strata.Store(smoke_config("gpu"), process_group=pg, timeout=20)
        s.submit(0, batch_of(np.random.default_rng(rank)))
        outs = s.forward(0)
        s.backward(0, [np.ones_like(o) for o in outs])
        world, step = s.world, s.step
        s.close()
        return world, step

    got = two_ranks(train)
    assert [e for _, e in got] == [None, None], got
    assert [r for r, _ in got] == [({"rank": r, "size": 2, "kind": "torch", "backend": "gloo"}, 1) for r in (0, 1)]


def test_a_world_store_closed_while_a_device_array_and_stream_live():
    """close() of a world's store discards its batches in flight (a collective) and lets go of the
    store; a DeviceArray and a Stream it made keep the device until they go, without a collective."""
    def run(rank, pg):
        s = strata.Store(smoke_config("gpu"), process_group=pg, timeout=20)
        a, st = s.device_array((8, 8)), s.stream()
        s.submit(0, batch_of(np.random.default_rng(rank)))
        s.close()
        a.copy_from(np.full((8, 8), rank, np.float32), stream=st)
        total = float(a.to_numpy(stream=st).sum())
        del a, st
        gc.collect()
        return total

    got = two_ranks(run)
    assert got == [(0.0, None), (64.0, None)], got


def test_world_comm_collectives_on_two_thread_ranks():
    """strata._strata._WorldComm (test-only): the transport communicator's collectives by themselves."""
    def run(rank, pg):
        c = strata._strata._WorldComm(pg, 20)
        assert (c.rank, c.size) == (rank, 2)
        # all_to_all_v: rank r sends r + 1 + p bytes of value 10 * r + p to rank p (its own share too).
        send_counts = [rank + 1, rank + 2]
        send = np.concatenate([np.full(n, 10 * rank + p, np.uint8) for p, n in enumerate(send_counts)])
        recv_counts = [1 + rank, 2 + rank]
        recv = np.zeros(sum(recv_counts), np.uint8)
        c.all_to_all_v(send, send_counts, [0, send_counts[0]], recv, recv_counts, [0, recv_counts[0]])
        gathered = c.all_gather(np.array([rank, 7], np.uint8))
        data = np.array([5, 6, 7], np.uint8) if rank == 1 else np.zeros(3, np.uint8)
        c.broadcast(data, 1)
        total = np.array([1.5 * (rank + 1), -rank], np.float64)
        c.all_reduce(total, "sum")
        c.barrier()
        with pytest.raises(TypeError, match="send is a list"):
            c.all_gather([1, 2])
        return recv, gathered, data, total, c.counters()

    got = two_ranks(run)
    assert [e for _, e in got] == [None, None], got
    for rank, ((recv, gathered, data, total, counters), _) in enumerate(got):
        want = np.concatenate([np.full(p + 1 + rank, 10 * p + rank, np.uint8) for p in range(2)])
        np.testing.assert_array_equal(recv, want)
        np.testing.assert_array_equal(gathered, [0, 7, 1, 7])
        np.testing.assert_array_equal(data, [5, 6, 7])
        np.testing.assert_array_equal(total, [4.5, -1.0])
        assert counters["calls"] == 5 and counters["sent_bytes"] > 0 and counters["received_bytes"] > 0


# ---- the direct device path (CUDA with NCCL; CI has neither, so only what a CPU can check) ----
@pytest.mark.parametrize("backend, direct", [("gloo", False), ("mpi", False), ("nccl", True),
                                             ("cpu:gloo,cuda:nccl", True)])
def test_only_a_group_with_nccl_takes_device_buffers(monkeypatch, backend, direct):
    """The GPU whose buffers the transport moves in place: torch's current device for a group with
    NCCL, none (-1: the C++ side stages them, the emu device's always) for gloo or mpi."""
    from strata._process_group import _direct_cuda_device
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _direct_cuda_device(backend) == (3 if direct else -1)


def test_a_gloo_world_transport_takes_no_device_buffers():
    got = two_ranks(lambda rank, pg: strata._process_group.make_transport(pg, 20).cuda_device)
    assert got == [(-1, None), (-1, None)]


def test_cuda_bytes_is_a_uint8_cuda_array_interface_without_a_stream():
    from strata._process_group import _CudaBytes
    assert _CudaBytes(0x7f0000001000, 96, readonly=True).__cuda_array_interface__ == {
        "shape": (96,), "typestr": "|u1", "data": (0x7f0000001000, True), "version": 2, "strides": None}
    assert _CudaBytes(4096, 5).__cuda_array_interface__["data"] == (4096, False)


def test_device_operations_move_the_callers_bytes_in_place(monkeypatch):
    """all_gather_device, all_to_all_device and broadcast_device on two gloo thread ranks, with the
    caller's memory wrapped as CPU tensors instead of CUDA ones (the only part a CPU cannot run):
    the bytes land in the caller's buffers in rank order, and torch's current stream of the GPU is
    synchronized once after each operation that succeeded."""
    import ctypes
    from strata._process_group import ProcessGroupTransport

    def as_cpu(self, ptr, nbytes, readonly=False):
        if nbytes == 0 or ptr == 0:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)

    synced = []

    class Stream:
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            synced.append(self.device)

    monkeypatch.setattr(ProcessGroupTransport, "_cuda", as_cpu)
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)

    def run(rank, pg):
        t = strata._process_group.make_transport(pg, 20)
        t.cuda_device = 5  # as a group with NCCL would have it
        gather_send = np.array([rank, 7, 9], np.uint8)
        gathered = np.zeros(6, np.uint8)
        assert t.all_gather_device(3, gather_send.ctypes.data, gathered.ctypes.data) is None
        # rank r sends r + 1 + p bytes of value 10 * r + p to rank p, its own share included.
        send_splits = [rank + 1, rank + 2]
        send = np.concatenate([np.full(n, 10 * rank + p, np.uint8) for p, n in enumerate(send_splits)])
        recv_splits = [1 + rank, 2 + rank]
        recv = np.zeros(sum(recv_splits), np.uint8)
        assert t.all_to_all_device(send_splits, recv_splits, send.ctypes.data, recv.ctypes.data) is None
        data = np.array([5, 6, 7, 8], np.uint8) if rank == 1 else np.zeros(4, np.uint8)
        assert t.broadcast_device(4, 1, data.ctypes.data) is None
        return gathered, recv, data

    got = two_ranks(run)
    assert [e for _, e in got] == [None, None], got
    for rank, ((gathered, recv, data), _) in enumerate(got):
        np.testing.assert_array_equal(gathered, [0, 7, 9, 1, 7, 9])
        np.testing.assert_array_equal(recv, np.concatenate([np.full(p + 1 + rank, 10 * p + rank, np.uint8)
                                                            for p in range(2)]))
        np.testing.assert_array_equal(data, [5, 6, 7, 8])
    assert synced == [5] * 6


def test_a_gpu_world_with_device_views_on_emu_gives_the_bits_of_host_arrays():
    """A `gpu` world of two on the emu device, forward and backward into device views, gives the
    outputs and rows of the same world with NumPy arrays, bit for bit. Its exchange is staged (the
    emu device's addresses are no host memory, so gloo cannot move them in place: see
    strata._process_group): its rows and gradients cross the host link, so its H2D and D2H bytes
    exceed those of a one-rank store of the same batches, which moves only keys and metadata."""
    def run(rank, pg):
        host = strata.Store(smoke_config("gpu"), process_group=pg, timeout=20)
        dev = strata.Store(smoke_config("gpu"), process_group=pg, timeout=20)
        one = strata.Store(smoke_config("gpu"))
        rng = np.random.default_rng(11 + rank)
        for step in range(STEPS):
            b = batch_of(rng)
            for s in (host, dev, one):
                s.submit(step, b)
            outs = host.forward(step)
            douts = [dev.device_array(o.shape) for o in outs]
            oouts = [one.device_array(o.shape) for o in outs]
            dev.forward(step, douts)
            one.forward(step, oouts)
            for o, d in zip(outs, douts):
                np.testing.assert_array_equal(o, d.to_numpy())
            grads = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
            dgrads, ograds = [dev.device_array(g.shape) for g in grads], [one.device_array(g.shape) for g in grads]
            for g, d, o in zip(grads, dgrads, ograds):
                d.copy_from(g)
                o.copy_from(g)
            host.backward(step, grads)
            dev.backward(step, dgrads)
            one.backward(step, ograds)
        for t in range(3):
            info = host.shard_info(t)
            np.testing.assert_array_equal(host.read_shard(t, 0, info["local_rows"])[0],
                                          dev.read_shard(t, 0, info["local_rows"])[0])
        links = [s.stats()["links"] for s in (dev, one)]
        for s in (host, dev):
            s.close()
        return [(l["h2d"], l["d2h"]) for l in links]

    got = two_ranks(run)
    assert [e for _, e in got] == [None, None], got
    for (world, one), _ in got:
        assert world[0] > one[0] and world[1] > one[1], (world, one)


def test_world_comm_all_to_all_v_checks_counts_against_the_arrays(pg):
    """_WorldComm.all_to_all_v refuses counts or displacements outside its arrays, or negative, naming
    the argument and the rank, before any byte moves (it read and wrote past them before)."""
    c = strata._strata._WorldComm(pg, 20)
    send, recv = np.arange(4, dtype=np.uint8), np.zeros(4, np.uint8)
    for args, match in [(([2], [3], [2], [0]), r"send_displs\[0\] \+ send_counts\[0\] = 5 .*send's 4 bytes"),
                        (([2], [0], [2], [1 << 22]), r"recv_displs\[0\] \+ recv_counts\[0\] = 4194306 .*recv's 4"),
                        (([-1], [0], [2], [0]), r"send_counts\[0\] = -1 \(expected >= 0\)"),
                        (([2], [0], [2], [-2]), r"recv_displs\[0\] = -2 \(expected >= 0\)")]:
        sc, sd, rc, rd = args
        with pytest.raises(ValueError, match=match):
            c.all_to_all_v(send, sc, sd, recv, rc, rd)
    assert recv.tolist() == [0, 0, 0, 0]
    c.all_to_all_v(send, [4], [0], recv, [4], [0])  # a world of one: its own bytes
    assert recv.tolist() == [0, 1, 2, 3]


def test_a_module_of_cpu_tables_in_a_world_names_process_group_false():
    got = two_ranks(lambda rank, pg: st.EmbeddingBagCollection(tables_config("cpu"), process_group=pg, timeout=20))
    for rank, (_, e) in enumerate(got):
        assert isinstance(e, ValueError), (rank, repr(e))
        assert "every table must be gpu or hybrid" in str(e), (rank, str(e))
        assert str(e).endswith("(or process_group=False for a store of this process alone)"), (rank, str(e))


def _failing_all_gather(error):
    """A ProcessGroupTransport.all_gather that fails as torch would, with `error`."""
    def all_gather(self, nbytes):
        return self._failure("allgather", error)
    return all_gather


@pytest.mark.parametrize("error, expected", [
    (RuntimeError("Operation timed out!"), "Unavailable.*timed out after 4000 ms \\(the process group does not say"),
    (RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 2500ms for recv operation to "
                  "complete"), "timed out after 2500 ms"),
    (RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:4242"),
     "Unavailable.*a peer left the process group \\(its process exited or was killed\\): torch allgather: "
     ".*Connection closed by peer"),
    (RuntimeError("[gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:4242: Connection reset by peer"),
     "a peer left the process group"),
    (ValueError("something else"), "Internal.*torch allgather on the gloo process group failed: ValueError: "
                                   "something else"),
])
def test_transport_failures_become_runtime_errors(monkeypatch, error, expected):
    from strata._process_group import ProcessGroupTransport
    monkeypatch.setattr(ProcessGroupTransport, "all_gather", _failing_all_gather(error))
    got = two_ranks(lambda rank, pg: strata.Store(tables_config("gpu"), process_group=pg, timeout=4))
    for rank, (_, e) in enumerate(got):
        assert isinstance(e, RuntimeError) and re.search(expected, str(e)), (rank, repr(e))


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_a_collective_is_raised_by_the_call(monkeypatch, interrupt):
    from strata._process_group import ProcessGroupTransport
    real = ProcessGroupTransport.all_gather

    def all_gather(self, nbytes):
        if getattr(self, "interrupt", False):
            raise interrupt
        return real(self, nbytes)

    monkeypatch.setattr(ProcessGroupTransport, "all_gather", all_gather)
    opened = threading.Barrier(2)

    def run(rank, pg):
        s = strata.Store(tables_config("gpu"), process_group=pg, timeout=20)
        opened.wait(20)
        ProcessGroupTransport.interrupt = True  # every rank's transport raises from now on
        try:
            s.set_learning_rate(0.5)
        except BaseException as e:
            first = e
        else:
            first = None
        # The world is broken since (the ranks may be out of step): the next call says why.
        try:
            s.set_learning_rate(0.5)
        except RuntimeError as e:
            second = str(e)
        else:
            second = None
        return first, second

    try:
        got = two_ranks(run)
    finally:
        ProcessGroupTransport.interrupt = False
    for rank, (r, e) in enumerate(got):
        assert e is None, (rank, repr(e))
        assert isinstance(r[0], interrupt), (rank, r)
        assert "interrupted" in (r[1] or ""), (rank, r)


def test_a_world_store_left_open_at_exit_does_not_wait_for_its_peers(tmp_path):
    """A store still open (a batch in flight) when the interpreter exits: its destruction's discard
    is a collective, which the transport refuses once the interpreter finalizes, so the process
    exits at once instead of waiting for its peers (rank 0 here waits until rank 1 has exited)."""
    script = f"""
import numpy as np, torch.distributed as dist, strata, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from test_world_api import tables_config, batch_of
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://{tmp_path / 'fs'}", rank=rank, world_size=2)
s = strata.Store(tables_config("hybrid", sharding=["row"]), process_group=dist.group.WORLD, timeout=60)
s.submit(0, batch_of(np.random.default_rng(rank)))
s.forward(0)
keep = [s]  # alive until the interpreter finalizes
print("open", flush=True)
if rank == 0:
    sys.stdin.read()  # until the parent saw rank 1 exit
"""
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r)], env=dict(os.environ, OMP_NUM_THREADS="1"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        out1, err1 = procs[1].communicate(timeout=30)
        out0, err0 = procs[0].communicate(input="", timeout=30)
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == 0 and out1.strip() == "open", (procs[1].returncode, out1, err1)
    assert procs[0].returncode == 0 and out0.strip() == "open", (procs[0].returncode, out0, err0)


def test_ctrl_c_interrupts_a_collective_waiting_for_a_peer(tmp_path):
    """Ctrl-C (SIGINT) while a collective waits for a peer that does not arrive: KeyboardInterrupt
    from the call at once, not after the timeout (the transport polls the operation)."""
    script = f"""
import os, sys, time, torch.distributed as dist, strata
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from test_world_api import tables_config
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://{tmp_path / 'fs'}", rank=rank, world_size=2)
s = strata.Store(tables_config("gpu"), process_group=dist.group.WORLD, timeout=60)
print("open", flush=True)
if rank == 1:
    sys.stdin.read()  # alive, never arrives
    os._exit(0)
t0 = time.monotonic()
try:
    s.set_learning_rate(0.5)
except BaseException as e:
    print(f"{{type(e).__name__}} after {{time.monotonic() - t0:.1f}} s", flush=True)
os._exit(0)
"""
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r)], env=dict(os.environ, OMP_NUM_THREADS="1"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "open"
        time.sleep(1)
        sent = time.monotonic()
        procs[0].send_signal(signal.SIGINT)
        line = procs[0].stdout.readline().strip()
        waited = time.monotonic() - sent
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert line.startswith("KeyboardInterrupt after") and waited < 10, (line, waited)


# ---- EmbeddingBagCollection ----
def _tensors(batch):
    return {n: {k: torch.from_numpy(v) for k, v in f.items()} for n, f in batch.items()}


@pytest.mark.parametrize("placement", ["gpu", "hybrid"])
def test_world_of_one_module_is_bit_identical(pg, placement):
    c = tables_config(placement)
    world = st.EmbeddingBagCollection(c)  # the default group is initialized: a world of one
    alone = st.EmbeddingBagCollection(c, process_group=False)
    assert world.store.world is not None and alone.store.world is None
    assert (world.rank, world.world_size, alone.rank, alone.world_size) == (0, 1, 0, 1)
    rng = np.random.default_rng(3)
    for _ in range(STEPS):
        batch = batch_of(rng)
        outs = [m(_tensors(batch)) for m in (world, alone)]
        targets = {n: torch.from_numpy(rng.normal(size=tuple(t.shape)).astype(np.float32))
                   for n, t in outs[0].to_dict().items()}
        for o in outs:
            sum(((o[n] - targets[n]) ** 2).sum() for n in o.keys()).backward()
        for n in targets:
            assert torch.equal(outs[0][n], outs[1][n]), n
    a, b = world.state_dict(), alone.state_dict()
    assert list(a) == list(b)  # today's keys exactly: no shard entries in a world of one
    assert not any(k.endswith((".shard", ".replicas")) for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    world.load_state_dict(b)
    world.close()
    with pytest.raises(RuntimeError, match="store is closed"):
        world(_tensors(batch_of(rng)))


def test_module_process_group_false_and_explicit(pg):
    c = tables_config("gpu")
    assert st.EmbeddingBagCollection(c, process_group=False).store.world is None
    m = st.EmbeddingBagCollection(c, process_group=pg, timeout=datetime.timedelta(seconds=30))
    assert m.store.world == {"rank": 0, "size": 1, "kind": "torch", "backend": "gloo"}
    m.close()
    with pytest.raises(ValueError, match="without a process_group"):
        st.EmbeddingBagCollection(c, process_group=False, timeout=3)


def test_module_default_group_without_torch_distributed_ignores_its_timeout(monkeypatch):
    """process_group=None with torch.distributed not initialized is a store of this process alone: a
    timeout (for the worlds the same script may run in) is checked, then ignored."""
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    m = st.EmbeddingBagCollection(tables_config("gpu"), timeout=60)
    assert m.store.world is None and (m.rank, m.world_size) == (0, 1)
    m.close()
    with pytest.raises(ValueError, match="timeout 0"):
        st.EmbeddingBagCollection(tables_config("gpu"), timeout=0)


def test_forward_failure_is_not_hidden_by_its_discard(pg, monkeypatch):
    """In a world the discard after a failed lookup is a collective that may fail too (a peer
    left): the lookup's error is raised, the discard's noted on it."""
    m = st.EmbeddingBagCollection(tables_config("gpu"))
    store = m.store

    class DiscardFails:
        def __getattr__(self, name):
            return getattr(store, name)

        def discard(self, batch_id):
            raise RuntimeError("a peer left the process group")

    def lookup_fails(*args):
        raise KeyError("the lookup's own error")

    monkeypatch.setattr(m, "_lookup", lookup_fails)
    m.store = DiscardFails()
    with pytest.raises(KeyError, match="the lookup's own error") as e:
        m.eval()(_tensors(batch_of(np.random.default_rng(4))))
    assert any("a peer left" in note for note in getattr(e.value, "__notes__", []))
    m.store = store
    m.close()


# ---- two processes ----
SMOKE_SHARDING = ["row", "table", "column"]


def smoke_config(placement):
    c = tables_config(placement, cache_rows=4, sharding=SMOKE_SHARDING if placement != "cpu" else None)
    c["tables"][2]["optimizer"]["kind"] = "adagrad"  # column sharding takes no rowwise_adagrad
    return c


def smoke_steps(ranks):
    """Every rank's batch and output weights W (loss = sum(out * W)) of each step, from one seed."""
    rng = np.random.default_rng(7)
    steps = []
    for _ in range(STEPS):
        per_rank = []
        for _ in range(ranks):
            b = batch_of(rng)
            dims = {"user": 8, "item": 4, "ctx": 3}
            w = {n: rng.normal(size=(len(f["keys"]) if n == "ctx" else BATCH, dims[n])).astype(np.float32)
                 for n, f in b.items()}
            per_rank.append((b, w))
        steps.append(per_rank)
    return steps


@pytest.mark.parametrize("change", ["learning_rate", "step", "step_missing", "learning_rate_missing"])
def test_a_world_load_whose_ranks_disagree_on_a_rate_or_the_step_writes_nothing(change):
    """The learning rates and the step are the world's: a state_dict whose rate or step on rank 1
    differs from rank 0's (or is missing on one rank only, strict=False) is refused on both ranks,
    naming rank 1 and the key, before any rank writes its shards."""
    def run(rank, pg):
        m = st.EmbeddingBagCollection(smoke_config("gpu"), process_group=pg, timeout=20)
        rng = np.random.default_rng(rank)

        def step():
            o = m(_tensors(batch_of(rng)))
            sum(o[n].sum() for n in o.keys()).backward()
        step()
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        step()
        before = {k: v.clone() for k, v in m.state_dict().items()}
        if rank == 1:
            if change == "learning_rate":
                sd["embedding_bags.user.learning_rate"] = torch.tensor(0.05)
            elif change == "step":
                sd["step"] = torch.tensor(7, dtype=torch.int64)
            elif change == "step_missing":
                del sd["step"]
            else:
                del sd["embedding_bags.item.learning_rate"]
        try:
            m.load_state_dict(sd, strict=False)
            err = None
        except RuntimeError as e:
            err = str(e)
        after = m.state_dict()
        unchanged = [k for k in before if torch.equal(before[k], after[k])]
        m.close()
        return err, sorted(unchanged) == sorted(before)

    key = {"learning_rate": "embedding_bags.user.learning_rate", "step": "step", "step_missing": "step",
           "learning_rate_missing": "embedding_bags.item.learning_rate"}[change]
    got = two_ranks(run)
    for rank, (res, e) in enumerate(got):
        assert e is None, got
        err, unchanged = res
        assert err is not None and f"'{key}'" in err and "rank 1" in err, (rank, err)
        assert unchanged, (rank, err)


def _load_after_the_world_broke(monkeypatch, breaking_all_gather, error):
    """Both ranks train a step, then every rank's ProcessGroupTransport.all_gather is
    ``breaking_all_gather(self, nbytes, real)`` for one store collective (set_learning_rate), which
    fails matching ``error``; load_state_dict then refuses on every rank naming the broken world and
    ``error``, before writing a shard (write_shard is local and would succeed; set_learning_rate
    would then fail)."""
    from strata._process_group import ProcessGroupTransport
    real = ProcessGroupTransport.all_gather
    monkeypatch.setattr(ProcessGroupTransport, "all_gather",
                        lambda self, n: breaking_all_gather(self, n, real) if self.breaking else real(self, n))
    monkeypatch.setattr(ProcessGroupTransport, "breaking", False, raising=False)
    ready = threading.Barrier(2)

    def run(rank, pg):
        m = st.EmbeddingBagCollection(smoke_config("gpu"), process_group=pg, timeout=20)
        rng = np.random.default_rng(rank)
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        o = m(_tensors(batch_of(rng)))
        sum(o[n].sum() for n in o.keys()).backward()
        before = {k: v.clone() for k, v in m.state_dict().items()}
        ready.wait(20)
        ProcessGroupTransport.breaking = True
        with pytest.raises(RuntimeError, match=error):
            m.set_learning_rate(0.5)
        ready.wait(20)
        ProcessGroupTransport.breaking = False
        with pytest.raises(RuntimeError) as e:
            m.load_state_dict(sd)
        weights, _ = m.store.read_shard("user", 0, 1)  # local: no collective
        return str(e.value), torch.equal(torch.from_numpy(weights), before["embedding_bags.user.weight"][:1])

    for rank, (res, e) in enumerate(two_ranks(run)):
        assert e is None, (rank, repr(e))
        err, unchanged = res
        assert "broken" in err and re.search(error, err) and "nothing was loaded" in err, (rank, err)
        assert unchanged, (rank, err)


def test_a_world_load_after_its_world_broke_writes_nothing(monkeypatch):
    """A collective of the store failed (the transport's all_gather: a timeout, on every rank): the
    world is broken, so load_state_dict refuses on every rank before writing a shard."""
    failing = _failing_all_gather(RuntimeError("Operation timed out!"))
    _load_after_the_world_broke(monkeypatch, lambda self, n, real: failing(self, n), "timed out")


def test_a_world_load_after_its_communicator_broke_writes_nothing(monkeypatch):
    """The communicator broke without a failure of the transport (every rank received a foreign
    header: a collective of the trainer's own met one of Strata's): load_state_dict refuses on
    every rank before writing a shard, naming the error."""
    def foreign(self, nbytes, real):
        failed = real(self, nbytes)
        self._recv[:nbytes * self.size].fill_(0)  # no strata header from any rank
        return failed
    _load_after_the_world_broke(monkeypatch, foreign, "sent no strata header")


def _concat(batches):
    return {n: {k: np.concatenate([b[n][k] for b in batches]) for k in ("keys", "lengths")} for n in batches[0]}


def _worker(rank, size, init_file, out):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    m = st.EmbeddingBagCollection(smoke_config("hybrid"), timeout=60)
    assert (m.rank, m.world_size) == (rank, size)
    saved = {}
    for step, per_rank in enumerate(smoke_steps(size)):
        batch, w = per_rank[rank]
        o = m(_tensors(batch))
        sum((o[n] * torch.from_numpy(w[n])).sum() for n in o.keys()).backward()
        for n in o.keys():
            saved[f"out{step}_{n}"] = o[n].detach().numpy()
    sd = m.state_dict()
    saved["keys"] = np.array(sorted(sd))
    for n in ("user", "item", "ctx"):
        saved[f"rows_{n}"] = m.store.read_rows(n)[0]  # a collective: the whole table on every rank
        saved[f"shard_{n}"] = sd[f"embedding_bags.{n}.shard"].numpy()
        saved[f"weight_{n}"] = sd[f"embedding_bags.{n}.weight"].numpy()
    m.load_state_dict(sd)  # a round trip
    m.load_state_dict({k.replace("embedding_bags.", "tables.", 1): v for k, v in sd.items()})  # the names before
    # Rank 1 is given rank 0's shard of 'user': refused there, and so on rank 0 too; nothing written.
    bad = dict(sd)
    if rank == 1:
        vec = sd["embedding_bags.user.shard"].clone()
        vec[1] = 0
        bad["embedding_bags.user.shard"] = vec
    try:
        m.load_state_dict(bad)
        saved["refusal"] = np.array("none")
    except RuntimeError as e:
        saved["refusal"] = np.array(str(e))
    after = m.state_dict()
    saved["unchanged"] = np.array(all(torch.equal(after[k], sd[k]) for k in sd))
    m.close()
    dist.destroy_process_group()
    np.savez(os.path.join(out, f"rank{rank}.npz"), **saved)


def test_two_ranks_match_a_one_rank_cpu_reference(tmp_path):
    size = 2
    init_file = str(tmp_path / "filestore")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "worker", str(r), str(size), init_file, str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(size)]
    deadline = time.monotonic() + 150
    logs, late = [], []
    for r, p in enumerate(procs):
        try:
            logs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            late.append(r)
            for q in procs:
                q.kill()
            logs.append(p.communicate()[0].decode(errors="replace"))
    assert not late, f"ranks {late} did not finish within 150 s (killed):\n" + "\n".join(logs)
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{logs[r]}"
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(size)]

    # The reference: one `cpu` store, the ranks' batches concatenated in rank order.
    ref = strata.Store(smoke_config("cpu"))
    for step, per_rank in enumerate(smoke_steps(size)):
        ref.submit(step, _concat([b for b, _ in per_rank]))
        outs = ref.forward(step)
        names = ["user", "item", "ctx"]
        start = {n: 0 for n in names}
        for r in range(size):
            for n, o in zip(names, outs):
                mine = got[r][f"out{step}_{n}"]
                np.testing.assert_allclose(mine, o[start[n]:start[n] + len(mine)], rtol=1e-4, atol=1e-5,
                                           err_msg=f"rank {r} step {step} {n}")
                start[n] += len(mine)
        ref.backward(step, [np.concatenate([per_rank[r][1][n] for r in range(size)]) for n in names])
    for n in ("user", "item", "ctx"):
        want = ref.read_rows(n)[0]
        for r in range(size):
            np.testing.assert_allclose(got[r][f"rows_{n}"], want, rtol=1e-4, atol=1e-5, err_msg=f"rank {r} {n}")
            shard = got[r][f"shard_{n}"]
            assert shard[0] == size and shard[1] == r
            if shard[2] == 2:  # row: local row i is global row rank + i * size
                np.testing.assert_allclose(got[r][f"weight_{n}"], want[r::size], rtol=1e-4, atol=1e-5)
            if shard[2] == 3:  # column
                np.testing.assert_allclose(got[r][f"weight_{n}"], want[:, shard[8]:shard[8] + shard[9]],
                                           rtol=1e-4, atol=1e-5)
    keys = list(got[0]["keys"])
    assert "embedding_bags.user.shard" in keys and "embedding_bags.user.replicas" in keys and "step" in keys
    assert "embedding_bags.item.optimizer_state" not in keys  # sgd
    r1 = str(got[1]["refusal"])
    assert "embedding_bags.user.shard: saved by rank 0 of 2 (row sharding); this module is rank 1 of 2 (row): a " \
           "shard loads only into the rank that saved it" in r1, r1
    r0 = str(got[0]["refusal"])
    assert "rank 1 of 2 refused its state_dict" in r0, r0
    assert bool(got[0]["unchanged"]) and bool(got[1]["unchanged"])


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "worker":
    _worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])


# ---- the tensors a process group holds outlive the operation (the exit abort) ----
# A tensor that Python drops while gloo's worker thread still holds its operation is released last
# by that thread, which must then take the GIL: at interpreter exit CPython ends such a thread
# inside ~TensorImpl (noexcept) and the process aborts ("terminate called without an active
# exception"). So the transport keeps every tensor it gave the group after the operation returned.
class _Recording:
    """A process group that records weak references to every tensor its operations are given."""

    def __init__(self, pg, hang=False):
        self._pg = pg
        self.hang = hang
        self.refs = []

    def _record(self, value):
        if isinstance(value, torch.Tensor):
            self.refs.append(weakref.ref(value))
        elif isinstance(value, (list, tuple)):
            for v in value:
                self._record(v)

    def __getattr__(self, name):
        real = getattr(self._pg, name)
        if name not in ("allgather", "alltoall_base", "broadcast"):
            return real

        def op(*args):
            self._record(args)
            if self.hang:
                class Never:
                    def is_completed(self):
                        return False
                return Never()
            return real(*args)
        return op


def _alive(refs):
    gc.collect()
    return [r() is not None for r in refs]


def test_the_tensors_given_to_the_group_outlive_the_operation_and_the_transport(pg):
    t = strata._process_group.make_transport(pg, 20)
    rec = _Recording(pg)
    t.pg = rec
    t.host_stage(8, 8)
    assert t.all_gather(8) is None
    assert t.all_to_all([8], [8]) is None
    assert t.broadcast(8, 0) is None
    assert rec.refs and all(_alive(rec.refs)), _alive(rec.refs)
    del t
    assert all(_alive(rec.refs)), "a closed transport freed the tensors of its last operations"


def test_the_tensors_of_an_abandoned_operation_are_never_freed(pg):
    t = strata._process_group.make_transport(pg, 0.01)
    rec = _Recording(pg, hang=True)
    t.pg = rec
    t.host_stage(8, 8)
    kind, _ = t.all_gather(8)
    assert kind == "timeout"
    assert rec.refs and all(_alive(rec.refs))
    del t
    assert all(_alive(rec.refs)), "a closed transport freed the tensors of an operation the group still holds"


def test_a_world_load_whose_check_raises_on_one_rank_is_refused_on_every_rank():
    """A check of load_state_dict raising on rank 1 (before the agreement) is agreed on as a
    refusal: rank 1 raises it, rank 0 refuses naming rank 1 at once (not at the timeout), and
    neither writes."""
    def run(rank, pg):
        m = st.EmbeddingBagCollection(smoke_config("gpu"), process_group=pg, timeout=30)
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        if rank == 1:
            def boom(*args):
                raise ValueError("a check that raised")
            m._check_shard_entries = boom
        start = time.monotonic()
        try:
            m.load_state_dict(sd)
            err = None
        except Exception as e:
            err = e
        took = time.monotonic() - start
        m.close()
        return err, took

    got = two_ranks(run)
    assert [e for _, e in got] == [None, None], got
    (err0, took0), (err1, took1) = got[0][0], got[1][0]
    assert isinstance(err1, ValueError) and "a check that raised" in str(err1), repr(err1)
    assert isinstance(err0, RuntimeError) and "rank 1 of 2 refused" in str(err0), repr(err0)
    assert took0 < 10 and took1 < 10, (took0, took1)
