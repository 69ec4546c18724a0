"""strata.Store with outputs and gradients in device memory, on the emulated device: device arrays
(anything with __cuda_array_interface__; here strata.DeviceArray) give the bits of NumPy arrays,
synchronously and stream-ordered; every bad input raises with the store's message and changes
nothing."""

import numpy as np
import pytest
import torch

import strata
from conftest import config, random_feature, table

ROWS = {"a": 40, "b": 30}


def open_store(mode):
    return strata.Store(config([table("a", ROWS["a"], 4, optimizer="adagrad", mode=mode),
                                table("b", ROWS["b"], 3, pooling="mean", optimizer="sgd", mode=mode)], mode))


def batch(rng):
    return {"a": random_feature(rng, ROWS["a"], 4, weighted=True), "b": random_feature(rng, ROWS["b"], 4)}


def snapshot(s):
    rows = {n: s.read_rows(n) for n in ROWS}
    return {"rows": {n: (w.copy(), st.copy()) for n, (w, st) in rows.items()}, "step": s.step,
            "in_flight": s.in_flight}


def assert_same(x, y):
    assert x["step"] == y["step"] and x["in_flight"] == y["in_flight"]
    for n in x["rows"]:
        np.testing.assert_array_equal(x["rows"][n][0], y["rows"][n][0])
        np.testing.assert_array_equal(x["rows"][n][1], y["rows"][n][1])


class FakeDeviceArray:
    """A device array as another library would describe it (over a strata.DeviceArray's memory)."""

    def __init__(self, base, **changes):
        self.base = base
        self.__cuda_array_interface__ = dict(base.__cuda_array_interface__, **changes)


@pytest.mark.parametrize("mode", ["cached", "gpu"])
@pytest.mark.parametrize("stream_kind", [None, "stream", "handle"])
def test_device_arrays_give_the_bits_of_numpy_arrays(mode, stream_kind):
    host, dev = open_store(mode), open_store(mode)
    assert host.device["backend"] == "emu" and dev.device["backend"] == "emu"
    # A strata Stream, or the int handle 0: the device's default stream (as torch's default stream is 0).
    stream = {None: None, "stream": dev.stream(), "handle": 0}[stream_kind]
    rng = np.random.default_rng(7)
    for step in range(6):
        b = batch(rng)
        host.submit(step, b)
        dev.submit(step, b)
        outs = host.forward(step)
        douts = [dev.device_array(o.shape) for o in outs]
        assert dev.forward(step, douts, stream=stream) is not None
        for o, d in zip(outs, douts):
            np.testing.assert_array_equal(o, d.to_numpy(stream=stream))  # bit for bit
        grads = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
        dgrads = [dev.device_array(g.shape) for g in grads]
        for g, d in zip(grads, dgrads):
            d.copy_from(g, stream=stream)
        host.backward(step, grads)
        dev.backward(step, dgrads, stream=stream)
        if stream_kind == "stream":
            stream.synchronize()  # the gradients stay alive until the updates that read them ran
    assert_same(snapshot(host), snapshot(dev))
    assert dev.step == 6 and dev.stats()["links"]["h2d"] > 0
    # Device arrays keep the activations off the host: no host copy of them and no staging for
    # them, where the numpy store copies every output and gradient through pinned staging.
    dst, hst = dev.stats(), host.stats()
    assert dst["links"]["host_copy"] == 0 and dst["activation_staging"]["entries"] == 0
    assert hst["links"]["host_copy"] >= 2 * 6 * sum(o.nbytes for o in outs)
    assert hst["activation_staging"]["entries"] >= 1 and hst["activation_staging"]["pinned"] > 0
    assert dst["staging"]["entries"] >= 1 and dst["device_resources"]["allocations"] > 0


