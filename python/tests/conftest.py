"""Shared helpers of the Python tests: store configs in every mode, random jagged batches, and the
part of TorchRec's KeyedJaggedTensor that the module reads."""

import numpy as np
import pytest
import torch

MODES = ["cpu", "cached", "offload"]
PLACEMENTS = ["cpu", "offload", "cached", "gpu", "hybrid"]  # every placement (gpu and hybrid on one rank)


def table(name, rows, dim, pooling="sum", optimizer="sgd", lr=0.1, mode="cpu", cache_rows=None):
    t = {"name": name, "rows": rows, "dim": dim, "pooling": pooling, "placement": mode,
         "init": {"bound": 0.1, "seed": 1},
         "optimizer": {"kind": optimizer, "learning_rate": lr, "eps": 1e-8, "initial_accumulator": 0.0}}
    if mode in ("cached", "hybrid"):  # a hybrid table on one rank is a cached one
        t["cache"] = {"rows": cache_rows or min(rows, 13)}  # one batch of <= 12 rows fits; rows are evicted
    return t


def config(tables, mode="cpu", **extra):
    c = {"threads": 1, "tables": tables}
    if mode != "cpu":
        c["device"] = {"backend": "emu"}
    c.update(extra)
    return c


def random_feature(rng, rows, batch, max_len=3, weighted=False):
    lengths = rng.integers(0, max_len + 1, size=batch).astype(np.int64)
    keys = rng.integers(0, rows, size=int(lengths.sum())).astype(np.int64)
    f = {"keys": keys, "lengths": lengths}
    if weighted:
        f["weights"] = rng.uniform(0.5, 2.0, size=keys.shape[0]).astype(np.float32)
    return f


@pytest.fixture
def rng():
    return np.random.default_rng(0)


class FakeJagged:
    """The part of TorchRec's JaggedTensor that the module reads."""

    def __init__(self, f):
        self.f = f

    def values(self):
        return torch.from_numpy(self.f["keys"])

    def lengths(self):
        return torch.from_numpy(self.f["lengths"])

    def weights_or_none(self):
        return torch.from_numpy(self.f["weights"]) if "weights" in self.f else None


class FakeKJT:
    """The part of TorchRec's KeyedJaggedTensor that the module reads (torchrec is not a Debian package)."""

    def __init__(self, b):
        self.b = b

    def keys(self):
        return list(self.b)

    def to_dict(self):
        return {k: FakeJagged(f) for k, f in self.b.items()}
