"""strata.torch.EmbeddingBagCollection: state_dict by table, KeyedJaggedTensor-shaped input, eval
mode, the pipelining helper, and bad input (raises, changes nothing)."""

import numpy as np
import pytest
import torch

import strata
import strata.torch as st
from conftest import FakeKJT, config, random_feature, table


def make(mode="cpu", optimizer="adagrad", **extra):
    return st.EmbeddingBagCollection(config([table("user", 30, 4, optimizer=optimizer, mode=mode),
                                             table("item", 20, 2, optimizer=optimizer, mode=mode)], mode, **extra))


def batch(rng, n=4):
    return {"user": random_feature(rng, 30, n), "item": random_feature(rng, 20, n, weighted=True)}


def tensors(b):
    return {k: {kk: torch.from_numpy(v) for kk, v in f.items()} for k, f in b.items()}


def step(ebc, features):
    out = ebc(features)
    out.values().pow(2).sum().backward()
    return out


def test_state_dict_round_trip_by_table():
    rng = np.random.default_rng(0)
    a = make()
    for _ in range(3):
        step(a, tensors(batch(rng)))
    a.set_learning_rate(0.03, "item")
    sd = a.state_dict()
    assert set(sd) == {f"embedding_bags.{n}.{k}" for n in ("user", "item") for k in ("weight", "optimizer_state",
                                                                            "learning_rate")} | {"step"}
    assert sd["step"].dtype == torch.int64 and int(sd["step"]) == 3
    assert sd["embedding_bags.user.weight"].shape == (30, 4)
    assert sd["embedding_bags.user.optimizer_state"].shape == (30, 4)
    b = make()
    b.load_state_dict(sd)
    assert b.learning_rate("item") == pytest.approx(0.03)
    for k, v in b.state_dict().items():
        torch.testing.assert_close(v, sd[k], rtol=0, atol=0)
    # Both continue identically.
    for m in (a, b):
        step(m, tensors(batch(np.random.default_rng(5))))
    key = "embedding_bags.user.weight"
    torch.testing.assert_close(a.state_dict()[key], b.state_dict()[key], rtol=0, atol=0)
    # Nested in a model, under a prefix.
    model = torch.nn.Sequential(make())
    model.load_state_dict({"0." + k: v for k, v in sd.items()})


def test_bad_state_dict_raises_and_changes_nothing():
    a = make()
    before = {k: v.clone() for k, v in a.state_dict().items()}
    sd = {k: v.clone() + 1 for k, v in before.items()}
    bad = [
        dict(sd, **{"embedding_bags.user.weight": torch.zeros(29, 4)}),
        dict(sd, **{"embedding_bags.user.weight": torch.zeros(30, 4, dtype=torch.float64)}),
        dict(sd, **{"embedding_bags.item.learning_rate": torch.tensor(-1.0)}),
        dict(sd, **{"embedding_bags.item.optimizer_state": torch.zeros(20, 3)}),
        {k: v for k, v in sd.items() if k != "embedding_bags.item.weight"},
        dict(sd, **{"embedding_bags.other.weight": torch.zeros(1, 1)}),
    ]
    for b in bad:
        with pytest.raises(RuntimeError):
            a.load_state_dict(b)
        for k, v in a.state_dict().items():
            torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_nested_load_checks_every_entry_before_writing_any():
    """Nested in another module, torch calls the tables' _load_from_state_dict itself (the module's
    own load_state_dict does not run): an old state_dict without the step, or one with an unexpected
    key of the module, wrote every table before torch raised (issue 29), or loaded silently."""
    rng = np.random.default_rng(2)
    a = make()
    for _ in range(2):
        step(a, tensors(batch(rng)))
    sd = {"0." + k: v for k, v in a.state_dict().items()}
    model = torch.nn.Sequential(make())
    before = model.state_dict()
    no_step = {k: v for k, v in sd.items() if k != "0.step"}
    for bad, words in [(no_step, 'Missing key(s) in state_dict: "0.step"'),
                       (dict(sd, **{"0.embedding_bags.other.weight": torch.zeros(1, 1)}),
                        '"0.embedding_bags.other.weight"'),
                       (dict(sd, **{"0.foo": torch.zeros(1)}), 'Unexpected key(s) in state_dict: "0.foo"')]:
        for strict in (True, False):
            with pytest.raises(RuntimeError) as e:
                model.load_state_dict(bad, strict=strict)
            assert words in str(e.value) or not strict, str(e.value)
            assert "nothing was loaded" in str(e.value), str(e.value)
            for k, v in model.state_dict().items():
                torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    # A partial load of the nested module: its own load_state_dict, non-strict.
    result = model[0].load_state_dict({k[2:]: v for k, v in no_step.items()}, strict=False)
    assert result.missing_keys == ["step"] and model[0].store.step == 0
    loaded = model[0].state_dict()["embedding_bags.user.weight"]
    torch.testing.assert_close(loaded, sd["0.embedding_bags.user.weight"], rtol=0, atol=0)
    result = model[0].load_state_dict({"foo": 1, **{k[2:]: v for k, v in sd.items()}}, strict=False, assign=False)
    assert result.unexpected_keys == ["foo"] and model[0].store.step == 2