def test_outputs_may_mix_host_and_device_memory():
    host, dev = open_store("cached"), open_store("cached")
    b = batch(np.random.default_rng(3))
    host.submit(0, b)
    dev.submit(0, b)
    outs = host.forward(0)
    d0, h1 = dev.device_array(outs[0].shape), np.empty_like(outs[1])
    dev.forward(0, [d0, h1])
    np.testing.assert_array_equal(outs[0], d0.to_numpy())
    np.testing.assert_array_equal(outs[1], h1)
    g0 = dev.device_array(outs[0].shape)
    g0.copy_from(np.ones_like(outs[0]))
    dev.backward(0, [g0, np.ones_like(outs[1])])
    host.backward(0, [np.ones_like(outs[0]), np.ones_like(outs[1])])
    assert_same(snapshot(host), snapshot(dev))


def test_device_array_copies_and_interface():
    s = open_store("gpu")
    a = s.device_array((3, 2))
    iface = a.__cuda_array_interface__
    assert iface["version"] == 3 and iface["typestr"] == "<f4" and iface["shape"] == (3, 2)
    assert iface["strides"] is None and iface["data"] == (a.ptr, False) and a.shape == (3, 2)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    a.copy_from(torch.from_numpy(x))
    np.testing.assert_array_equal(a.to_numpy(), x)
    with pytest.raises(ValueError, match=r"copy_from: source has shape \(2, 3\) \(expected \(3, 2\)"):
        a.copy_from(x.reshape(2, 3))
    with pytest.raises(TypeError, match="dtype float64"):
        a.copy_from(x.astype(np.float64))
    with pytest.raises(ValueError, match="belongs to another device"):
        a.to_numpy(stream=open_store("gpu").stream())
    with pytest.raises(ValueError, match=r"to_numpy: stream=0x7f00deadbee0: .*not a live emu stream"):
        a.to_numpy(stream=0x7F00DEADBEE0)
    np.testing.assert_array_equal(a.to_numpy(), x)
    assert s.device_array((0, 4)).to_numpy().shape == (0, 4)
    cpu = open_store("cpu")
    assert cpu.device is None
    with pytest.raises(RuntimeError, match="Store.stream\\(\\): this store has no device"):
        cpu.stream()
    with pytest.raises(RuntimeError, match="Store.device_array\\(\\): this store has no device"):
        cpu.device_array((1, 1))


