"""PyTorch front end of Strata: ``EmbeddingBagCollection`` and the pipelining helper.

``EmbeddingBagCollection(config, device="cpu")`` is a ``torch.nn.Module`` over a ``strata.Store``.
Its forward takes a batch of sparse features, one per table (the feature's name is the table's):

* a dict ``{table: {"keys" | "values": ..., "lengths" | "offsets": ..., "weights": ...}}`` of CPU
  tensors or NumPy arrays (keys int64 or int32, weights float32 and optional), or
* TorchRec's ``KeyedJaggedTensor`` (anything with its ``to_dict()`` of jagged tensors), or
* a ``SubmittedBatch`` yielded by :func:`pipelined` (the batch is already submitted),

and returns a :class:`KeyedEmbeddings`: the pooled embeddings per feature, (batch, dim) each (or
(num_keys, dim) for tables with pooling ``none``), and ``values()``, their concatenation.

The backward of the outputs applies the gradients to the store with each table's fused optimizer
(as FBGEMM's table-batched embedding does): the tables are not parameters, so dense optimizers
never see them, and there is no ``zero_grad`` to do for them. In training mode with gradients
enabled a forwarded batch stays in flight until its backward; otherwise (``eval()``,
``torch.no_grad()``) it is retired at once. Every forward in training mode must be followed by a
backward of its outputs (or by ``discard_in_flight()``), or the batches pile up in the store.

Only CPU tensors are served for now (``device="cpu"``); CUDA tensors wait for the store's device
data path.
"""

import numpy as np
import torch
from torch import nn

import strata
from strata.pipeline import pipelined

__all__ = ["EmbeddingBagCollection", "KeyedEmbeddings", "SubmittedBatch", "pipelined"]


class KeyedEmbeddings:
    """The outputs of one forward, by feature (like TorchRec's ``KeyedTensor``)."""

    def __init__(self, keys, tensors):
        self._keys = list(keys)
        self._tensors = list(tensors)

    def keys(self):
        """Feature (table) names, in the order of the input."""
        return list(self._keys)

    def to_dict(self):
        """{feature: tensor (batch, dim)}."""
        return dict(zip(self._keys, self._tensors))

    def __getitem__(self, key):
        return self._tensors[self._keys.index(key)]

    def __len__(self):
        return len(self._keys)

    def values(self):
        """The features' embeddings side by side: (batch, sum of dims), differentiable."""
        return torch.cat(self._tensors, dim=1)


class SubmittedBatch:
    """A batch already submitted (or previewed) to a module's store by :func:`pipelined`; pass it
    to the module's forward in place of the features."""

    __slots__ = ("owner", "batch_id", "tables")

    def __init__(self, owner, batch_id, tables):
        self.owner = owner
        self.batch_id = batch_id
        self.tables = tables


class _Lookup(torch.autograd.Function):
    """forward: the store's lookup of a submitted batch; backward: the store's fused update."""

    @staticmethod
    def forward(ctx, anchor, module, batch_id, shapes):
        outs = [torch.empty(shape, dtype=torch.float32) for shape in shapes]
        # numpy() views share the tensors' memory: the store writes the outputs in place.
        module.store.forward(batch_id, [o.numpy() for o in outs])
        ctx.module = module
        ctx.batch_id = batch_id
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        module, batch_id = ctx.module, ctx.batch_id
        module.store.backward(batch_id, [g.detach().to(torch.float32).contiguous().numpy() for g in grads])
        module._in_flight.discard(batch_id)
        return None, None, None, None


def _check_device(device):
    device = torch.device(device)
    if device.type != "cpu":
        raise ValueError(
            f"device {device} (expected cpu: CUDA tensors wait for the store's device data path)")
    return device


def _features_of(batch):
    """The store's batch dict for a forward input (dict or KeyedJaggedTensor)."""
    if isinstance(batch, dict):
        return batch
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
        f"features is a {type(batch).__name__} (expected a dict {{table: {{'keys', 'lengths' or 'offsets', "
        "'weights'}}}}, a KeyedJaggedTensor or a SubmittedBatch)")


