"""strata.Store from Python: the C++ API with NumPy arrays and CPU tensors; every bad input raises
the fitting exception with the Status message and changes nothing."""

import numpy as np
import pytest
import torch

import strata
from conftest import config, random_feature, table


def open_store(mode="cpu", optimizer="adagrad"):
    return strata.Store(config([table("a", 20, 4, optimizer=optimizer, mode=mode),
                                table("b", 10, 3, pooling="mean", optimizer=optimizer, mode=mode)], mode))


def snapshot(s):
    rows = {n: s.read_rows(n) for n in ("a", "b")}
    return {"rows": {n: (w.copy(), st.copy()) for n, (w, st) in rows.items()}, "step": s.step,
            "in_flight": s.in_flight, "lr": (s.learning_rate("a"), s.learning_rate("b"))}


def assert_same(x, y):
    assert x["step"] == y["step"] and x["in_flight"] == y["in_flight"] and x["lr"] == y["lr"]
    for n in x["rows"]:
        np.testing.assert_array_equal(x["rows"][n][0], y["rows"][n][0])
        np.testing.assert_array_equal(x["rows"][n][1], y["rows"][n][1])


def good_batch():
    return {"a": {"keys": np.array([1, 2, 2, 19]), "lengths": np.array([2, 0, 2])},
            "b": {"keys": np.array([3, 4]), "offsets": np.array([0, 1, 1, 2])}}


def test_train_step_and_config_round_trip(tmp_path):
    s = open_store()
    s.submit(0, good_batch())
    outs = s.forward(0)
    assert [o.shape for o in outs] == [(3, 4), (3, 3)] and all(o.dtype == np.float32 for o in outs)
    before = s.read_rows("a", 1, 2)[0].copy()
    s.backward(0, [np.ones((3, 4), np.float32), np.ones((3, 3), np.float32)])
    assert s.step == 1 and s.in_flight == 0
    assert not np.array_equal(before, s.read_rows("a", 1, 2)[0])
    assert s.config["tables"][1]["pooling"] == "mean"
    assert strata.Store(s.config).config == s.config  # the config dict opens an equal store
    # Same outputs from int32 keys, torch tensors and strided arrays.
    variants = [
        {"a": {"keys": np.array([1, 2, 2, 19], np.int32), "lengths": np.array([2, 0, 2], np.int32)}},
        {"a": {"values": torch.tensor([1, 2, 2, 19]), "lengths": torch.tensor([2, 0, 2])}},
        {"a": {"keys": np.array([1, 0, 2, 0, 2, 0, 19, 0])[::2], "offsets": np.array([0, 2, 2, 4])}},
    ]
    results = []
    for i, v in enumerate(variants):
        s.submit(10 + i, v)
        results.append(s.forward(10 + i)[0])
        s.discard(10 + i)
    for r in results[1:]:
        np.testing.assert_array_equal(results[0], r)


def test_forward_writes_into_given_tensors():
    s = open_store()
    s.submit(0, good_batch())
    outs = [torch.full((3, 4), 7.0), torch.full((3, 3), 7.0)]
    returned = s.forward(0, [o.numpy() for o in outs])
    assert np.shares_memory(returned[0], outs[0].numpy())
    np.testing.assert_array_equal(outs[0].numpy(), s.forward(0)[0])


def test_outputs_must_be_arrays_or_tensors():
    """forward(outputs=...) and read_rows(out=...) write into what they are given: a list would be
    converted into a temporary copy (freed while the store writes into it, and never seen by the
    caller), so it is refused; arrays and tensors are written in place."""
    s = open_store()
    s.submit(0, good_batch())
    before = snapshot(s)
    lists = [[[np.float32(0)] * 4] * 3, [[np.float32(0)] * 3] * 3]
    with pytest.raises(TypeError, match=r"outputs\[0\] is a list \(expected a float32, float16 or bfloat16 NumPy "
                                        r"array or CPU torch tensor to write into\)"):
        s.forward(0, lists)
    with pytest.raises(TypeError, match=r"outputs\[1\] is a list"):
        s.forward(0, [np.zeros((3, 4), np.float32), lists[1]])
    with pytest.raises(TypeError, match="table 'a': out is a list"):
        s.read_rows("a", 0, 2, out=[[np.float32(0)] * 4] * 2)
    with pytest.raises(TypeError, match="table 'a': state_out is a list"):
        s.read_rows("a", 0, 2, state_out=[[np.float32(0)] * 4] * 2)
    assert_same(before, snapshot(s))
    # Tensors themselves (not only their numpy() views) are written in place.
    outs = [torch.full((3, 4), 7.0, requires_grad=True), torch.full((3, 3), 7.0)]
    s.forward(0, outs)
    np.testing.assert_array_equal(outs[0].detach().numpy(), s.forward(0)[0])
    with pytest.raises(ValueError, match="not C-contiguous"):
        s.forward(0, [torch.zeros(4, 3).t(), outs[1]])
    rows = torch.zeros(2, 4)
    s.read_rows("a", 1, 2, out=rows)
    np.testing.assert_array_equal(rows.numpy(), s.read_rows("a", 1, 2)[0])
    s.discard(0)


