"""Dynamic tables from Python (issue 36): strata.Store's keys_held, read_keys, write_keys and
stats()["dynamic"], and strata.torch.EmbeddingBagCollection training a dynamic table (admission on
first use, admit_after, evaluation batches admitting nothing), its state_dict entries (keys,
weight, optimizer_state) and their round trip, and the refusals of bad input."""

import numpy as np
import pytest
import torch

import strata
import strata.torch as st
from conftest import FakeKJT, config, table

INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
DIM = 4


def dynamic_table(name, capacity, optimizer="sgd", lr=0.1, **options):
    """A dynamic table of the cpu placement (the default; every placement serves them), initialized as conftest's
    dense tables are (init seed 1, bound 0.1)."""
    t = table(name, capacity, DIM, optimizer=optimizer, lr=lr)
    del t["rows"]
    t.update(kind="dynamic", capacity=capacity, **options)
    return t


def bags(*keys):
    """One feature of one key per bag."""
    return {"keys": torch.tensor(keys, dtype=torch.int64), "lengths": torch.ones(len(keys), dtype=torch.int64)}


def initial_rows(name, keys, optimizer="sgd"):
    """What dense rows `keys` of a table named `name` start as: a dynamic table's new row of key k."""
    dense = strata.Store(config([table(name, max(keys) + 1, DIM, optimizer=optimizer)]))
    return dense.read_rows(name)[0][list(keys)]


def test_store_keys_held_read_keys_and_stats():
    s = strata.Store(config([dynamic_table("u", 8, optimizer="adagrad"), table("d", 5, DIM)]))
    held = s.keys_held("u")
    assert held.dtype == np.int64 and held.shape == (0,)
    s.submit(0, {"u": {"keys": np.array([INT64_MAX, 7, INT64_MIN, 7]), "lengths": np.array([2, 2])}})
    out = s.forward(0)
    s.backward(0, [np.ones_like(o) for o in out])
    held = s.keys_held("u")
    assert held.dtype == np.int64 and held.tolist() == [INT64_MIN, 7, INT64_MAX]
    w, state = s.read_keys("u", held)
    assert w.shape == (3, DIM) and state.shape == (3, DIM)
    np.testing.assert_array_equal(state[1], np.full(DIM, 4.0, np.float32))  # adagrad: key 7's two uses, grad 1 each
    out_w, out_s = np.empty((2, DIM), np.float32), np.empty((2, DIM), np.float32)
    ret = s.read_keys("u", torch.tensor([INT64_MAX, INT64_MIN]), out=out_w, state_out=out_s)
    assert ret[0] is out_w and ret[1] is out_s
    np.testing.assert_array_equal(out_w, w[[2, 0]])
    assert s.read_keys("u", np.array([], np.int64))[0].shape == (0, DIM)
    assert s.stats()["dynamic"] == {"u": {"rows": 3, "capacity": 8, "admissions": 3, "evictions": 0,
                                          "expirations": 0, "not_admitted": 0, "unseen": 0,
                                          "index_bytes": s.stats()["dynamic"]["u"]["index_bytes"]}}
    assert s.stats()["dynamic"]["u"]["index_bytes"] > 0


def test_store_bad_arguments_name_what_is_wrong():
    s = strata.Store(config([dynamic_table("u", 8), table("d", 5, DIM)]))
    s.submit(0, {"u": bags(-5)})
    s.discard(0)
    with pytest.raises(ValueError, match=r"table 'u': key 3 at position 1 has no row \(expected keys that keys_held"):
        s.read_keys("u", [-5, 3])
    with pytest.raises(TypeError, match=r"table 'u': keys has dtype float64 \(expected int64 or int32\)"):
        s.read_keys("u", np.array([1.0]))
    with pytest.raises(ValueError, match=r"table 'u': keys has shape \(1, 1\) \(expected 1-D\)"):
        s.read_keys("u", np.zeros((1, 1), np.int64))
    with pytest.raises(TypeError, match=r"table 'u': keys has dtype uint64"):
        s.write_keys("u", np.array([1], np.uint64), np.zeros((1, DIM), np.float32))
    with pytest.raises(ValueError, match=r"table 'u': out has shape \(1, 5\) \(expected \(1, 4\)\)"):
        s.read_keys("u", [-5], out=np.zeros((1, 5), np.float32))
    with pytest.raises(TypeError, match="table is a int"):
        s.keys_held(0)
    with pytest.raises(ValueError, match="table 'd': keys_held of a dense table"):
        s.keys_held("d")
    with pytest.raises(ValueError, match="table 'd': read_keys of a dense table"):
        s.read_keys("d", [0])
    with pytest.raises(ValueError, match="read_rows of a dynamic table"):
        s.read_rows("u")
    with pytest.raises(ValueError, match=r"table 'u': weights has 1 rows for 2 keys \(expected one row per key"):
        s.write_keys("u", [1, 2], np.zeros((1, DIM), np.float32))
    with pytest.raises(TypeError, match=r"table 'u': weights has dtype float64 \(expected float32\)"):
        s.write_keys("u", [1], np.zeros((1, DIM)))
    with pytest.raises(ValueError, match=r"table 'u': state given, but optimizer sgd keeps no state"):
        s.write_keys("u", [1], np.zeros((1, DIM), np.float32), np.zeros((1, DIM), np.float32))
    assert s.keys_held("u").tolist() == [-5]


