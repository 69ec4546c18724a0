"""PyTorch front end of Strata: ``EmbeddingBagCollection`` and the pipelining helper.

``EmbeddingBagCollection(config, device="cpu")`` is a ``torch.nn.Module`` over a ``strata.Store``
(``device="cuda"``: see the end). Its forward takes a batch of sparse features by name (a table's
own name, or one of the ``features`` its config lists: several features may look up one table, as
README "Features" says):

* a dict ``{feature: {"keys" | "values": ..., "lengths" | "offsets": ..., "weights" |
  "per_sample_weights": ...}}`` of CPU tensors or NumPy arrays (keys int64 or int32, weights float32
  and optional; "values" is TorchRec's name and "per_sample_weights" torch's, and a feature gives
  one name of each; None is an absent entry). ``offsets`` read as torch.nn.EmbeddingBag's do under its
  ``include_last_offset``: with the module's ``include_last_offset=True`` (Strata's default; torch's
  is False) batch + 1 of them, the last the key count; with ``include_last_offset=False`` one per
  bag (batch), the last bag running to the end of the keys. Offsets of torch's default given to a
  module of Strata's are refused (the last is not the key count), unless the last bag is empty,
  when they read as one bag fewer. Every feature has the first's
  batch size (ValueError naming the feature, the length given and the one expected), or
* TorchRec's ``KeyedJaggedTensor`` (anything with its ``to_dict()`` of jagged tensors; its offsets
  are always batch + 1, whatever ``include_last_offset``), or
* a ``SubmittedBatch`` yielded by :func:`pipelined` (the batch is already submitted),

and returns a :class:`KeyedEmbeddings`: the pooled embeddings per feature, (batch, dim) each (or
(num_keys, dim) for tables with pooling ``none``), and ``values()``, their concatenation, with
TorchRec ``KeyedTensor``'s ``keys()``, ``length_per_key()``, ``offset_per_key()`` and ``key_dim()``.

The backward of the outputs applies the gradients to the store with each table's fused optimizer
(as FBGEMM's table-batched embedding does): the tables are not parameters, so dense optimizers
never see them, and there is no ``zero_grad`` to do for them. In training mode with gradients
enabled a forwarded batch stays in flight until its backward; otherwise (``eval()``,
``torch.no_grad()``) it is retired at once. Every forward in training mode must be followed by a
backward of its outputs (or by ``discard_in_flight()``), or the batches pile up in the store.

Each forward's batch is one optimizer step of the store. When several forwards feed one loss, one
``backward()`` applies their batches at its end in the order they were submitted (autograd itself
runs the later lookup first), each with the gradient of its own outputs: the second lookup read the
rows before the first step was applied, unlike one lookup of both batches' keys.

Where no backward reaches a forward's outputs, its batch stays in flight until
``discard_in_flight()``: an exception between forward and backward, a loss that does not use the
outputs, or ``torch.autograd.grad(loss, inputs)`` whose ``inputs`` are dense parameters only (the
lookup's backward does not run). A second backward through the same outputs
(``retain_graph=True``) raises ValueError: the batch was retired by the first.

**Half-size tables** (a table's ``dtype``, ``state_dtype`` or ``output_dtype`` ``bf16`` or ``fp16``, README
"Half-size rows"): ``state_dict()`` gives ``torch.bfloat16`` / ``torch.float16`` weights and optimizer state
of those dtypes and ``load_state_dict`` takes them; outputs and their gradients have the table's
``output_dtype`` (host memory: the module refuses a half-size ``output_dtype`` with ``device='cuda'``).

**Dynamic tables** (``"kind": "dynamic"`` with a ``"capacity"``, README "Dynamic tables"; every
placement of one rank serves them, and a world's ``gpu`` and ``hybrid`` ones, sharded by key):
their keys are any int64, and a key gets a row the first time a training batch uses it
(``admit_after``: its N-th use), starting at its initial values. A forward in training mode with
gradients enabled submits a training batch; in ``eval()`` or under ``torch.no_grad()`` an
evaluation batch, which admits no key (keys without a row read their initial values, or zeros, and
count in ``store.stats()["dynamic"][table]["unseen"]``). A :class:`SubmittedBatch` submitted for
evaluation and forwarded in training raises RuntimeError and is retired. ``state_dict()`` holds a
dynamic table's keys held, ``embedding_bags.<name>.keys`` (int64, ascending), and their rows
(``weight`` (n, dim), ``optimizer_state`` (n, state_dim)): see ``EmbeddingBagCollection``. In a world
of more than one rank each rank's shard holds the keys ``strata.Store.key_owner`` gives it (row
sharding: a hash of the key; table sharding: one rank holds them all), and ``state_dict()`` holds
that shard's keys and rows with a ``shard`` vector; ``merge_state_dicts`` of every rank's gives the
whole table, which loads into a module of any world size, each rank taking its own keys (see
``state_dict`` and ``load_state_dict``).

Outputs are written by the store with the GIL released; other threads must not resize or free
them meanwhile (the module allocates its own, so this concerns ``strata.Store.forward`` callers).

``device="cuda"`` (or ``"cuda:N"``, or a ``torch.device``) opens the store on that GPU (the
config's ``device.backend`` must be ``cuda`` or ``auto`` and its ``ordinal``, when a number, N;
``"cuda"`` alone is torch's current device) and serves CUDA tensors: the outputs are allocated by
torch (its caching allocator, on the current stream) and written by the store's stream-ordered
forward on ``torch.cuda.current_stream()``, and backward hands the store the CUDA gradients
(contiguous float32) on the stream the lookup's backward ran on, stream-ordered: the trainer's
kernels and the store's follow each other on the stream with no host sync between them (except
the gradients' finiteness check, README "Outputs and gradients on the device"). The store must
have a device (a ``gpu``, ``cached``, ``offload`` or ``hybrid`` table): a config of ``cpu``
tables only is refused with ``device="cuda"``, as is a torch without CUDA. Keys stay on the CPU
(the store plans on the host, ahead of the device): keys, lengths and weights on a CUDA device
are refused (ValueError), not copied; keep the data loader's sparse features on the CPU.

**A world over torch.distributed.** ``process_group`` (default: ``torch.distributed.group.WORLD``
when ``torch.distributed`` is initialized) makes the module's store this process's rank of a Strata
world over the group's ranks (``strata.Store(config, process_group=...)``): its ``gpu`` and
``hybrid`` tables are sharded over the ranks by each table's ``sharding`` plan (with more than one
rank every table must be ``gpu`` or ``hybrid``; ``process_group=False`` keeps a store of this process
alone, e.g. per-process tables under DDP). Each rank passes its own batch to forward and gets its
own outputs, and its backward sends its own gradients; **each row's update is the sum of all ranks'
gradients** of that row (as TorchRec and FBGEMM do; DDP averages only the dense part: scale the loss
or the learning rate if you want a mean). Every rank must make the same calls in the same order
(forward, backward, ``discard_in_flight``, ``set_learning_rate``, ``state_dict``, ``load_state_dict``,
``close``: they are collectives). A rank that left fails the others' next call with RuntimeError
("a peer left the process group"), a rank that never arrives fails it after ``timeout`` ("timed out
after N ms"). Call ``close()`` at the end on every rank: the store's destruction at garbage
collection (at times that differ per rank) would be a collective.
"""

import collections
import collections.abc
import inspect
import json
import numbers
import threading

import numpy as np
import torch
from torch import nn

import strata
from strata._dtypes import TORCH_DTYPES, float32_rows, rows_as
from strata._reshard import ENTRIES, HEAD, OLD_HEAD, merge_state_dicts, saved_table_entries, table_entries
from strata.pipeline import pipelined

__all__ = ["EmbeddingBagCollection", "KeyedEmbeddings", "SubmittedBatch", "TableOptimizer", "merge_state_dicts",
           "pipelined"]

# torch >= 2.1's Module.load_state_dict takes `assign`; older ones do not.
_LOAD_TAKES_ASSIGN = "assign" in inspect.signature(nn.Module.load_state_dict).parameters

# What load_state_dict writes into one table: weights and state (float32 NumPy rows, None: keep the
# table's), the learning rate (None: keep it), and a dynamic table's keys (the rows' keys; None for a
# dense table).
_TableLoad = collections.namedtuple("_TableLoad", "name weights state rate keys", defaults=(None,))


