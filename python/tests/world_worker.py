#!/usr/bin/python3
"""One rank of a Strata world over a torch.distributed process group (gloo), started by
test_world.py as its own process:

  world_worker.py SCENARIO RANK WORLD INIT_FILE [ARGS...]

The ranks meet through a FileStore (init_method=file://INIT_FILE: no ports). Scenarios:
``equivalence`` (steps through Store with host views and through the EmbeddingBagCollection with
autograd, checked against a one-rank ``cpu`` reference trained on the concatenated batches, then
the state_dict checks), ``save CKPT ROWS`` and ``load CKPT ROWS`` (a world checkpoint: Store.save
into CKPT after a few steps, the whole tables, step and rates written to ROWS (.npz); a world of
another size loads CKPT and must hold exactly those), ``dynamic`` (dynamic tables over 2 ranks: training
against the reference, state_dict shards, merge_state_dicts and loads), and the faults ``config``, ``kill`` and
``sleep`` (3 ranks each).
Output lines the parent reads: ``EVENT <time>`` (the faulty rank, just before its fault),
``ERROR <time> <type>: <text>`` (an expected error, as it arrived) and ``OK <scenario>`` at the
end. Anything unexpected is an uncaught exception: a traceback and a non-zero exit.
"""

import datetime
import itertools
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import strata
import strata.torch as st

TYPES = ["replicated", "table", "row", "column"]
PLACEMENTS = ["gpu", "hybrid"]
# Per table of TYPES x PLACEMENTS: every optimizer, rowwise_adagrad never on a column shard.
OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam", "rowwise_adagrad", "sgd", "adagrad", "adam"]
POOLINGS = ["sum", "mean", "none"]
SHARD_TYPE = {"replicated": 0, "table": 1, "row": 2, "column": 3}  # ShardingType's order (store.hpp)
TIMEOUT = 60  # seconds: collectives of the healthy scenarios (2 loaded cores)


def say(*words):
    print(*words, flush=True)


def expect_error(kind, what, call, *needles):
    """Runs call(), which must raise `kind` whose text holds every needle; prints its ERROR line."""
    try:
        call()
    except kind as e:
        say(f"ERROR {time.time():.3f} {type(e).__name__}: {e}")
        missing = [n for n in needles if n not in str(e)]
        if missing:
            raise AssertionError(f"{what}: {type(e).__name__} {e!r} lacks {missing}") from e
        return e
    raise AssertionError(f"{what}: no {kind.__name__} was raised")


# ---- configs and batches ----
def world_tables(cache_rows=4):
    tables = []
    for i, (stype, placement) in enumerate(itertools.product(TYPES, PLACEMENTS)):
        t = {"name": f"{stype}_{placement}", "rows": 19 + 3 * i, "dim": 4 + i % 3, "pooling": POOLINGS[i % 3],
             "placement": placement, "sharding": {"type": stype}, "init": {"bound": 0.1, "seed": 10 + i},
             "optimizer": {"kind": OPTIMIZERS[i], "learning_rate": 0.1, "eps": 1e-8}}
        if placement == "hybrid":
            t["cache"] = {"rows": cache_rows}  # smaller than a batch: rows are evicted and bypass the cache
        tables.append(t)
    return tables


def world_config(tables):
    return {"threads": 1, "device": {"backend": "emu"}, "tables": tables}


def reference_config(tables):
    """The same tables whole on one rank, placement cpu."""
    ref = []
    for t in tables:
        t = {k: v for k, v in t.items() if k not in ("sharding", "cache")}
        t["placement"] = "cpu"
        ref.append(t)
    return {"threads": 1, "tables": ref}