def test_store_write_keys_makes_the_table_hold_exactly_those_keys():
    s = strata.Store(config([dynamic_table("u", 4, optimizer="adagrad")]))
    for key in (9, 10):
        s.submit(0, {"u": bags(key)})
        s.backward(0, [np.ones_like(o) for o in s.forward(0)])
    state9 = s.read_keys("u", [9])[1]
    w = np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM)
    s.write_keys("u", np.array([INT64_MAX, 9, INT64_MIN]), w)  # key 10 goes; 9 stays
    assert s.keys_held("u").tolist() == [INT64_MIN, 9, INT64_MAX]
    got_w, got_s = s.read_keys("u", [INT64_MAX, 9, INT64_MIN])
    np.testing.assert_array_equal(got_w, w)
    # Without state: a key held keeps its own, a new one gets the initial state (adagrad's 0).
    np.testing.assert_array_equal(got_s, np.concatenate([np.zeros((1, DIM)), state9, np.zeros((1, DIM))]))
    with pytest.raises(ValueError, match=r"table 'u'.* key 1 .*distinct"):
        s.write_keys("u", [1, 1], np.zeros((2, DIM), np.float32))
    with pytest.raises(ValueError, match=r"table 'u'.* 5 keys .*capacity"):
        s.write_keys("u", np.arange(5), np.zeros((5, DIM), np.float32))
    assert s.keys_held("u").tolist() == [INT64_MIN, 9, INT64_MAX]


def test_torch_new_key_starts_at_its_initial_row_and_trains():
    m = st.EmbeddingBagCollection(config([dynamic_table("u", 8)]))
    keys = (INT64_MIN, 3, INT64_MAX)
    out = m(FakeKJT({"u": {"keys": np.array(keys), "lengths": np.ones(3, np.int64)}}))["u"]
    # Key 3's new row is what dense row 3 of a table of that name starts as.
    np.testing.assert_array_equal(out[1].detach().numpy(), initial_rows("u", [3])[0])
    before = out.detach().numpy().copy()
    out.sum().backward()  # sgd, lr 0.1: each row minus 0.1
    assert m.store.keys_held("u").tolist() == sorted(keys)
    np.testing.assert_allclose(m.store.read_keys("u", list(keys))[0], before - 0.1, rtol=0, atol=1e-7)
    assert m.store.stats()["dynamic"]["u"]["admissions"] == 3


def test_torch_admit_after_keeps_the_initial_output_and_drops_the_gradient():
    m = st.EmbeddingBagCollection(config([dynamic_table("u", 8, admit_after=2)]))
    init = initial_rows("u", [5])[0]
    out = m({"u": bags(5)})["u"]
    np.testing.assert_array_equal(out[0].detach().numpy(), init)
    out.sum().backward()  # dropped: key 5 has no row yet
    assert m.store.keys_held("u").size == 0 and m.store.stats()["dynamic"]["u"]["not_admitted"] == 1
    out = m({"u": bags(5)})["u"]  # its second use: admitted, starting at its initial row
    np.testing.assert_array_equal(out[0].detach().numpy(), init)
    out.sum().backward()
    assert m.store.keys_held("u").tolist() == [5]
    np.testing.assert_allclose(m.store.read_keys("u", [5])[0][0], init - 0.1, rtol=0, atol=1e-7)


