"""strata.torch.EmbeddingBagCollection(device="cuda"): the device parsing and refusals run here
(torch.cuda.is_available() is faked where a test needs it); the tests that train on a GPU are
skipped without one (torch.cuda.is_available() False: they cannot run on a machine without CUDA)."""

import json

import numpy as np
import pytest
import torch

import strata.torch as st
from conftest import random_feature, table

CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a torch with CUDA")


def device_config(placement="cached", **device):
    c = {"threads": 1, "tables": [table("a", 50, 4, optimizer="adagrad", mode=placement),
                                  table("b", 30, 3, pooling="mean", mode=placement)]}
    if device:
        c["device"] = device
    return c


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch says it has CUDA devices, the current one being 2 (nothing here uses one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)


def test_device_must_be_cpu_or_cuda():
    with pytest.raises(ValueError, match=r"device meta \(expected cpu or cuda\)"):
        st.EmbeddingBagCollection(device_config(), device="meta")
    assert st.EmbeddingBagCollection(device_config(), device=torch.device("cpu")).device == torch.device("cpu")


@pytest.mark.skipif(CUDA, reason="checks the refusal of a torch without CUDA")
def test_cuda_refused_when_torch_has_no_cuda():
    for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
        with pytest.raises(ValueError, match=r"device cuda.*: this torch has no CUDA device \(torch.cuda."
                                             r"is_available\(\) is False; expected device='cpu'\)"):
            st.EmbeddingBagCollection(device_config(), device=device)


def test_cuda_device_resolves_the_ordinal_into_the_store_config(fake_cuda):
    assert st._check_device("cuda") == torch.device("cuda", 2)  # torch's current device
    assert st._check_device("cuda:1") == torch.device("cuda", 1)
    assert st._check_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    cuda1 = torch.device("cuda", 1)
    for given in ({}, {"backend": "auto"}, {"backend": "cuda", "ordinal": "current"}, {"ordinal": 1},
                  {"ordinal": "auto", "capacity": 1000}):
        c = device_config(**given)
        got = st._store_config(c, cuda1)
        assert got["device"] == dict(given, backend="cuda", ordinal=1)
        assert got["tables"] == c["tables"] and c == device_config(**given)  # the caller's config is not changed
    assert st._store_config(json.dumps(device_config()), cuda1)["device"] == {"backend": "cuda", "ordinal": 1}
    assert st._store_config(device_config(backend="emu"), torch.device("cpu")) == device_config(backend="emu")
    with pytest.raises(ValueError, match=r"device cuda:1, but the config's device.backend is 'emu' \(expected "
                                         r"'cuda' or 'auto', or device='cpu'\)"):
        st.EmbeddingBagCollection(device_config(backend="emu"), device="cuda:1")
    with pytest.raises(ValueError, match=r"device cuda:1, but the config's device.ordinal is 0 \(expected 1"):
        st.EmbeddingBagCollection(device_config(ordinal=0), device="cuda:1")


def test_cuda_refused_for_a_store_without_a_device(fake_cuda):
    with pytest.raises(ValueError, match=r"device cuda:2, but the store has no device: its tables are all 'cpu'"):
        st.EmbeddingBagCollection(device_config("cpu"), device="cuda")


@pytest.mark.skipif(CUDA, reason="checks the store's refusal on a machine without a GPU")
def test_cuda_store_open_fails_in_the_store_words_without_a_gpu(fake_cuda):
    with pytest.raises(RuntimeError, match=r"Unavailable: device backend cuda: no CUDA GPU is visible"):
        st.EmbeddingBagCollection(device_config("cached"), device="cuda:0")


# ---- on a GPU ----

def batches(rows=(50, 30), steps=12, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield {"a": {k: torch.from_numpy(v) for k, v in random_feature(rng, rows[0], 8, weighted=True).items()},
               "b": {k: torch.from_numpy(v) for k, v in random_feature(rng, rows[1], 8).items()}}


@needs_gpu
@pytest.mark.parametrize("placement", ["cached", "gpu", "offload"])
def test_cuda_module_matches_the_cpu_module_bit_for_bit(placement):
    # The reference: the same tables on the emulated device, served as CPU tensors.
    ref = st.EmbeddingBagCollection(device_config(placement, backend="emu"))
    mod = st.EmbeddingBagCollection(device_config(placement), device="cuda")
    assert mod.store.device["backend"] == "cuda"
    mix = {"a": torch.randn(4, generator=torch.Generator().manual_seed(1)),
           "b": torch.randn(3, generator=torch.Generator().manual_seed(2))}
    for b in batches():
        ro, mo = ref(b), mod(b)
        assert mo["a"].device.type == "cuda" and mo["a"].dtype == torch.float32
        for name in ("a", "b"):
            assert torch.equal(ro[name], mo[name].cpu())
        sum(((ro[n] * mix[n]) ** 2).sum() for n in mix).backward()
        sum(((mo[n] * mix[n].cuda()) ** 2).sum() for n in mix).backward()
    assert ref.store.step == mod.store.step == 12 and mod.store.in_flight == 0
    rs, ms = ref.state_dict(), mod.state_dict()
    for k in rs:
        assert torch.equal(rs[k], ms[k]), k


@needs_gpu
def test_cuda_module_two_lookups_one_backward_and_eval():
    ref = st.EmbeddingBagCollection(device_config("cached", backend="emu"))
    mod = st.EmbeddingBagCollection(device_config("cached"), device="cuda")
    b1, b2 = list(batches(steps=2, seed=3))
    # Two lookups feeding one loss: applied in submit order at the end of the backward pass.
    for m, dev in ((ref, "cpu"), (mod, "cuda")):
        x, y = m(b1), m(b2)
        (x.values().pow(2).sum() + 2 * y.values().sum()).backward()
        assert m.store.in_flight == 0
    with torch.no_grad():
        for name in ("a", "b"):
            assert torch.equal(ref.eval()(b1)[name], mod.eval()(b1)[name].cpu())
    assert mod.store.in_flight == 0
    with pytest.raises(ValueError, match="keys is a tensor on cuda"):
        mod({"a": {"keys": b1["a"]["keys"].cuda(), "lengths": b1["a"]["lengths"]}})
    assert mod.store.in_flight == 0