def test_load_state_dict_checks_every_table_before_writing_any():
    """Entries that only fail when written (a float64 NumPy weight, a list, a rate that float32
    cannot hold) are found before any table changes, also when an earlier table is fine."""
    a = make()
    before = {k: v.clone() for k, v in a.state_dict().items()}
    sd = {k: v.clone() + 1 for k, v in before.items()}  # "user" (first) is fine in every case
    key = "embedding_bags.item."
    item = sd[key + "weight"]
    bad = [
        (key + "weight has dtype float64 (expected float32)", {key + "weight": item.numpy().astype(np.float64)}),
        (key + "weight is a list", {key + "weight": item.tolist()}),
        (key + "optimizer_state has dtype int64", {key + "optimizer_state": np.zeros((20, 2), np.int64)}),
        (key + "learning_rate 1e+39 (expected a finite number >= 0", {key + "learning_rate": 1e39}),
        (key + "learning_rate -0.5 (expected a finite number >= 0", {key + "learning_rate": -0.5}),
        (key + "learning_rate 1e-50", {key + "learning_rate": 1e-50}),
        (key + "learning_rate 1e+39", {key + "learning_rate": torch.tensor(1e39, dtype=torch.float64)}),
        (key + "learning_rate is", {key + "learning_rate": torch.tensor([0.1, 0.2])}),
        # Only numbers are rates, as for set_learning_rate (float() took these).
        (key + "learning_rate is a str", {key + "learning_rate": "0.1"}),
        (key + "learning_rate is a bool", {key + "learning_rate": True}),
        (key + "learning_rate is a Tensor of shape (1,)", {key + "learning_rate": torch.tensor([0.1])}),
    ]
    for words, change in bad:
        with pytest.raises(RuntimeError) as e:
            a.load_state_dict(dict(sd, **change))
        assert words in str(e.value), str(e.value)
        for k, v in a.state_dict().items():
            torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    # Float32 NumPy arrays and plain numbers load.
    a.load_state_dict({k: (v.numpy() if v.dim() else float(v) if v.is_floating_point() else int(v))
                       for k, v in sd.items()})
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v, sd[k], rtol=0, atol=0)


def test_two_lookups_in_one_loss_apply_in_submit_order():
    """Autograd runs the later lookup's backward first; the module applies the batches of one
    backward pass in submit order, as the store's calls forward 1, forward 2, backward 1, backward 2."""
    rng = np.random.default_rng(4)
    b1, b2 = batch(rng), batch(rng)
    b2["user"] = b1["user"]  # the same rows: the order of two Adagrad steps on them shows
    g1, g2 = (torch.from_numpy(rng.normal(size=(4, 6)).astype(np.float32)) for _ in range(2))
    m = make(optimizer="adagrad")
    o1, o2 = m(tensors(b1)), m(tensors(b2))
    ((o1.values() * g1).sum() + (o2.values() * g2).sum()).backward()
    assert m.store.in_flight == 0 and m.store.step == 2
    ref = strata.Store(m.store.config)
    for i, b in enumerate((b1, b2)):
        ref.submit(i, b)
        ref.forward(i)
    for i, g in enumerate((g1, g2)):
        ref.backward(i, [np.ascontiguousarray(g[:, :4].numpy()), np.ascontiguousarray(g[:, 4:].numpy())])
    for n in ("user", "item"):
        for got, want in zip(m.store.read_rows(n), ref.read_rows(n)):
            np.testing.assert_array_equal(got, want)


def test_backward_that_never_comes_retain_graph_and_grad_of_dense_parameters():
    rng = np.random.default_rng(6)
    m = make()
    dense = torch.nn.Linear(6, 1)
    # An exception between forward and backward: that batch stays in flight, later steps train.
    m(tensors(batch(rng)))
    step(m, tensors(batch(rng)))
    assert m.store.step == 1 and m.store.in_flight == 1
    m.discard_in_flight()
    assert m.store.in_flight == 0
    # torch.autograd.grad of dense parameters only: the lookup's backward does not run.
    loss = dense(m(tensors(batch(rng))).values()).sum()
    torch.autograd.grad(loss, list(dense.parameters()))
    assert m.store.step == 1 and m.store.in_flight == 1
    m.discard_in_flight()
    # retain_graph: a second backward of the same lookup raises; the first was applied once.
    loss = m(tensors(batch(rng))).values().pow(2).sum()
    loss.backward(retain_graph=True)
    assert m.store.step == 2
    with pytest.raises(ValueError, match="was not submitted"):
        loss.backward()
    assert m.store.step == 2 and m.store.in_flight == 0