def test_torch_evaluation_admits_nothing():
    m = st.EmbeddingBagCollection(config([dynamic_table("u", 8)]))
    m({"u": bags(1)})["u"].sum().backward()
    m.eval()
    out = m({"u": bags(1, 2, 2)})["u"]  # eval mode: key 2 is unseen twice, read at its initial row
    np.testing.assert_array_equal(out[1].numpy(), initial_rows("u", [2])[0])
    m.train()
    with torch.no_grad():
        m({"u": bags(3)})
    assert m.store.keys_held("u").tolist() == [1] and m.store.in_flight == 0
    stats = m.store.stats()["dynamic"]["u"]
    assert (stats["unseen"], stats["admissions"], stats["not_admitted"]) == (3, 1, 0)


def test_torch_batch_submitted_for_evaluation_is_refused_for_training_and_retired():
    m = st.EmbeddingBagCollection(config([dynamic_table("u", 8)]))
    m.eval()
    batch = m.submit({"u": bags(4)})
    m.train()
    with pytest.raises(RuntimeError, match="submitted for evaluation .* submit it again in training mode"):
        m(batch)
    assert m.store.in_flight == 0 and m.store.keys_held("u").size == 0


def train_steps(m, batches):
    for b in batches:
        out = m(b)
        sum(o.float().pow(2).sum() for o in out.to_dict().values()).backward()


def batches(rng, n, new_keys=4):
    """Batches of a dynamic table ("u": keys anywhere in int64, a few near its ends) and a dense one."""
    pool = np.concatenate([[INT64_MIN, INT64_MIN + 1, INT64_MAX], rng.integers(INT64_MIN, INT64_MAX, new_keys)])
    out = []
    for _ in range(n):
        u = rng.choice(pool, size=6)
        out.append({"u": {"keys": torch.from_numpy(u), "lengths": torch.tensor([2, 1, 3])},
                    "d": {"keys": torch.from_numpy(rng.integers(0, 6, 3)), "lengths": torch.tensor([1, 1, 1])}})
    return out


def same_bits(a, b):
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(view.get(a.dtype, a.dtype)),
                                                                     b.view(view.get(b.dtype, b.dtype)))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_state_dict_entries_of_a_dynamic_table(dtype):
    cfg = config([dict(dynamic_table("u", 16, optimizer="adam"), dtype=dtype, state_dtype=dtype),
                  table("d", 6, DIM, optimizer="adagrad")])
    m = st.EmbeddingBagCollection(cfg)
    train_steps(m, batches(np.random.default_rng(1), 3))
    sd = m.state_dict()
    keys = sd["embedding_bags.u.keys"]
    want = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    assert keys.dtype == torch.int64 and keys.tolist() == m.store.keys_held("u").tolist() == sorted(keys.tolist())
    assert sd["embedding_bags.u.weight"].dtype == want and sd["embedding_bags.u.weight"].shape == (len(keys), DIM)
    assert sd["embedding_bags.u.optimizer_state"].dtype == want
    assert sd["embedding_bags.u.optimizer_state"].shape == (len(keys), 2 * DIM)
    w, s = m.store.read_keys("u", keys)
    np.testing.assert_array_equal(sd["embedding_bags.u.weight"].float().numpy(), w)
    np.testing.assert_array_equal(sd["embedding_bags.u.optimizer_state"].float().numpy(), s)
    assert "embedding_bags.d.keys" not in sd and sd["embedding_bags.d.weight"].shape == (6, DIM)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_state_dict_round_trip_loses_nothing(dtype):
    cfg = config([dict(dynamic_table("u", 16, optimizer="adam"), dtype=dtype, state_dtype=dtype),
                  table("d", 6, DIM, optimizer="adagrad")])
    rng = np.random.default_rng(2)
    m = st.EmbeddingBagCollection(cfg)
    train_steps(m, batches(rng, 3))
    sd = m.state_dict()
    n = st.EmbeddingBagCollection(cfg)
    n({"u": bags(42), "d": bags(0)})["u"].sum().backward()  # a key the state_dict does not hold: dropped
    n.load_state_dict(sd)
    got = n.state_dict()
    assert list(got) == list(sd) and all(same_bits(got[k], sd[k]) for k in sd)
    later = batches(rng, 3, new_keys=2)  # keys held, and new ones
    train_steps(m, later)
    train_steps(n, later)
    after_m, after_n = m.state_dict(), n.state_dict()
    assert all(same_bits(after_m[k], after_n[k]) for k in after_m)