def rank_batch(seed, step, rank, tables):
    """Rank `rank`'s batch and output gradients at `step`: (features, grads) by table name."""
    rng = np.random.default_rng([seed, step, rank])
    bags = int(rng.integers(1, 5))
    features, grads = {}, {}
    for i, t in enumerate(tables):
        lengths = rng.integers(0, 4, size=bags).astype(np.int64)
        keys = rng.integers(0, t["rows"], size=int(lengths.sum())).astype(np.int64)
        f = {"keys": keys, "lengths": lengths}
        if i % 2 == 1:  # weights on half the features
            f["weights"] = rng.uniform(0.5, 2.0, size=keys.shape[0]).astype(np.float32)
        features[t["name"]] = f
        rows = keys.shape[0] if t["pooling"] == "none" else bags
        grads[t["name"]] = (rng.integers(-1000, 1001, size=(rows, t["dim"])) / 1000).astype(np.float32)
    return features, grads


def global_batch(seed, step, world, tables):
    """Every rank's batch (rebuilt from the seeds) and their concatenation in rank order."""
    per_rank = [rank_batch(seed, step, r, tables) for r in range(world)]
    features, grads = {}, {}
    for t in tables:
        n = t["name"]
        fs = [p[0][n] for p in per_rank]
        features[n] = {k: np.concatenate([f[k] for f in fs]) for k in fs[0]}
        grads[n] = np.concatenate([p[1][n] for p in per_rank])
    return per_rank, features, grads


def output_slice(per_rank, rank, table):
    """Rank `rank`'s rows of a global output of `table`: its bags, or its keys (pooling none)."""
    n = table["name"]
    if table["pooling"] == "none":
        counts = [p[0][n]["keys"].shape[0] for p in per_rank]
    else:
        counts = [p[0][n]["lengths"].shape[0] for p in per_rank]
    first = sum(counts[:rank])
    return slice(first, first + counts[rank])


def check_close(what, got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {got.shape}, reference {want.shape}")
    bad = np.abs(got - want) > 1e-5 + 1e-4 * np.abs(want)  # sharded_harness.hpp's tolerance
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} values differ from the reference, first at {i}: {got[i]} vs "
                             f"{want[i]}")


def shard_slice(weights, state, kind, dim, local_rows, row_start, row_step, col_offset, local_dim):
    """The reference's rows of a shard: (weights (local_rows, local_dim), state (local_rows,
    optimizer_state_dim(kind, local_dim))): state block b's local column j is global state column
    b * dim + col_offset + j (rowwise_adagrad: its one column; a rank holding none: local_dim 0)."""
    idx = row_start + row_step * np.arange(local_rows)
    w = weights[idx][:, col_offset:col_offset + local_dim]
    s = state[idx]
    if kind != "rowwise_adagrad":
        blocks = s.shape[1] // dim  # sgd none, adagrad one block of dim columns, adam two (m and v)
        s = s[:, [b * dim + col_offset + j for b in range(blocks) for j in range(local_dim)]]
    return w, s


def expected_replicas(stype, info, world):
    if stype == "replicated":
        return list(range(world))
    if stype == "table":
        return [info["rank"]] if info["local_rows"] > 0 else []
    return [info["rank"]]


# ---- the equivalence scenario ----
def check_shards(store, ref, tables, rank, world):
    """Every table's shard (read_shard) against the reference's rows."""
    owners = []
    for t in tables:
        n = t["name"]
        info = store.shard_info(n)
        stype = t["sharding"]["type"]
        assert info["type"] == stype and info["world"] == world and info["rank"] == rank, (n, info)
        assert info["rows"] == t["rows"] and info["dim"] == t["dim"], (n, info)
        assert info["replicas"] == expected_replicas(stype, info, world), (n, info)
        if stype == "row":
            assert (info["row_start"], info["row_step"]) == (rank, world), (n, info)
            assert info["local_rows"] == len(range(rank, t["rows"], world)), (n, info)
        if info["local_rows"] > 0:
            owners.append(n)
            w, s = store.read_shard(n, 0, info["local_rows"])
            rw, rs = ref.read_rows(n)
            ew, es = shard_slice(rw, rs, t["optimizer"]["kind"], t["dim"], info["local_rows"], info["row_start"],
                                 info["row_step"], info["col_offset"], info["local_dim"])
            check_close(f"rank {rank} read_shard({n}) weights", w, ew)
            check_close(f"rank {rank} read_shard({n}) state", s, es)
    return owners


