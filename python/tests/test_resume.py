"""Resuming from a state_dict: a run interrupted after some steps (state_dict, a new module,
load_state_dict) continues bit for bit as the uninterrupted run, for every optimizer and placement:
the state_dict holds everything the next update reads (rows, optimizer state, learning rates and
the store's step, which Adam's bias correction reads). Old state_dicts without the step and bad
entries are refused, naming the entry."""

import numpy as np
import pytest
import torch

import strata.torch as st
from conftest import PLACEMENTS, config, random_feature, table

OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]

TABLES = [("user", 24, 4, "sum"), ("item", 16, 3, "mean")]
BEFORE, AFTER = 3, 2  # steps before and after the interruption


def make(optimizer, placement):
    return st.EmbeddingBagCollection(config([table(n, r, d, pooling, optimizer, 0.1, placement, cache_rows=13)
                                             for n, r, d, pooling in TABLES], placement))


def batches(steps):
    rng = np.random.default_rng(3)
    out = []
    for _ in range(steps):
        b = {n: {k: torch.from_numpy(v) for k, v in random_feature(rng, r, 4, weighted=(n == "user")).items()}
             for n, r, _, _ in TABLES}
        g = torch.from_numpy(rng.normal(size=(4, sum(d for _, _, d, _ in TABLES))).astype(np.float32))
        out.append((b, g))
    return out


def train(m, steps):
    for i, (b, g) in steps:
        if i == 1:
            m.set_learning_rate(0.05, "item")  # a rate that differs from the config's, before the interruption
        (m(b).values() * g).sum().backward()


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_interrupted_run_equals_the_uninterrupted_one_bit_for_bit(optimizer, placement):
    steps = list(enumerate(batches(BEFORE + AFTER)))
    whole = make(optimizer, placement)
    train(whole, steps)
    first = make(optimizer, placement)
    train(first, steps[:BEFORE])
    saved = first.state_dict()
    assert int(saved["step"]) == BEFORE
    resumed = make(optimizer, placement)
    resumed.load_state_dict(saved)
    assert resumed.store.step == BEFORE and resumed.learning_rate("item") == np.float32(0.05)
    train(resumed, steps[BEFORE:])
    assert resumed.store.step == whole.store.step == BEFORE + AFTER
    assert_same_state(whole, resumed)


def trained(optimizer="adam"):
    m = make(optimizer, "cpu")
    train(m, list(enumerate(batches(2))))
    return m


def test_a_state_dict_without_the_step_is_refused_under_strict_and_loads_without():
    """A state_dict saved before the step was part of it: strict loading refuses it (the step
    would silently restart), strict=False loads the rest and reports 'step' missing, keeping the
    module's step."""
    old = {k: v for k, v in trained().state_dict().items() if k != "step"}
    m = make("adam", "cpu")
    before = m.state_dict()
    with pytest.raises(RuntimeError, match=r"missing keys \['step'\]"):
        m.load_state_dict(old)
    assert_same_dict(before, m.state_dict())
    result = m.load_state_dict(old, strict=False)
    assert result.missing_keys == ["step"] and result.unexpected_keys == []
    assert m.store.step == 0
    for k, v in old.items():
        assert torch.equal(m.state_dict()[k], v), k


def assert_same_dict(x, y):
    assert x.keys() == y.keys()
    for k in x:
        assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("entry,words", [
    (torch.tensor(2.0), "step has dtype torch.float32 (expected an integer"),
    (torch.tensor([2]), "step has shape (1,) (expected a scalar"),
    (torch.tensor(-1), "step -1 (expected >= 0)"),
    (-3, "step -3 (expected >= 0)"),
    (2**63 - 1, "step 9223372036854775807 (expected at most 2^63 - 2"),  # the next update takes step + 1
    (torch.tensor(2**63 - 1), "step 9223372036854775807 (expected at most 2^63 - 2"),
    (2.5, "step is a float (expected an integer"),
    ("2", "step is a str (expected an integer"),
    (True, "step is a bool (expected an integer"),
    (np.array([2, 3]), "step has shape (2,) (expected a scalar"),
])
def test_a_bad_step_is_refused_naming_it_and_changes_nothing(entry, words):
    sd = trained().state_dict()
    m = make("adam", "cpu")
    before = m.state_dict()
    with pytest.raises(RuntimeError) as e:
        m.load_state_dict(dict(sd, step=entry))
    assert words in str(e.value), str(e.value)
    assert_same_dict(before, m.state_dict())


def test_step_entry_forms_that_load():
    sd = trained().state_dict()
    for step in (np.int64(2), 2, torch.tensor(2, dtype=torch.int32), np.array(2)):
        m = make("adam", "cpu")
        m.load_state_dict(dict(sd, step=step))
        assert m.store.step == 2


def test_strict_loading_needs_every_entry_the_next_update_reads():
    """Under strict, a table's optimizer state and learning rate are required like its weight: a
    state_dict without them would leave the module's own (silently another run's state)."""
    sd = trained("adagrad").state_dict()
    for key in ("embedding_bags.user.optimizer_state", "embedding_bags.item.learning_rate"):
        m = make("adagrad", "cpu")
        before = m.state_dict()
        with pytest.raises(RuntimeError, match=rf"missing keys \['{key}'\]"):
            m.load_state_dict({k: v for k, v in sd.items() if k != key})
        assert_same_dict(before, m.state_dict())
        result = m.load_state_dict({k: v for k, v in sd.items() if k != key}, strict=False)
        assert result.missing_keys == [key]
