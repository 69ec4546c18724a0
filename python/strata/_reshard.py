"""Whole tables from the state_dicts of a world's ranks (``strata.torch.merge_state_dicts``).

A world's ``EmbeddingBagCollection.state_dict()`` holds one rank's shards, each table's described by
``tables.<name>.shard`` (int64[10]: world, rank, type, rows, dim, row_start, row_step, local_rows,
col_offset, local_dim; see ``EmbeddingBagCollection.state_dict``). Merging every rank's gives the
state_dict of one rank holding whole tables, which loads into a module of any world size: a one-rank
module takes it as its own, and each rank of a world writes its slice.
"""

import numpy as np
import torch

# The shard vector's fields, in order (python/strata/torch.py writes them).
_FIELDS = ("world", "rank", "type", "rows", "dim", "row_start", "row_step", "local_rows", "col_offset", "local_dim")
_TYPES = ("replicated", "table", "row", "column")  # ShardingType's order (dispatch/sharding_plan.hpp)
_ENTRIES = ("weight", "optimizer_state", "shard", "replicas", "learning_rate")


def _array(value, what):
    """A host NumPy view of a tensor or array entry."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            value = value.cpu()
        return value.detach().numpy()
    if isinstance(value, np.ndarray):
        return value
    raise ValueError(f"{what} is a {type(value).__name__} (expected a tensor or NumPy array)")


def _scalar(value, what):
    """A number entry (step, learning_rate) as a Python int or float."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        a = _array(value, what)
        if a.size != 1:
            raise ValueError(f"{what} has shape {tuple(a.shape)} (expected a single value)")
        return a.reshape(()).item()
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return value.item() if isinstance(value, np.generic) else value
    raise ValueError(f"{what} is a {type(value).__name__} (expected a number)")


def _tables_of(sd, prefix):
    """The table names of one rank's state_dict: those with a ``tables.<name>.shard`` entry."""
    head, tail = prefix + "tables.", ".shard"
    return sorted(k[len(head):-len(tail)] for k in sd if k.startswith(head) and k.endswith(tail))


def merge_state_dicts(state_dicts, prefix=""):
    """Merges the ``state_dict()`` of every rank of one world (any order, each rank once) into the
    state_dict of one rank holding whole tables: ``<prefix>tables.<name>.weight`` (rows, dim),
    ``.optimizer_state`` (rows, state columns; absent for sgd) and ``.learning_rate`` per table, and
    ``<prefix>step``, exactly the entries a one-rank ``EmbeddingBagCollection`` saves. It loads into
    a module of any world size with the same tables (``load_state_dict``: a one-rank module takes it
    whole; each rank of a world writes the rows and columns it holds). Entries outside the tables
    and the step (a dense model's parameters, equal on every rank under DDP) are taken from rank 0's.

    Rows come from the rank that holds them (a replicated table from its lowest replica). Raises
    ValueError, returning nothing, naming the entry and rank for: a rank missing or given twice,
    state_dicts of different worlds, of different steps or learning rates (a world's are equal on
    every rank at one point of training), tables that differ between ranks, and a shard whose
    entries do not match its ``shard`` vector."""
    if isinstance(state_dicts, dict) or not hasattr(state_dicts, "__iter__"):
        raise ValueError(f"state_dicts is a {type(state_dicts).__name__} (expected a list of every rank's "
                         "state_dict())")
    sds = list(state_dicts)
    if not sds:
        raise ValueError("state_dicts is empty (expected every rank's state_dict() of one world)")
    shards = []  # per input: {table: shard vector}
    for i, sd in enumerate(sds):
        tables = _tables_of(sd, prefix)
        if not tables:
            raise ValueError(f"state_dicts[{i}] has no '{prefix}tables.<name>.shard' entry (expected the "
                             "state_dict() of a rank of a world of more than one rank)")
        shards.append({t: _shard(sd, f"{prefix}tables.{t}.", i) for t in tables})
    world = {next(iter(s.values()))["world"] for s in shards}
    by_rank = {}
    for i, s in enumerate(shards):
        for t, v in s.items():
            if v["world"] != next(iter(s.values()))["world"] or v["rank"] != next(iter(s.values()))["rank"]:
                raise ValueError(f"state_dicts[{i}]: tables of different ranks or worlds in one state_dict "
                                 f"('{prefix}tables.{t}.shard' says rank {v['rank']} of {v['world']})")
        rank = next(iter(s.values()))["rank"]
        if rank in by_rank:
            raise ValueError(f"state_dicts[{by_rank[rank]}] and state_dicts[{i}] are both rank {rank}'s (expected "
                             "each rank's once)")
        by_rank[rank] = i
    if len(world) != 1:
        raise ValueError(f"state_dicts of worlds of {sorted(world)} ranks (expected the state_dicts of one world)")
    (n,) = world
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
        key = f"{prefix}tables.{t}."
        _check_equal(ordered, key + "learning_rate", "the learning rate")
        merged.update(_merge_table(ordered, t, key))
    merged[prefix + "step"] = torch.tensor(_scalar(ordered[0][1][prefix + "step"], prefix + "step"),
                                           dtype=torch.int64)
    ours = {prefix + "step"} | {f"{prefix}tables.{t}.{e}" for t in tables for e in _ENTRIES}
    rest = {k: v for k, v in ordered[0][1].items() if k not in ours}
    return {**rest, **merged}