def store_steps(pg, seed, tables, rank, world, steps):
    """Steps through strata.Store with host views (NumPy), checked against the reference."""
    store = strata.Store(world_config(tables), process_group=pg, timeout=TIMEOUT)
    world_info = store.world
    assert world_info == {"rank": rank, "size": world, "kind": "torch", "backend": "gloo"}, world_info
    ref = strata.Store(reference_config(tables))
    names = [t["name"] for t in tables]
    for step in steps:
        per_rank, gfeatures, ggrads = global_batch(seed, step, world, tables)
        features, grads = per_rank[rank]
        store.submit(step, features)
        ref.submit(step, gfeatures)
        outs, routs = store.forward(step), ref.forward(step)
        for t, out, rout in zip(tables, outs, routs):
            check_close(f"rank {rank} step {step} Store output {t['name']}", out,
                        rout[output_slice(per_rank, rank, t)])
        store.backward(step, [grads[n] for n in names])
        ref.backward(step, [ggrads[n] for n in names])
    assert store.step == ref.step == len(steps)
    check_shards(store, ref, tables, rank, world)
    store.close()
    expect_error(RuntimeError, "a closed store", lambda: store.shard_info(names[0]), "store is closed")


def ebc_steps(seed, tables, rank, world, steps):
    """Steps through the EmbeddingBagCollection with autograd and a StepLR on sparse_optimizer();
    returns the module and the reference after them."""
    ebc = st.EmbeddingBagCollection(world_config(tables), timeout=TIMEOUT)  # the default group
    assert (ebc.rank, ebc.world_size) == (rank, world)
    ref = st.EmbeddingBagCollection(reference_config(tables), process_group=False)
    assert (ref.rank, ref.world_size) == (0, 1)
    scheds = [torch.optim.lr_scheduler.StepLR(m.sparse_optimizer(), step_size=1, gamma=0.5) for m in (ebc, ref)]
    for step in steps:
        per_rank, gfeatures, ggrads = global_batch(seed, step, world, tables)
        features, grads = per_rank[rank]
        out = ebc(features)
        rout = ref(gfeatures)
        for t in tables:
            n = t["name"]
            check_close(f"rank {rank} step {step} module output {n}", out[n].detach(),
                        rout[n].detach()[output_slice(per_rank, rank, t)])
        sum(((out[n] * torch.from_numpy(grads[n])).sum() for n in grads), torch.zeros(())).backward()
        sum(((rout[n] * torch.from_numpy(ggrads[n])).sum() for n in ggrads), torch.zeros(())).backward()
        for s in scheds:
            s.optimizer.step()
            s.step()  # a collective set_learning_rate on the world
    return ebc, ref


def check_state_dict(ebc, ref, tables, rank, world):
    sd, rsd = ebc.state_dict(), ref.state_dict()
    assert int(sd["step"]) == int(rsd["step"]), (sd["step"], rsd["step"])
    for t in tables:
        n = t["name"]
        p = f"embedding_bags.{n}."
        shard = sd[p + "shard"]
        assert shard.dtype == torch.int64 and shard.shape == (10,), (n, shard)
        w_, r_, stype, rows, dim, row_start, row_step, local_rows, col_offset, local_dim = shard.tolist()
        assert (w_, r_, stype, rows, dim) == (world, rank, SHARD_TYPE[t["sharding"]["type"]], t["rows"], t["dim"]), \
            (n, shard)
        replicas = sd[p + "replicas"].tolist()
        assert replicas == expected_replicas(t["sharding"]["type"], {"rank": rank, "local_rows": local_rows}, world), \
            (n, replicas)
        assert float(sd[p + "learning_rate"]) == float(rsd[p + "learning_rate"]), n
        rstate = rsd.get(p + "optimizer_state", torch.zeros((t["rows"], 0)))
        kind = t["optimizer"]["kind"]
        ew, es = shard_slice(rsd[p + "weight"].numpy(), rstate.numpy(), kind, dim, local_rows, row_start, row_step,
                             col_offset, local_dim)
        check_close(f"rank {rank} state_dict {p}weight", sd[p + "weight"], ew)
        # optimizer_state as one rank's: present unless the optimizer keeps none (sgd)
        assert (p + "optimizer_state" in sd) == (kind != "sgd"), (n, sorted(sd))
        if kind != "sgd":
            check_close(f"rank {rank} state_dict {p}optimizer_state", sd[p + "optimizer_state"], es)
    return sd


