"""Every public call of the package, given an argument of a wrong type, raises TypeError or
ValueError naming that argument and what was expected (never pybind11's generic "Unable to cast
Python instance" or a message about some internal value), and changes nothing. The calls are
walked from the package's public names: a new public call fails test_every_public_call_is_walked
until it has its row in CALLS."""

import inspect
import os
import re

import numpy as np
import pytest
import torch

import strata
import strata.pipeline
import strata.torch as st
from conftest import config, random_feature, table
from test_reshard import SPECS, shard_dicts

# Wrong values per kind of argument (each is the wrong type for that kind; None where None is not
# accepted).
INT = ["1", 1.5, True, [1], None, np.float32(1), torch.tensor(1.5)]
OPTIONAL_INT = ["1", 1.5, True, [1]]
NUMBER = ["0.1", b"0.1", True, [0.1], None, object(), torch.tensor([0.1, 0.2])]
NAME = [3, b"a", ["a"], None, np.str_("a").encode()]
OPTIONAL_NAME = [3, b"a", ["a"]]
PATH = [3, None, ["p"], 1.5]
FEATURES = [[1], "a", 3, None, (1, 2)]
VIEWS = ["a", 3, {"a": 1}, b"ab"]  # a list of arrays, or None where optional
ARRAY = ["x", 3, None, [[0.0]]]
OPTIONAL_ARRAY = ["x", 3, [[0.0]]]
STREAM = ["s", 1.5, [1], True]


def open_store():
    s = strata.Store(config([table("a", 20, 4, optimizer="adagrad", mode="cached"),
                             table("b", 10, 3, optimizer="adagrad", mode="cached")], "cached"))
    rng = np.random.default_rng(0)
    s.submit(0, {"a": random_feature(rng, 20, 3), "b": random_feature(rng, 10, 3)})
    s.forward(0)
    return s


def module():
    return st.EmbeddingBagCollection(config([table("user", 30, 4, optimizer="adagrad"),
                                             table("item", 20, 2, optimizer="adagrad")]))


def batch():
    rng = np.random.default_rng(1)
    return {"user": random_feature(rng, 30, 4), "item": random_feature(rng, 20, 4)}


def keyed():
    return st.KeyedEmbeddings(["user"], [torch.zeros(2, 4)])