def test_bad_device_inputs_raise_and_change_nothing():
    s, other, cpu = open_store("cached"), open_store("cached"), open_store("cpu")
    b = batch(np.random.default_rng(5))
    s.submit(0, b)
    cpu.submit(0, b)
    ref = open_store("cached")
    ref.submit(0, b)
    shapes = [o.shape for o in ref.forward(0)]
    good = [s.device_array(sh) for sh in shapes]
    before = snapshot(s)

    def refused(exc, pattern, outs=None, stream=None, store=s, op="forward"):
        with pytest.raises(exc, match=pattern):
            if op == "forward":
                store.forward(0, outs if outs is not None else good, stream=stream)
            else:
                store.backward(0, outs, stream=stream)
        assert_same(before, snapshot(s))

    base = good[0]
    refused(TypeError, r"outputs\[0\] is a device array of dtype float64 \(typestr '<f8'; expected float32\)",
            [FakeDeviceArray(base, typestr="<f8"), good[1]])
    refused(ValueError, r"outputs\[0\] is a device array of shape \(4, 4\) that is not C-contiguous",
            [FakeDeviceArray(base, strides=(4, 20)), good[1]])
    refused(ValueError, r"outputs\[1\] is a device array of shape \(12,\) \(expected 2-D\)",
            [good[0], FakeDeviceArray(good[1], shape=(12,))])
    refused(ValueError, r"outputs\[0\] is a read-only device array",
            [FakeDeviceArray(base, data=(base.ptr, True)), good[1]])
    # The store's own checks, in its words.
    refused(ValueError, r"batch 0, table 'a': output .*shape", [s.device_array((2, 4)), good[1]])
    refused(ValueError, r"batch 0, table 'a': output view 0 \(device memory\): .*emu device",
            [other.device_array(shapes[0]), good[1]])
    refused(ValueError, r"forward of batch 0: stream=0x7f00deadbee0: .*not a live emu stream",
            stream=0x7F00DEADBEE0)
    refused(ValueError, r"forward of batch 0: the stream belongs to another device", stream=other.stream())
    refused(ValueError, r"__cuda_array_interface__: stream=0x7f00deadbee0: .*not a live emu stream",
            [FakeDeviceArray(base, stream=0x7F00DEADBEE0), good[1]])
    refused(TypeError, r"stream is a str \(expected None, a strata Stream", stream="cuda")
    refused(TypeError, r"stream is a bool", stream=True)
    refused(ValueError, r"stream -1 \(expected a CUDA stream handle", stream=-1)
    with pytest.raises(ValueError, match=r"this store has no device, so it takes no stream"):
        cpu.forward(0, stream=0)
    with pytest.raises(ValueError, match=r"output view 0 is device memory, but this store has no device"):
        cpu.forward(0, [other.device_array(shapes[0]), other.device_array(shapes[1])])
    assert cpu.in_flight == 1
    # Keys stay host memory.
    with pytest.raises(ValueError, match=r"table 'a': keys is a tensor on meta .*keys, offsets, lengths and "
                                         r"weights stay host memory"):
        s.submit(1, {"a": {"keys": torch.zeros(2, dtype=torch.int64, device="meta"), "lengths": np.array([2])}})
    assert_same(before, snapshot(s))

    # The good call still works; then gradients: a host array where forward wrote device memory.
    s.forward(0, good)
    grads = [s.device_array(sh) for sh in shapes]
    for g in grads:
        g.copy_from(np.ones(g.shape, np.float32))
    before = snapshot(s)
    refused(ValueError, r"table 'b': gradient view 1 is host memory, but forward's output was device memory",
            [grads[0], np.ones(shapes[1], np.float32)], op="backward")
    refused(TypeError, r"grads\[1\] is a device array of dtype float64",
            [grads[0], FakeDeviceArray(grads[1], typestr="<f8")], op="backward")
    refused(ValueError, r"gradient view 0 \(device memory\): .*emu device",
            [other.device_array(shapes[0]), grads[1]], op="backward")
    refused(ValueError, r"backward of batch 0: stream=0x7f00deadbee0", grads, stream=0x7F00DEADBEE0, op="backward")
    # A read-only gradient is fine (the store only reads it).
    s.backward(0, [FakeDeviceArray(grads[0], data=(grads[0].ptr, True)), grads[1]])
    assert s.step == 1 and s.in_flight == 0


# A DeviceArray or Stream that outlives Store.close() keeps the store's device (and the store's memory)
# until it goes: still usable, and destroyed without touching freed memory (a subprocess: the failure
# was a segfault). A world's close() is the same (test_world_api.py); here a store of one rank.
_OUTLIVE = r"""
import gc, sys
import numpy as np
import strata
sys.path.insert(0, sys.argv[1])
from test_device_arrays import open_store
s = open_store("gpu")
what = sys.argv[2]
a = s.device_array((64, 64))
st = s.stream()
s.close()
if what == "use":
    a.copy_from(np.ones((64, 64), np.float32), stream=st)
    st.synchronize()
    assert a.to_numpy().sum() == 64 * 64
if what in ("array", "use"):
    del a
    gc.collect()
    junk = [np.ones(1000) for _ in range(1000)]
del st
gc.collect()
if what == "stream":
    del a
    gc.collect()
print("survived", what, flush=True)
"""


@pytest.mark.parametrize("what", ["array", "stream", "use"])
def test_device_arrays_and_streams_outlive_close(what):
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _OUTLIVE, os.path.dirname(os.path.abspath(__file__)), what],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"survived {what}" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