def state_dicts_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def across_world_sizes(ebc, ref, tables, sd, rank, world):
    """Every rank's state_dict merged (strata.torch.merge_state_dicts) holds the reference's whole
    tables; the world loads the whole tables back into its own shards; a one-rank module loads them
    as its own. Any world size M thus loads a world of N's state_dicts (whole tables into shards is
    the same per-rank slicing for every M)."""
    every = [None] * world
    dist.all_gather_object(every, sd)
    merged = st.merge_state_dicts(every)
    rsd = ref.state_dict()
    assert sorted(merged) == sorted(rsd), (sorted(merged), sorted(rsd))
    assert int(merged["step"]) == int(rsd["step"])
    for t in tables:
        p = f"embedding_bags.{t['name']}."
        check_close(f"rank {rank} merged {p}weight", merged[p + "weight"], rsd[p + "weight"].numpy())
        if p + "optimizer_state" in rsd:
            check_close(f"rank {rank} merged {p}optimizer_state", merged[p + "optimizer_state"],
                        rsd[p + "optimizer_state"].numpy())
        assert float(merged[p + "learning_rate"]) == float(rsd[p + "learning_rate"]), p
    # Whole entries are checked as a one-rank module checks them, on every rank before any writes.
    column = next(t["name"] for t in tables if t["sharding"]["type"] == "column")
    bad = dict(merged)
    bad[f"embedding_bags.{column}.weight"] = merged[f"embedding_bags.{column}.weight"].reshape(-1)
    expect_error(RuntimeError, "a flattened whole weight", lambda: ebc.load_state_dict(bad),
                 f"embedding_bags.{column}.weight has shape")
    bad = {k: v for k, v in merged.items() if k != f"embedding_bags.{column}.weight"}
    e = expect_error(RuntimeError, "a whole weight missing", lambda: ebc.load_state_dict(bad),
                     f"embedding_bags.{column}.weight")
    assert f"embedding_bags.{column}.shard" not in str(e), e
    assert state_dicts_equal(ebc.state_dict(), sd), "a refused load_state_dict changed the state"
    features, grads = rank_batch(33, 6, rank, tables)  # a step that changes the state first
    out = ebc(features)
    sum(((out[n] * torch.from_numpy(grads[n])).sum() for n in grads), torch.zeros(())).backward()
    assert not state_dicts_equal(ebc.state_dict(), sd)
    ebc.load_state_dict(merged)
    assert state_dicts_equal(ebc.state_dict(), sd), "the merged whole tables did not load back into the shards"
    one = st.EmbeddingBagCollection(reference_config(tables), process_group=False)
    one.load_state_dict(merged)
    assert state_dicts_equal(one.state_dict(), merged), "a one-rank module did not load the merged tables"