# (call, the valid arguments, {argument: wrong values}); `call(ctx, **arguments)` makes the call
# on the context's objects.
CALLS = {
    "Store": (lambda c, **a: strata.Store(**a),
              {"config": config([table("a", 4, 2)]), "process_group": None, "timeout": None},
              {"config": [42, [1], None, 1.5], "process_group": [3, "x", True, [1]], "timeout": ["10", [1], 5]}),
    "Store.shard_info": (lambda c, **a: c["store"].shard_info(**a), {"table": "a"},
                         {"table": [b"a", ["a"], None, 1.5, 7]}),
    "Store.read_shard": (lambda c, **a: c["store"].read_shard(**a), {"table": "a", "local_row0": 0, "n": 1},
                         {"table": [b"a", ["a"], None, 1.5], "local_row0": INT, "n": INT}),
    "Store.write_shard": (lambda c, **a: c["store"].write_shard(**a),
                          {"table": "a", "local_row0": 0, "weights": np.zeros((1, 4), np.float32), "state": None},
                          {"table": [b"a", ["a"], None, 1.5], "local_row0": INT, "weights": ARRAY,
                           "state": OPTIONAL_ARRAY}),
    "Store.submit": (lambda c, **a: c["store"].submit(**a), {"batch_id": 5, "features": {}, "train": True},
                     {"batch_id": INT, "features": FEATURES, "train": ["yes", 1, None]}),
    "Store.preview": (lambda c, **a: c["store"].preview(**a), {"batch_id": 5, "features": {}},
                      {"batch_id": INT, "features": FEATURES}),
    "Store.forward": (lambda c, **a: c["store"].forward(**a), {"batch_id": 0, "outputs": None, "stream": None},
                      {"batch_id": INT, "outputs": VIEWS, "stream": STREAM}),
    "Store.backward": (lambda c, **a: c["store"].backward(**a),
                       {"batch_id": 0, "grads": [np.zeros((3, 4), np.float32), np.zeros((3, 3), np.float32)],
                        "stream": None},
                       {"batch_id": INT, "grads": VIEWS + [None], "stream": STREAM}),
    "Store.discard": (lambda c, **a: c["store"].discard(**a), {"batch_id": 0}, {"batch_id": INT}),
    "Store.save": (lambda c, **a: c["store"].save(**a), {"dir": "unused"}, {"dir": PATH}),
    "Store.load": (lambda c, **a: c["store"].load(**a), {"dir": "unused"}, {"dir": PATH}),
    "Store.export_npy": (lambda c, **a: c["store"].export_npy(**a), {"table": "a", "path": "unused.npy"},
                         {"table": NAME, "path": PATH}),
    "Store.import_npy": (lambda c, **a: c["store"].import_npy(**a), {"table": "a", "path": "unused.npy"},
                         {"table": NAME, "path": PATH}),
    "Store.read_rows": (lambda c, **a: c["store"].read_rows(**a),
                        {"table": "a", "row0": 0, "n": 2, "out": None, "state_out": None},
                        {"table": NAME, "row0": INT, "n": OPTIONAL_INT, "out": OPTIONAL_ARRAY,
                         "state_out": OPTIONAL_ARRAY}),
    "Store.keys_held": (lambda c, **a: c["store"].keys_held(**a), {"table": "a"}, {"table": NAME}),
    "Store.read_keys": (lambda c, **a: c["store"].read_keys(**a),
                        {"table": "a", "keys": np.zeros(1, np.int64), "out": None, "state_out": None},
                        {"table": NAME, "keys": ARRAY + [np.zeros(1)], "out": OPTIONAL_ARRAY,
                         "state_out": OPTIONAL_ARRAY}),
    "Store.key_owner": (lambda c, **a: c["store"].key_owner(**a), {"table": "a", "keys": np.zeros(1, np.int64)},
                        {"table": NAME, "keys": ARRAY + [np.zeros(1)]}),
    "Store.write_keys": (lambda c, **a: c["store"].write_keys(**a),
                         {"table": "a", "keys": np.zeros(1, np.int64), "weights": np.zeros((1, 4), np.float32),
                          "state": None},
                         {"table": NAME, "keys": ARRAY + [np.zeros(1)], "weights": ARRAY, "state": OPTIONAL_ARRAY}),
    "Store.write_rows": (lambda c, **a: c["store"].write_rows(**a),
                         {"table": "a", "row0": 0, "weights": np.zeros((1, 4), np.float32), "state": None},
                         {"table": NAME, "row0": INT, "weights": ARRAY, "state": OPTIONAL_ARRAY}),
    "Store.set_learning_rate": (lambda c, **a: c["store"].set_learning_rate(**a), {"lr": 0.1, "table": None},
                                {"lr": NUMBER, "table": OPTIONAL_NAME}),
    "Store.learning_rate": (lambda c, **a: c["store"].learning_rate(**a), {"table": "a"}, {"table": NAME}),
    "Store.set_step": (lambda c, **a: c["store"].set_step(**a), {"step": 3}, {"step": INT}),
    "Store.from_checkpoint": (lambda c, **a: strata.Store.from_checkpoint(**a), {"dir": "unused", "overrides": None},
                              {"dir": PATH, "overrides": [[1], 3, "x"]}),
    "Store.device_array": (lambda c, **a: c["store"].device_array(**a), {"shape": (2, 3)},
                           {"shape": ["ab", 3, None, (1, "2"), (1.5, 2), (1, 2, 3), {1: 2}]}),
    "DeviceArray.copy_from": (lambda c, **a: c["array"].copy_from(**a),
                              {"source": np.zeros((2, 3), np.float32), "stream": None},
                              {"source": ARRAY, "stream": STREAM}),
    "DeviceArray.to_numpy": (lambda c, **a: c["array"].to_numpy(**a), {"stream": None}, {"stream": STREAM}),
    "EmbeddingBagCollection": (lambda c, **a: st.EmbeddingBagCollection(**a),
                               {"config": config([table("a", 4, 2)]), "device": "cpu", "process_group": None,
                                "timeout": None, "include_last_offset": True},
                               {"config": [42, [1], None], "device": [[1], 1.5, None, True, "nonsense"],
                                # timeout without a group in effect is checked, then ignored: 0 is refused, 5 not
                                "process_group": [3, "x", [1]], "timeout": ["10", 0],
                                "include_last_offset": ["yes", 1, None]}),
    "EmbeddingBagCollection.forward": (lambda c, **a: c["module"].forward(**a), {"batch": batch()},
                                       {"batch": FEATURES}),
    "EmbeddingBagCollection.submit": (lambda c, **a: c["module"].submit(**a), {"batch": batch()},
                                      {"batch": FEATURES}),
    "EmbeddingBagCollection.preview": (lambda c, **a: c["module"].preview(**a), {"batch": batch()},
                                       {"batch": FEATURES}),
    "EmbeddingBagCollection.submit_previewed": (lambda c, **a: c["module"].submit_previewed(**a),
                                                {"batch_id": 9, "batch": batch()},
                                                {"batch_id": INT, "batch": FEATURES}),
    "EmbeddingBagCollection.set_learning_rate": (lambda c, **a: c["module"].set_learning_rate(**a),
                                                 {"lr": 0.1, "table": None}, {"lr": NUMBER, "table": OPTIONAL_NAME}),
    "EmbeddingBagCollection.learning_rate": (lambda c, **a: c["module"].learning_rate(**a), {"table": "user"},
                                             {"table": NAME}),
    "EmbeddingBagCollection.sparse_optimizer": (lambda c, **a: c["module"].sparse_optimizer(**a), {"dense": None},
                                                {"dense": [3, "x", [1]]}),
    "EmbeddingBagCollection.load_state_dict": (lambda c, **a: c["module"].load_state_dict(**a),
                                               {"state_dict": module().state_dict(), "strict": True, "assign": False},
                                               {"state_dict": [[1], 3, "x", None], "strict": ["yes", 1, None],
                                                "assign": ["yes", 1, None]}),
    "KeyedEmbeddings": (lambda c, **a: st.KeyedEmbeddings(**a), {"keys": ["a"], "tensors": [torch.zeros(1, 1)]},
                        {"keys": [3, "a", None, [1]], "tensors": [3, None, [np.zeros((1, 1))]]}),
    "KeyedEmbeddings.__getitem__": (lambda c, **a: c["keyed"][a["key"]], {"key": "user"},
                                    {"key": [0, None, ("user",)]}),
    "SubmittedBatch": (lambda c, **a: st.SubmittedBatch(**a),
                       {"owner": None, "batch_id": 1, "tables": [], "train": True},
                       {"batch_id": INT, "tables": [3, None, "ab"], "train": ["yes", 1, None]}),
    "merge_state_dicts": (lambda c, **a: st.merge_state_dicts(**a), {"state_dicts": shard_dicts(2, SPECS)[0],
                                                                     "prefix": ""},
                          {"state_dicts": [3, None, "x", {"a": 1}, [3]], "prefix": [3, None, b"x"]}),
    "pipelined": (lambda c, **a: st.pipelined(**a),
                  {"module": module(), "batches": [], "sparse": None, "ahead": 1, "preview": 0},
                  {"module": [3, None], "batches": [3, None], "sparse": [3, "x"], "ahead": INT, "preview": INT}),
}

