"""TorchRec's and torch.nn.EmbeddingBag's shapes in strata.torch: KeyedTensor's accessors on the
outputs, offsets of length batch (include_last_offset=False, against torch.nn.EmbeddingBag),
per_sample_weights, and the state_dict names embedding_bags.<table>.* (those before, tables.<table>.*,
still load)."""

import array

import numpy as np
import pytest
import torch

import strata
import strata.torch as st
from conftest import FakeKJT, config, table


def make(optimizer="adagrad", pooling="sum", **kwargs):
    return st.EmbeddingBagCollection(config([table("user", 10, 3, pooling, optimizer),
                                             table("item", 8, 2, pooling, optimizer)]), **kwargs)


def feature(keys, offsets, **extra):
    return {"keys": torch.tensor(keys, dtype=torch.int64), "offsets": torch.tensor(offsets, dtype=torch.int64),
            **extra}


def test_outputs_have_keyed_tensors_accessors():
    out = make().eval()({"user": feature([1, 2, 3], [0, 1, 3]), "item": feature([4], [0, 0, 1])})
    assert out.length_per_key() == [3, 2] and out.offset_per_key() == [0, 3, 5] and out.key_dim() == 1
    for key, a, b in zip(out.keys(), out.offset_per_key(), out.offset_per_key()[1:]):
        assert torch.equal(out.values()[:, a:b], out[key])
    empty = st.KeyedEmbeddings([], [])
    assert empty.length_per_key() == [] and empty.offset_per_key() == [0]


@pytest.mark.parametrize("pooling,weighted", [("sum", True), ("mean", False)])
def test_offsets_of_length_batch_match_torch_embedding_bag(pooling, weighted):
    ebc = make("sgd", pooling, include_last_offset=False)
    bag = torch.nn.EmbeddingBag(10, 3, mode=pooling, include_last_offset=False)
    ebc.store.write_rows("user", 0, bag.weight.detach().numpy())
    opt = torch.optim.SGD(bag.parameters(), lr=0.1)  # table() sets the store's rate to 0.1 too
    # Bags [1, 2], [], [2, 5, 7], then the last to the end of the keys: [0], then [] (no key after offsets[-1]).
    for keys, offsets in (([1, 2, 2, 5, 7, 0], [0, 2, 2, 5]), ([1, 2, 2, 5, 7], [0, 2, 2, 5])):
        w = torch.linspace(0.5, 2.0, len(keys)) if weighted else None
        f = feature(keys, offsets, **({"per_sample_weights": w} if weighted else {}))
        out = ebc({"user": f})["user"]
        ref = bag(f["keys"], f["offsets"], per_sample_weights=w)
        assert out.shape == ref.shape == (4, 3)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
        target = torch.linspace(-1, 1, 12).reshape(4, 3)
        ((out - target) ** 2).sum().backward()
        opt.zero_grad()
        ((ref - target) ** 2).sum().backward()
        opt.step()
        np.testing.assert_allclose(ebc.store.read_rows("user")[0], bag.weight.detach().numpy(), rtol=0, atol=1e-5)
    # Strata's default, include_last_offset=True (torch's is False): offsets of length batch + 1.
    out = make().eval()({"user": feature([1, 2, 2, 5, 7, 0], [0, 2, 2, 5, 6])})
    assert out["user"].shape == (4, 3)


def test_offsets_of_a_wrong_length_are_refused_naming_the_feature():
    ebc = make(include_last_offset=False)
    user = feature([1, 2, 3], [0, 1, 1])
    bad = [
        ({"user": user, "item": feature([4], [0, 0])}, r"feature 'item': offsets of length 2 \(expected 3"),
        ({"user": user, "item": {"keys": torch.tensor([4]), "lengths": torch.tensor([1, 0])}},
         r"feature 'item': lengths of length 2 \(expected 3"),
        ({"user": feature([1, 2, 3], [0, 1, 4])}, r"feature 'user': offsets\[2\] is 4, past the 3 keys"),
        ({"user": feature([1, 2, 3], [])}, r"feature 'user': offsets of length 0 with 3 keys"),
    ]
    for batch, message in bad:
        with pytest.raises(ValueError, match=message):
            ebc(batch)
        assert ebc.store.in_flight == 0
    with pytest.raises(TypeError, match="include_last_offset is a str"):
        make(include_last_offset="no")
    # No feature and no bag: a batch of 0 samples.
    assert ebc({"user": feature([], [])})["user"].shape == (0, 3)