def test_load_state_dict_refuses_entries_of_the_other_kind_naming_the_table():
    cfg = config([dynamic_table("u", 4), table("d", 6, DIM)])
    m = st.EmbeddingBagCollection(cfg)
    m({"u": bags(7), "d": bags(1)})["u"].sum().backward()
    sd = m.state_dict()
    keys, w = sd["embedding_bags.u.keys"], sd["embedding_bags.u.weight"]
    dense_w = sd["embedding_bags.d.weight"]
    cases = [
        ({"embedding_bags.u.keys": None, "embedding_bags.u.weight": torch.zeros(4, DIM)},
         r"embedding_bags.u.weight without embedding_bags.u.keys: table 'u' is dynamic"),
        ({"embedding_bags.d.keys": torch.arange(6)}, r"embedding_bags.d.keys given, but table 'd' is dense"),
        ({"embedding_bags.u.keys": torch.tensor([7, 8])},
         r"embedding_bags.u.weight has shape \(1, 4\) \(expected \(2, 4\): one row per key of embedding_bags.u.keys"),
        ({"embedding_bags.u.keys": keys.float()}, r"embedding_bags.u.keys is a torch.float32 tensor"),
        ({"embedding_bags.u.keys": keys.reshape(1, 1).numpy()},
         r"embedding_bags.u.keys has dtype int64 and shape \(1, 1\)"),
        ({"embedding_bags.u.keys": torch.tensor([3, 3]), "embedding_bags.u.weight": torch.zeros(2, DIM)},
         r"embedding_bags.u.keys holds key 3 more than once"),
        ({"embedding_bags.u.keys": torch.arange(5), "embedding_bags.u.weight": torch.zeros(5, DIM)},
         r"embedding_bags.u.keys holds 5 keys \(expected .* at most the table's capacity 4"),
    ]
    for change, error in cases:
        bad = {k: v for k, v in {**sd, **change}.items() if v is not None}
        with pytest.raises(RuntimeError, match=error):
            m.load_state_dict(bad)
        with pytest.raises(RuntimeError, match=error):
            m.load_state_dict(bad, strict=False)
    assert m.store.keys_held("u").tolist() == keys.tolist()
    np.testing.assert_array_equal(m.store.read_keys("u", keys)[0], w.numpy())
    np.testing.assert_array_equal(m.store.read_rows("d")[0], dense_w.numpy())


@pytest.mark.parametrize("mode", ["offload", "cached", "gpu"])
def test_device_placements_train_as_cpu_bit_for_bit(mode):
    """A dynamic table of a device placement (emu) next to a dense one trains as the cpu placement does, bit for bit:
    outputs each step and the state_dict at the end, with evictions (capacity 5 of 7 keys) and a cache of 2 rows."""
    def cfg(m):
        u = dict(dynamic_table("u", 5, optimizer="adagrad"), placement=m)
        if m == "cached":
            u["cache"] = {"rows": 2}
        return config([u, table("d", 6, DIM, optimizer="adagrad", mode=m)], mode=m)
    cpu, dev = st.EmbeddingBagCollection(cfg("cpu")), st.EmbeddingBagCollection(cfg(mode))
    for b in batches(np.random.default_rng(3), 12):
        a, z = cpu(b), dev(b)
        assert all(same_bits(a[k], z[k].cpu()) for k in ("u", "d"))
        for out in (a, z):
            sum(o.float().pow(2).sum() for o in out.to_dict().values()).backward()
    assert dev.store.stats()["dynamic"]["u"]["evictions"] > 0
    want, got = cpu.state_dict(), dev.state_dict()
    assert list(got) == list(want) and all(same_bits(got[k], want[k]) for k in want)


def test_store_key_owner_without_a_world_is_rank_0():
    """Store.key_owner: every key's owner is rank 0 in a store without a world (test_world.py asks a world's);
    a dense table is refused."""
    s = strata.Store(config([dynamic_table("u", 8), table("d", 5, DIM)]))
    owners = s.key_owner("u", np.array([INT64_MIN, -1, 0, INT64_MAX]))
    assert owners.dtype == np.int32 and owners.tolist() == [0, 0, 0, 0]
    assert s.key_owner("u", torch.tensor([], dtype=torch.int64)).shape == (0,)
    with pytest.raises(ValueError, match=r"table 'd': key_owner of a dense table \(expected a dynamic table\)"):
        s.key_owner("d", [0])
    with pytest.raises(TypeError, match=r"table 'u': keys has dtype float64"):
        s.key_owner("u", np.array([1.0]))
