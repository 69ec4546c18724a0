"""Whole tables from the state_dicts of a world's ranks (``strata.torch.merge_state_dicts``).

A world's ``EmbeddingBagCollection.state_dict()`` holds one rank's shards, each table's described by
``embedding_bags.<name>.shard`` (int64[10]: world, rank, type, rows, dim, row_start, row_step, local_rows,
col_offset, local_dim; see ``EmbeddingBagCollection.state_dict``; a dynamic table's, beside its ``keys``,
int64[6]: world, rank, type, capacity, dim, shard_capacity). Merging every rank's gives the
state_dict of one rank holding whole tables, which loads into a module of any world size: a one-rank
module takes it as its own, and each rank of a world writes its slice.
"""

import collections.abc

import numpy as np
import torch

from strata._dtypes import float32_rows, rows_as

# The shard vector's fields, in order (python/strata/torch.py writes them).
_FIELDS = ("world", "rank", "type", "rows", "dim", "row_start", "row_step", "local_rows", "col_offset", "local_dim")
# A dynamic table's shard vector (beside its ``keys``): keys, not rows, are sharded (ShardLayout::key_owner).
_KEY_FIELDS = ("world", "rank", "type", "capacity", "dim", "shard_capacity")
_TYPES = ("replicated", "table", "row", "column")  # ShardingType's order (dispatch/sharding_plan.hpp)
ENTRIES = ("keys", "weight", "optimizer_state", "shard", "replicas", "learning_rate")  # keys: a dynamic table's
# A table's entries are <prefix>embedding_bags.<table>.<entry> (TorchRec's EmbeddingBagCollection
# names its tables' weights so); state_dicts saved before hold <prefix>tables.<table>.<entry>, which load too.
HEAD, OLD_HEAD = "embedding_bags.", "tables."


def table_entries(prefix, table, head=HEAD):
    """The name of a table's entries in state_dict(), up to the entry: '<prefix>embedding_bags.<table>.'
    (with ``head=OLD_HEAD``, the name before: '<prefix>tables.<table>.')."""
    return f"{prefix}{head}{table}."


def saved_table_entries(state_dict, prefix, table):
    """Where a table's entries are in a state_dict to load: ``table_entries``, or the names saved
    before them ('<prefix>tables.<table>.') where the state_dict holds the table's entries under
    those only. ValueError when it holds entries of the table under both."""
    new, old = table_entries(prefix, table), table_entries(prefix, table, OLD_HEAD)
    if not any(old + e in state_dict for e in ENTRIES):
        return new
    if any(new + e in state_dict for e in ENTRIES):
        raise ValueError(f"entries '{old}*' and '{new}*' of one table (expected either name, not both: "
                         f"'{old}*' is the name state_dicts held before '{new}*')")
    return old


def with_current_names(state_dict, prefix, tables):
    """A copy of ``state_dict`` whose entries of ``tables`` saved under the names before
    ('tables.<table>.*') are renamed to today's ('embedding_bags.<table>.*'; see
    saved_table_entries)."""
    out = dict(state_dict)
    for table in tables:
        saved, new = saved_table_entries(state_dict, prefix, table), table_entries(prefix, table)
        if saved != new:
            for e in ENTRIES:
                if saved + e in out:
                    out[new + e] = out.pop(saved + e)
    return out


def _array(value, what):
    """A host NumPy view of a tensor or array entry."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in (torch.float32, torch.float64, torch.int64, torch.int32):
            raise ValueError(f"{what} is a {value.dtype} tensor (expected float32 rows, int64 shard vectors)")
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    raise ValueError(f"{what} is a {type(value).__name__} (expected a tensor or NumPy array)")


def _rows(value, what, dtypes):
    """A weight or optimizer_state entry as float32 NumPy rows (half-size rows widened: exact),
    its torch dtype appended to ``dtypes``."""
    if isinstance(value, torch.Tensor) and value.dtype in (torch.bfloat16, torch.float16):
        dtypes.append(value.dtype)
        return float32_rows(value)
    a = _array(value, what)
    dtypes.append(torch.float16 if a.dtype == np.float16 else torch.float32)
    return a.astype(np.float32) if a.dtype == np.float16 else a


def _scalar(value, what, integer=False):
    """A number entry (learning_rate; step with ``integer``) as a Python float or int."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        a = _array(value, what)
        if a.size != 1:
            raise ValueError(f"{what} has shape {tuple(a.shape)} (expected a single value)")
        value = a.reshape(())[()]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} is a {type(value).__name__} (expected a number)")
    if integer and not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} is {value} (expected an integer: the step)")
    return value.item() if isinstance(value, np.generic) else value