@pytest.mark.parametrize("kind", ["array", "range", "memoryview"])
def test_offsets_of_length_batch_in_any_type_the_store_reads_get_the_key_count(kind):
    offsets = {"array": array.array("q", [0, 2, 4]), "range": range(0, 6, 2),
               "memoryview": memoryview(array.array("q", [0, 2, 4]))}[kind]
    ebc = make(include_last_offset=False).eval()
    out = ebc({"user": {"keys": torch.tensor([1, 2, 3, 4]), "offsets": offsets}})["user"]
    assert torch.equal(out, ebc({"user": feature([1, 2, 3, 4], [0, 2, 4])})["user"])


@pytest.mark.filterwarnings("error")  # NumPy 1's DeprecationWarning of an out-of-range conversion, too
@pytest.mark.parametrize("dtype", ["int8", "int16", "uint8", "uint16", "uint64", "torch.int8"])
def test_offsets_of_length_batch_of_another_dtype_are_refused_as_the_store_does(dtype):
    keys = np.zeros(70000, dtype=np.int64)  # more keys than int8, int16, uint8 and uint16 hold
    offsets = torch.tensor([0, 2], dtype=torch.int8) if dtype == "torch.int8" else np.array([0, 2], dtype=dtype)
    name = dtype.removeprefix("torch.")
    with pytest.raises(TypeError, match=rf"table 'user': offsets has dtype {name} \(expected int64"):
        make(include_last_offset=False).eval()({"user": {"keys": keys, "offsets": offsets}})


def test_keyed_jagged_tensors_and_lengths_are_unaffected_by_include_last_offset():
    keys, lengths = np.array([1, 2, 3, 4]), np.array([2, 0, 2])
    b = {"user": {"keys": keys, "lengths": lengths}}
    ref = make().eval()(b)["user"]
    a = make(include_last_offset=False).eval()
    assert torch.equal(a(b)["user"], ref) and torch.equal(a(FakeKJT(b))["user"], ref)
    assert torch.equal(a({"user": feature([1, 2, 3, 4], [0, 2, 2])})["user"], ref)


def test_per_sample_weights_is_torchs_name_of_the_weights():
    ebc = make().eval()
    w = torch.tensor([0.5, 2.0, 3.0])
    by_ours = ebc({"user": feature([1, 2, 3], [0, 1, 3], weights=w)})["user"]
    assert torch.equal(ebc({"user": feature([1, 2, 3], [0, 1, 3], per_sample_weights=w)})["user"], by_ours)
    # None is an absent entry: the other name is the feature's.
    assert torch.equal(ebc({"user": feature([1, 2, 3], [0, 1, 3], weights=w, per_sample_weights=None)})["user"],
                       by_ours)
    assert torch.equal(ebc({"user": feature([1, 2, 3], [0, 1, 3], weights=None, per_sample_weights=w)})["user"],
                       by_ours)
    k = torch.tensor([1, 2, 3])
    assert torch.equal(ebc({"user": {"keys": None, "values": k, "offsets": torch.tensor([0, 1, 3]),
                                     "weights": w}})["user"], by_ours)
    store = strata.Store(config([table("user", 10, 3)]))
    for name, f in (("ebc", None), ("submit", store.submit), ("preview", store.preview)):
        for both in ({"weights": w, "per_sample_weights": w}, {"keys": k, "values": k}):
            batch = {"user": {"keys": k, "offsets": torch.tensor([0, 1, 3])} | both}
            ours, torchs = both
            with pytest.raises(ValueError, match=f"table 'user': both '{ours}' and '{torchs}'"):
                ebc(batch) if f is None else f(0, batch)
    assert ebc.store.in_flight == 0 and store.in_flight == 0


def trained():
    ebc = make()
    out = ebc({"user": feature([1, 2, 3], [0, 1, 3]), "item": feature([4, 5], [0, 2, 2])})
    out.values().pow(2).sum().backward()
    return ebc


def test_state_dict_names_are_torchrecs_and_the_names_before_still_load():
    sd = trained().state_dict()
    assert set(sd) == {f"embedding_bags.{t}.{e}" for t in ("user", "item")
                       for e in ("weight", "optimizer_state", "learning_rate")} | {"step"}
    old = {k.replace("embedding_bags.", "tables.", 1): v for k, v in sd.items()}
    mixed = {k: v for k, v in old.items() if ".item." not in k} | {k: v for k, v in sd.items() if ".item." in k}
    for given in (old, mixed):  # every table's entries by the names before, or one table's
        fresh = make()
        fresh.load_state_dict(given)
        for k, v in fresh.state_dict().items():
            assert torch.equal(v, sd[k]), k
        nested = torch.nn.Sequential(make())
        nested.load_state_dict({"0." + k: v for k, v in given.items()})
        assert torch.equal(nested[0].state_dict()["embedding_bags.user.weight"], sd["embedding_bags.user.weight"])
    fresh = make()
    before = fresh.state_dict()
    refusals = [
        ({**old, "tables.user.weight": torch.zeros(9, 3)}, "tables.user.weight has shape (9, 3)"),
        ({**old, "embedding_bags.user.weight": sd["embedding_bags.user.weight"]},
         "'tables.user.*' and 'embedding_bags.user.*'"),
    ]
    for given, message in refusals:
        with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
            fresh.load_state_dict(given)
        for k, v in fresh.state_dict().items():
            assert torch.equal(v, before[k]), k
    missing = fresh.load_state_dict({"tables.user.weight": sd["embedding_bags.user.weight"]}, strict=False)
    assert "embedding_bags.user.optimizer_state" in missing.missing_keys and not missing.unexpected_keys


