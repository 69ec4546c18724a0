#!/usr/bin/python3
"""A small DLRM trained with Strata embedding tables: bottom MLP over the 13 dense features,
one pooled embedding per categorical feature (26 tables, Criteo's shape), pairwise dot
interaction, top MLP, binary cross-entropy. Data: synthetic Criteo-shaped batches (labels from a
hidden rule, so the loss can go down), or a Criteo TSV file (label, 13 integer, 26 hex fields)
with --criteo, read again from its start (a new epoch, said on the console) until --steps steps
ran. Prints the loss and samples/s every --log-every steps; --torch-tables trains the
same model with torch.nn.EmbeddingBag tables (+ sparse Adagrad) instead, for comparison, one
EmbeddingBag per table or, with --torch-tables fused, one EmbeddingBag holding every table (one
lookup and one optimizer step per batch: plain PyTorch's fastest form). --json PATH writes the
run's figures (the steps run, samples/s per window, their median without the first window, losses).
--device cuda (the default when torch has CUDA) runs the dense model on the GPU and serves the
Strata tables as CUDA tensors (their placement then defaults to cached; cpu is refused there).

Under torchrun (WORLD_SIZE set) every process is one rank of a Strata world over the trainer's
process group (gloo on the CPU, nccl on CUDA, on the GPU LOCAL_RANK): the tables are sharded
(row-sharded above --row-shard-above rows, else whole on one rank), `gpu` on the emulated device
or `hybrid` on CUDA by default, the dense model is in DistributedDataParallel, each rank trains on
its own data (seed --seed + rank; --criteo: every world-th batch), prints its loss, and rank 0 the
world's samples/s and its exchange figures (bytes per step and the dedup factor).

  PYTHONPATH=build/default/python /usr/bin/python3 python/examples/train_dlrm.py --steps 200
  PYTHONPATH=build/default/python /usr/bin/python3 -m torch.distributed.run --nnodes 1 --nproc_per_node 2 \
      --master_addr 127.0.0.1 --master_port 29533 python/examples/train_dlrm.py --steps 200
"""

import argparse
import datetime
import itertools
import json
import math
import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import strata.torch as st

DENSE, SPARSE = 13, 26


def mlp(sizes, last_sigmoid=False):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """The dense part: bottom MLP, pairwise dot interaction with the embeddings, top MLP (what
    DistributedDataParallel wraps under torchrun; the tables are Strata's, sharded)."""

    def __init__(self, dim):
        super().__init__()
        self.bottom = mlp([DENSE, 64, dim])
        pairs = (SPARSE + 1) * SPARSE // 2
        self.top = mlp([dim + pairs, 64, 1])

    def forward(self, dense, embs):
        x = self.bottom(dense)
        feats = torch.stack([x] + embs, dim=1)  # (batch, 27, dim)
        dots = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.tril_indices(feats.shape[1], feats.shape[1], offset=-1)
        return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)


class DLRM(nn.Module):
    def __init__(self, tables, dim, rows):
        super().__init__()
        self.names = [f"c{i}" for i in range(SPARSE)]
        self.tables = tables
        self.dense = DenseArch(dim)

    def forward(self, dense, sparse):
        emb = self.tables(sparse)
        return self.dense(dense, [emb[n] for n in self.names])


class TorchTables(nn.Module):
    """The same tables as torch.nn.EmbeddingBag (the baseline)."""

    def __init__(self, rows, dim):
        super().__init__()
        self.bags = nn.ModuleDict({f"c{i}": nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
                                   for i in range(SPARSE)})
        for b in self.bags.values():
            nn.init.uniform_(b.weight, -0.05, 0.05)

    def forward(self, sparse):
        out = {}
        for n, f in sparse.items():
            offsets = torch.cat([f["lengths"].new_zeros(1), torch.cumsum(f["lengths"], 0)[:-1]])
            out[n] = self.bags[n](f["keys"], offsets)
        return out