# Public calls that take no argument (methods and properties), or whose arguments are torch's.
NO_ARGUMENTS = {
    "Store.drop_previews", "Store.flush", "Store.stats", "Store.stream", "Store.device", "Store.step",
    "Store.in_flight", "Store.previewed", "Store.config", "Stream.synchronize", "DeviceArray.shape",
    "DeviceArray.ptr", "EmbeddingBagCollection.discard_in_flight", "KeyedEmbeddings.keys",
    "KeyedEmbeddings.to_dict", "KeyedEmbeddings.values", "KeyedEmbeddings.__len__", "KeyedEmbeddings.key_dim",
    "KeyedEmbeddings.length_per_key", "KeyedEmbeddings.offset_per_key",
    "EmbeddingBagCollection.extra_repr", "EmbeddingBagCollection.state_dict", "EmbeddingBagCollection.rank",
    "EmbeddingBagCollection.world_size", "EmbeddingBagCollection.close", "Store.close", "Store.world",
    "SubmittedBatch.owner", "SubmittedBatch.batch_id", "SubmittedBatch.tables", "SubmittedBatch.forwarded",
    "SubmittedBatch.train",
}


def public_calls():
    """The package's public calls: its classes' own public methods and properties (and their
    constructors, and __getitem__/__len__), and its functions."""
    names = set()
    classes = {"Store": strata.Store, "Stream": strata.Stream, "DeviceArray": strata.DeviceArray,
               "EmbeddingBagCollection": st.EmbeddingBagCollection, "KeyedEmbeddings": st.KeyedEmbeddings,
               "SubmittedBatch": st.SubmittedBatch}
    for cname, cls in classes.items():
        if cname not in ("Stream", "DeviceArray"):  # made by Store.stream() and Store.device_array()
            names.add(cname)
        for n, v in vars(cls).items():
            if (not n.startswith("_") or n in ("__getitem__", "__len__")) and n not in ("training", "call_super_init"):
                names.add(f"{cname}.{n}")
    for fname in set(st.__all__) | set(strata.pipeline.__all__) | set(strata.__all__):
        if inspect.isfunction(getattr(st, fname, None)):
            names.add(fname)
    return names