@pytest.mark.parametrize("mode", ["cpu", "cached"])
def test_several_features_of_one_table_train_it_as_torch_trains_a_shared_weight(mode):
    # "item" is looked up by "clicked" (the table's sum) and "bought" (mean), as one weight shared by two
    # torch.nn.EmbeddingBags; a KeyedJaggedTensor names the features, and both features' gradients reach the rows.
    t = table("item", 12, 3, "sum", "sgd", mode=mode)
    t["features"] = ["clicked", {"name": "bought", "pooling": "mean"}]
    ebc = st.EmbeddingBagCollection(config([t, table("user", 5, 2)], mode=mode), device="cpu")
    weight = torch.nn.Parameter(torch.tensor(ebc.store.read_rows("item")[0]))
    opt = torch.optim.SGD([weight], lr=0.1)
    rng = np.random.default_rng(3)
    for _ in range(4):
        clicked = {"keys": rng.integers(0, 12, 7), "lengths": np.array([2, 0, 3, 2])}
        bought = {"keys": rng.integers(0, 4, 5), "lengths": np.array([1, 2, 0, 2])}
        user = {"keys": np.array([1, 2, 3, 4]), "lengths": np.array([1, 1, 1, 1])}
        out = ebc(FakeKJT({"clicked": clicked, "user": user, "bought": bought}))
        assert out.keys() == ["clicked", "user", "bought"] and out.length_per_key() == [3, 2, 3]
        refs = [torch.nn.functional.embedding_bag(torch.tensor(f["keys"]), weight,
                                                  torch.tensor(np.concatenate([[0], np.cumsum(f["lengths"])[:-1]])),
                                                  mode=mode)
                for f, mode in ((clicked, "sum"), (bought, "mean"))]
        ref_c, ref_b = refs
        torch.testing.assert_close(out["clicked"], ref_c, rtol=0, atol=1e-6)
        torch.testing.assert_close(out["bought"], ref_b, rtol=0, atol=1e-6)
        target = torch.linspace(-1, 1, 12).reshape(4, 3)
        ((out["clicked"] - target) ** 2 + (out["bought"] + target) ** 2).sum().backward()
        opt.zero_grad()
        ((ref_c - target) ** 2 + (ref_b + target) ** 2).sum().backward()
        opt.step()
        np.testing.assert_allclose(ebc.store.read_rows("item")[0], weight.detach().numpy(), rtol=0, atol=1e-6)
    # The table's own name is not one of its features.
    with pytest.raises(ValueError, match="unknown feature 'item'"):
        ebc({"item": {"keys": torch.tensor([1]), "lengths": torch.tensor([1])}})
    assert ebc.store.in_flight == 0


@pytest.mark.parametrize("mode", ["cpu", "cached"])
def test_int32_keys_and_offsets_train_as_int64_ones(mode):
    # int32 keys and offsets go to the store as int32 (JaggedKeys::keys32, offsets32): the same outputs and rows.
    stores = [st.EmbeddingBagCollection(config([table("user", 10, 3, "mean", "adagrad", mode=mode)], mode=mode))
              for _ in range(2)]
    rng = np.random.default_rng(7)
    for _ in range(3):
        keys, offsets = rng.integers(0, 10, 9), np.array([0, 2, 2, 6, 9])
        outs = []
        for ebc, dtype in zip(stores, (torch.int64, torch.int32)):
            f = {"keys": torch.tensor(keys, dtype=dtype), "offsets": torch.tensor(offsets, dtype=dtype)}
            out = ebc({"user": f})["user"]
            (out * torch.linspace(-1, 1, 12).reshape(4, 3)).sum().backward()
            outs.append(out.detach())
        assert torch.equal(outs[0], outs[1])
        assert np.array_equal(stores[0].store.read_rows("user")[0], stores[1].store.read_rows("user")[0])
    with pytest.raises(ValueError, match="key 10 at position 0 out of range"):
        stores[1]({"user": {"keys": torch.tensor([10], dtype=torch.int32), "offsets": torch.tensor([0, 1])}})