def equivalence(rank, world):
    seed = 33
    tables = world_tables()
    pg = dist.group.WORLD
    store_steps(pg, seed, tables, rank, world, steps=range(3))
    ebc, ref = ebc_steps(seed, tables, rank, world, steps=range(3, 5))
    sd = {k: v.clone() for k, v in check_state_dict(ebc, ref, tables, rank, world).items()}

    # A round trip: one more step changes the state, and loading sd restores it exactly.
    features, grads = rank_batch(seed, 5, rank, tables)
    out = ebc(features)
    sum(((out[n] * torch.from_numpy(grads[n])).sum() for n in grads), torch.zeros(())).backward()
    assert not state_dicts_equal(ebc.state_dict(), sd)
    ebc.load_state_dict(sd)
    assert state_dicts_equal(ebc.state_dict(), sd), "load_state_dict(state_dict()) did not restore the state"

    # A shard saved by another world is refused on every rank (torch's RuntimeError of load_state_dict),
    # before anything is written.
    foreign = dict(sd)
    row = next(t["name"] for t in tables if t["sharding"]["type"] == "row")
    shard = sd[f"embedding_bags.{row}.shard"].clone()
    shard[0] = world + 1
    foreign[f"embedding_bags.{row}.shard"] = shard
    foreign[f"embedding_bags.{row}.weight"] = sd[f"embedding_bags.{row}.weight"] + 1
    expect_error(RuntimeError, "a foreign shard", lambda: ebc.load_state_dict(foreign), f"embedding_bags.{row}.shard",
                 "a shard loads only into the rank that saved it", "merge_state_dicts")
    assert state_dicts_equal(ebc.state_dict(), sd), "a refused load_state_dict changed the state"
    across_world_sizes(ebc, ref, tables, sd, rank, world)
    ebc.close()
    if world == 3:
        comm_subset(rank, world)


# ---- dynamic tables (2 ranks) ----
def dynamic_tables():
    """A row-sharded dynamic table (keys by a hash; adagrad, sum) and a table-sharded one (rank 1's
    by its index; adam, mean), of capacities no shard fills (no eviction: the reference's single
    key index then holds the same keys as the shards together)."""
    return [{"name": "users", "kind": "dynamic", "capacity": 64, "dim": 4, "pooling": "sum", "placement": "gpu",
             "init": {"bound": 0.1, "seed": 5}, "optimizer": {"kind": "adagrad", "learning_rate": 0.1}},
            {"name": "items", "kind": "dynamic", "capacity": 48, "dim": 3, "pooling": "mean", "placement": "hybrid",
             "cache": {"rows": 4}, "sharding": {"type": "table"}, "init": {"bound": 0.1, "seed": 6},
             "optimizer": {"kind": "adam", "learning_rate": 0.05, "eps": 1e-8}}]


def dynamic_batch(step, rank, tables):
    """Rank `rank`'s batch and output gradients at `step`: keys from a pool of 24 int64 keys of any
    magnitude (shared by the ranks and the steps, so rows are updated by both ranks and again)."""
    pool = np.random.default_rng(7).integers(-2**62, 2**62, size=24)
    rng = np.random.default_rng([step, rank])
    features, grads = {}, {}
    for t in tables:
        lengths = rng.integers(0, 4, size=3).astype(np.int64)
        features[t["name"]] = {"keys": pool[rng.integers(0, len(pool), size=int(lengths.sum()))], "lengths": lengths}
        grads[t["name"]] = (rng.integers(-1000, 1001, size=(3, t["dim"])) / 1000).astype(np.float32)
    return features, grads