class EmbeddingBagCollection(nn.Module):
    """Embedding tables held in a ``strata.Store`` (any placement mode), trained by the store's
    fused optimizer. ``config``: the store config as a dict or JSON string (README, "Using the
    store"). ``state_dict()`` holds ``tables.<name>.weight`` (rows, dim), ``tables.<name>.
    optimizer_state`` (rows, state_dim; absent for sgd) and ``tables.<name>.learning_rate`` per
    table; Adam's step counter is store-wide and only in checkpoints (``store.save``)."""

    def __init__(self, config, device="cpu"):
        super().__init__()
        self.device = _check_device(device)
        self.store = strata.Store(config)
        self._tables = {t["name"]: t for t in self.store.config["tables"]}
        self._next_id = 0
        self._in_flight = set()
        # Outputs of a custom autograd function require grad only when an input does: this
        # tensor, never a parameter, makes the lookup part of the graph.
        self._anchor = torch.zeros((), requires_grad=True)

    # ---- batch ids ----
    def _take_id(self):
        batch_id = self._next_id
        self._next_id += 1
        return batch_id

    def _shapes(self, features):
        shapes = []
        for name, f in features.items():
            table = self._tables.get(name)
            if table is None:
                return None  # the store names it
            if table["pooling"] == "none":
                rows = len(f.get("keys", f.get("values", ())))
            elif "lengths" in f:
                rows = len(f["lengths"])
            else:
                rows = max(len(f.get("offsets", ())) - 1, 0)
            shapes.append((rows, table["dim"]))
        return shapes

    def submit(self, batch):
        """Submits a batch now (for prefetching) and returns the SubmittedBatch to forward later."""
        features = _features_of(batch)
        batch_id = self._take_id()
        self.store.submit(batch_id, features)
        return SubmittedBatch(self, batch_id, [(name, shape) for name, shape in zip(features, self._shapes(features))])

    def preview(self, batch):
        """Announces a batch's keys (store.preview) and returns the id its submit must use."""
        features = _features_of(batch)
        batch_id = self._take_id()
        self.store.preview(batch_id, features)
        return batch_id

    def submit_previewed(self, batch_id, batch):
        """Submits a previewed batch under its id (see preview)."""
        features = _features_of(batch)
        self.store.submit(batch_id, features)
        return SubmittedBatch(self, batch_id, [(name, shape) for name, shape in zip(features, self._shapes(features))])

    def forward(self, batch):
        if isinstance(batch, SubmittedBatch):
            if batch.owner is not self:
                raise ValueError(f"SubmittedBatch {batch.batch_id} belongs to another EmbeddingBagCollection")
            submitted = batch
        else:
            submitted = self.submit(batch)
        names = [name for name, _ in submitted.tables]
        shapes = [shape for _, shape in submitted.tables]
        train = self.training and torch.is_grad_enabled()
        try:
            if train:
                outs = _Lookup.apply(self._anchor, self, submitted.batch_id, shapes)
                self._in_flight.add(submitted.batch_id)
            else:
                outs = [torch.empty(shape, dtype=torch.float32) for shape in shapes]
                self.store.forward(submitted.batch_id, [o.numpy() for o in outs])
                self.store.discard(submitted.batch_id)
        except Exception:
            if not train or submitted.batch_id not in self._in_flight:
                self.store.discard(submitted.batch_id)
            raise
        return KeyedEmbeddings(names, outs)

    def discard_in_flight(self):
        """Retires every batch forwarded in training mode whose backward never came."""
        for batch_id in sorted(self._in_flight):
            self.store.discard(batch_id)
        self._in_flight.clear()

    # ---- learning rate ----
    def set_learning_rate(self, lr, table=None):
        """Sets a table's learning rate (every table's when table is None) from the next backward."""
        self.store.set_learning_rate(float(lr), table)

    def learning_rate(self, table):
        return self.store.learning_rate(table)

    # ---- state dict: table weights and optimizer state by table name ----
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name in self._tables:
            weights, state = self.store.read_rows(name)
            destination[f"{prefix}tables.{name}.weight"] = torch.from_numpy(weights)
            if state.shape[1] > 0:
                destination[f"{prefix}tables.{name}.optimizer_state"] = torch.from_numpy(state)
            destination[f"{prefix}tables.{name}.learning_rate"] = torch.tensor(self.store.learning_rate(name))

    def load_state_dict(self, state_dict, strict=True):
        """Loads table weights (and optimizer state and learning rate where given). Every entry is
        checked before any row changes: on an error (a wrong shape or dtype, and with ``strict``
        a missing or unexpected key) it raises RuntimeError and the tables are unchanged."""
        if strict:
            want = {f"tables.{n}.weight" for n in self._tables}
            known = want | {f"tables.{n}.{s}" for n in self._tables for s in ("optimizer_state", "learning_rate")}
            missing, unexpected = sorted(want - set(state_dict)), sorted(set(state_dict) - known)
            if missing or unexpected:
                raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}: missing keys {missing}, "
                                   f"unexpected keys {unexpected} (nothing was loaded)")
        return super().load_state_dict(state_dict, strict)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        ours = {k for k in state_dict if k.startswith(prefix + "tables.")}
        plan, problems = [], []
        if self.store.in_flight:
            problems.append(f"{self.store.in_flight} batch(es) in flight (expected none: run their backward or "
                            "discard_in_flight() first)")
        for name, table in self._tables.items():
            key = f"{prefix}tables.{name}."
            weight, state, lr = (state_dict.get(key + s) for s in ("weight", "optimizer_state", "learning_rate"))
            ours.difference_update({key + "weight", key + "optimizer_state", key + "learning_rate"})
            if weight is None:
                missing_keys.append(key + "weight")
                continue
            w = _host_float32(weight, key + "weight", problems)
            s = None if state is None else _host_float32(state, key + "optimizer_state", problems)
            if w is not None and tuple(w.shape) != (table["rows"], table["dim"]):
                problems.append(f"{key}weight has shape {tuple(w.shape)} (expected ({table['rows']}, {table['dim']}))")
            state_dim = self.store.read_rows(name, 0, 0)[1].shape[1]
            if s is not None and tuple(s.shape) != (table["rows"], state_dim):
                problems.append(f"{key}optimizer_state has shape {tuple(s.shape)} (expected ({table['rows']}, "
                                f"{state_dim}) for optimizer {table['optimizer']['kind']})")
            rate = None
            if lr is not None:
                rate = float(lr)
                if not (rate > 0 and np.isfinite(rate)):
                    problems.append(f"{key}learning_rate {rate} (expected a finite number > 0)")
            plan.append((name, w, s, rate))
        unexpected_keys.extend(sorted(ours))
        error_msgs.extend(problems)
        if problems:
            return  # load_state_dict raises; nothing was changed
        for name, w, s, rate in plan:
            self.store.write_rows(name, 0, w, s)  # checked above; fails only with batches in flight
            if rate is not None:
                self.store.set_learning_rate(rate, name)


def _host_float32(t, what, problems):
    if isinstance(t, torch.Tensor):
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype != torch.float32:
            problems.append(f"{what} has dtype {t.dtype} (expected torch.float32)")
            return None
        return t.detach().contiguous().numpy()
    return t
