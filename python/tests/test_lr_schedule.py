"""Learning rates from Python: 0 is a rate (an update of zero), torch's schedulers drive the tables'
rates through EmbeddingBagCollection.sparse_optimizer, and repr() lists the tables."""

import numpy as np
import pytest
import torch

import strata
import strata.torch as st
from conftest import config, random_feature, table


def make(lr=0.1):
    return st.EmbeddingBagCollection(config([table("user", 30, 4, optimizer="adagrad", lr=lr),
                                             table("item", 20, 2, optimizer="adam", lr=lr)]))


def train_step(ebc, rng, opt=None):
    out = ebc({"user": random_feature(rng, 30, 4), "item": random_feature(rng, 20, 4)})
    out.values().pow(2).sum().backward()
    if opt is not None:
        opt.step()


def test_zero_rate_keeps_the_weights_and_advances_the_state():
    rng = np.random.default_rng(0)
    ebc = make(lr=0.0)  # from the config
    assert ebc.learning_rate("user") == 0.0
    ebc.set_learning_rate(0)  # and set
    before = {k: v.clone() for k, v in ebc.state_dict().items()}
    for _ in range(3):
        train_step(ebc, rng)
    after = ebc.state_dict()
    for name in ("user", "item"):
        key = f"embedding_bags.{name}."
        assert torch.equal(after[key + "weight"], before[key + "weight"]), name
        assert not torch.equal(after[key + "optimizer_state"], before[key + "optimizer_state"]), name
    assert int(after["step"]) == 3
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="expected a finite number >= 0"):
            ebc.set_learning_rate(bad, "user")
        assert ebc.learning_rate("user") == 0.0
    # A state_dict's rate of 0 loads; a negative one is refused.
    ebc.load_state_dict(dict(after, **{"embedding_bags.user.learning_rate": torch.tensor(0.0)}))
    with pytest.raises(RuntimeError, match="embedding_bags.user.learning_rate -0.5 "):
        ebc.load_state_dict(dict(after, **{"embedding_bags.user.learning_rate": -0.5}))


@pytest.mark.parametrize("kind", ["cosine", "step"])
def test_one_scheduler_drives_the_dense_and_the_table_rates_through_the_last_step(kind):
    rng = np.random.default_rng(1)
    ebc = make(lr=0.1)
    dense = torch.nn.Linear(2, 1)
    opt = ebc.sparse_optimizer(torch.optim.SGD(dense.parameters(), lr=0.1))
    assert isinstance(opt, torch.optim.Optimizer)
    assert [g.get("table") for g in opt.param_groups] == [None, "user", "item"]
    steps = 6
    if kind == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=0)
    else:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(steps):
        dense(torch.ones(1, 2)).sum().backward()
        train_step(ebc, rng, opt)
        sched.step()
        dense_lr = opt.param_groups[0]["lr"]
        for name in ("user", "item"):  # every step: the table's rate in the store is the dense one's
            assert ebc.learning_rate(name) == np.float32(dense_lr), (name, dense_lr)
    assert dense_lr == (0.0 if kind == "cosine" else 0.1 * 0.5 ** 3)
    # At the last rate (0 for the cosine) the next step changes no weight.
    weights = ebc.state_dict()["embedding_bags.user.weight"].clone()
    train_step(ebc, rng, opt)
    assert torch.equal(weights, ebc.state_dict()["embedding_bags.user.weight"]) == (kind == "cosine")
    # A rate set by other means shows in the group; a bad one from a scheduler raises and changes nothing.
    ebc.set_learning_rate(0.25, "item")
    assert opt.param_groups[2]["lr"] == 0.25
    with pytest.raises(ValueError, match="expected a finite number >= 0"):
        opt.param_groups[1]["lr"] = -1.0
    assert ebc.learning_rate("user") == np.float32(dense_lr)
    # Its state_dict round-trips the tables' rates with the dense optimizer's state.
    sd = opt.state_dict()
    ebc.set_learning_rate(0.5)
    opt.load_state_dict(sd)
    assert ebc.learning_rate("item") == 0.25


