"""Pipelining for trainers: submit the next batches ahead (and preview further ones) from a data
loader, so that a cached store prefetches their rows while the trainer works on the current one.
Used through ``strata.torch.pipelined``; works with any module that has ``submit``, ``preview``,
``submit_previewed`` and ``store`` (``strata.torch.EmbeddingBagCollection``)."""

import collections
import itertools
import numbers

__all__ = ["pipelined"]


def pipelined(module, batches, sparse=None, ahead=1, preview=0):
    """Iterates over ``batches`` (a data loader or any iterable), yielding ``(batch,
    submitted)``, where ``submitted`` is the batch's sparse features already submitted to
    ``module``'s store: pass it to ``module(submitted)``. While the trainer works on one batch the
    next ``ahead`` are submitted (so a cached store prefetches their rows) and the ``preview``
    after those are previewed (their keys steer the lookahead cache; needs ``cache.preview`` >=
    ``preview`` in the store config). ``sparse(batch)`` picks the sparse features out of a batch
    (default: the batch itself). Its arguments are checked at the call (TypeError or ValueError
    naming the argument), before anything is submitted. So ``ahead`` + 1 batches are in flight while the trainer works on
    one (the next is submitted when it asks for it): ``ahead`` + 1 must not exceed
    ``cache.max_in_flight``. When the generator closes (the loop ended, stopped with ``break`` or
    an exception, or ``close()``), the batches it submitted and that were never forwarded, yielded
    or not, are discarded, and the previews dropped. A batch forwarded and not yet backpropagated
    is the module's (``discard_in_flight()``)."""
    for name in ("submit", "preview", "submit_previewed", "store"):
        if not hasattr(module, name):
            raise TypeError(f"module is a {type(module).__name__} without {name} (expected a module with submit, "
                            "preview, submit_previewed and store: strata.torch.EmbeddingBagCollection)")
    for name, value in (("ahead", ahead), ("preview", preview)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} is a {type(value).__name__} (expected an int >= 0)")
    if ahead < 0 or preview < 0:
        raise ValueError(f"ahead {ahead} and preview {preview} (expected >= 0)")
    if sparse is not None and not callable(sparse):
        raise TypeError(f"sparse is a {type(sparse).__name__} (expected None or a function of a batch)")
    pick = sparse if sparse is not None else (lambda b: b)
    try:
        it = iter(batches)
    except TypeError:
        raise TypeError(f"batches is a {type(batches).__name__} (expected an iterable of batches: a data loader, "
                        "a list, a generator)") from None
    return _pipeline(module, it, pick, ahead, preview)  # arguments checked at the call, not at the first next()


def _pipeline(module, it, pick, ahead, preview):
    """The generator of ``pipelined`` over the iterator ``it``."""
    window = collections.deque()  # [batch, SubmittedBatch or previewed id]; the front is the current one
    yielded = []  # SubmittedBatches yielded before the current one and not forwarded yet
    exhausted = False

    def fill():
        nonlocal exhausted
        # Submit the front of the window, oldest first (their previews are in place already).
        for entry in itertools.islice(window, 0, ahead + 1):
            if not hasattr(entry[1], "batch_id"):  # a previewed id
                entry[1] = module.submit_previewed(entry[1], pick(entry[0]))
        while not exhausted and len(window) < ahead + 1 + preview:
            try:
                batch = next(it)
            except StopIteration:
                exhausted = True
                break
            if len(window) < ahead + 1:
                window.append([batch, module.submit(pick(batch))])
            else:
                window.append([batch, module.preview(pick(batch))])

    try:
        fill()
        while window:
            # The current batch stays at the front of the window (and in the count of ahead + 1)
            # until the trainer asks for the next.
            yield tuple(window[0])
            yielded.append(window.popleft()[1])
            yielded = [s for s in yielded if not getattr(s, "forwarded", False)]
            fill()
    finally:
        for submitted in yielded + [entry for _, entry in window]:
            if hasattr(submitted, "batch_id") and not getattr(submitted, "forwarded", False):
                module.store.discard(submitted.batch_id)
        module.store.drop_previews()