class FusedTorchTables(nn.Module):
    """Every table in one torch.nn.EmbeddingBag (table i's rows at i * rows), so a batch is one
    lookup and one sparse optimizer step, as TorchRec's unsharded fused path does without FBGEMM."""

    def __init__(self, rows, dim):
        super().__init__()
        self.rows = rows
        self.names = [f"c{i}" for i in range(SPARSE)]
        self.bag = nn.EmbeddingBag(rows * SPARSE, dim, mode="sum", sparse=True)
        nn.init.uniform_(self.bag.weight, -0.05, 0.05)

    def forward(self, sparse):
        keys = torch.cat([sparse[n]["keys"] + i * self.rows for i, n in enumerate(self.names)])
        lengths = torch.cat([sparse[n]["lengths"] for n in self.names])
        offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)[:-1]])
        pooled = self.bag(keys, offsets).view(SPARSE, -1, self.bag.embedding_dim)
        return {n: pooled[i] for i, n in enumerate(self.names)}


def synthetic_batches(batch, rows, seed):
    """Criteo-shaped batches: 13 log-scaled dense features, 26 one-hot categorical features with
    Zipf-skewed ids; the label depends on the dense features and a hidden score per id."""
    rng = np.random.default_rng(seed)
    hidden = np.random.default_rng(1234).normal(size=(SPARSE, rows)).astype(np.float32)
    w = np.random.default_rng(4321).normal(size=DENSE).astype(np.float32)
    while True:
        dense = np.log1p(rng.exponential(3.0, size=(batch, DENSE))).astype(np.float32)
        ids = (rng.zipf(1.2, size=(batch, SPARSE)) - 1) % rows
        score = dense @ w * 0.3 + hidden[np.arange(SPARSE), ids].sum(axis=1) * 0.4
        label = (score + rng.normal(size=batch) > np.median(score)).astype(np.float32)
        yield dense, ids.astype(np.int64), label


def criteo_batches(path, batch, rows):
    """Batches from a Criteo TSV file (label, 13 integers, 26 hex ids; empty fields allowed),
    ids hashed into `rows`, epoch after epoch: at the end of the file (the lines short of a last
    whole batch are left out) it says so and starts over. A file without one whole batch is an
    error naming its lines and --batch."""
    epoch = 1
    while True:
        batches = 0
        for batch_of_file in _criteo_file_batches(path, batch, rows):
            batches += 1
            yield batch_of_file
        if batches == 0:
            with open(path) as f:
                lines = sum(1 for _ in f)
            raise SystemExit(f"--criteo {path}: {lines} lines, fewer than one batch of --batch {batch} (expected at "
                             f"least {batch} lines: lower --batch or use a longer file)")
        epoch += 1
        print(f"--criteo {path}: end of the file after {batches} batches of {batch}; epoch {epoch} starts over "
              "from its first line", flush=True)


def _criteo_file_batches(path, batch, rows):
    """One pass over a Criteo TSV file: its whole batches."""
    with open(path) as f:
        while True:
            lines = list(itertools.islice(f, batch))
            if len(lines) < batch:
                return
            dense = np.zeros((batch, DENSE), np.float32)
            ids = np.zeros((batch, SPARSE), np.int64)
            label = np.zeros(batch, np.float32)
            for r, line in enumerate(lines):
                cols = line.rstrip("\n").split("\t")
                label[r] = float(cols[0] or 0)
                dense[r] = [math.log1p(max(float(c or 0), 0.0)) for c in cols[1:1 + DENSE]]
                ids[r] = [int(c or "0", 16) % rows for c in cols[1 + DENSE:1 + DENSE + SPARSE]]
            yield dense, ids, label


def sparse_features(ids, device=None):
    lengths = torch.ones(ids.shape[0], dtype=torch.int64, device=device)
    return {f"c{i}": {"keys": torch.from_numpy(np.ascontiguousarray(ids[:, i])).to(device), "lengths": lengths}
            for i in range(SPARSE)}


