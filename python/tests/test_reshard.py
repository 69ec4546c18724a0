"""strata.torch.merge_state_dicts: the state_dicts of every rank of a world (worlds of 1-4 ranks,
every sharding type and optimizer state width) merge into the whole tables they were cut from, and
each refusal names what is wrong. The shards here are cut by this file's own rules from known
tables; test_world.py merges the state_dicts of real worlds and loads them across world sizes."""

import itertools

import numpy as np
import pytest
import torch

import strata.torch as st
from conftest import config, table

TYPES = {"replicated": 0, "table": 1, "row": 2, "column": 3}
STATE_BLOCKS = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": None, "adam": 2}  # None: one column per row


def state_dim(optimizer, dim):
    blocks = STATE_BLOCKS[optimizer]
    return 1 if blocks is None else blocks * dim


def cut(world, kind, rows, dim, owner=0):
    """Each rank's shard vector: world, rank, type, rows, dim, row_start, row_step, local_rows,
    col_offset, local_dim (the column split gives the first ranks one column more)."""
    out = []
    for r in range(world):
        if kind == "row":
            local = max(0, -(-(rows - r) // world))
            out.append([world, r, 2, rows, dim, r, world, local, 0, dim])
        elif kind == "column":
            base, extra = divmod(dim, world)
            c0 = r * base + min(r, extra)
            out.append([world, r, 3, rows, dim, 0, 1, rows, c0, base + (r < extra)])
        elif kind == "table":
            out.append([world, r, 1, rows, dim, 0, 1, rows if r == owner else 0, 0, dim if r == owner else 0])
        else:
            out.append([world, r, 0, rows, dim, 0, 1, rows, 0, dim])
    return out


def shard_dicts(world, specs, step=7, prefix="", head="embedding_bags."):
    """(every rank's state_dict, the whole tables) for specs [(name, kind, rows, dim, optimizer)];
    head="tables." names the entries as state_dicts did before."""
    rng = np.random.default_rng(world)
    whole, sds = {}, [{} for _ in range(world)]
    for name, kind, rows, dim, opt in specs:
        w = rng.normal(size=(rows, dim)).astype(np.float32)
        s = rng.normal(size=(rows, state_dim(opt, dim))).astype(np.float32)
        whole[name] = (w, s, 0.25)
        owner = world - 1
        holders = [r for r in range(world)] if kind == "replicated" else [owner] if kind == "table" else None
        for r, v in enumerate(cut(world, kind, rows, dim, owner)):
            sel = slice(v[5], v[5] + v[7] * v[6], v[6])
            c0, c1 = v[8], v[8] + v[9]
            lw = w[sel, c0:c1] if v[7] else np.zeros((0, v[9]), np.float32)
            blocks = STATE_BLOCKS[opt]
            if kind == "column":
                ls = np.concatenate([s[sel, b * dim + c0:b * dim + c1] for b in range(blocks)] or
                                    [np.zeros((rows, 0), np.float32)], axis=1)
            else:
                ls = s[sel] if v[7] else np.zeros((0, s.shape[1]), np.float32)
            key = f"{prefix}{head}{name}."
            sds[r][key + "weight"] = torch.from_numpy(np.ascontiguousarray(lw))
            if opt != "sgd":
                sds[r][key + "optimizer_state"] = torch.from_numpy(np.ascontiguousarray(ls))
            sds[r][key + "shard"] = torch.tensor(v, dtype=torch.int64)
            reps = holders if holders is not None else [r]
            sds[r][key + "replicas"] = torch.tensor(reps if v[7] else [], dtype=torch.int64)
            sds[r][key + "learning_rate"] = torch.tensor(0.25)
    for r in range(world):
        sds[r][prefix + "step"] = torch.tensor(step, dtype=torch.int64)
    return sds, whole


SPECS = [("rep", "replicated", 5, 3, "adam"), ("tab", "table", 4, 2, "adagrad"), ("row", "row", 11, 5, "adam"),
         ("few", "row", 2, 3, "rowwise_adagrad"), ("col", "column", 6, 7, "adam"), ("cola", "column", 3, 4, "adagrad"),
         ("plain", "row", 9, 1, "sgd")]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_shards_of_every_rank_merge_into_the_whole_tables(world):
    specs = [s for s in SPECS if s[1] != "column" or s[3] >= world]
    sds, whole = shard_dicts(world, specs, prefix="ebc.")
    for order in (list(range(world)), list(reversed(range(world)))):
        merged = st.merge_state_dicts([sds[r] for r in order], prefix="ebc.")
        assert int(merged["ebc.step"]) == 7 and merged["ebc.step"].dtype == torch.int64
        for name, _, _, _, opt in specs:
            w, s, lr = whole[name]
            assert torch.equal(merged[f"ebc.embedding_bags.{name}.weight"], torch.from_numpy(w)), name
            if opt == "sgd":
                assert f"ebc.embedding_bags.{name}.optimizer_state" not in merged
            else:
                assert torch.equal(merged[f"ebc.embedding_bags.{name}.optimizer_state"], torch.from_numpy(s)), name
            assert float(merged[f"ebc.embedding_bags.{name}.learning_rate"]) == lr
            assert f"ebc.embedding_bags.{name}.shard" not in merged
            assert f"ebc.embedding_bags.{name}.replicas" not in merged


def test_state_dicts_saved_with_the_names_before_merge_into_todays():
    sds, _ = shard_dicts(2, SPECS[:3], prefix="ebc.")
    old, _ = shard_dicts(2, SPECS[:3], prefix="ebc.", head="tables.")
    old[0]["tables.dense"] = torch.ones(1)  # not a table's entry: kept as it is
    merged, from_old = st.merge_state_dicts(sds, prefix="ebc."), st.merge_state_dicts(old, prefix="ebc.")
    assert list(from_old) == ["tables.dense"] + list(merged)
    assert all(torch.equal(from_old[k], v) for k, v in merged.items())
    both = [dict(sd) for sd in old]
    both[1]["ebc.embedding_bags.rep.weight"] = both[1]["ebc.tables.rep.weight"]
    refused(both, "state_dicts[1]: entries 'ebc.tables.rep.*' and 'ebc.embedding_bags.rep.*' of one table",
            prefix="ebc.")


def test_entries_outside_the_tables_come_from_rank_0():
    sds, _ = shard_dicts(2, SPECS[:3])
    sds[0]["dense.weight"] = torch.ones(2)
    sds[1]["dense.weight"] = torch.zeros(2)
    merged = st.merge_state_dicts(sds)
    assert torch.equal(merged["dense.weight"], torch.ones(2))


def refused(sds, *needles, prefix=""):
    with pytest.raises(ValueError) as e:
        st.merge_state_dicts(sds, prefix=prefix)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_a_missing_or_doubled_rank_is_refused():
    sds, _ = shard_dicts(4, SPECS[:3])
    refused([sds[0], sds[1], sds[3]], "ranks 0, 1, 3 of a world of 4", "missing rank 2")
    refused([sds[0], sds[1], sds[1], sds[3]], "are both rank 1's")
    refused([], "empty")
    with pytest.raises(TypeError, match="expected a list"):
        st.merge_state_dicts(sds[0])


def test_state_dicts_of_different_worlds_steps_or_rates_are_refused():
    two, _ = shard_dicts(2, SPECS[:3])
    three, _ = shard_dicts(3, SPECS[:3])
    refused([two[0], three[1]], "worlds of [2, 3] ranks")
    sds, _ = shard_dicts(3, SPECS[:3])
    sds[2]["step"] = torch.tensor(8)
    refused(sds, "'step' is 8 on rank 2 but 7 on rank 0")
    sds, _ = shard_dicts(3, SPECS[:3])
    sds[1]["embedding_bags.row.learning_rate"] = torch.tensor(0.5)
    refused(sds, "'embedding_bags.row.learning_rate' is 0.5 on rank 1 but 0.25 on rank 0")
    sds, _ = shard_dicts(2, SPECS[:3])
    del sds[1]["step"]
    refused(sds, "'step' is absent on rank 1")


def test_shards_that_do_not_match_their_vector_or_table_are_refused():
    sds, _ = shard_dicts(2, SPECS[:5])
    sds[1]["embedding_bags.row.weight"] = sds[1]["embedding_bags.row.weight"][:-1]
    refused(sds, "rank 1's 'embedding_bags.row.weight'", "expected float32 (5, 5)")
    sds, _ = shard_dicts(2, SPECS[:5])
    sds[0]["embedding_bags.col.optimizer_state"] = sds[0]["embedding_bags.col.optimizer_state"][:, :-1]
    refused(sds, "rank 0's 'embedding_bags.col.optimizer_state'", "a multiple of 4 columns")
    sds, _ = shard_dicts(2, SPECS[:5])
    v = sds[1]["embedding_bags.row.shard"].clone()
    v[3], v[7] = 12, 6  # a row shard of another table's rows
    sds[1]["embedding_bags.row.shard"] = v
    refused(sds, "rank 1's 'embedding_bags.row.shard' is a row shard of a (12, 5) table but rank 0's a row shard of "
            "(11, 5)")
    sds, _ = shard_dicts(2, SPECS[:5])
    del sds[1]["embedding_bags.tab.shard"]
    refused(sds, "rank 1's state_dict has tables")
    sds, _ = shard_dicts(2, SPECS[:5])
    v = sds[1]["embedding_bags.row.shard"].clone()
    v[5] = 0  # rank 1 claims rank 0's rows
    sds[1]["embedding_bags.row.shard"] = v
    refused(sds, "state_dicts[1]['embedding_bags.row.shard']", "not a row shard of rank 1 of 2")
    sds, _ = shard_dicts(2, SPECS[:5])
    v = sds[1]["embedding_bags.col.shard"].clone()
    v[8] = 0  # rank 1's columns start where rank 0's do
    sds[1]["embedding_bags.col.shard"] = v
    refused(sds, "rank 1's 'embedding_bags.col.shard'", "overlaps")
    refused([{"step": torch.tensor(1)}], "has no 'embedding_bags.<name>.shard' entry")


def test_a_one_rank_module_loads_the_merge_and_refuses_the_shards_naming_the_way():
    tables = [table("user", 11, 5, optimizer="adam"), table("item", 9, 1)]
    m = st.EmbeddingBagCollection(config(tables), process_group=False)
    sds, whole = shard_dicts(3, [("user", "row", 11, 5, "adam"), ("item", "row", 9, 1, "sgd")])
    with pytest.raises(RuntimeError, match="merge_state_dicts"):
        m.load_state_dict(sds[0])
    before = m.state_dict()
    assert not torch.equal(before["embedding_bags.user.weight"], torch.from_numpy(whole["user"][0]))
    m.load_state_dict(st.merge_state_dicts(sds))
    after = m.state_dict()
    for name in ("user", "item"):
        assert torch.equal(after[f"embedding_bags.{name}.weight"], torch.from_numpy(whole[name][0]))
    assert torch.equal(after["embedding_bags.user.optimizer_state"], torch.from_numpy(whole["user"][1]))
    assert int(after["step"]) == 7 and float(after["embedding_bags.item.learning_rate"]) == 0.25


def test_the_cut_covers_every_row_and_column_once():
    """This file's own cut (the test's premise): each (row, column) held by exactly one rank, or by
    every rank for replicated tables."""
    for world, (kind, rows, dim) in itertools.product([1, 2, 3, 4], [("row", 2, 3), ("row", 11, 2),
                                                                      ("column", 3, 4), ("table", 4, 2)]):
        if kind == "column" and dim < world:
            continue
        count = np.zeros((rows, dim), int)
        for v in cut(world, kind, rows, dim, owner=world - 1):
            count[v[5]:v[5] + v[7] * v[6]:v[6], v[8]:v[8] + v[9]] += 1
        assert (count == 1).all(), (world, kind)


def test_malformed_entries_are_refused_naming_the_entry_and_rank():
    sds, _ = shard_dicts(2, SPECS[:3])
    del sds[1]["embedding_bags.row.weight"]
    refused(sds, "rank 1's state_dict has 'embedding_bags.row.shard' but no 'embedding_bags.row.weight'")
    sds, _ = shard_dicts(2, [("row", "row", 4, 2, "sgd")])
    v = sds[1]["embedding_bags.row.shard"].clone()
    v[5], v[6] = 3, -2  # rows 3, 1: a layout no world writes
    sds[1]["embedding_bags.row.shard"] = v
    refused(sds, "state_dicts[1]['embedding_bags.row.shard']", "not a row shard of rank 1 of 2")
    sds, _ = shard_dicts(2, SPECS[:3])
    sds[1]["embedding_bags.rep.weight"] = sds[1]["embedding_bags.rep.weight"] + 100
    refused(sds, "rank 1's replica of 'embedding_bags.rep.weight'", "differs from rank 0's")
    sds, _ = shard_dicts(2, SPECS[:3])
    sds[1]["embedding_bags.tab.optimizer_state"] = torch.zeros(1, dtype=torch.float64)
    refused(sds, "rank 1's 'embedding_bags.tab.optimizer_state' is float64 (1,)")
    sds, _ = shard_dicts(2, SPECS[:3])
    for sd in sds:
        sd["step"] = torch.tensor(7.5)
    refused(sds, "'step' is 7.5", "expected an integer")
    sds, _ = shard_dicts(2, SPECS[:3])
    sds[0]["embedding_bags.row.weight"] = sds[0]["embedding_bags.row.weight"].to(torch.bfloat16)
    # A bf16 table's rows on one rank only (half-size rows merge as their dtype: test_half.py).
    refused(sds, "rank 1's 'embedding_bags.row.weight' is torch.float32 but rank 0's torch.bfloat16")
    sds, _ = shard_dicts(2, SPECS[:3])
    sds[1]["embedding_bags.row.shard"] = sds[1]["embedding_bags.row.shard"].to(torch.float32)
    refused(sds, "state_dicts[1]['embedding_bags.row.shard'] is float32")
    with pytest.raises(TypeError, match=r"state_dicts\[1\] is a list"):
        st.merge_state_dicts([sds[0], [1, 2]])


def test_a_step_absent_on_every_rank_is_left_out():
    sds, whole = shard_dicts(2, SPECS[:3])
    for sd in sds:
        del sd["step"]
    merged = st.merge_state_dicts(sds)
    assert "step" not in merged
    assert torch.equal(merged["embedding_bags.row.weight"], torch.from_numpy(whole["row"][0]))


def test_dynamic_shards_merge_into_the_whole_table_by_key():
    """A dynamic table's shards (keys, their rows, the 6-value shard vector) beside a dense table's:
    the keys of both ranks ascending with their rows; a key in two ranks' shards, a dense shard
    beside a dynamic one's and a shard vector of the wrong length are refused naming them."""
    sds, whole = shard_dicts(2, SPECS[:3])
    keys = np.array([-2**63, 9, -4, 2**62, 5], np.int64)
    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    p = "embedding_bags.dyn."
    for r, mine in enumerate(([0, 2, 4], [1, 3])):  # each rank's keys ascending, as keys_held gives them
        mine = sorted(mine, key=lambda i: keys[i])
        sds[r].update({p + "keys": torch.from_numpy(keys[mine]), p + "weight": torch.from_numpy(rows[mine]),
                       p + "optimizer_state": torch.from_numpy(rows[mine, :1] + 100),
                       p + "shard": torch.tensor([2, r, 2, 8, 2, 4]), p + "learning_rate": torch.tensor(0.5)})
    merged = st.merge_state_dicts(sds)
    order = np.argsort(keys)
    assert merged[p + "keys"].tolist() == keys[order].tolist()
    assert torch.equal(merged[p + "weight"], torch.from_numpy(rows[order]))
    assert torch.equal(merged[p + "optimizer_state"], torch.from_numpy(rows[order, :1] + 100))
    assert float(merged[p + "learning_rate"]) == 0.5 and p + "shard" not in merged
    assert torch.equal(merged["embedding_bags.row.weight"], torch.from_numpy(whole["row"][0]))
    twice = [dict(sd) for sd in sds]
    twice[1][p + "keys"] = torch.tensor([-4, 2**62])  # key -4 is rank 0's too
    refused(twice, "key -4 is in rank 0's and rank 1's 'embedding_bags.dyn.keys'")
    mixed = [dict(sd) for sd in sds]
    del mixed[1][p + "keys"]
    mixed[1][p + "shard"] = torch.tensor(cut(2, "row", 2, 2)[1])
    refused(mixed, "rank 1's 'embedding_bags.dyn.*' is a dense table's shard but rank 0's a dynamic one's")
    short = [dict(sd) for sd in sds]
    short[0][p + "shard"] = torch.tensor([2, 0, 2, 8, 2])
    refused(short, "state_dicts[0]['embedding_bags.dyn.shard'] is int64 with 5 values", "dynamic table's shard")