def test_sparse_optimizer_alone_and_bad_arguments():
    ebc = make(lr=0.1)
    opt = ebc.sparse_optimizer()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    opt.step()
    sched.step()
    assert ebc.learning_rate("user") == np.float32(0.1 * 0.1)
    with pytest.raises(TypeError, match="dense is a str"):
        ebc.sparse_optimizer("sgd")


def test_repr_lists_the_tables():
    ebc = make(lr=0.1)
    ebc.set_learning_rate(0.0, "item")
    for text in (repr(ebc.store), repr(ebc)):
        assert "user: rows=30, dim=4, dtype=fp32, placement=cpu, optimizer=adagrad(lr=0.1)" in text, text
        assert "item: rows=20, dim=2, dtype=fp32, placement=cpu, optimizer=adam(lr=0)" in text, text
    assert repr(ebc).startswith("EmbeddingBagCollection(")
    assert "step=0" in repr(strata.Store(config([table("a", 3, 2)])))


@pytest.mark.parametrize("load", ["optimizer", "dense"])
def test_a_scheduler_drives_the_rates_after_a_resume(load):
    # load_state_dict gives the dense optimizer new param group dicts: the scheduler must write those.
    ebc = make(lr=0.1)
    dense = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(dense.parameters(), lr=0.1)
    opt = ebc.sparse_optimizer(sgd)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    if load == "optimizer":
        opt.load_state_dict(opt.state_dict())
    else:
        sgd.load_state_dict(sgd.state_dict())
    for i in range(1, 4):
        dense(torch.ones(1, 2)).sum().backward()
        opt.step()
        sched.step()
        assert sgd.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** i), i
        for name in ("user", "item"):
            assert ebc.learning_rate(name) == np.float32(0.1 * 0.5 ** i), (name, i)
    assert opt.param_groups[0] is sgd.param_groups[0] and opt.state is sgd.state


def test_a_tiny_negative_rate_is_refused_not_taken_for_zero():
    # -1e-50 narrows to float32's -0.0: refused as negative before narrowing, on every path.
    ebc = make(lr=0.1)
    with pytest.raises(ValueError, match=r"set_learning_rate: table 'user': learning_rate -1e-50 \(expected a finite "
                                         r"number >= 0\)"):
        ebc.set_learning_rate(-1e-50, "user")
    with pytest.raises(ValueError, match=r"set_learning_rate: learning_rate -1e-50 \(expected a finite number >= 0\)"):
        ebc.store.set_learning_rate(-1e-50)
    assert ebc.learning_rate("user") == np.float32(0.1) and ebc.learning_rate("item") == np.float32(0.1)
    with pytest.raises(RuntimeError, match="embedding_bags.user.learning_rate -1e-50 "):
        ebc.load_state_dict(dict(ebc.state_dict(), **{"embedding_bags.user.learning_rate": -1e-50}))
    for tiny in (-1e-50, 1e-50):  # in a config: a number float32 holds only as 0 is not that number
        with pytest.raises(ValueError, match="learning_rate"):
            strata.Store(config([table("user", 30, 4, lr=tiny)]))


def test_a_bad_optimizer_state_dict_changes_nothing():
    ebc = make(lr=0.1)
    dense = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(dense.parameters(), lr=0.1)
    opt = ebc.sparse_optimizer(sgd)
    sd = opt.state_dict()
    sd["dense"]["param_groups"][0]["lr"] = 0.7
    key = r"state_dict\['table_lr'\]"
    for rates, match in (({"user": 0.3, "item": -1.0}, key + r"\['item'\] -1.0 \(expected a finite number >= 0"),
                         ({"user": 0.3, "item": "fast"}, key + r"\['item'\] is a str"),
                         ([0.3, 0.3], key + r" is a list \(expected a dict")):
        with pytest.raises((ValueError, TypeError), match=match):
            opt.load_state_dict({"dense": sd["dense"], "table_lr": rates})
        assert sgd.param_groups[0]["lr"] == 0.1  # the dense state is not loaded either
        assert ebc.learning_rate("user") == np.float32(0.1) and ebc.learning_rate("item") == np.float32(0.1)
    opt.load_state_dict({"dense": sd["dense"], "table_lr": {"user": 0.3, "item": 0.0}})
    assert sgd.param_groups[0]["lr"] == 0.7 and ebc.learning_rate("user") == np.float32(0.3)
    assert ebc.learning_rate("item") == 0.0