def _shard(sd, key, i):
    """The shard vector of one table entry of state_dicts[i], as a dict of its fields."""
    v = _array(sd[key + "shard"], f"state_dicts[{i}]['{key}shard']").reshape(-1)
    if v.size != len(_FIELDS):
        raise ValueError(f"state_dicts[{i}]['{key}shard'] has {v.size} values (expected {len(_FIELDS)})")
    s = dict(zip(_FIELDS, (int(x) for x in v)))
    if not 0 <= s["type"] < len(_TYPES) or not 0 <= s["rank"] < s["world"]:
        raise ValueError(f"state_dicts[{i}]['{key}shard'] is {list(v)} (expected type 0-3 and 0 <= rank < world)")
    return s


def _check_equal(ordered, key, what):
    """Refuses an entry that is absent on some ranks or differs from rank 0's."""
    values = [(r, None if key not in sd else _scalar(sd[key], f"rank {r}'s '{key}'")) for r, sd, _ in ordered]
    r0 = values[0][1]
    for r, v in values[1:]:
        if v != r0:
            raise ValueError(f"'{key}' is {_shown(v)} on rank {r} but {_shown(r0)} on rank 0 (expected {what} of one "
                             "point of training, equal on every rank)")


def _shown(value):
    return "absent" if value is None else str(value)


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
    state, blocks = None, 0
    filled = np.zeros((rows, dim), dtype=bool)
    for r, sd, s in ordered:
        sh = s[t]
        w = _array(sd[key + "weight"], f"rank {r}'s '{key}weight'")
        if w.dtype != np.float32 or tuple(w.shape) != (sh["local_rows"], sh["local_dim"]):
            raise ValueError(f"rank {r}'s '{key}weight' is {w.dtype} {tuple(w.shape)} (expected float32 "
                             f"{(sh['local_rows'], sh['local_dim'])}: its shard's local_rows and local_dim)")
        if sh["local_rows"] == 0:
            continue
        if kind == 0 and r != _lowest_replica(sd, key, r):
            continue  # a replicated table: the lowest replica's rows
        rsel = np.arange(sh["row_start"], sh["row_start"] + sh["local_rows"] * sh["row_step"], sh["row_step"])
        c0, c1 = sh["col_offset"], sh["col_offset"] + sh["local_dim"]
        if rsel.size and (rsel[-1] >= rows or c1 > dim or c0 < 0):
            raise ValueError(f"rank {r}'s '{key}shard' {list(sh.values())} reaches past the ({rows}, {dim}) table")
        if filled[rsel, c0:c1].any():
            raise ValueError(f"rank {r}'s '{key}shard' overlaps another rank's rows (expected each row and column "
                             "held once)")
        weight[rsel, c0:c1] = w
        filled[rsel, c0:c1] = True
        if any(has_state):
            st = _array(sd[key + "optimizer_state"], f"rank {r}'s '{key}optimizer_state'")
            cols = st.shape[1] if st.ndim == 2 else -1
            # Column shards keep `blocks` state columns per weight column (adagrad 1, adam 2), block b's
            # local column j at global state column b * dim + col_offset + j.
            b = cols // sh["local_dim"] if kind == 3 and sh["local_dim"] else None
            if (st.dtype != np.float32 or st.ndim != 2 or st.shape[0] != sh["local_rows"]
                    or (kind == 3 and (not b or b * sh["local_dim"] != cols))):
                raise ValueError(f"rank {r}'s '{key}optimizer_state' is {st.dtype} {tuple(st.shape)} (expected "
                                 f"float32 with {sh['local_rows']} rows" +
                                 (f" and a multiple of {sh['local_dim']} columns)" if kind == 3 else ")"))
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
    out = {key + "weight": torch.from_numpy(weight)}
    if state is not None:
        out[key + "optimizer_state"] = torch.from_numpy(state)
    if key + "learning_rate" in ordered[0][1]:
        out[key + "learning_rate"] = torch.tensor(_scalar(ordered[0][1][key + "learning_rate"], key + "learning_rate"),
                                                  dtype=torch.float32)
    return out


def _lowest_replica(sd, key, r):
    """The lowest rank of a replicated shard's ``replicas`` entry (this rank when absent)."""
    if key + "replicas" not in sd:
        return r
    rep = _array(sd[key + "replicas"], f"rank {r}'s '{key}replicas'").reshape(-1)
    return int(rep.min()) if rep.size else r