def _tables_of(sd, prefix):
    """The table names of one rank's state_dict: those with a ``embedding_bags.<name>.shard`` entry
    (or one named as before, ``tables.<name>.shard``)."""
    tail = ".shard"
    return sorted({k[len(prefix + head):-len(tail)] for head in (HEAD, OLD_HEAD) for k in sd
                   if k.startswith(prefix + head) and k.endswith(tail)})


def merge_state_dicts(state_dicts, prefix=""):
    """Merges the ``state_dict()`` of every rank of one world (any order, each rank once) into the
    state_dict of one rank holding whole tables: ``<prefix>embedding_bags.<name>.weight`` (rows, dim),
    ``.optimizer_state`` (rows, state columns; absent for sgd) and ``.learning_rate`` per table, and
    ``<prefix>step``, exactly the entries a one-rank ``EmbeddingBagCollection`` saves. It loads into
    a module of any world size with the same tables (``load_state_dict``: a one-rank module takes it
    whole; each rank of a world writes the rows and columns it holds). Entries outside the tables
    and the step (a dense model's parameters, equal on every rank under DDP) are taken from rank 0's.
    State_dicts saved with the names before, ``<prefix>tables.<name>.*``, merge too (into today's).

    A dynamic table (its shards' ``keys`` beside a 6-value ``shard``) merges into
    ``<prefix>embedding_bags.<name>.keys`` (every rank's keys, ascending), ``.weight`` and
    ``.optimizer_state`` (their rows in that order) and ``.learning_rate``, as a one-rank module's
    state_dict holds it; a key in two ranks' shards is refused naming it.

    Rows come from the rank that holds them (a replicated table from its lowest replica). Raises
    TypeError for arguments of the wrong type, and ValueError, returning nothing, naming the entry and rank for: a rank missing or given twice,
    state_dicts of different worlds, of different steps or learning rates (a world's are equal on
    every rank at one point of training), tables that differ between ranks, and a shard whose
    entries do not match its ``shard`` vector."""
    if isinstance(state_dicts, (collections.abc.Mapping, str, bytes)) or not hasattr(state_dicts, "__iter__"):
        raise TypeError(f"state_dicts is a {type(state_dicts).__name__} (expected a list of every rank's "
                        "state_dict())")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix is a {type(prefix).__name__} (expected a str, as load_state_dict's keys start)")
    sds = list(state_dicts)
    if not sds:
        raise ValueError("state_dicts is empty (expected every rank's state_dict() of one world)")
    shards = []  # per input: {table: shard vector}
    for i, sd in enumerate(sds):
        if not isinstance(sd, collections.abc.Mapping):
            raise TypeError(f"state_dicts[{i}] is a {type(sd).__name__} (expected a rank's state_dict())")
        tables = _tables_of(sd, prefix)
        if not tables:
            raise ValueError(f"state_dicts[{i}] has no '{table_entries(prefix, '<name>')}shard' entry (expected the "
                             "state_dict() of a rank of a world of more than one rank)")
        try:
            sds[i] = sd = with_current_names(sd, prefix, tables)
        except ValueError as e:
            raise ValueError(f"state_dicts[{i}]: {e}") from None
        shards.append({t: _shard(sd, table_entries(prefix, t), i) for t in tables})
    for i, s in enumerate(shards):
        first = next(iter(s.values()))
        for t, v in s.items():
            if (v["world"], v["rank"]) != (first["world"], first["rank"]):
                raise ValueError(f"state_dicts[{i}]: tables of different ranks or worlds in one state_dict "
                                 f"('{table_entries(prefix, t)}shard' says rank {v['rank']} of {v['world']})")
    world = {next(iter(s.values()))["world"] for s in shards}
    if len(world) != 1:
        raise ValueError(f"state_dicts of worlds of {sorted(world)} ranks (expected the state_dicts of one world)")
    (n,) = world
    by_rank = {}
    for i, s in enumerate(shards):
        rank = next(iter(s.values()))["rank"]
        if rank in by_rank:
            raise ValueError(f"state_dicts[{by_rank[rank]}] and state_dicts[{i}] are both rank {rank}'s (expected "
                             "each rank's once)")
        by_rank[rank] = i
    if sorted(by_rank) != list(range(n)):
        missing = [r for r in range(n) if r not in by_rank]
        raise ValueError(f"state_dicts of ranks {', '.join(map(str, sorted(by_rank)))} of a world of {n} "
                         f"(missing rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))})")
    ordered = [(r, sds[by_rank[r]], shards[by_rank[r]]) for r in range(n)]
    tables = list(ordered[0][2])
    for r, _, s in ordered[1:]:
        if list(s) != tables:
            raise ValueError(f"rank {r}'s state_dict has tables {list(s)} but rank 0's {tables} (expected the "
                             "state_dicts of one world)")
    _check_equal(ordered, prefix + "step", "the step")
    merged = {}
    for t in tables:
        key = table_entries(prefix, t)
        _check_equal(ordered, key + "learning_rate", "the learning rate")
        dynamic = [r for r, _, s in ordered if s[t].get("dynamic")]
        if dynamic and len(dynamic) != n:
            r = next(r for r in range(n) if r not in dynamic)
            raise ValueError(f"rank {r}'s '{key}*' is a dense table's shard but rank {dynamic[0]}'s a dynamic one's "
                             f"(with '{key}keys'; expected one table)")
        merged.update(_merge_keys(ordered, t, key) if dynamic else _merge_table(ordered, t, key))
    if prefix + "step" in ordered[0][1]:  # absent on every rank: left out, as a strict load then says
        merged[prefix + "step"] = torch.tensor(_scalar(ordered[0][1][prefix + "step"], prefix + "step", True),
                                               dtype=torch.int64)
    ours = {prefix + "step"} | {table_entries(prefix, t) + e for t in tables for e in ENTRIES}
    rest = {k: v for k, v in ordered[0][1].items() if k not in ours}
    return {**rest, **merged}


def _shard(sd, key, i):
    """The shard vector of one table entry of state_dicts[i], as a dict of its fields (a dynamic
    table's, beside its ``keys``: _KEY_FIELDS, and "dynamic" True)."""
    what = f"state_dicts[{i}]['{key}shard']"
    v = _array(sd[key + "shard"], what).reshape(-1)
    if key + "keys" in sd:
        if v.size != len(_KEY_FIELDS) or not np.issubdtype(v.dtype, np.integer):
            raise ValueError(f"{what} is {v.dtype} with {v.size} values (expected the {len(_KEY_FIELDS)} integers of a "
                             f"dynamic table's shard beside its '{key}keys': {', '.join(_KEY_FIELDS)})")
        s = dict(zip(_KEY_FIELDS, (int(x) for x in v)))
        if s["type"] not in (1, 2) or not 0 <= s["rank"] < s["world"] or s["dim"] < 1 or not (
                0 <= s["shard_capacity"] <= s["capacity"]):
            raise ValueError(f"{what} is {list(s.values())} (expected type 1 (table) or 2 (row), 0 <= rank < world, "
                             "dim >= 1, 0 <= shard_capacity <= capacity)")
        return dict(s, dynamic=True)
    if v.size != len(_FIELDS) or not np.issubdtype(v.dtype, np.integer):
        raise ValueError(f"{what} is {v.dtype} with {v.size} values (expected {len(_FIELDS)} integers)")
    s = dict(zip(_FIELDS, (int(x) for x in v)))
    if not 0 <= s["type"] < len(_TYPES) or not 0 <= s["rank"] < s["world"] or s["rows"] < 0 or s["dim"] < 1:
        raise ValueError(f"{what} is {list(s.values())} (expected type 0-3, 0 <= rank < world, rows >= 0, dim >= 1)")
    if list(s.values()) not in _layouts(s):
        raise ValueError(f"{what} is {list(s.values())}, not a {_TYPES[s['type']]} shard of rank {s['rank']} of "
                         f"{s['world']} (expected one of {_layouts(s)})")
    return s


def _layouts(s):
    """The shard vectors a rank may hold of a table of its type (python/strata/torch.py writes them;
    dispatch/sharding_plan.hpp: row i of a row shard is global row rank + i * world; a table's owner
    holds it all, the others nothing; a column shard is any column range of every row)."""
    w, r, kind, rows, dim = (s[f] for f in _FIELDS[:5])
    head = [w, r, kind, rows, dim]
    if kind == 2:
        return [head + [r, w, max(0, -(-(rows - r) // w)), 0, dim]]
    if kind == 3:
        return [head + [0, 1, rows, s["col_offset"], s["local_dim"]]] if (
            s["local_dim"] >= 1 and 0 <= s["col_offset"] <= dim - s["local_dim"]) else []
    whole = head + [0, 1, rows, 0, dim]
    return [whole, head + [0, 1, 0, 0, 0]] if kind == 1 else [whole]


def _check_equal(ordered, key, what):
    """Refuses an entry that is absent on some ranks or differs from rank 0's."""
    values = [(r, None if key not in sd else _scalar(sd[key], f"rank {r}'s '{key}'", key.endswith("step")))
              for r, sd, _ in ordered]
    r0 = values[0][1]
    for r, v in values[1:]:
        if v != r0:
            raise ValueError(f"'{key}' is {_shown(v)} on rank {r} but {_shown(r0)} on rank 0 (expected {what} of one "
                             "point of training, equal on every rank)")


def _shown(value):
    return "absent" if value is None else str(value)


def _merge_keys(ordered, t, key):
    """A dynamic table's whole keys (ascending), their rows and the rate from every rank's shard."""
    first = ordered[0][2][t]
    for r, _, s in ordered:
        if any(s[t][f] != first[f] for f in ("type", "capacity", "dim")):
            raise ValueError(f"rank {r}'s '{key}shard' is {[s[t][f] for f in _KEY_FIELDS]} but rank 0's "
                             f"{[first[f] for f in _KEY_FIELDS]} (expected one table: type, capacity and dim equal)")
    has_state = [key + "optimizer_state" in sd for _, sd, _ in ordered]
    if any(has_state) != all(has_state):
        raise ValueError(f"'{key}optimizer_state' is on ranks {[r for r, h in enumerate(has_state) if h]} only "
                         "(expected on every rank or none)")
    keys, weights, states, dtypes = [], [], [], {"weight": [], "optimizer_state": []}
    for r, sd, s in ordered:
        if key + "weight" not in sd:
            raise ValueError(f"rank {r}'s state_dict has '{key}keys' but no '{key}weight' (expected both)")
        k = _array(sd[key + "keys"], f"rank {r}'s '{key}keys'")
        if k.dtype != np.int64 or k.ndim != 1:
            raise ValueError(f"rank {r}'s '{key}keys' is {k.dtype} {tuple(k.shape)} (expected 1-D int64)")
        if len(k) > s[t]["shard_capacity"]:
            raise ValueError(f"rank {r}'s '{key}keys' holds {len(k)} keys (expected at most its shard's capacity, "
                             f"{s[t]['shard_capacity']})")
        w = _rows(sd[key + "weight"], f"rank {r}'s '{key}weight'", dtypes["weight"])
        if w.dtype != np.float32 or tuple(w.shape) != (len(k), first["dim"]):
            raise ValueError(f"rank {r}'s '{key}weight' is {w.dtype} {tuple(w.shape)} (expected float32 "
                             f"{(len(k), first['dim'])}: one row per key of its '{key}keys')")
        if any(has_state):
            st = _rows(sd[key + "optimizer_state"], f"rank {r}'s '{key}optimizer_state'", dtypes["optimizer_state"])
            if st.dtype != np.float32 or st.ndim != 2 or st.shape[0] != len(k) or (
                    states and st.shape[1] != states[0].shape[1]):
                raise ValueError(f"rank {r}'s '{key}optimizer_state' is {st.dtype} {tuple(st.shape)} (expected float32 "
                                 f"with {len(k)} rows, one per key, and rank 0's columns)")
            states.append(st)
        for entry, seen in dtypes.items():
            if seen and seen[-1] != seen[0]:
                raise ValueError(f"rank {r}'s '{key}{entry}' is {seen[-1]} but rank 0's {seen[0]} (expected one "
                                 "table's dtype on every rank)")
        keys.append(k)
        weights.append(w)
    every = np.concatenate(keys)
    order = np.argsort(every, kind="stable")
    ranks = np.repeat(np.arange(len(keys)), [len(k) for k in keys])
    twice = np.flatnonzero(every[order][1:] == every[order][:-1])
    if twice.size:
        a, b = sorted((int(ranks[order[twice[0]]]), int(ranks[order[twice[0] + 1]])))
        raise ValueError(f"key {int(every[order[twice[0]]])} is in rank {a}'s and rank {b}'s '{key}keys' (expected "
                         "each key in one rank's shard)")
    out = {key + "keys": torch.from_numpy(np.ascontiguousarray(every[order])),
           key + "weight": rows_as(np.concatenate(weights)[order], dtypes["weight"][0])}
    if states:
        out[key + "optimizer_state"] = rows_as(np.concatenate(states)[order], dtypes["optimizer_state"][0])
    if key + "learning_rate" in ordered[0][1]:
        out[key + "learning_rate"] = torch.tensor(_scalar(ordered[0][1][key + "learning_rate"], key + "learning_rate"),
                                                  dtype=torch.float32)
    return out


def _merge_table(ordered, t, key):
    """One table's whole weight, optimizer state and rate from every rank's shard."""
    first = ordered[0][2][t]
    rows, dim, kind = first["rows"], first["dim"], first["type"]
    for r, _, s in ordered:
        if (s[t]["rows"], s[t]["dim"], s[t]["type"]) != (rows, dim, kind):
            raise ValueError(f"rank {r}'s '{key}shard' is a {_TYPES[s[t]['type']]} shard of a ({s[t]['rows']}, "
                             f"{s[t]['dim']}) table but rank 0's a {_TYPES[kind]} shard of ({rows}, {dim}) (expected "
                             "one table)")
    has_state = [key + "optimizer_state" in sd for _, sd, _ in ordered]
    if any(has_state) != all(has_state):
        raise ValueError(f"'{key}optimizer_state' is on ranks {[r for r, h in enumerate(has_state) if h]} only "
                         "(expected on every rank or none)")
    weight = np.full((rows, dim), np.nan, dtype=np.float32)
    dtypes = {"weight": [], "optimizer_state": []}  # each rank's torch dtype of the entry
    state, blocks = None, 0
    filled = np.zeros((rows, dim), dtype=bool)
    lowest = {}  # a replicated table's lowest replica: (weight, state), which every other must equal
    for r, sd, s in ordered:
        sh = s[t]
        if key + "weight" not in sd:
            raise ValueError(f"rank {r}'s state_dict has '{key}shard' but no '{key}weight' (expected both)")
        w = _rows(sd[key + "weight"], f"rank {r}'s '{key}weight'", dtypes["weight"])
        if w.dtype != np.float32 or tuple(w.shape) != (sh["local_rows"], sh["local_dim"]):
            raise ValueError(f"rank {r}'s '{key}weight' is {w.dtype} {tuple(w.shape)} (expected float32 "
                             f"{(sh['local_rows'], sh['local_dim'])}: its shard's local_rows and local_dim)")
        st = (_rows(sd[key + "optimizer_state"], f"rank {r}'s '{key}optimizer_state'", dtypes["optimizer_state"])
              if any(has_state) else None)
        if st is not None and (st.dtype != np.float32 or st.ndim != 2 or st.shape[0] != sh["local_rows"]):
            raise ValueError(f"rank {r}'s '{key}optimizer_state' is {st.dtype} {tuple(st.shape)} (expected float32 "
                             f"with {sh['local_rows']} rows)")
        for entry, seen in dtypes.items():
            if seen and seen[-1] != seen[0]:
                raise ValueError(f"rank {r}'s '{key}{entry}' is {seen[-1]} but rank 0's {seen[0]} (expected one "
                                 "table's dtype on every rank)")
        if sh["local_rows"] == 0:
            continue
        if kind == 0:
            if lowest:
                lw, ls = lowest["rows"]
                # By bits: NaN != NaN would refuse equal replicas holding one.
                if not np.array_equal(lw.view(np.uint32), w.view(np.uint32)) or (
                        ls is not None and not np.array_equal(ls.view(np.uint32), st.view(np.uint32))):
                    raise ValueError(f"rank {r}'s replica of '{key}weight' (or its optimizer_state) differs from rank "
                                     f"{lowest['rank']}'s (expected equal replicas of a replicated table)")
                continue
            lowest.update(rows=(w, st), rank=r)
        rsel = np.arange(sh["row_start"], sh["row_start"] + sh["local_rows"] * sh["row_step"], sh["row_step"])
        c0, c1 = sh["col_offset"], sh["col_offset"] + sh["local_dim"]
        if rsel.size and (rsel[-1] >= rows or c1 > dim or c0 < 0):
            raise ValueError(f"rank {r}'s '{key}shard' {list(sh.values())} reaches past the ({rows}, {dim}) table")
        if filled[rsel, c0:c1].any():
            raise ValueError(f"rank {r}'s '{key}shard' overlaps another rank's rows (expected each row and column "
                             "held once)")
        weight[rsel, c0:c1] = w
        filled[rsel, c0:c1] = True
        if st is not None:
            cols = st.shape[1]
            # Column shards keep `blocks` state columns per weight column (adagrad 1, adam 2), block b's
            # local column j at global state column b * dim + col_offset + j.
            b = cols // sh["local_dim"] if kind == 3 else None
            if kind == 3 and b * sh["local_dim"] != cols:
                raise ValueError(f"rank {r}'s '{key}optimizer_state' is {st.dtype} {tuple(st.shape)} (expected "
                                 f"float32 with {sh['local_rows']} rows and a multiple of {sh['local_dim']} columns)")
            width = b * dim if kind == 3 else cols
            if state is None:
                state, blocks = np.full((rows, width), np.nan, dtype=np.float32), b
            elif state.shape[1] != width:
                raise ValueError(f"rank {r}'s '{key}optimizer_state' has {cols} columns, not those of rank 0's "
                                 "shards (expected one optimizer)")
            if kind == 3:
                for k in range(blocks):
                    state[rsel, k * dim + c0:k * dim + c1] = st[:, k * sh["local_dim"]:(k + 1) * sh["local_dim"]]
            else:
                state[rsel] = st
    if not filled.all():
        raise ValueError(f"the shards of '{key}weight' leave rows or columns of the ({rows}, {dim}) table unheld "
                         "(expected every rank's state_dict of one world)")
    # Half-size tables' rows go back to their dtype (exact: they were widened from it).
    out = {key + "weight": rows_as(weight, dtypes["weight"][0])}
    if state is not None:
        out[key + "optimizer_state"] = rows_as(state, dtypes["optimizer_state"][0])
    if key + "learning_rate" in ordered[0][1]:
        out[key + "learning_rate"] = torch.tensor(_scalar(ordered[0][1][key + "learning_rate"], key + "learning_rate"),
                                                  dtype=torch.float32)
    return out

