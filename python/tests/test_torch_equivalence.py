"""EmbeddingBagCollection trains like torch.nn.EmbeddingBag + a torch optimizer (sparse gradients)
from the same initial weights: forward outputs and weights within 1e-5 over 50 steps, in the cpu,
cached (emulated device, a cache that evicts) and offload modes."""

import zlib

import numpy as np
import pytest
import torch

import strata.torch as st
from conftest import MODES, config, random_feature, table

STEPS = 50
BATCH = 4
TABLES = [("user", 40, 8), ("item", 25, 4), ("ctx", 12, 3)]


def make_pair(tmp_path, mode, optimizer, pooling, lr, rng):
    """A Strata module and torch EmbeddingBags with the same (random) initial weights: the first
    table goes in through import_npy, the others through load_state_dict."""
    cfg = config([table(n, r, d, pooling, optimizer, lr, mode) for n, r, d in TABLES], mode)
    ebc = st.EmbeddingBagCollection(cfg)
    bags, init = {}, {}
    for n, r, d in TABLES:
        init[n] = rng.uniform(-0.5, 0.5, size=(r, d)).astype(np.float32)
        bag = torch.nn.EmbeddingBag(r, d, mode=pooling, sparse=True)
        with torch.no_grad():
            bag.weight.copy_(torch.from_numpy(init[n]))
        bags[n] = bag
    first = TABLES[0][0]
    np.save(tmp_path / "first.npy", init[first])
    ebc.store.import_npy(first, str(tmp_path / "first.npy"))
    given = {f"embedding_bags.{n}.weight": torch.from_numpy(init[n]) for n, _, _ in TABLES[1:]}
    missing = ebc.load_state_dict(given, strict=False).missing_keys
    # Every other entry (the first table's weight, optimizer states, rates, step) keeps its value.
    assert f"embedding_bags.{first}.weight" in missing and sorted(missing) == sorted(set(ebc.state_dict()) - set(given))
    for n, _, _ in TABLES:
        np.testing.assert_array_equal(ebc.store.read_rows(n)[0], init[n])
    return ebc, bags


def torch_optimizer(optimizer, params, lr):
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.Adagrad(params, lr=lr, eps=1e-8, initial_accumulator_value=0.0)


def train_and_compare(ebc, bags, optimizer, lr, rng, weighted, schedule=None):
    opt = torch_optimizer(optimizer, [b.weight for b in bags.values()], lr)
    sched = schedule(opt) if schedule else None
    for step in range(STEPS):
        batch = {n: random_feature(rng, r, BATCH, weighted=weighted) for n, r, _ in TABLES}
        targets = {n: torch.from_numpy(rng.normal(size=(BATCH, d)).astype(np.float32)) for n, _, d in TABLES}
        # Strata
        out = ebc({n: {k: torch.from_numpy(v) for k, v in f.items()} for n, f in batch.items()})
        loss = sum(((out[n] - targets[n]) ** 2).sum() for n in out.keys())
        loss.backward()
        # torch
        opt.zero_grad()
        ref = {}
        for n, f in batch.items():
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(f["lengths"])[:-1]]).astype(np.int64))
            w = torch.from_numpy(f["weights"]) if "weights" in f else None
            ref[n] = bags[n](torch.from_numpy(f["keys"]), offsets, per_sample_weights=w)
        sum(((ref[n] - targets[n]) ** 2).sum() for n in ref).backward()
        for n, f in batch.items():
            if len(f["keys"]) == 0:
                # torch 1.13's sparse Adagrad fails on an empty sparse gradient ("size of tensor a
                # (d) must match the size of tensor b (0)"); no key means no row to update.
                bags[n].weight.grad = None
        opt.step()
        for n in ref:
            np.testing.assert_allclose(out[n].detach().numpy(), ref[n].detach().numpy(), atol=1e-5, rtol=0,
                                       err_msg=f"step {step} table {n} output")
        if sched:
            sched.step()
            ebc.set_learning_rate(sched.get_last_lr()[0])
    for n in bags:
        np.testing.assert_allclose(ebc.store.read_rows(n)[0], bags[n].weight.detach().numpy(), atol=1e-5, rtol=0,
                                   err_msg=f"table {n} weights after {STEPS} steps")
    assert ebc.store.step == STEPS
    assert ebc.store.in_flight == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("pooling,weighted", [("sum", False), ("mean", False), ("sum", True)])
def test_matches_torch_embedding_bag(tmp_path, mode, optimizer, pooling, weighted):
    # A seed per case that every run shares (hash() of a str changes with PYTHONHASHSEED).
    rng = np.random.default_rng(zlib.crc32(repr((mode, optimizer, pooling, weighted)).encode()))
    lr = 0.05 if optimizer == "sgd" else 0.1
    ebc, bags = make_pair(tmp_path, mode, optimizer, pooling, lr, rng)
    train_and_compare(ebc, bags, optimizer, lr, rng, weighted)
    if mode == "cached":
        stats = ebc.store.stats()["cache"]
        assert sum(s["evictions"] for s in stats.values()) > 0  # the cache was too small to keep every row


@pytest.mark.parametrize("mode", MODES)
def test_learning_rate_setter_follows_a_torch_schedule(tmp_path, mode):
    rng = np.random.default_rng(7)
    ebc, bags = make_pair(tmp_path, mode, "sgd", "sum", 0.2, rng)
    train_and_compare(ebc, bags, "sgd", 0.2, rng, False,
                      schedule=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5))
    assert ebc.learning_rate("user") == pytest.approx(0.2 * 0.5 ** (STEPS // 7))