def test_weighted_and_strided_gradients():
    s, t = open_store(), open_store()
    f = {"a": {"keys": np.array([1, 2, 3]), "lengths": np.array([1, 2]), "weights": np.array([0.5, 2, 1], np.float32)}}
    g = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
    for store, grad in ((s, g[:, ::2]), (t, np.ascontiguousarray(g[:, ::2]))):
        store.submit(0, f)
        store.forward(0)
        store.backward(0, [grad])  # a strided gradient is read through one copy
    np.testing.assert_array_equal(s.read_rows("a")[0], t.read_rows("a")[0])


def test_rows_npy_checkpoint_and_learning_rate(tmp_path):
    s = open_store()
    w = np.random.default_rng(1).uniform(-1, 1, size=(20, 4)).astype(np.float32)
    s.write_rows("a", 0, w, np.full((20, 4), 0.5, np.float32))
    np.testing.assert_array_equal(s.read_rows("a")[0], w)
    np.testing.assert_array_equal(s.read_rows("a", 5, 3)[1], np.full((3, 4), 0.5, np.float32))
    out = np.zeros((2, 4), np.float32)
    s.read_rows("a", 2, 2, out=out)
    np.testing.assert_array_equal(out, w[2:4])
    s.export_npy("a", tmp_path / "a.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), w)
    s.set_learning_rate(0.25, "b")
    s.set_learning_rate(0.5)
    s.set_learning_rate(0.125, "a")
    s.save(tmp_path / "ckpt")
    t = open_store()
    t.load(str(tmp_path / "ckpt"))
    assert (t.learning_rate("a"), t.learning_rate("b")) == (0.125, 0.5)
    assert_same(snapshot(s), snapshot(t))
    np.save(tmp_path / "b.npy", np.ones((10, 3), np.float32))
    t.import_npy("b", tmp_path / "b.npy")
    np.testing.assert_array_equal(t.read_rows("b")[0], np.ones((10, 3), np.float32))


def test_stats_of_a_cached_store():
    s = open_store("cached")
    rng = np.random.default_rng(0)
    for i in range(5):
        s.submit(i, {"a": random_feature(rng, 20, 4)})
        s.forward(i)
        s.discard(i)
    st = s.stats()
    assert st["device"] == "emu" and st["cache"]["a"]["accesses"] > 0 and st["links"]["h2d"] > 0
    assert st["cache"]["a"]["bypassed"] == 0  # every batch's rows fit the 13 cache rows


def test_stats_say_where_each_engine_and_table_lives():
    s = strata.Store(config([table("a", 20, 4), table("b", 30, 8, mode="cached", cache_rows=5)], "cached"))
    s.write_rows("a", 0, np.ones((20, 4), np.float32))  # touches a's pages
    st = s.stats()
    assert sorted(e["engine"] for e in st["numa_engines"]) == ["cached", "cpu"]
    assert set(st["numa"]) == {"memory_node", "thread_node", "pinned_node", "note"}
    tables = {t["table"]: t for t in st["numa_tables"]}
    assert set(tables) == {"a", "b"}  # b: the cached table's host tier
    assert (tables["a"]["engine"], tables["a"]["placement"]) == ("cpu", "cpu")
    assert (tables["b"]["engine"], tables["b"]["placement"]) == ("cached", "cached")
    pages = tables["a"]["pages"]
    assert pages["sampled"] > 0
    if not pages["note"]:  # a kernel that answers move_pages: every touched page is on a node
        assert sum(pages["nodes"].values()) + pages["unfaulted"] == pages["sampled"]
        assert all(n >= 0 for n in pages["nodes"])


def test_a_batch_larger_than_the_cache_trains_and_counts_its_bypassed_rows():
    s = strata.Store(config([table("a", 20, 4, mode="cached", cache_rows=2)], "cached"))
    ref = strata.Store(config([table("a", 20, 4)]))
    batch = {"a": {"keys": np.arange(20, dtype=np.int64), "lengths": np.full(5, 4, np.int64)}}
    for st in (s, ref):
        st.submit(0, batch)
        out = st.forward(0)
        st.backward(0, [np.ones_like(out[0])])
    np.testing.assert_array_equal(s.read_rows("a")[0], ref.read_rows("a")[0])
    assert s.stats()["cache"]["a"]["bypassed"] == 18  # 20 distinct rows, 2 cache rows


def read_only(shape):
    a = np.zeros(shape, np.float32)
    a.flags.writeable = False
    return a


def meta(t):
    return t.to("meta")


BAD_SUBMITS = [
    (TypeError, "features is a list", [1, 2]),
    (TypeError, "keys has dtype float64 (expected int64", {"a": {"keys": np.array([1.0]), "lengths": np.array([1])}}),
    (TypeError, "keys has dtype uint64", {"a": {"keys": np.array([1], np.uint64), "lengths": np.array([1])}}),
    (TypeError, "keys has dtype <U1", {"a": {"keys": "1", "lengths": np.array([1])}}),
    (ValueError, "key 20 at position 0 out of range [0, 20)", {"a": {"keys": np.array([20]), "lengths": np.array([1])}}),
    (ValueError, "key -1", {"a": {"keys": np.array([-1]), "lengths": np.array([1])}}),
    (ValueError, "lengths[1] = -1 (expected >= 0)", {"a": {"keys": np.array([1]), "lengths": np.array([2, -1])}}),
    (ValueError, "give exactly one of 'offsets'", {"a": {"keys": np.array([1]), "lengths": np.array([1]),
                                                         "offsets": np.array([0, 1])}}),
    (ValueError, "give exactly one of 'offsets'", {"a": {"keys": np.array([1])}}),
    (ValueError, "keys has shape (1, 1) (expected 1-D)", {"a": {"keys": np.array([[1]]), "lengths": np.array([1])}}),
    (ValueError, "unknown entry 'weight'", {"a": {"keys": np.array([1]), "lengths": np.array([1]),
                                                  "weight": np.array([1.0], np.float32)}}),
    (ValueError, "'zzz'", {"zzz": {"keys": np.array([1]), "lengths": np.array([1])}}),
    (ValueError, "offsets", {"a": {"keys": np.array([1, 2]), "offsets": np.array([0, 1])}}),
    (TypeError, "weights has dtype float64 (expected float32)",
     {"a": {"keys": np.array([1]), "lengths": np.array([1]), "weights": np.array([1.0])}}),
    (ValueError, "weights", {"a": {"keys": np.array([1]), "lengths": np.array([1]),
                                   "weights": np.array([1.0, 2.0], np.float32)}}),
    (ValueError, "batch", {"a": {"keys": np.array([1]), "lengths": np.array([1])},
                           "b": {"keys": np.array([1]), "lengths": np.array([1, 0])}}),
    (ValueError, "is a tensor on meta (expected a CPU tensor",
     {"a": {"keys": meta(torch.tensor([1])), "lengths": torch.tensor([1])}}),
]


@pytest.mark.parametrize("error,words,features", BAD_SUBMITS, ids=[b[1][:30] for b in BAD_SUBMITS])
def test_bad_submit_raises_and_changes_nothing(error, words, features):
    s = open_store()
    before = snapshot(s)
    with pytest.raises(error) as e:
        s.submit(0, features)
    assert words in str(e.value)
    assert_same(before, snapshot(s))
    s.submit(0, good_batch())  # id 0 is free: nothing was submitted


def test_bad_calls_raise_and_change_nothing(tmp_path):
    s = open_store()
    s.submit(0, good_batch())
    before = snapshot(s)
    g_ok = [np.ones((3, 4), np.float32), np.ones((3, 3), np.float32)]
    cases = [
        (ValueError, "already in flight", lambda: s.submit(0, good_batch())),
        (ValueError, "batch 5 was not submitted", lambda: s.forward(5)),
        (RuntimeError, "", lambda: s.backward(0, g_ok)),  # before forward
        (ValueError, "not C-contiguous", lambda: s.forward(0, [np.zeros((4, 3), np.float32).T, g_ok[1]])),
        (TypeError, "dtype float64", lambda: s.forward(0, [np.zeros((3, 4)), g_ok[1]])),
        (ValueError, "output", lambda: s.forward(0, [np.zeros((3, 5), np.float32), g_ok[1]])),
        (ValueError, "read-only", lambda: s.forward(0, [read_only((3, 4)), g_ok[1]])),
        (ValueError, "'zz'", lambda: s.read_rows("zz")),
        (ValueError, "", lambda: s.read_rows("a", 15, 10)),
        (ValueError, "", lambda: s.read_rows("a", -1, 2)),
        (ValueError, "weights has shape (2, 3) (expected (2, 4))", lambda: s.write_rows("a", 0, np.zeros((2, 3), np.float32))),
        (ValueError, "learning_rate -1 (expected a finite number >= 0)", lambda: s.set_learning_rate(-1.0, "a")),
        (ValueError, "learning_rate -1e-30 (expected a finite number >= 0)", lambda: s.set_learning_rate(-1e-30, "a")),
        (ValueError, "learning_rate nan", lambda: s.set_learning_rate(float("nan"))),
        (ValueError, "learning_rate 1e-50 for table 'a' is outside float32's range",
         lambda: s.set_learning_rate(1e-50, "a")),
        (ValueError, "learning_rate 1e+39 is outside float32's range", lambda: s.set_learning_rate(1e39)),
        (ValueError, "unknown table 'q'", lambda: s.set_learning_rate(0.1, "q")),
        (TypeError, "", lambda: s.submit(1.5, good_batch())),
        (RuntimeError, "in flight", lambda: s.load(tmp_path / "nothing")),
        (ValueError, "", lambda: s.export_npy("q", tmp_path / "q.npy")),
    ]
    for error, words, call in cases:
        with pytest.raises(error) as e:
            call()
        assert words in str(e.value), str(e.value)
        assert_same(before, snapshot(s))
    s.forward(0)
    before = snapshot(s)
    bad_grads = [
        (TypeError, "grads is a dict", {"a": g_ok[0]}),
        (ValueError, "gradient", [g_ok[0]]),
        (ValueError, "gradient", [np.ones((2, 4), np.float32), g_ok[1]]),
        (ValueError, "grads[0] has shape (12,) (expected 2-D)", [np.ones(12, np.float32), g_ok[1]]),
        (TypeError, "grads[1] has dtype float64", [g_ok[0], np.ones((3, 3))]),
        (ValueError, "column 0 is nan", [np.full((3, 4), np.nan, np.float32), g_ok[1]]),
        (ValueError, "is a tensor on meta", [meta(torch.ones(3, 4)), g_ok[1]]),
    ]
    for error, words, grads in bad_grads:
        with pytest.raises(error) as e:
            s.backward(0, grads)
        assert words in str(e.value), str(e.value)
        assert_same(before, snapshot(s))
    with pytest.raises(RuntimeError, match="in flight"):
        s.write_rows("a", 0, np.zeros((1, 4), np.float32))  # batches in flight
    assert_same(before, snapshot(s))
    s.backward(0, g_ok)


def test_bad_configs():
    with pytest.raises(TypeError, match="config is a int"):
        strata.Store(42)
    with pytest.raises(ValueError, match="rows"):
        strata.Store({"tables": [{"name": "a", "rows": -1, "dim": 4}]})
    with pytest.raises(ValueError):
        strata.Store("{not json")
    # Messages cut a long key or value at a character boundary: cut inside one, Python could not
    # decode the message and raised UnicodeDecodeError.
    key = '"a' + "\u00e9" * 150 + '"'
    with pytest.raises(ValueError, match="is given twice"):
        strata.Store("{" + key + ": 1, " + key + ': 2, "tables": []}')
    with pytest.raises(ValueError, match="rows"):
        strata.Store({"tables": [{"name": "a", "rows": "\u00e9" * 40, "dim": 4}]})
    # Half-size element types the config's rules refuse are refused as the C++ store refuses them,
    # naming the table, the field and the value (issue 31); every placement serves half-size outputs.
    strata.Store({"device": {"backend": "emu"},
                  "tables": [{"name": "a", "rows": 4, "dim": 4, "placement": "offload", "output_dtype": "bf16"}]})
    with pytest.raises(ValueError, match=r"table 'a': stochastic_rounding on a table of fp32 rows and fp32 state"):
        strata.Store({"tables": [{"name": "a", "rows": 4, "dim": 4, "stochastic_rounding": True}]})


def test_threads_sharing_one_store():
    """Python threads may share a store: its calls run one at a time (GIL released)."""
    import threading

    s = open_store(optimizer="sgd")
    errors = []

    def train(first):
        try:
            rng = np.random.default_rng(first)
            for i in range(first, first + 20):
                s.submit(i, {"a": random_feature(rng, 20, 3)})
                out = s.forward(i)
                s.backward(i, [np.ones_like(out[0])])
        except Exception as e:  # reported below, on the main thread
            errors.append(e)

    threads = [threading.Thread(target=train, args=(100 * t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and s.step == 80 and s.in_flight == 0