def dynamic_world(rank, world):
    """3 training steps of a 2-rank world against a one-rank cpu reference trained on the ranks'
    batches concatenated; each rank's state_dict holds its shard's keys (key_owner: its own) and
    rows; merge_state_dicts of both is the reference's state_dict (keys exactly, rows within the
    tolerance) and loads into a one-rank module and back into the world, as each rank's own
    state_dict does; a rank given the other rank's keys refuses naming the entry and a key, on
    every rank, nothing changed."""
    tables = dynamic_tables()
    ebc = st.EmbeddingBagCollection(world_config(tables), timeout=TIMEOUT)
    ref = st.EmbeddingBagCollection(reference_config(tables), process_group=False)
    for step in range(3):
        per_rank = [dynamic_batch(step, r, tables) for r in range(world)]
        features, grads = per_rank[rank]
        gfeatures = {t["name"]: {k: np.concatenate([p[0][t["name"]][k] for p in per_rank]) for k in ("keys", "lengths")}
                     for t in tables}
        out, rout = ebc(features), ref(gfeatures)
        for t in tables:
            n = t["name"]
            check_close(f"rank {rank} step {step} output {n}", out[n].detach(), rout[n].detach()[3 * rank:3 * rank + 3])
        sum((out[n] * torch.from_numpy(grads[n])).sum() for n in grads).backward()
        sum((rout[n] * torch.from_numpy(np.concatenate([p[1][n] for p in per_rank]))).sum() for n in grads).backward()
    sd = {k: v.clone() for k, v in ebc.state_dict().items()}
    rsd = ref.state_dict()
    for i, t in enumerate(tables):
        n, p = t["name"], f"embedding_bags.{t['name']}."
        keys = sd[p + "keys"]
        assert keys.dtype == torch.int64 and torch.equal(keys, keys.sort().values), (n, keys)
        assert np.array_equal(ebc.store.key_owner(n, keys.numpy()), np.full(len(keys), rank)), (n, keys)
        shard_type = SHARD_TYPE[t.get("sharding", {"type": "row"})["type"]]
        shard_capacity = t["capacity"] // world if shard_type == 2 else t["capacity"] * (rank == i % world)
        assert sd[p + "shard"].tolist() == [world, rank, shard_type, t["capacity"], t["dim"], shard_capacity], \
            (n, sd[p + "shard"])
        assert p + "replicas" not in sd and sd[p + "weight"].shape == (len(keys), t["dim"]), (n, sorted(sd))
    every = [None] * world
    dist.all_gather_object(every, sd)
    merged = st.merge_state_dicts(every)
    assert sorted(merged) == sorted(rsd), (sorted(merged), sorted(rsd))
    assert int(merged["step"]) == int(rsd["step"]) == 3
    for t in tables:
        p = f"embedding_bags.{t['name']}."
        assert torch.equal(merged[p + "keys"], rsd[p + "keys"]), (p, merged[p + "keys"], rsd[p + "keys"])
        for e in ("weight", "optimizer_state"):
            check_close(f"rank {rank} merged {p}{e}", merged[p + e], rsd[p + e].numpy())
        assert float(merged[p + "learning_rate"]) == float(rsd[p + "learning_rate"]), p

    # A key of rank 0's shard given to rank 1 (its own state_dict with rank 0's users entries): refused on
    # both ranks, rank 1 naming the entry and a key, nothing loaded.
    p = "embedding_bags.users."
    bad = dict(sd)
    if rank == 1:
        bad.update({p + e: every[0][p + e] for e in ("keys", "weight", "optimizer_state")})
    needles = ([f"{p}keys holds key {int(every[0][p + 'keys'][0])}, of rank 0's shard of table 'users'"] if rank == 1
               else ["rank 1 of 2 refused its state_dict"])
    expect_error(RuntimeError, "a key of another rank's shard", lambda: ebc.load_state_dict(bad), *needles)
    assert state_dicts_equal(ebc.state_dict(), sd), "a refused load_state_dict changed the state"

    one = st.EmbeddingBagCollection(reference_config(tables), process_group=False)
    one.load_state_dict(merged)
    assert state_dicts_equal(one.state_dict(), merged), "a one-rank module did not load the merged tables"
    features, grads = dynamic_batch(9, rank, tables)  # a step that changes the state (and admits new keys) first
    out = ebc(features)
    sum((out[n] * torch.from_numpy(grads[n])).sum() for n in grads).backward()
    assert not state_dicts_equal(ebc.state_dict(), sd)
    ebc.load_state_dict(merged)
    assert state_dicts_equal(ebc.state_dict(), sd), "the merged whole tables did not load back into the shards"
    out = ebc(features)  # and each rank's own shard loads back into it
    sum((out[n] * torch.from_numpy(grads[n])).sum() for n in grads).backward()
    ebc.load_state_dict(sd)
    assert state_dicts_equal(ebc.state_dict(), sd), "load_state_dict(state_dict()) did not restore the shards"
    ebc.close()