class KeyedEmbeddings:
    """The outputs of one forward, by feature, as TorchRec's ``KeyedTensor`` gives them: ``keys()``,
    ``values()`` (the features side by side), ``length_per_key()``, ``offset_per_key()``,
    ``key_dim()``, ``to_dict()`` and ``[feature]``."""

    def __init__(self, keys, tensors):
        if isinstance(keys, str) or not isinstance(keys, collections.abc.Iterable):
            raise TypeError(f"keys is a {type(keys).__name__} (expected a list of feature names)")
        if not isinstance(tensors, collections.abc.Iterable):
            raise TypeError(f"tensors is a {type(tensors).__name__} (expected a list of tensors, one per key)")
        self._keys = list(keys)
        self._tensors = list(tensors)
        bad = [k for k in self._keys if not isinstance(k, str)]
        if bad:
            raise TypeError(f"keys holds a {type(bad[0]).__name__} (expected feature names: str)")
        bad = [t for t in self._tensors if not isinstance(t, torch.Tensor)]
        if bad:
            raise TypeError(f"tensors holds a {type(bad[0]).__name__} (expected tensors)")
        if len(self._keys) != len(self._tensors):
            raise ValueError(f"keys has {len(self._keys)} names and tensors {len(self._tensors)} tensors (expected "
                             "one tensor per key)")

    def keys(self):
        """Feature (table) names, in the order of the input."""
        return list(self._keys)

    def to_dict(self):
        """{feature: tensor (batch, dim)}."""
        return dict(zip(self._keys, self._tensors))

    def __getitem__(self, key):
        if not isinstance(key, str):
            raise TypeError(f"key is a {type(key).__name__} (expected a feature name: str, one of {self._keys})")
        if key not in self._keys:
            raise ValueError(f"feature {key!r} is not in these embeddings (expected one of {self._keys})")
        return self._tensors[self._keys.index(key)]

    def __len__(self):
        return len(self._keys)

    def values(self):
        """The features' embeddings side by side: (batch, sum of dims), differentiable."""
        return torch.cat(self._tensors, dim=1)

    def key_dim(self):
        """The dimension of ``values()`` along which the features lie side by side: 1 (TorchRec's
        ``KeyedTensor.key_dim``)."""
        return 1

    def length_per_key(self):
        """Each feature's width in ``values()``: its table's dim, in the order of ``keys()``."""
        return [t.shape[self.key_dim()] for t in self._tensors]

    def offset_per_key(self):
        """Where each feature's columns start in ``values()``, and the total width last (n + 1 ints
        from 0): feature i is ``values()[:, offset_per_key()[i]:offset_per_key()[i + 1]]``."""
        offsets = [0]
        for length in self.length_per_key():
            offsets.append(offsets[-1] + length)
        return offsets


class SubmittedBatch:
    """A batch already submitted (or previewed) to a module's store by :func:`pipelined`; pass it
    to the module's forward in place of the features."""

    __slots__ = ("owner", "batch_id", "tables", "forwarded", "train")

    def __init__(self, owner, batch_id, tables, train=True):
        if isinstance(batch_id, bool) or not isinstance(batch_id, numbers.Integral):
            raise TypeError(f"batch_id is a {type(batch_id).__name__} (expected an int)")
        if not isinstance(tables, list):
            raise TypeError(f"tables is a {type(tables).__name__} (expected a list of (name, (rows, dim)))")
        if not isinstance(train, bool):
            raise TypeError(f"train is a {type(train).__name__} (expected a bool)")
        self.owner = owner
        self.batch_id = batch_id
        self.tables = tables
        self.forwarded = False  # set by the owner's forward, which then retires it (or keeps it for backward)
        self.train = train  # submitted as a training batch (dynamic tables admitted its keys) or an evaluation one


class _Lookup(torch.autograd.Function):
    """forward: the store's lookup of a submitted batch; backward: the store's fused update."""

    @staticmethod
    def forward(ctx, anchor, module, batch_id, shapes, dtypes):
        outs = module._lookup(batch_id, shapes, dtypes)
        ctx.module = module
        ctx.batch_id = batch_id
        ctx.dtypes = dtypes
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        # Applied at the end of this backward pass, with the other lookups of the pass, in submit order.
        ctx.module._defer_backward(ctx.batch_id, *ctx.module._gradients(grads, ctx.dtypes))
        return None, None, None, None, None


def _check_device(device):
    """The module's device: cpu, or cuda with its index (torch's current device for "cuda")."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device is a {type(device).__name__} (expected 'cpu', 'cuda', 'cuda:N' or a torch.device)")
    try:
        device = torch.device(device)
    except RuntimeError as e:  # torch's words for a string it does not parse
        raise ValueError(f"device {device!r} (expected 'cpu', 'cuda', 'cuda:N' or a torch.device): {e}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device {device} (expected cpu or cuda)")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device}: this torch has no CUDA device (torch.cuda.is_available() is False; "
                         "expected device='cpu')")
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)


def _store_config(config, device):
    """The store config for the module's device: on cuda, the store opens that GPU."""
    if device.type != "cuda":
        return config
    if isinstance(config, str):
        config = json.loads(config)
    elif not isinstance(config, dict):
        return config  # strata.Store names it
    config = json.loads(json.dumps(config))
    dev = config.setdefault("device", {})
    if not isinstance(dev, dict):
        return config  # strata.Store names it
    backend, ordinal = dev.get("backend", "auto"), dev.get("ordinal", "auto")
    if backend not in ("auto", "cuda"):
        raise ValueError(f"device {device}, but the config's device.backend is {backend!r} (expected 'cuda' or "
                         "'auto', or device='cpu')")
    if isinstance(ordinal, int) and not isinstance(ordinal, bool) and ordinal not in (-1, device.index):
        raise ValueError(f"device {device}, but the config's device.ordinal is {ordinal} (expected {device.index}, "
                         "'current' or 'auto', or leave it out)")
    dev["backend"], dev["ordinal"] = "cuda", device.index
    return config


def _default_process_group(process_group):
    """The process group of a module's store: None -> torch.distributed's WORLD when initialized
    (else None), False -> None, anything else as given (strata.Store checks it)."""
    if process_group is False:
        return None
    if process_group is None:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.group.WORLD
        return None
    return process_group


def _features_of(batch, include_last_offset=True):
    """The store's batch dict for a forward input (dict or KeyedJaggedTensor)."""
    if isinstance(batch, dict):
        return _dict_features(batch, include_last_offset)
    to_dict = getattr(batch, "to_dict", None)
    if callable(to_dict) and callable(getattr(batch, "keys", None)):  # a KeyedJaggedTensor
        features = {}
        for name, jt in to_dict().items():
            f = {"keys": jt.values(), "lengths": jt.lengths()}
            weights = jt.weights_or_none()
            if weights is not None:
                f["weights"] = weights
            features[name] = f
        return features
    raise TypeError(
        f"batch is a {type(batch).__name__} (expected a dict {{feature: {{'keys', 'lengths' or 'offsets', "
        "'weights'}} or a KeyedJaggedTensor; forward takes a SubmittedBatch too)")


def _entry(f, ours, alias=None):
    """A feature's entry by Strata's name or its alias (``keys``/``values``), None where absent: an
    entry given as None is absent, as the store reads it (which refuses both names given)."""
    x = f.get(ours)
    return f.get(alias) if x is None and alias else x


def _host_vector(x):
    """A feature's entry as a vector that Python reads, where the store would read it as keys,
    offsets or lengths (1-D, int64 or int32): a CPU tensor as it is, anything else as
    ``np.asarray`` reads it (a NumPy array, list, array.array, range, memoryview, anything with
    ``__array__``), as the store does. None for anything else (absent, on a device, of another
    shape or dtype): the store refuses it, naming it."""
    if isinstance(x, torch.Tensor):
        ok = x.dtype in (torch.int64, torch.int32) and x.dim() == 1 and x.device.type == "cpu"
        return x if ok else None
    if x is None:
        return None
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):  # a ragged list
        return None
    return a if a.ndim == 1 and a.dtype in (np.int64, np.int32) else None


def _dict_features(batch, include_last_offset):
    """A forward's dict input as the store takes it: each feature's bags checked against the first
    feature's batch size (naming the length as given), and offsets of length batch
    (``include_last_offset=False``, torch.nn.EmbeddingBag's) completed with the key count. What
    Python cannot read (a wrong type, shape or dtype) goes to the store as given, which names it."""
    features, first = {}, None  # first: (feature, batch size) of the first feature with bags
    for name, f in batch.items():
        if not isinstance(f, dict):
            features[name] = f
            continue
        if (_entry(f, "offsets") is None) == (_entry(f, "lengths") is None):
            features[name] = f
            continue
        entry = "offsets" if _entry(f, "offsets") is not None else "lengths"
        bags = _host_vector(f[entry])
        if bags is None:
            features[name] = f
            continue
        extra = 1 if entry == "offsets" and include_last_offset else 0  # the offset past the last bag
        if first is None:
            if len(bags) < extra:
                raise ValueError(f"feature {name!r}: offsets of length 0 (expected batch + 1 >= 1 values with "
                                 "include_last_offset=True: one per bag, then the key count)")
            first = (name, len(bags) - extra)
        elif len(bags) != first[1] + extra:
            how = ("one per sample, then the key count (include_last_offset=True)" if extra else
                   "one per sample" + (" (include_last_offset=False)" if entry == "offsets" else ""))
            raise ValueError(f"feature {name!r}: {entry} of length {len(bags)} (expected {first[1] + extra}, "
                             f"{how}: feature {first[0]!r} has {first[1]} samples)")
        if entry == "offsets" and not include_last_offset:
            f = _last_offset_added(name, f, bags)
        features[name] = f
    return features


def _last_offset_added(name, f, offsets):
    """Feature ``f`` with offsets of length batch (the last bag runs to the end of the keys, as
    torch.nn.EmbeddingBag's include_last_offset=False) completed to batch + 1."""
    keys = _host_vector(_entry(f, "keys", "values"))
    if keys is None:
        return f  # the store names it
    n = len(keys)
    if len(offsets) == 0 and n:
        raise ValueError(f"feature {name!r}: offsets of length 0 with {n} keys (expected one offset per bag, "
                         "the first 0: the keys belong to no bag)")
    if len(offsets) and int(offsets[-1]) > n:
        raise ValueError(f"feature {name!r}: offsets[{len(offsets) - 1}] is {int(offsets[-1])}, past the {n} keys "
                         "(expected at most the key count: with include_last_offset=False the last bag runs from "
                         "the last offset to the end of the keys)")
    if isinstance(offsets, torch.Tensor):
        offsets = torch.cat([offsets, torch.tensor([n], dtype=offsets.dtype)])
    else:
        offsets = np.append(offsets, np.array(n, dtype=offsets.dtype))
    return dict(f, offsets=offsets)