def test_keyed_jagged_tensor_input_eval_mode_and_outputs():
    rng = np.random.default_rng(1)
    b = batch(rng)
    a = make()
    a.eval()
    out_dict = a(tensors(b))
    out_kjt = a(FakeKJT(b))
    assert a.store.in_flight == 0 and a.store.step == 0  # eval: retired at once, nothing applied
    assert out_dict.keys() == ["user", "item"] and out_dict.values().shape == (4, 6)
    torch.testing.assert_close(out_dict.values(), out_kjt.values(), rtol=0, atol=0)
    torch.testing.assert_close(out_dict.to_dict()["item"], out_dict.values()[:, 4:], rtol=0, atol=0)
    a.train()
    with torch.no_grad():
        a(tensors(b))
    assert a.store.in_flight == 0


@pytest.mark.parametrize("mode", ["cpu", "cached"])
def test_pipelined_training_equals_plain_training(mode):
    extra = {"cache": {"policy": "lookahead", "lookahead": 2, "preview": 4}} if mode == "cached" else {}
    rng = np.random.default_rng(2)
    loader = [(tensors(batch(rng)), i) for i in range(12)]
    plain, piped = make(mode, **extra), make(mode, **extra)
    for sparse, _ in loader:
        step(plain, sparse)
    seen = []
    for (sparse, i), submitted in st.pipelined(piped, loader, sparse=lambda b: b[0], ahead=2,
                                               preview=4 if mode == "cached" else 0):
        assert piped.store.in_flight >= 1
        seen.append(i)
        step(piped, submitted)
    assert seen == list(range(12)) and piped.store.in_flight == 0
    torch.testing.assert_close(plain.state_dict()["embedding_bags.user.weight"],
                               piped.state_dict()["embedding_bags.user.weight"], rtol=0, atol=0)
    # Stopping early discards the batches submitted ahead.
    gen = st.pipelined(piped, loader, sparse=lambda b: b[0], ahead=2)
    (_, submitted) = next(gen)
    step(piped, submitted)
    gen.close()
    assert piped.store.in_flight == 0


def test_pipelined_keeps_ahead_plus_one_in_flight_and_discards_what_was_never_forwarded():
    rng = np.random.default_rng(2)
    loader = [tensors(batch(rng)) for _ in range(6)]
    # ahead + 1 batches in flight at most: fits cache.max_in_flight = ahead + 1.
    for ahead in (1, 2):
        m = make("cached", cache={"max_in_flight": ahead + 1})
        most = 0
        for submitted in (s for _, s in st.pipelined(m, loader, ahead=ahead)):
            most = max(most, m.store.in_flight)
            step(m, submitted)
        assert most == ahead + 1 and m.store.step == 6 and m.store.in_flight == 0
    # The consumer stops (break, an exception, close) before forwarding the batch it was given.
    m = make()
    for _ in st.pipelined(m, loader, ahead=1):
        break
    assert m.store.in_flight == 0

    def fails():
        for _ in st.pipelined(m, loader, ahead=2):
            raise KeyError("data")

    with pytest.raises(KeyError):
        fails()
    assert m.store.in_flight == 0
    gen = st.pipelined(m, loader, ahead=1)
    _, first = next(gen)
    _, second = next(gen)  # the first was never forwarded either
    step(m, second)
    gen.close()
    assert m.store.in_flight == 0 and m.store.step == 1


def test_module_bad_input_raises_and_changes_nothing():
    with pytest.raises(ValueError, match="device cuda"):
        st.EmbeddingBagCollection(config([table("user", 4, 2)]), device="cuda")
    a, other = make(), make()
    rng = np.random.default_rng(3)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    b = tensors(batch(rng))
    bad = [
        (TypeError, [1, 2]),
        (TypeError, dict(b, user={"keys": b["user"]["keys"].float(), "lengths": b["user"]["lengths"]})),
        (ValueError, dict(b, user={"keys": b["user"]["keys"] + 30, "lengths": b["user"]["lengths"]})),
        (ValueError, dict(b, user={"keys": b["user"]["keys"].to("meta"), "lengths": b["user"]["lengths"]})),
        (ValueError, other.submit(b)),
    ]
    for error, x in bad:
        with pytest.raises(error):
            a(x)
        assert a.store.in_flight == 0
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    # A gradient with NaN: the backward raises, nothing is applied, the batch can still be discarded.
    out = a(b)
    with pytest.raises(ValueError, match="is nan"):
        (out.values() * float("nan")).sum().backward()
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    a.discard_in_flight()
    assert a.store.in_flight == 0