# ---- the transport communicator by itself (strata._strata._WorldComm, test-only) ----
def comm_subset(rank, world):
    """A conformance subset over the process group: all_to_all_v with uneven and zero counts (the
    own share included), all_gather, broadcast from each root, all_reduce, counters, and a size
    mismatch that every rank reports."""
    comm = strata._strata._WorldComm(dist.group.WORLD, TIMEOUT)
    assert (comm.rank, comm.size) == (rank, world)
    calls = comm.counters()["calls"]
    send_counts = [(rank + q) % world for q in range(world)]  # rank r sends (r + q) % n bytes to q: zeros too
    recv_counts = [(q + rank) % world for q in range(world)]
    send = np.concatenate([np.full(c, 16 * rank + q, np.uint8) for q, c in enumerate(send_counts)])
    recv = np.full(sum(recv_counts), 255, np.uint8)
    comm.all_to_all_v(send, send_counts, np.cumsum([0] + send_counts[:-1]).tolist(), recv, recv_counts,
                      np.cumsum([0] + recv_counts[:-1]).tolist())
    want = np.concatenate([np.full(c, 16 * q + rank, np.uint8) for q, c in enumerate(recv_counts)])
    assert np.array_equal(recv, want), (recv, want)
    gathered = comm.all_gather(np.full(3, rank, np.uint8))
    assert np.array_equal(gathered, np.repeat(np.arange(world, dtype=np.uint8), 3)), gathered
    for root in range(world):
        data = np.full(5, 10 + rank, np.uint8)
        comm.broadcast(data, root)
        assert np.array_equal(data, np.full(5, 10 + root, np.uint8)), (root, data)
    x = np.array([rank + 0.25, -rank], np.float64)
    comm.all_reduce(x, "sum")
    assert x.tolist() == [sum(q + 0.25 for q in range(world)), -sum(range(world))], x
    m = np.array([rank, -rank], np.int64)
    comm.all_reduce(m, "max")
    assert m.tolist() == [world - 1, 0], m
    counters = comm.counters()
    assert counters["calls"] > calls and counters["sent_bytes"] > 0 and counters["received_bytes"] > 0, counters
    expect_error(ValueError, "all_gather sizes that differ",
                 lambda: comm.all_gather(np.zeros(4 if rank == 1 else 3, np.uint8)), "ranks disagree", "rank 1: 4")


# ---- world checkpoints: Store.save on one world, Store.load on another ----
def whole_tables(store, tables):
    """Every table's rows and optimizer state (read_rows: a collective, the whole table on every
    rank), each table's learning rate and the step, as the arrays of an .npz."""
    out = {"step": np.array(store.step)}
    for t in tables:
        n = t["name"]
        out[f"weight_{n}"], out[f"state_{n}"] = store.read_rows(n)
        out[f"rate_{n}"] = np.array(store.learning_rate(n), np.float32)
    return out


def checkpoint_save(rank, world, ckpt, rows):
    """Two steps (every optimizer's state moves), one table's rate changed, then the collective save."""
    tables = world_tables()
    store = strata.Store(world_config(tables), process_group=dist.group.WORLD, timeout=TIMEOUT)
    for step in range(2):
        features, grads = rank_batch(21, step, rank, tables)
        store.submit(step, features)
        store.forward(step)
        store.backward(step, [grads[t["name"]] for t in tables])
    store.set_learning_rate(0.025, tables[0]["name"])
    store.save(ckpt)
    saved = whole_tables(store, tables)
    if rank == 0:
        np.savez(rows, **saved)
    store.close()


def checkpoint_load(rank, world, ckpt, rows):
    """A store of another init (and world size) loads the checkpoint: every rank then holds exactly
    the saver's tables, step and rates."""
    tables = world_tables()
    for t in tables:
        t["init"] = {"bound": 0.3, "seed": 99}
    store = strata.Store(world_config(tables), process_group=dist.group.WORLD, timeout=TIMEOUT)
    saved = np.load(rows)
    assert not np.array_equal(store.read_rows(tables[0]["name"])[0], saved[f"weight_{tables[0]['name']}"])
    store.load(ckpt)
    got = whole_tables(store, tables)
    for k in saved.files:
        assert np.array_equal(got[k], saved[k]), f"rank {rank} of {world}: {k} differs from the saver's"
    store.close()