def report_world(tables, rank, world, samples_per_s, steps):
    """Rank 0's summary of a world: its samples/s times the ranks (they step together), and from its
    store's stats()["dispatch"] the bytes it exchanged per step and the dedup factor (the bytes
    without dedup over those with it)."""
    if rank != 0:
        return
    d = tables.store.stats()["dispatch"]
    print(f"world: {world} ranks, {samples_per_s * world:,.0f} samples/s", flush=True)
    factor = d["bytes_no_dedup"] / d["bytes"] if d["bytes"] else 1.0
    print(f"rank 0 exchange: {d['bytes'] / steps:,.0f} bytes/step, dedup factor {factor:.2f}", flush=True)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The docstring as written, and every flag's default after its help (where the help does not
    say it already)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" not in text and action.default not in (None, argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


def train(a, model, data, dense_opt, sparse_opt, loss_fn, prefix=""):
    """The training loop: returns the losses and the samples/s of each --log-every window (each line
    starts with `prefix`: "rank r " in a world)."""
    losses, rates, t0, window_loss, window_n = [], [], time.perf_counter(), 0.0, 0
    for step, (dense, sparse, label) in enumerate(data, 1):
        dense_opt.zero_grad()
        if sparse_opt:
            sparse_opt.zero_grad()
        loss = loss_fn(model(dense, sparse), label)
        loss.backward()
        dense_opt.step()
        if sparse_opt:
            sparse_opt.step()
        losses.append(loss.item())
        window_loss, window_n = window_loss + loss.item(), window_n + 1
        if step % a.log_every == 0:
            rates.append(window_n * a.batch / (time.perf_counter() - t0))
            print(f"{prefix}step {step:6d}  loss {window_loss / window_n:.4f}  {rates[-1]:,.0f} samples/s", flush=True)
            t0, window_loss, window_n = time.perf_counter(), 0.0, 0
    return losses, rates


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_HelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="training steps (batches) to run")
    p.add_argument("--batch", type=int, default=256, help="samples per batch")
    p.add_argument("--rows", type=int, default=10000, help="rows per table")
    p.add_argument("--dim", type=int, default=16, help="embedding dimension (and the bottom MLP's output)")
    p.add_argument("--mode", help="placement of the Strata tables: cpu, offload, cached, gpu, hybrid (default: "
                   "cpu, cached on cuda; under torchrun gpu, hybrid on cuda)")
    p.add_argument("--cache-fraction", type=float, default=0.2,
                   help="--mode cached or hybrid: the share of each table's rows its device cache holds, in (0, 1]")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where the dense model and the outputs live: cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=0, help="Strata and torch threads (0: torch's default)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate of the tables and of the dense Adagrad")
    p.add_argument("--criteo", help="a Criteo TSV file, read epoch after epoch until --steps (default: synthetic "
                   "data)")
    p.add_argument("--torch-tables", nargs="?", const="per-table", choices=["per-table", "fused"],
                   help="torch.nn.EmbeddingBag tables instead of Strata: one per table (per-table, the value when "
                   "the flag is given alone) or all in one (fused) (default: Strata tables)")
    p.add_argument("--json", help="write the steps run, samples/s per window, their median and the losses to this "
                   "file (default: none)")
    p.add_argument("--log-every", type=int, default=50, help="print the loss and samples/s every this many steps")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (rank r's: seed + r), the initial "
                   "rows and torch")
    p.add_argument("--row-shard-above", type=int, default=4096, help="under torchrun: tables of more rows are "
                   "row-sharded over the ranks, the others table-sharded (whole on one rank)")
    a = p.parse_args(argv)
    for flag, value in (("--steps", a.steps), ("--batch", a.batch), ("--rows", a.rows), ("--dim", a.dim),
                        ("--log-every", a.log_every)):
        if value <= 0:
            p.error(f"{flag} {value} (expected an integer > 0)")
    if not 0 < a.cache_fraction <= 1:
        p.error(f"--cache-fraction {a.cache_fraction} (expected a fraction of the rows in (0, 1])")
    world = int(os.environ.get("WORLD_SIZE", 0))  # under torchrun: one rank of a world
    device = torch.device(a.device)
    rank, prefix = 0, ""
    if world:
        if a.torch_tables:
            p.error("--torch-tables runs on one process (under torchrun the tables are Strata's, sharded)")
        # A clear error in 2 minutes rather than torch's default 30 when a rank fails or hangs.
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=2))
        rank, prefix = dist.get_rank(), f"rank {dist.get_rank()} "
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
    a.mode = a.mode or ("hybrid" if world and device.type == "cuda" else "gpu" if world
                        else "cached" if device.type == "cuda" else "cpu")
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    threads = a.threads or torch.get_num_threads()

    if a.torch_tables:
        tables = (FusedTorchTables if a.torch_tables == "fused" else TorchTables)(a.rows, a.dim).to(device)
        sparse_opt = torch.optim.Adagrad(tables.parameters(), lr=a.lr, eps=1e-8)
    else:
        table = {"rows": a.rows, "dim": a.dim, "placement": a.mode, "init": {"bound": 0.05, "seed": a.seed},
                 "optimizer": {"kind": "adagrad", "learning_rate": a.lr, "eps": 1e-8}}
        if a.mode in ("cached", "hybrid"):
            table["cache"] = {"fraction": a.cache_fraction}
        if world:  # big tables split by rows over the ranks, small ones whole on one rank each
            table["sharding"] = {"type": "row" if a.rows > a.row_shard_above else "table"}
        config = {"threads": threads, "tables": [dict(table, name=f"c{i}") for i in range(SPARSE)]}
        if a.mode != "cpu":
            config["device"] = {"backend": "auto"}
        # In a world the module joins torch.distributed's default group (process_group=None).
        tables = st.EmbeddingBagCollection(config, device=device)
        sparse_opt = None  # the store's fused Adagrad runs in backward
    model = DLRM(tables, a.dim, a.rows).to(device)
    if world:  # the dense part data-parallel; each row's update is the sum of every rank's gradients
        model.dense = nn.parallel.DistributedDataParallel(model.dense,
                                                          device_ids=[device] if device.type == "cuda" else None)
    dense_opt = torch.optim.Adagrad([p for n, p in model.named_parameters() if not n.startswith("tables.")], lr=a.lr)
    loss_fn = nn.BCEWithLogitsLoss()

    data_seed = a.seed + rank  # each rank its own samples (the hidden rule is the same)
    data = criteo_batches(a.criteo, a.batch, a.rows) if a.criteo else synthetic_batches(a.batch, a.rows, data_seed)
    if world and a.criteo:
        data = itertools.islice(data, rank, None, world)  # every world-th batch of the file
    # Dense features and labels go to the device; the sparse features stay on the CPU (Strata plans
    # on the host; the torch baselines look up on the device).
    data = ((torch.from_numpy(d).to(device), sparse_features(i, device if a.torch_tables else None),
             torch.from_numpy(y).to(device)) for d, i, y in itertools.islice(data, a.steps))
    if not a.torch_tables:
        data = ((d, s, y) for (d, _, y), s in st.pipelined(tables, data, sparse=lambda b: b[1], ahead=1))

    start = time.perf_counter()
    try:
        losses, rates = train(a, model, data, dense_opt, sparse_opt, loss_fn, prefix)
    except (ValueError, RuntimeError) as e:  # e.g. a batch the device cannot hold: say which flags size it
        if a.torch_tables or world:
            raise
        raise SystemExit(f"train_dlrm: {e} (with --batch {a.batch}, --mode {a.mode}, --cache-fraction "
                         f"{a.cache_fraction}, --rows {a.rows}: lower --batch or change the placement or cache "
                         "size)") from None
    if world:
        report_world(tables, rank, world, len(losses) * a.batch / (time.perf_counter() - start), len(losses))
        tables.close()  # collective: before the group goes
        dist.destroy_process_group()
    if a.json:
        tables_kind = "strata " + a.mode if not a.torch_tables else "torch " + a.torch_tables
        steady = rates[1:] or rates  # the first window includes warm-up
        with open(a.json, "w") as f:
            json.dump({"tables": tables_kind, "device": str(device), "threads": threads, "batch": a.batch,
                       "rows": a.rows, "dim": a.dim, "steps": len(losses), "log_every": a.log_every, "samples_per_s": rates,
                       "median_samples_per_s": statistics.median(steady) if steady else None,
                       "losses": losses}, f, indent=1)
    return losses


if __name__ == "__main__":
    main()