class EmbeddingBagCollection(nn.Module):
    """Embedding tables held in a ``strata.Store`` (any placement mode), trained by the store's
    fused optimizer. ``config``: the store config as a dict or JSON string (README, "Using the
    store"). ``state_dict()`` holds everything the next update reads: ``embedding_bags.<name>.weight``
    (rows, dim; TorchRec's ``EmbeddingBagCollection`` names its weights so),
    ``embedding_bags.<name>.optimizer_state`` (rows, state_dim; absent for sgd) and
    ``embedding_bags.<name>.learning_rate`` per table, and ``step``, the store's step counter (an int64
    scalar tensor; Adam's bias correction reads it). A module that loads it continues bit for bit as
    the one that saved it (see ``load_state_dict``; the names state_dicts had before,
    ``tables.<name>.*``, load too).

    A dynamic table's entries are its keys held, ``embedding_bags.<name>.keys`` (an int64 tensor,
    ascending), and their rows in that order: ``weight`` (n, dim) and ``optimizer_state`` (n,
    state_dim), of the table's ``dtype`` and ``state_dtype`` as a dense table's. ``load_state_dict``
    makes the table hold exactly those keys with those rows (``strata.Store.write_keys``; keys distinct,
    at most the capacity, one row per key); without ``optimizer_state`` (``strict=False``) a key the
    table held keeps its own state and a new one gets the initial state. A dense table's entries (no
    ``keys``) are refused by a dynamic table and a dynamic one's by a dense table, naming the table.
    What a dynamic table's state_dict does not carry (its key index's bookkeeping): each key's last
    use and use count, the admission counts of keys without a row, and the tables' clock. The loaded
    keys are as just used (touched in key order), so rows, updates and outputs continue bit for bit
    until the table is full or a key without a row is counted: which row a full table evicts (lru,
    lfu), when a row expires (``evict_after_steps``) and when a key reaches ``admit_after`` start afresh.
    The store's checkpoints keep those too (``module.store.save(dir)`` and ``load``, or
    ``strata.Store.from_checkpoint``: README "Dynamic tables").

    ``include_last_offset``: how the forward reads a dict feature's ``offsets``, as
    torch.nn.EmbeddingBag does (True, Strata's default, torch's is False: batch + 1 offsets; False:
    batch offsets, the last bag to the end of the keys; see the module's doc).

    ``process_group``: None (the default) is ``torch.distributed.group.WORLD`` when
    ``torch.distributed`` is available and initialized, else a store of this process alone; False is
    always a store of this process alone; a ``torch.distributed.ProcessGroup`` makes this module one
    rank of a world over it (the module's doc, "A world over torch.distributed": each row's update
    is the sum of all ranks' gradients). ``timeout``: how long a collective waits for the other
    ranks (seconds or a datetime.timedelta, from 1 ms to 365 days; None: torch.distributed's
    default_pg_timeout); with process_group=None and torch.distributed not initialized it is
    checked and ignored (the same script may run in a world or alone; process_group=False with a
    timeout is a ValueError).
    In a world of more than one rank, ``state_dict()`` holds this rank's shards (see
    ``state_dict``)."""

    def __init__(self, config, device="cpu", process_group=None, timeout=None, include_last_offset=True):
        super().__init__()
        if not isinstance(include_last_offset, bool):
            raise TypeError(f"include_last_offset is a {type(include_last_offset).__name__} (expected a bool)")
        self.include_last_offset = include_last_offset
        self.device = _check_device(device)
        if process_group is None and timeout is not None and _default_process_group(None) is None:
            from strata._process_group import timeout_of
            timeout_of(timeout)  # checked, then ignored: no group is in effect
            timeout = None
        process_group = _default_process_group(process_group)
        try:
            self.store = strata.Store(_store_config(config, self.device), process_group=process_group,
                                      timeout=timeout)
        except ValueError as e:
            if process_group is not None and "must be gpu or hybrid" in str(e):
                raise ValueError(f"{e} (or process_group=False for a store of this process alone)") from None
            raise
        self._process_group = process_group
        self._timeout = timeout
        if self.device.type == "cuda" and self.store.device is None:
            raise ValueError(f"device {self.device}, but the store has no device: its tables are all 'cpu' "
                             "(expected a gpu, cached, offload or hybrid table, or device='cpu')")
        self._tables = {t["name"]: t for t in self.store.config["tables"]}
        # Feature name -> (its table's config, its pooling): a table lists its features, or is its own one.
        self._features = {}
        for t in self._tables.values():
            for f in t.get("features", [t["name"]]):
                name, pooling = (f, t["pooling"]) if isinstance(f, str) else (f["name"], f.get("pooling", t["pooling"]))
                self._features[name] = (t, pooling)
        if self.device.type == "cuda":
            for name, t in self._tables.items():
                if t.get("output_dtype", "fp32") != "fp32":
                    raise ValueError(f"table '{name}': output_dtype {t['output_dtype']} with device {self.device}: "
                                     "the Python module passes half-size outputs in host memory only (expected "
                                     "output_dtype fp32 with device='cuda', or device='cpu')")
        self._next_id = 0
        self._in_flight = set()
        # Gradients of lookups whose backward ran in the current backward pass: [(batch_id, grads, stream)].
        self._deferred = []
        self._deferred_lock = threading.Lock()
        # Outputs of a custom autograd function require grad only when an input does: this
        # tensor, never a parameter, makes the lookup part of the graph.
        self._anchor = torch.zeros((), requires_grad=True)
        # True while this module's own load_state_dict(strict=False) runs: torch tells
        # _load_from_state_dict strict=True whatever the caller asked.
        self._partial_load = False

    # ---- batch ids ----
    def _take_id(self):
        batch_id = self._next_id
        self._next_id += 1
        return batch_id

    def _shapes(self, features):
        shapes = []
        for name, f in features.items():
            table, pooling = self._features.get(name, (None, None))
            if table is None:
                return None  # the store names it
            if pooling == "none":
                keys = _entry(f, "keys", "values")
                rows = 0 if keys is None else len(keys)
            elif _entry(f, "lengths") is not None:
                rows = len(f["lengths"])
            else:
                offsets = _entry(f, "offsets")
                rows = 0 if offsets is None else max(len(offsets) - 1, 0)
            shapes.append((rows, table["dim"]))
        return shapes

    def submit(self, batch):
        """Submits a batch now (for prefetching) and returns the SubmittedBatch to forward later: a training batch
        in training mode with gradients enabled, else an evaluation one (dynamic tables admit no key for it)."""
        features = _features_of(batch, self.include_last_offset)
        batch_id = self._take_id()
        train = self.training and torch.is_grad_enabled()
        self.store.submit(batch_id, features, train=train)
        shapes = [(name, shape) for name, shape in zip(features, self._shapes(features))]
        return SubmittedBatch(self, batch_id, shapes, train)

    def preview(self, batch):
        """Announces a batch's keys (store.preview) and returns the id its submit must use."""
        features = _features_of(batch, self.include_last_offset)
        batch_id = self._take_id()
        self.store.preview(batch_id, features)
        return batch_id

    def submit_previewed(self, batch_id, batch):
        """Submits a previewed batch under its id (see preview), for training or evaluation as submit() decides."""
        features = _features_of(batch, self.include_last_offset)
        train = self.training and torch.is_grad_enabled()
        self.store.submit(batch_id, features, train=train)
        shapes = [(name, shape) for name, shape in zip(features, self._shapes(features))]
        return SubmittedBatch(self, batch_id, shapes, train)

    def forward(self, batch):
        if isinstance(batch, SubmittedBatch):
            if batch.owner is not self:
                raise ValueError(f"SubmittedBatch {batch.batch_id} belongs to another EmbeddingBagCollection")
            submitted = batch
        else:
            submitted = self.submit(batch)
        submitted.forwarded = True
        names = [name for name, _ in submitted.tables]
        shapes = [shape for _, shape in submitted.tables]
        dtypes = [TORCH_DTYPES[self._features[name][0].get("output_dtype", "fp32")] for name in names]
        train = self.training and torch.is_grad_enabled()
        if train and not submitted.train:
            self.store.discard(submitted.batch_id)
            raise RuntimeError(
                f"batch {submitted.batch_id} was submitted for evaluation (the module in eval mode or under "
                "torch.no_grad()) and is now looked up for training: submit it again in training mode"
            )
        try:
            if train:
                outs = _Lookup.apply(self._anchor, self, submitted.batch_id, shapes, dtypes)
            else:
                outs = self._lookup(submitted.batch_id, shapes, dtypes)
        except BaseException as first:
            # Still in flight: the lookup failed. In a world the discard is a collective that may
            # fail too (a peer left): the lookup's error is the one raised.
            try:
                self.store.discard(submitted.batch_id)
            except Exception as e:
                if hasattr(first, "add_note"):
                    first.add_note(f"discarding batch {submitted.batch_id} then failed too: {e}")
            raise
        if train:
            self._in_flight.add(submitted.batch_id)
        else:
            self.store.discard(submitted.batch_id)
        return KeyedEmbeddings(names, outs)

    # ---- the device's side of a lookup ----
    def _lookup(self, batch_id, shapes, dtypes):
        """New output tensors on the module's device, of each table's output_dtype, written by the
        store's forward of the batch."""
        outs = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in zip(shapes, dtypes)]
        if self.device.type == "cuda":
            # Allocated on the current stream (torch's caching allocator) and written on it.
            self.store.forward(batch_id, outs, stream=torch.cuda.current_stream(self.device).cuda_stream)
        else:
            # The store writes the CPU tensors' memory in place.
            self.store.forward(batch_id, outs)
        return outs

    def _gradients(self, grads, dtypes):
        """(gradients, stream) of a lookup's backward as the store takes them: contiguous, of each
        table's output_dtype, on the module's device, and on cuda the stream the backward runs on
        (None on cpu)."""
        grads = [g.detach().to(dtype).contiguous() for g, dtype in zip(grads, dtypes)]
        if self.device.type != "cuda":
            return grads, None
        stream = torch.cuda.current_stream(self.device)
        for g in grads:
            g.record_stream(stream)  # freed after the store's read on `stream`, wherever it was allocated
        return grads, stream.cuda_stream

    def _defer_backward(self, batch_id, grads, stream=None):
        with self._deferred_lock:
            self._deferred.append((batch_id, grads, stream))
        torch.autograd.Variable._execution_engine.queue_callback(self._apply_deferred)

    def _apply_deferred(self):
        """End of a backward pass: applies its lookups' gradients in submit (batch id) order. Each
        is tried; the first error is raised (a refused batch stays in flight). Holds the lock while
        applying, so a concurrent pass's callback returns only once its batches are applied."""
        with self._deferred_lock:
            pending = sorted(self._deferred, key=lambda entry: entry[0])
            self._deferred = []
            error = None
            for batch_id, grads, stream in pending:
                try:
                    self.store.backward(batch_id, grads, stream=stream)
                    self._in_flight.discard(batch_id)
                except Exception as e:  # raised below, once the later batches were tried
                    error = error or e
            if error is not None:
                raise error

    def discard_in_flight(self):
        """Retires every batch forwarded in training mode whose backward never came (or whose
        backward pass failed before applying it)."""
        with self._deferred_lock:
            self._deferred = []
            for batch_id in sorted(self._in_flight):
                self.store.discard(batch_id)
            self._in_flight.clear()

    # ---- the world ----
    @property
    def rank(self):
        """This process's rank in the store's world (0 for a store of this process alone)."""
        world = self.store.world
        return 0 if world is None else world["rank"]

    @property
    def world_size(self):
        """The number of ranks of the store's world (1 for a store of this process alone)."""
        world = self.store.world
        return 1 if world is None else world["size"]

    def close(self):
        """Closes the store (``strata.Store.close``): in a world a collective, on every rank; batches
        in flight are discarded. Later calls raise RuntimeError "store is closed"."""
        with self._deferred_lock:
            self._deferred = []
            self._in_flight.clear()
        self.store.close()

    # ---- learning rate ----
    def set_learning_rate(self, lr, table=None):
        """Sets a table's learning rate (lr: a number; every table's when table is None) from the
        next backward. The rates are part of ``state_dict()`` and of the store's checkpoints:
        loading either replaces the rates in force, also those of a new config (set them again
        after loading to change them)."""
        self.store.set_learning_rate(lr, table)

    def learning_rate(self, table):
        return self.store.learning_rate(table)

    def sparse_optimizer(self, dense=None):
        """The tables' learning rates as a ``torch.optim.Optimizer`` that ``torch.optim.lr_scheduler``
        classes drive: a :class:`TableOptimizer` with one param group per table (its ``"lr"`` is the
        table's rate, ``"table"`` its name). Given ``dense`` (the dense model's optimizer), its param
        groups come first and ``step()``/``zero_grad()`` are the dense optimizer's, so one scheduler
        drives the dense and the sparse rates alike::

            opt = ebc.sparse_optimizer(torch.optim.Adagrad(dense_params, lr=0.05))
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=0)
            # per step: loss.backward(); opt.step(); sched.step()
        """
        return TableOptimizer(self, dense)

    def extra_repr(self):
        return f"device={self.device}, store={self.store!r}"

    # ---- state dict: table weights, optimizer state and rates by table name, and the step ----
    def _dtype(self, name, field):
        """The torch dtype of a table's ``field`` (dtype, state_dtype or output_dtype)."""
        return TORCH_DTYPES[self._tables[name].get(field, "fp32")]

    def _state_dim(self, name):
        return self.store.shard_info(name)["state_dim"]

    def _dynamic(self, name):
        """Whether a table is dynamic (``"kind": "dynamic"``: rows by key, up to its capacity)."""
        return self._tables[name].get("kind", "dense") == "dynamic"

    def _rows_of(self, name):
        """(keys, weights, state) of a table as the store holds it: a dynamic table's keys held
        (ascending) and their rows, a dense table's every row (keys None)."""
        if not self._dynamic(name):
            return (None, *self.store.read_rows(name))
        keys = self.store.keys_held(name)
        return (keys, *self.store.read_keys(name, keys))

    def _keeps_state(self, name):
        """Whether the table's optimizer keeps state (every optimizer but sgd)."""
        return self._tables[name]["optimizer"]["kind"] != "sgd"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self.world_size > 1:
            self._save_shards(destination, prefix)
            return
        for name in self._tables:
            keys, weights, state = self._rows_of(name)
            key = table_entries(prefix, name)
            if keys is not None:
                destination[key + "keys"] = torch.from_numpy(keys)
            destination[key + "weight"] = rows_as(weights, self._dtype(name, "dtype"))
            if state.shape[1] > 0:
                destination[key + "optimizer_state"] = rows_as(state, self._dtype(name, "state_dtype"))
            destination[key + "learning_rate"] = torch.tensor(self.store.learning_rate(name))
        destination[f"{prefix}step"] = torch.tensor(self.store.step, dtype=torch.int64)

    def _save_shards(self, destination, prefix):
        """state_dict() of a world of more than one rank: this rank's shards (see state_dict)."""
        for name in self._tables:
            if self._dynamic(name):
                self._save_key_shard(destination, prefix, name)
                continue
            info = self.store.shard_info(name)
            weights, state = self.store.read_shard(name, 0, info["local_rows"])
            key = table_entries(prefix, name)
            destination[key + "weight"] = rows_as(weights, self._dtype(name, "dtype"))
            if self._keeps_state(name):
                destination[key + "optimizer_state"] = rows_as(state, self._dtype(name, "state_dtype"))
            destination[key + "shard"] = torch.tensor(_shard_vector(info), dtype=torch.int64)
            destination[key + "replicas"] = torch.tensor(info["replicas"], dtype=torch.int64)
            destination[key + "learning_rate"] = torch.tensor(self.store.learning_rate(name))
        destination[f"{prefix}step"] = torch.tensor(self.store.step, dtype=torch.int64)

    def _save_key_shard(self, destination, prefix, name):
        """A dynamic table's entries in a world's state_dict: this rank's shard (see state_dict)."""
        keys, weights, state = self._rows_of(name)  # keys_held and read_keys: this rank's shard's
        key = table_entries(prefix, name)
        destination[key + "keys"] = torch.from_numpy(keys)
        destination[key + "weight"] = rows_as(weights, self._dtype(name, "dtype"))
        if state.shape[1] > 0:
            destination[key + "optimizer_state"] = rows_as(state, self._dtype(name, "state_dtype"))
        destination[key + "shard"] = torch.tensor(_key_shard_vector(self, name), dtype=torch.int64)
        destination[key + "learning_rate"] = torch.tensor(self.store.learning_rate(name))

    def state_dict(self, *args, **kwargs):
        """What the next update reads (the class's doc). In a world of more than one rank each rank
        saves its own shards, and the call reads only local memory (but every rank should call it at
        the same point: it reads the learning rates and the step of a store in step): per table
        ``embedding_bags.<name>.weight`` (local_rows, local_dim) and ``embedding_bags.<name>.optimizer_state``
        (local_rows, state columns; absent for sgd) of this rank's shard, ``embedding_bags.<name>.shard``
        (int64[10]: world, rank, type (0 replicated, 1 table, 2 row, 3 column), rows, dim, row_start,
        row_step, local_rows, col_offset, local_dim: local row i is global row row_start + i *
        row_step, local column j global column col_offset + j; ``strata.Store.shard_info``),
        ``embedding_bags.<name>.replicas`` (int64: the ranks holding the same shard) and
        ``embedding_bags.<name>.learning_rate``, and ``step``. A table this rank does not hold has 0 rows.
        A dynamic table's entries are its shard's keys and their rows: ``embedding_bags.<name>.keys``
        (int64, ascending: ``strata.Store.keys_held`` of this rank, every key one that
        ``strata.Store.key_owner`` gives this rank), ``weight`` (n, dim) and ``optimizer_state`` (n,
        state_dim; absent for sgd) of the table's dtypes, ``learning_rate`` and
        ``embedding_bags.<name>.shard`` (int64[6]: world, rank, type (1 table, 2 row), capacity, dim,
        shard_capacity: the keys this rank's shard holds at most, 0 on a rank without a shard of a
        table-sharded table; its 6 values, a dense shard's 10, and the ``keys`` beside it mark a
        dynamic table's shard; no ``replicas``).
        Such a state_dict loads only into the same rank of a world of the same size and config;
        ``strata.torch.merge_state_dicts`` of every rank's gives whole tables (a dynamic table's:
        every rank's keys, ascending, with their rows, as a one-rank module's state_dict has it),
        which load into a module of any world size."""
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Loads what ``state_dict()`` holds: table weights, optimizer state (tensors or NumPy
        arrays of the table's ``dtype`` and ``state_dtype``: float32, or bfloat16 (tensors only) or
        float16 for half-size tables; another dtype is refused, not converted), learning rates (numbers: an int or float, or a 0-d tensor or NumPy
        array, that float32 holds) and ``step`` (an integer from 0 to 2^63 - 2, as the next update
        takes step + 1: an int, a 0-d integer tensor or NumPy array), then continues bit for bit as
        the module that saved it. ``assign`` (torch's, passed on where torch takes it) changes
        nothing here: the rows are always copied into the store. A table's entries may have the names
        state_dicts had before ``embedding_bags.<name>.*``, ``tables.<name>.*`` (a table's entries
        under both names are refused); errors name the entries as given, except that in a world
        of more than one rank a step or learning rate that differs between ranks is named by
        today's names (``step``, ``embedding_bags.<name>.learning_rate``), as ``missing_keys``
        are. A dynamic table takes its ``keys`` (int64, distinct, at most its capacity) with one row
        of ``weight`` and ``optimizer_state`` per key and then holds exactly those keys
        (``strata.Store.write_keys``; the class's doc says what such a state_dict does not carry);
        a dense table's entries given to a dynamic table, or a dynamic one's to a dense table, are
        refused naming the table.

        With ``strict`` (the default) every entry of ``state_dict()`` must be there: a state_dict
        without ``step`` (saved before the step was part of it) or without a table's optimizer
        state or rate is refused, since the module would continue from its own, silently another
        run's. Load such a state_dict with ``strict=False``: it loads what is there and reports the
        rest in ``missing_keys``, which keep the module's current values (set the step with
        ``module.store.set_step(n)`` if you know it), and unexpected keys in ``unexpected_keys``.
        A table's optimizer state without its weight is refused either way.

        Every entry is checked before any row changes: on an error (a wrong shape, type or dtype,
        a bad rate or step, and with ``strict`` a missing or unexpected key) it raises RuntimeError
        naming the entry, and nothing is changed. Once the entries are checked, only the device
        can fail the load: the write of a ``gpu``, ``cached`` or ``hybrid`` table whose device has
        failed (before or during the load) raises, and the tables written before it hold the
        state_dict's rows while the rest keep their own (load again on a store whose device works).

        Nested in another module (``nn.Sequential(ebc)``), torch loads each submodule in turn and
        this method does not run: the module's entries are checked as under ``strict`` whatever the
        parent's ``strict``, and with one missing, unexpected or bad the tables load nothing and the
        parent's load raises. For a partial load of a nested module, call its own
        ``load_state_dict(entries, strict=False)`` with its entries (their prefix removed). An
        error elsewhere in the parent's state dict (a missing or unexpected key of another module)
        raises after the tables were loaded, as it does after torch's own parameters were copied.

        In a world of more than one rank it is a collective (every rank calls it at the same point)
        that loads either this rank's shards, as ``state_dict()`` of the same rank saved them (each
        ``embedding_bags.<name>.shard`` must equal this rank's layout: a shard of another rank or world is
        refused), or whole tables (entries without ``shard``: a one-rank module's state_dict, or
        ``merge_state_dicts`` of every rank's of a world of any size), of which each rank writes the
        rows and columns it holds. So a world's state_dicts load into a world of another size, or one
        rank, through ``merge_state_dicts``. Every
        entry of every rank is checked before any rank writes: a state_dict refused on one rank is
        refused on all (the others' errors name that rank), with nothing written, and so is one whose
        ``step`` or a ``learning_rate`` differs between ranks or is absent on some ranks only (the
        error names the key and the rank; the step and the rates are the world's).

        A dynamic table in such a world: each rank writes its own shard with
        ``strata.Store.write_keys``, which then holds exactly the keys it takes. Given this rank's
        shard (entries with ``shard``, as ``state_dict()`` of this rank saved them: the vector must
        equal this rank's), every key must be one of this rank's shard: a key of another rank's is
        refused naming the entry, the key and its rank (``strata.Store.key_owner``), on every rank
        before any writes. Given the whole table (no ``shard``: a one-rank module's state_dict, or
        ``merge_state_dicts``' of a world of any size; checked as a one-rank module checks it), each
        rank takes the keys its shard owns, with their rows; more of them than its shard holds
        (``shard_capacity``: the capacity is split between the ranks, so a full table may not fit a
        world's shards) is refused naming the entry. The key index's bookkeeping starts afresh as
        in a one-rank load (the class's doc)."""
        if not isinstance(state_dict, collections.abc.Mapping):
            raise TypeError(f"state_dict is a {type(state_dict).__name__} (expected a mapping of names to tensors, "
                            "as state_dict() returns)")
        if not isinstance(strict, bool):
            raise TypeError(f"strict is a {type(strict).__name__} (expected a bool)")
        if not isinstance(assign, bool):
            raise TypeError(f"assign is a {type(assign).__name__} (expected a bool)")
        self._partial_load = not strict
        try:
            if _LOAD_TAKES_ASSIGN:
                return super().load_state_dict(state_dict, strict, assign=assign)
            return super().load_state_dict(state_dict, strict)
        finally:
            self._partial_load = False

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Every entry under the prefix is the module's (it has no submodules of torch's own).
        ours = {k for k in state_dict if k.startswith(prefix)
                and not any(k.startswith(f"{prefix}{child}.") for child in self._modules)}
        world = self.world_size > 1  # a world of more than one rank: this rank's shards
        plan, problems, missing = [], [], []
        # In a world, a check that raises on this rank is a refusal the other ranks must hear of (they
        # would wait in agree_values for it until the timeout): noted, agreed on, then raised here.
        raised = None
        try:
            step = self._check_load(state_dict, prefix, ours, plan, problems, missing, missing_keys, unexpected_keys)
        except Exception as e:
            if not world:
                raise
            raised = e
            problems.append(f"{type(e).__name__}: {e}")
            plan, step = [_TableLoad(name, None, None, None) for name in self._tables], None
        if world:
            self._agree_on_load(prefix, plan, step, problems)
        if raised is not None:
            raise raised
        error_msgs.extend(problems)
        if problems:
            return  # torch's load_state_dict raises; nothing was changed
        # Every entry is checked and no batch is in flight, so the rates and the step cannot be
        # refused; a write fails only when the device of a gpu, cached or hybrid table has failed,
        # and then the tables before it stay written (load_state_dict's docstring).
        write = self.store.write_shard if world else self.store.write_rows
        for name, w, s, rate, keys in plan:
            if keys is not None:
                self.store.write_keys(name, keys, w, s)
            elif w is not None:
                write(name, 0, w, s)
            if rate is not None:
                self.store.set_learning_rate(rate, name)
        if step is not None:
            self.store.set_step(step)

    def _check_load(self, state_dict, prefix, ours, plan, problems, missing, missing_keys, unexpected_keys):
        """The checks of _load_from_state_dict: appends each table's (name, weights, state, rate) to
        ``plan`` and the refusals to ``problems``; returns the step to write (or None)."""
        world = self.world_size > 1
        if self.store.in_flight:
            problems.append(f"{self.store.in_flight} batch(es) in flight (expected none: run their backward or "
                            "discard_in_flight() first)")
        shards = sorted(k for k in ours if k.endswith(".shard") and k.startswith((prefix + HEAD, prefix + OLD_HEAD)))
        if shards and not world:
            problems.append(f"{shards[0]}: a world's state_dict holds shards, which load only into the rank that "
                            "saved them (merge every rank's state_dict() with strata.torch.merge_state_dicts and "
                            "load the result)")
        for name in self._tables:
            check = self._check_table_entries
            if world:
                check = self._check_key_shard_entries if self._dynamic(name) else self._check_shard_entries
            try:
                key = saved_table_entries(state_dict, prefix, name)  # errors name the entries as given
            except ValueError as e:  # entries under both names
                problems.append(str(e))
                ours.difference_update(table_entries(prefix, name, head) + entry for head in (HEAD, OLD_HEAD)
                                       for entry in ENTRIES)
                plan.append(_TableLoad(name, None, None, None))
                continue
            before = len(missing)
            plan.append(check(state_dict, key, name, ours, missing, problems))
            # Missing entries by the names state_dict() gives, whichever the others were given by.
            missing[before:] = [table_entries(prefix, name) + k[len(key):] for k in missing[before:]]
        step = state_dict.get(prefix + "step")
        ours.discard(prefix + "step")
        if step is None:
            missing.append(prefix + "step")
        else:
            step = _step_count(step, prefix + "step", problems)
        unexpected = sorted(ours)
        missing_keys.extend(missing)
        unexpected_keys.extend(unexpected)
        if (missing or unexpected) and not self._partial_load:
            how = (f"submodule '{prefix[:-1]}''s own load_state_dict, given its entries ('{prefix}' removed) and "
                   "strict=False," if prefix else "load_state_dict(..., strict=False)")
            problems.append(f"{type(self).__name__}{' ' + repr(prefix[:-1]) if prefix else ''}: missing keys "
                            f"{missing}, unexpected keys {unexpected}: nothing was loaded into its tables ({how} "
                            "loads what is there)")
        return step

    def _agree_on_load(self, prefix, plan, step, problems):
        """A world's load, before any rank writes (one all-gather of every rank's verdict, step and
        rates): the writes are followed by collectives (set_learning_rate, set_step) that a rank
        which refused would never join, and that would refuse a step or rate differing between
        ranks after every rank wrote its shards. Notes in ``problems`` a world broken by an earlier
        error of its communicator (this rank's: a store collective would fail), the other ranks' refusals,
        else the first step or rate that differs from rank 0's (absent counts as a value), so that
        every rank refuses with nothing written."""
        from strata._process_group import agree_values
        broken = self.store._world_broken
        if broken:
            problems.append(f"the world is broken since a collective failed ({broken}): nothing was loaded (every "
                            "collective of this store fails; open a new world)")
        mine = [len(problems), -1 if step is None else step]
        for *_, rate, _ in plan:
            mine += [0, 0] if rate is None else [1, int(np.float32(rate).view(np.int32))]
        every = agree_values(self._process_group, mine, self._timeout)
        others = [r for r, v in enumerate(every) if v[0] and r != self.rank]
        if others:
            problems.append(f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} of "
                            f"{self.world_size} refused {'their' if len(others) > 1 else 'its'} state_dict "
                            "(see the error there): nothing was loaded on any rank")
        if problems:
            return

        def entry(v, i):  # entry i (0: the step, then each table's rate) of one rank's vector
            return v[1:2] if i == 0 else v[2 * i:2 * i + 2]

        def value(v, i):
            if i == 0:
                return "absent" if v[1] < 0 else str(v[1])
            present, bits = entry(v, i)
            return str(np.int32(bits).view(np.float32)) if present else "absent"

        keys = [prefix + "step"] + [table_entries(prefix, name) + "learning_rate" for name, *_ in plan]
        for r in range(1, self.world_size):
            for i, key in enumerate(keys):
                if entry(every[r], i) != entry(every[0], i):
                    problems.append(f"'{key}' is {value(every[r], i)} on rank {r} but {value(every[0], i)} on rank "
                                    f"0 of {self.world_size} (expected the same on every rank: the step and the "
                                    "learning rates are the world's): nothing was loaded on any rank")
                    return

    def _check_table_entries(self, state_dict, key, name, ours, missing, problems):
        """A table's entries of a one-rank state_dict: the _TableLoad to write, each part None when
        absent or refused (noted in ``missing`` and ``problems``)."""
        table = self._tables[name]
        fields = ("keys", "weight", "optimizer_state", "learning_rate")
        keys, weight, state, lr = (state_dict.get(key + f) for f in fields)
        ours.difference_update(key + f for f in fields)
        state_dim = self._state_dim(name)
        dynamic = self._dynamic(name)
        missing.extend(key + f for f, v in zip(fields, (keys, weight, state, lr))
                       if v is None and (f != "optimizer_state" or state_dim > 0) and (f != "keys" or dynamic))
        rate = None if lr is None else _float32_rate(lr, key + "learning_rate", problems)
        if not dynamic:
            if keys is not None:
                problems.append(f"{key}keys given, but table '{name}' is dense (expected no keys: its rows are rows 0 "
                                f"to {table['rows'] - 1}; a dynamic table's entries do not load into a dense one)")
                return _TableLoad(name, None, None, rate)
            w, s = self._checked_rows(weight, state, key, (table["rows"], table["dim"]), (table["rows"], state_dim),
                                      "", name, problems)
            return _TableLoad(name, w, s, rate)
        if keys is None and weight is not None:
            problems.append(f"{key}weight without {key}keys: table '{name}' is dynamic (expected the keys of its rows "
                            "beside them, as state_dict() of a dynamic table saves them; a dense table's entries do "
                            "not load into a dynamic one)")
            return _TableLoad(name, None, None, rate)
        if keys is not None and weight is None:
            problems.append(f"{key}keys without {key}weight (expected both: the keys are those of the rows)")
            return _TableLoad(name, None, None, rate)
        if keys is None:
            return _TableLoad(name, None, None, rate)
        held = _key_vector(keys, key + "keys", table["capacity"], problems)
        if held is None:
            return _TableLoad(name, None, None, rate)
        n = len(held)
        w, s = self._checked_rows(weight, state, key, (n, table["dim"]), (n, state_dim),
                                  f": one row per key of {key}keys", name, problems)
        return _TableLoad(name, w, s, rate, held if w is not None else None)

    def _check_shard_entries(self, state_dict, key, name, ours, missing, problems):
        """A table's entries of a world's state_dict (this rank's shard; see state_dict), as
        _check_table_entries; the shard must be this rank's (entries without ``shard`` and ``replicas``
        are whole tables: _check_whole_for_shard)."""
        fields = ("weight", "optimizer_state", "shard", "replicas", "learning_rate")
        weight, state, shard, replicas, lr = (state_dict.get(key + f) for f in fields)
        ours.difference_update(key + f for f in fields)
        info = self.store.shard_info(name)
        if key + "keys" in state_dict:
            ours.discard(key + "keys")
            problems.append(f"{key}keys given, but table '{name}' is dense (expected no keys: a dynamic table's "
                            "entries do not load into a dense one)")
            return _TableLoad(name, None, None, None)
        if shard is None and replicas is None:
            return self._check_whole_for_shard(key, name, info, weight, state, lr, missing, problems)
        missing.extend(key + f for f, v in zip(fields, (weight, state, shard, replicas, lr))
                       if v is None and (f != "optimizer_state" or self._keeps_state(name)))
        if shard is not None:
            saved = _int_vector(shard, key + "shard", 10, problems)
            if saved is not None and saved != _shard_vector(info):
                problems.append(_shard_refusal(key + "shard", saved, _shard_vector(info)))
                return _TableLoad(name, None, None, None)
        if replicas is not None:
            saved = _int_vector(replicas, key + "replicas", None, problems)
            if saved is not None and saved != info["replicas"]:
                problems.append(f"{key}replicas {saved} (expected {info['replicas']}: the ranks holding this rank's "
                                "shard)")
        rows = info["local_rows"]
        state_dim = self.store.read_shard(name, 0, 0)[1].shape[1]
        w, s = self._checked_rows(weight, state, key, (rows, info["local_dim"]), (rows, state_dim),
                                  ": this rank's shard", name, problems)
        rate = None if lr is None else _float32_rate(lr, key + "learning_rate", problems)
        return _TableLoad(name, w if rows else None, s, rate)

    def _check_key_shard_entries(self, state_dict, key, name, ours, missing, problems):
        """A dynamic table's entries of a world's state_dict: this rank's shard (``shard`` equal to this
        rank's, every key this rank's), or the whole table (no ``shard``: a one-rank module's, or
        merge_state_dicts'), checked as a one-rank module checks it, of which this rank takes the keys
        its shard owns (``strata.Store.key_owner``). The _TableLoad writes them with write_keys."""
        shard = state_dict.get(key + "shard")
        capacity = self.store.stats()["dynamic"][name]["capacity"]  # this rank's shard's
        if shard is None:
            load = self._check_table_entries(state_dict, key, name, ours, missing, problems)
            if load.keys is None:
                return load
            mine = self.store.key_owner(name, load.keys) == self.rank
            if int(mine.sum()) > capacity:
                problems.append(f"{key}keys: {int(mine.sum())} of its {len(load.keys)} keys are rank {self.rank}'s "
                                f"(by strata.Store.key_owner), but rank {self.rank}'s shard of table '{name}' holds "
                                f"at most {capacity} keys (expected a table whose keys fit the shards of this world: "
                                "its capacity is split between the ranks)")
                return _TableLoad(name, None, None, load.rate)
            if not capacity:  # a rank without a shard (table sharding): no key to write (nor can it write none)
                return _TableLoad(name, None, None, load.rate)
            return _TableLoad(name, np.ascontiguousarray(load.weights[mine]),
                              None if load.state is None else np.ascontiguousarray(load.state[mine]), load.rate,
                              np.ascontiguousarray(load.keys[mine]))
        fields = ("keys", "weight", "optimizer_state", "shard", "learning_rate")
        keys, weight, state, _, lr = (state_dict.get(key + f) for f in fields)
        ours.difference_update(key + f for f in fields)
        state_dim = self._state_dim(name)
        missing.extend(key + f for f, v in zip(fields, (keys, weight, state, shard, lr))
                       if v is None and (f != "optimizer_state" or state_dim > 0))
        rate = None if lr is None else _float32_rate(lr, key + "learning_rate", problems)
        held_vector = _key_shard_vector(self, name)
        saved = _int_vector(shard, key + "shard", None, problems)
        if saved is None:
            return _TableLoad(name, None, None, rate)
        if saved != held_vector:
            problems.append(_shard_refusal(key + "shard", saved, held_vector, _KEY_SHARD_FIELDS))
            return _TableLoad(name, None, None, None)
        if (keys is None) != (weight is None):
            given, absent = ("keys", "weight") if weight is None else ("weight", "keys")
            problems.append(f"{key}{given} without {key}{absent} (expected both: the keys are those of the rows)")
            return _TableLoad(name, None, None, rate)
        if keys is None:
            return _TableLoad(name, None, None, rate)
        held = _key_vector(keys, key + "keys", capacity, problems, f"rank {self.rank}'s shard's capacity")
        if held is None:
            return _TableLoad(name, None, None, rate)
        owners = self.store.key_owner(name, held)
        other = np.flatnonzero(owners != self.rank)
        if other.size:
            k, owner = int(held[other[0]]), int(owners[other[0]])
            problems.append(f"{key}keys holds key {k}, of rank {owner}'s shard of table '{name}' (expected only keys "
                            f"of rank {self.rank}'s shard, as its state_dict() saves them; {other.size} of its "
                            f"{len(held)} keys are other ranks')")
            return _TableLoad(name, None, None, rate)
        n = len(held)
        w, s = self._checked_rows(weight, state, key, (n, self._tables[name]["dim"]), (n, state_dim),
                                  f": one row per key of {key}keys", name, problems)
        if not capacity:  # a rank without a shard (table sharding): no key (checked above) to write
            return _TableLoad(name, None, None, rate)
        return _TableLoad(name, w, s, rate, held if w is not None else None)

    def _check_whole_for_shard(self, key, name, info, weight, state, lr, missing, problems):
        """A table's whole entries (a one-rank state_dict, or merge_state_dicts' of a world's) loaded
        into a world: checked as a one-rank module checks them, then sliced to this rank's shard."""
        state_dim, column = info["state_dim"], info["type"] == "column"
        blocks = state_dim // info["dim"] if column else 0  # column shards: adagrad 1, adam 2 (never rowwise)
        missing.extend(key + f for f, v in (("weight", weight), ("optimizer_state", state), ("learning_rate", lr))
                       if v is None and (f != "optimizer_state" or state_dim > 0))
        before = len(problems)
        w, s = self._checked_rows(weight, state, key, (info["rows"], info["dim"]), (info["rows"], state_dim),
                                  ": the whole table, as a one-rank module or merge_state_dicts gives it", name,
                                  problems)
        rate = None if lr is None else _float32_rate(lr, key + "learning_rate", problems)
        if w is None or len(problems) > before or not info["local_rows"]:
            return _TableLoad(name, None, None, rate)
        rows = slice(info["row_start"], info["row_start"] + info["local_rows"] * info["row_step"], info["row_step"])
        c0, c1 = info["col_offset"], info["col_offset"] + info["local_dim"]
        w = np.ascontiguousarray(w[rows, c0:c1])
        if s is not None:
            d = info["dim"]  # column shards: state block b's local column j is global column b * dim + c0 + j
            s = np.ascontiguousarray(np.concatenate([s[rows, b * d + c0:b * d + c1] for b in range(blocks)], axis=1)
                                     if column and blocks else s[rows, :0] if column else s[rows])
        return _TableLoad(name, w, s, rate)

    def _checked_rows(self, weight, state, key, weight_shape, state_shape, whose, name, problems):
        """(weights, state) of a table's entries as float32 NumPy arrays of the shapes expected,
        each None when absent or refused (noted in ``problems``). Each entry must have its table's
        dtype (weights) or state_dtype (state): a float32 tensor for a bf16 table is refused, not
        rounded (convert it explicitly with ``.to(torch.bfloat16)``)."""
        w = None if weight is None else _host_rows(weight, key + "weight", self._dtype(name, "dtype"), problems)
        s = None if state is None else _host_rows(state, key + "optimizer_state", self._dtype(name, "state_dtype"),
                                                  problems)
        if weight is None and state is not None:
            problems.append(f"{key}optimizer_state without {key}weight (expected both: a row's state belongs "
                            "to its weights)")
        if w is not None and tuple(w.shape) != weight_shape:
            problems.append(f"{key}weight has shape {tuple(w.shape)} (expected {weight_shape}{whose})")
        if s is not None and tuple(s.shape) != state_shape:
            problems.append(f"{key}optimizer_state has shape {tuple(s.shape)} (expected {state_shape} for optimizer "
                            f"{self._tables[name]['optimizer']['kind']}{whose})")
        return w, s


_SHARDING_TYPES = ("replicated", "table", "row", "column")  # ShardingType's order (dispatch/sharding_plan.hpp)
_SHARD_FIELDS = ("world", "rank", "type", "rows", "dim", "row_start", "row_step", "local_rows", "col_offset",
                 "local_dim")
_KEY_SHARD_FIELDS = ("world", "rank", "type", "capacity", "dim", "shard_capacity")  # a dynamic table's shard


def _shard_vector(info):
    """The ``embedding_bags.<name>.shard`` entry of a shard_info dict: its 10 values (see state_dict)."""
    return [_SHARDING_TYPES.index(info["type"]) if f == "type" else int(info[f]) for f in _SHARD_FIELDS]


def _key_shard_vector(module, name):
    """The ``embedding_bags.<name>.shard`` entry of a dynamic table in a world: its 6 values (see state_dict):
    world, rank, type (1 table, 2 row), capacity, dim, and the keys this rank's shard holds at most."""
    info = module.store.shard_info(name)
    shard_capacity = module.store.stats()["dynamic"][name]["capacity"]
    return [info["world"], info["rank"], _SHARDING_TYPES.index(info["type"]), module._tables[name]["capacity"],
            info["dim"], int(shard_capacity)]


def _shard_refusal(what, saved, held, fields=_SHARD_FIELDS):
    """Why a saved shard vector does not load into this rank's shard ``held`` (``fields``: a dense
    table's shard vector's, or _KEY_SHARD_FIELDS, a dynamic table's)."""
    if len(saved) != len(held):
        dense = len(held) == len(_SHARD_FIELDS)
        return (f"{what} has {len(saved)} values, a {'dynamic' if dense else 'dense'} table's shard (expected the "
                f"{len(held)} of a {'dense' if dense else 'dynamic'} table's: {', '.join(fields)}; a "
                f"{'dynamic' if dense else 'dense'} table's entries do not load into a "
                f"{'dense' if dense else 'dynamic'} one)")

    def who(v):
        kind = _SHARDING_TYPES[v[2]] if 0 <= v[2] < len(_SHARDING_TYPES) else f"type {v[2]}"
        return f"rank {v[1]} of {v[0]} ({kind}"
    if saved[:3] != held[:3]:
        return (f"{what}: saved by {who(saved)} sharding); this module is {who(held)}): a shard loads only into "
                "the rank that saved it (to load into another rank or world, merge every rank's state_dict() with "
                "strata.torch.merge_state_dicts and load the result)")
    diff = ", ".join(f"{f} {a} (this rank's {b})" for f, a, b in zip(fields, saved, held) if a != b)
    return f"{what}: saved by {who(saved)}) with {diff}: the table's config differs from the one that saved it"


def _key_vector(t, what, capacity, problems, whose="the table's capacity"):
    """A dynamic table's ``keys`` entry (a 1-D int64 tensor or NumPy array: distinct, at most
    ``capacity`` of them, ``whose`` says what bounds them) as an int64 NumPy array, or None after
    noting why not in ``problems``."""
    expected = f"expected a 1-D int64 tensor of distinct keys, at most {whose} {capacity}, as state_dict() saves them"
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().numpy() if t.dtype == torch.int64 else t
    if not isinstance(t, np.ndarray):
        kind = f"a {t.dtype} tensor" if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"
        problems.append(f"{what} is {kind} ({expected})")
        return None
    if t.dtype != np.int64 or t.ndim != 1:
        problems.append(f"{what} has dtype {t.dtype} and shape {tuple(t.shape)} ({expected})")
        return None
    if len(t) > capacity:
        problems.append(f"{what} holds {len(t)} keys ({expected})")
        return None
    unique, counts = np.unique(t, return_counts=True)
    if len(unique) != len(t):
        problems.append(f"{what} holds key {int(unique[counts > 1][0])} more than once ({expected})")
        return None
    return np.ascontiguousarray(t)


def _int_vector(t, what, length, problems):
    """A state-dict int64 vector (a tensor or NumPy array of integers) as a list of ints, or None
    after noting why not in ``problems``."""
    expected = f"expected a 1-D integer tensor{f' of {length} values' if length else ''}, as state_dict() saves it"
    if isinstance(t, torch.Tensor):
        integral = not (t.dtype.is_floating_point or t.dtype.is_complex) and t.dtype != torch.bool
        t = t.detach().cpu().numpy()
    elif isinstance(t, np.ndarray):
        integral = t.dtype.kind in "iu"
    else:
        problems.append(f"{what} is a {type(t).__name__} ({expected})")
        return None
    if not integral or t.ndim != 1 or (length is not None and t.shape[0] != length):
        problems.append(f"{what} has dtype {t.dtype} and shape {tuple(t.shape)} ({expected})")
        return None
    return [int(v) for v in t]


class _TableGroup(dict):
    """A param group of :class:`TableOptimizer`: ``group["lr"]`` is the table's rate in the store.
    Setting it sets the store's rate at once (used from the next backward; a bad rate raises and
    changes nothing). Reading it gives the value last set, as torch's schedulers compute it (a
    double), unless the store's rate was changed since by other means (set_learning_rate,
    load_state_dict, load): then the store's."""

    def __init__(self, module, table):
        super().__init__(params=[], table=table, lr=module.learning_rate(table))
        self._module = module

    def __setitem__(self, key, value):
        if key == "lr":
            self._module.set_learning_rate(value, dict.__getitem__(self, "table"))
        super().__setitem__(key, value)

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if key == "lr":
            held = self._module.learning_rate(dict.__getitem__(self, "table"))
            if np.float32(value) != np.float32(held):
                return held
        return value

    def get(self, key, default=None):
        return self[key] if key in self else default


class TableOptimizer(torch.optim.Optimizer):
    """The learning rates of an :class:`EmbeddingBagCollection`'s tables as a torch optimizer, for
    torch's learning-rate schedulers (``EmbeddingBagCollection.sparse_optimizer``). Its param groups
    are the dense optimizer's (when given; read from it each time, so they stay its own after its
    ``load_state_dict``), then one per table: ``{"params": [], "table": name, "lr": rate}``; a
    scheduler's write of a table group's ``"lr"`` sets the table's rate in the store (held as
    float32; 0 is a rate: ``CosineAnnealingLR(eta_min=0)`` ends at an update of zero). The tables' update itself is fused into backward, so ``step()`` and ``zero_grad()`` are
    the dense optimizer's (nothing without one). ``state_dict()`` is this class's own format,
    ``{"dense": the dense optimizer's state_dict() or None, "table_lr": {table: rate}}`` (not torch's
    ``{"state", "param_groups"}``); ``load_state_dict`` takes only that. The table groups hold no
    ``momentum`` or ``betas``: ``OneCycleLR`` and ``CyclicLR`` need ``cycle_momentum=False``."""

    def __init__(self, module, dense=None):
        if not isinstance(module, EmbeddingBagCollection):
            raise TypeError(f"module is a {type(module).__name__} (expected an EmbeddingBagCollection)")
        if dense is not None and not isinstance(dense, torch.optim.Optimizer):
            raise TypeError(f"dense is a {type(dense).__name__} (expected None or a torch.optim.Optimizer)")
        self.module = module
        self.dense = dense
        self.table_groups = [_TableGroup(module, name) for name in module._tables]
        self._state = collections.defaultdict(dict)  # the state without a dense optimizer (none is kept)
        # torch's constructor sets up what its schedulers and hooks read; what it assigns to
        # param_groups and state (its one empty group) is dropped by the setters while it runs.
        self._constructing = True
        super().__init__([{"params": []}], {})
        self._constructing = False

    # Read each time, not copied: the dense optimizer's load_state_dict replaces its groups and state.
    @property
    def param_groups(self):
        """The dense optimizer's param groups as they are now, then the tables' (a new list each time)."""
        return (list(self.dense.param_groups) if self.dense is not None else []) + self.table_groups

    @param_groups.setter
    def param_groups(self, groups):
        if self._constructing:
            return
        groups = list(groups)
        n = len(groups) - len(self.table_groups)
        if n < 0 or any(a is not b for a, b in zip(groups[n:], self.table_groups)) or (n and self.dense is None):
            raise ValueError("param_groups must be the dense optimizer's groups followed by this optimizer's "
                             "table groups (set dense.param_groups to change the dense ones)")
        if self.dense is not None:
            self.dense.param_groups = groups[:n]

    @property
    def state(self):
        """The dense optimizer's state as it is now (the tables' optimizer state is in the store)."""
        return self.dense.state if self.dense is not None else self._state

    @state.setter
    def state(self, state):
        if self._constructing:
            return
        if self.dense is not None:
            self.dense.state = state
        else:
            self._state = state

    def add_param_group(self, param_group):
        """Adds a param group to the dense optimizer (ValueError without one)."""
        if self._constructing:
            return
        if self.dense is None:
            raise ValueError("add_param_group: this TableOptimizer has no dense optimizer to add the group to")
        self.dense.add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        """The dense optimizer's step (the tables were updated by backward)."""
        if self.dense is not None:
            return self.dense.step(closure)
        if closure is not None:
            with torch.enable_grad():
                return closure()
        return None

    def zero_grad(self, set_to_none=True):
        """The dense optimizer's zero_grad (the tables keep no gradients)."""
        if self.dense is not None:
            self.dense.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"dense": self.dense.state_dict() if self.dense is not None else None,
                "table_lr": {g["table"]: g["lr"] for g in self.table_groups}}

    def load_state_dict(self, state_dict):
        if not isinstance(state_dict, collections.abc.Mapping) or set(state_dict) != {"dense", "table_lr"}:
            raise ValueError("state_dict is not a TableOptimizer's (expected {'dense': ..., 'table_lr': {table: "
                             "rate}}, as state_dict() returns)")
        # Everything checked first: a refused state_dict changes neither the dense state nor any rate.
        rates = state_dict["table_lr"]
        if not isinstance(rates, collections.abc.Mapping):
            raise TypeError(f"state_dict['table_lr'] is a {type(rates).__name__} (expected a dict {{table: rate}}, "
                            "as state_dict() returns)")
        unknown = sorted(set(rates) - {g["table"] for g in self.table_groups}, key=str)
        if unknown:
            raise ValueError(f"state_dict has rates of tables {unknown} that the module does not have")
        problems = []
        held = {table: _float32_rate(lr, f"state_dict['table_lr'][{table!r}]", problems) for table, lr in rates.items()}
        if problems:
            raise ValueError("; ".join(problems))
        if (state_dict["dense"] is None) != (self.dense is None):
            raise ValueError("state_dict's dense optimizer state does not match this optimizer's (expected "
                             f"{'none' if self.dense is None else 'one'})")
        if self.dense is not None:
            self.dense.load_state_dict(state_dict["dense"])
        for g in self.table_groups:
            if g["table"] in held:
                g["lr"] = held[g["table"]]


def _host_rows(t, what, dtype, problems):
    """A state-dict array of torch dtype ``dtype`` (a tensor on any device, or a NumPy array:
    float32 or float16; NumPy has no bfloat16) as a float32 NumPy array (exact: every value of a
    half-size dtype is a float32), or None after noting why not in ``problems``."""
    mine = "" if dtype == torch.float32 else ", the table's dtype"
    if isinstance(t, torch.Tensor):
        if t.dtype != dtype:
            problems.append(f"{what} has dtype {t.dtype} (expected {dtype}{mine}; rows of another dtype load only "
                            f"when converted explicitly: .to({dtype}))")
            return None
        return float32_rows(t)
    if isinstance(t, np.ndarray):
        if dtype == torch.bfloat16:
            problems.append(f"{what} is a NumPy array of {t.dtype} (expected a torch.bfloat16 tensor, the table's "
                            "dtype: NumPy has no bfloat16)")
            return None
        want = np.float16 if dtype == torch.float16 else np.float32
        if t.dtype != want:
            problems.append(f"{what} has dtype {t.dtype} (expected {np.dtype(want)}{mine})")
            return None
        return t.astype(np.float32, copy=False)
    problems.append(f"{what} is a {type(t).__name__} (expected a {dtype} tensor or NumPy array)")
    return None


def _step_count(step, what, problems):
    """A state-dict step (an int, or a 0-d integer tensor or NumPy array) as an int from 0 to
    2^63 - 2 (the next update takes step + 1, an int64), or None after noting why not in
    ``problems``."""
    expected = "expected an integer >= 0: an int, or a 0-d integer tensor or NumPy array"
    if isinstance(step, (bool, np.bool_)):
        problems.append(f"{what} is a bool ({expected})")
        return None
    if isinstance(step, (torch.Tensor, np.ndarray, np.generic)):
        dtype = step.dtype
        integral = (not (dtype.is_floating_point or dtype.is_complex) and dtype != torch.bool
                    if isinstance(step, torch.Tensor) else dtype.kind in "iu")
        if not integral:
            problems.append(f"{what} has dtype {dtype} ({expected})")
            return None
        if tuple(step.shape) != ():
            problems.append(f"{what} has shape {tuple(step.shape)} (expected a scalar: an int, or a 0-d integer "
                            "tensor or NumPy array)")
            return None
        step = int(step)
    elif not isinstance(step, int):
        problems.append(f"{what} is a {type(step).__name__} ({expected})")
        return None
    if step < 0:
        problems.append(f"{what} {step} (expected >= 0)")
        return None
    if step > 2**63 - 2:
        problems.append(f"{what} {step} (expected at most 2^63 - 2: the next update takes step + 1)")
        return None
    return step


def _float32_rate(lr, what, problems):
    """A learning rate (a number: an int or float, or a 0-d tensor or NumPy array of one, as
    set_learning_rate takes) as the store will hold it (float32), or None after noting why not."""
    expected = "expected a number: an int or float, or a 0-d tensor or NumPy array"
    if isinstance(lr, (bool, np.bool_)):
        problems.append(f"{what} is a bool ({expected})")
        return None
    if isinstance(lr, (torch.Tensor, np.ndarray, np.generic)):
        if tuple(lr.shape) != ():
            problems.append(f"{what} is a {type(lr).__name__} of shape {tuple(lr.shape)} ({expected})")
            return None
        dtype = lr.dtype
        number = (dtype != torch.bool and not dtype.is_complex if isinstance(lr, torch.Tensor)
                  else dtype.kind in "iuf")
        if not number:
            problems.append(f"{what} has dtype {dtype} ({expected})")
            return None
    elif not isinstance(lr, numbers.Real):
        problems.append(f"{what} is a {type(lr).__name__} ({expected})")
        return None
    try:
        rate = float(lr)
    except OverflowError:  # an int no double holds
        problems.append(f"{what} is out of range (expected a finite number >= 0 that float32 holds)")
        return None
    with np.errstate(over="ignore", under="ignore"):
        held = np.float32(rate)
    # 0 is a rate (an update of zero); a positive rate that float32 rounds to 0 is not.
    if not (held >= 0 and np.isfinite(held)) or (held == 0 and rate != 0):
        problems.append(f"{what} {rate!r} (expected a finite number >= 0 that float32 holds)")
        return None
    return float(held) + 0.0  # -0.0 is 0