# ---- faults (3 ranks) ----
def small_config(rows=30):
    tables = [{"name": "user", "rows": rows, "dim": 4, "placement": "gpu", "sharding": {"type": "row"},
               "optimizer": {"kind": "adagrad", "learning_rate": 0.1}},
              {"name": "item", "rows": 17, "dim": 4, "placement": "hybrid", "cache": {"rows": 4},
               "sharding": {"type": "table"}, "optimizer": {"kind": "sgd", "learning_rate": 0.1}}]
    return world_config(tables)


def one_step(store, batch_id, rank):
    rng = np.random.default_rng([batch_id, rank])
    features = {"user": {"keys": rng.integers(0, 30, 6), "lengths": np.full(3, 2)},
                "item": {"keys": rng.integers(0, 17, 3), "lengths": np.ones(3, np.int64)}}
    store.submit(batch_id, features)
    outs = store.forward(batch_id)
    store.backward(batch_id, [np.ones_like(o) for o in outs])


def submit(store, batch_id, rank):
    rng = np.random.default_rng([batch_id, rank])
    store.submit(batch_id, {"user": {"keys": rng.integers(0, 30, 6), "lengths": np.full(3, 2)},
                            "item": {"keys": rng.integers(0, 17, 3), "lengths": np.ones(3, np.int64)}})


def fault_config(rank, world):
    """Rank 2's config has other rows; a set_learning_rate differing on rank 1; then rank 1 raises
    out of the program before a forward."""
    pg = dist.group.WORLD
    expect_error(ValueError, "configs that differ", lambda: strata.Store(small_config(31 if rank == 2 else 30),
                                                                          process_group=pg, timeout=TIMEOUT),
                 "rank 2", "rows")
    store = strata.Store(small_config(), process_group=pg, timeout=TIMEOUT)  # a matching open works
    one_step(store, 0, rank)
    expect_error(Exception, "a learning rate differing on rank 1",
                 lambda: store.set_learning_rate(0.2 if rank == 1 else 0.1, "user"), "rank 1")
    submit(store, 1, rank)
    if rank == 1:
        say(f"EVENT {time.time():.3f}")
        raise RuntimeError("rank 1 raises out of the program before forward (the test's fault)")
    expect_error(RuntimeError, "a peer that raised and exited", lambda: store.forward(1), "peer left")


def fault_kill(rank, world):
    """Rank 1 is SIGKILLed between submit and forward."""
    store = strata.Store(small_config(), process_group=dist.group.WORLD, timeout=TIMEOUT)
    one_step(store, 0, rank)
    submit(store, 1, rank)
    if rank == 1:
        say(f"EVENT {time.time():.3f}")
        os.kill(os.getpid(), signal.SIGKILL)
    expect_error(RuntimeError, "a peer SIGKILLed", lambda: store.forward(1), "peer left")


def fault_sleep(rank, world):
    """Rank 2 sleeps past timeout=3 between submit and forward."""
    store = strata.Store(small_config(), process_group=dist.group.WORLD, timeout=3)
    one_step(store, 0, rank)
    submit(store, 1, rank)
    if rank == 2:
        say(f"EVENT {time.time():.3f}")
        time.sleep(8)
        try:  # the others have given up: any error, but no hang
            store.forward(1)
        except Exception as e:
            say(f"LATE {type(e).__name__}: {e}")
        return
    expect_error(RuntimeError, "a peer that sleeps past the timeout", lambda: store.forward(1),
                 "timed out after 3000 ms")


SCENARIOS = {"equivalence": equivalence, "dynamic": dynamic_world, "save": checkpoint_save, "load": checkpoint_load,
             "config": fault_config, "kill": fault_kill, "sleep": fault_sleep}


def main():
    scenario, rank, world, init_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    SCENARIOS[scenario](rank, world, *sys.argv[5:])
    say(f"OK {scenario}")


if __name__ == "__main__":
    main()
