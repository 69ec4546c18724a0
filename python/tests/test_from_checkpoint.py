"""strata.Store.from_checkpoint: a store reopened from its checkpoint alone (the config the manifest
recorded) reads bit for bit as the store that saved it and trains on as that store, which kept
running, in every placement; overrides change what may differ (threads, cache size) and nothing
else."""

import numpy as np
import pytest

import strata
from conftest import PLACEMENTS, config, random_feature, table


def step(s, batch_id, rng):
    features = {"user": random_feature(rng, 24, 4, weighted=True), "item": random_feature(rng, 16, 4)}
    s.submit(batch_id, features)
    outs = s.forward(batch_id)
    s.backward(batch_id, [rng.normal(size=o.shape).astype(np.float32) for o in outs])
    return outs


def rows(s):
    return {t: s.read_rows(t) for t in ("user", "item")}


def assert_same(a, b):
    for t in a:
        for x, y in zip(a[t], b[t]):
            assert x.tobytes() == y.tobytes(), t


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_reopened_store_reads_and_trains_as_the_one_that_kept_running(tmp_path, placement):
    a = strata.Store(config([table("user", 24, 4, optimizer="adam", mode=placement),
                             table("item", 16, 3, optimizer="adagrad", mode=placement)], placement))
    rng = np.random.default_rng(0)
    for i in range(3):
        step(a, i, rng)
    a.set_learning_rate(0.0, "item")
    a.save(tmp_path)
    b = strata.Store.from_checkpoint(tmp_path, overrides={"threads": 2})
    assert b.step == 3 and b.config["threads"] == 2
    assert b.learning_rate("item") == 0.0 and b.learning_rate("user") == a.learning_rate("user")
    assert [t["placement"] for t in b.config["tables"]] == [placement, placement]
    assert_same(rows(a), rows(b))
    for i in range(3, 5):
        outs_a, outs_b = step(a, i, np.random.default_rng(i)), step(b, i, np.random.default_rng(i))
        for x, y in zip(outs_a, outs_b):
            assert x.tobytes() == y.tobytes()
    assert_same(rows(a), rows(b))


def test_overrides_that_change_results_are_refused(tmp_path):
    a = strata.Store(config([table("user", 24, 4, mode="cached")], "cached"))
    a.save(tmp_path)
    b = strata.Store.from_checkpoint(tmp_path, {"tables": {"user": {"cache": {"rows": 20}}}})
    assert b.config["tables"][0]["cache"]["rows"] == 20
    with pytest.raises(ValueError, match="table 'user' rows 30 differs from the checkpoint's 24"):
        strata.Store.from_checkpoint(tmp_path, {"tables": {"user": {"rows": 30}}})
    with pytest.raises(ValueError, match="the checkpoint has no table 'nope'"):
        strata.Store.from_checkpoint(tmp_path, {"tables": {"nope": {"rows": 30}}})
    with pytest.raises(TypeError, match="overrides is a list"):
        strata.Store.from_checkpoint(tmp_path, [1])
    with pytest.raises(ValueError, match="MANIFEST"):  # NotFound: no checkpoint there
        strata.Store.from_checkpoint(tmp_path / "none")


def test_overrides_apply_to_the_save_that_replaced_the_checkpoint_meanwhile(tmp_path, monkeypatch):
    # A save (of a changed rate and step) lands while from_checkpoint merges the overrides: it opens
    # that save, with the overrides, rather than refusing the new rate as an override.
    import json

    cfg = config([table("user", 24, 4, mode="cached"), table("item", 16, 3, mode="cached")], "cached")
    a, b = strata.Store(cfg), strata.Store(cfg)
    a.save(tmp_path)
    step(b, 0, np.random.default_rng(0))
    b.set_learning_rate(0.5)
    dumps, saved = json.dumps, []

    def dumps_then_save(*args, **kwargs):
        if not saved:
            saved.append(b.save(tmp_path))
        return dumps(*args, **kwargs)

    monkeypatch.setattr(json, "dumps", dumps_then_save)
    c = strata.Store.from_checkpoint(tmp_path, {"threads": 2, "tables": {"user": {"cache": {"rows": 20}}}})
    assert saved and c.step == 1 and c.learning_rate("user") == 0.5
    assert c.config["threads"] == 2 and c.config["tables"][0]["cache"]["rows"] == 20
    assert_same(rows(b), rows(c))