def test_every_public_call_is_walked():
    assert public_calls() == set(CALLS) | NO_ARGUMENTS


def context(tmp_path):
    s = open_store()
    return {"store": s, "array": s.device_array((2, 3)), "module": module(), "keyed": keyed()}


def state(c):
    s, m = c["store"], c["module"]
    return (s.step, s.in_flight, s.previewed, s.learning_rate("a"), s.read_rows("a")[0].tobytes(), m.store.step,
            m.store.in_flight, m.store.previewed, m.learning_rate("user"), m.store.read_rows("user")[0].tobytes())


@pytest.mark.parametrize("name", sorted(CALLS))
def test_wrong_argument_types_are_refused_naming_the_argument(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    call, valid, wrong = CALLS[name]
    assert set(wrong) <= set(valid)
    c = context(tmp_path)
    for arg, values in wrong.items():
        for value in values:
            before = state(c)
            with pytest.raises((TypeError, ValueError)) as e:
                call(c, **dict(valid, **{arg: value}))
            message = str(e.value)
            assert re.search(rf"(^|[^\w.]){re.escape(arg)}\b", message), (name, arg, repr(value), message)
            assert "expected" in message, (name, arg, repr(value), message)
            assert "Unable to cast" not in message and "incompatible function arguments" not in message, message
            assert state(c) == before, (name, arg, repr(value))


def test_set_learning_rate_with_a_table_of_the_wrong_type():
    """The case of the issue: set_learning_rate(0.1, 3) named pybind11's cast, not the table."""
    s = open_store()
    with pytest.raises(TypeError, match=r"^table is a int \(expected a table name: str\)$"):
        s.set_learning_rate(0.1, 3)
    with pytest.raises(TypeError, match=r"^batch_id is a float \(expected an int\)$"):
        s.discard(1.5)
    with pytest.raises(ValueError, match=r"batch_id 36893488147419103232 is out of range \(expected an int64"):
        s.discard(2**65)
    # NumPy scalars and 0-d tensors are numbers and ints.
    s.set_learning_rate(np.float32(0.25), "a")
    s.set_learning_rate(torch.tensor(0.5), "b")
    assert (s.learning_rate("a"), s.learning_rate("b")) == (0.25, 0.5)
    s.discard(np.int64(0))
    s.set_step(torch.tensor(4))
    assert s.step == 4 and s.in_flight == 0
    # A number no double holds (PyFloat_AsDouble's OverflowError read as a wrong type).
    for huge in (10**400, -10**400):
        with pytest.raises(ValueError, match=r"^lr is out of range \(expected a number"):
            s.set_learning_rate(huge)


def test_paths_as_str_bytes_and_path_like(tmp_path):
    """bytes paths are the file system's bytes (os.fsencode), not written as "b'...'"."""
    s = open_store()
    s.discard(0)
    for form in (str(tmp_path / "s"), bytes(tmp_path / "b"), tmp_path / "p"):
        s.save(form)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "p", "s"]
    # Names that are not UTF-8 (bytes, or a str with surrogate escapes as os.listdir gives) are
    # the file system's bytes, not a cast error.
    s.save(bytes(tmp_path) + b"/\xff")
    s.save(os.fsdecode(bytes(tmp_path) + b"/\xfe"))
    assert sorted(os.listdir(bytes(tmp_path))) == [b"b", b"p", b"s", b"\xfe", b"\xff"]
    s.load(bytes(tmp_path) + b"/\xff")
    s.export_npy("a", os.fsdecode(bytes(tmp_path) + b"/\xfd.npy"))
    s.import_npy("a", bytes(tmp_path) + b"/\xfd.npy")
    with pytest.raises(ValueError, match=r"\\xfc/MANIFEST"):  # named in the store's error (was UnicodeDecodeError)
        s.load(bytes(tmp_path) + b"/\xfc")
    with pytest.raises(ValueError, match=r"^dir holds a NUL byte"):  # the C library would stop at it
        s.save(str(tmp_path / "x\0y"))
    assert not (tmp_path / "x").exists()
