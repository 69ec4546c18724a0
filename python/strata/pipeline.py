"""Pipelining for trainers: submit the next batches ahead (and preview further ones) from a data
loader, so that a cached store prefetches their rows while the trainer works on the current one.
Used through ``strata.torch.pipelined``; works with any module that has ``submit``, ``preview``,
``submit_previewed`` and ``store`` (``strata.torch.EmbeddingBagCollection``)."""

import collections
import itertools

__all__ = ["pipelined"]


def pipelined(module, batches, sparse=None, ahead=1, preview=0):
    """Iterates over ``batches`` (a data loader or any iterable), yielding ``(batch,
    submitted)``, where ``submitted`` is the batch's sparse features already submitted to
    ``module``'s store: pass it to ``module(submitted)``. While the trainer works on one batch the
    next ``ahead`` are submitted (so a cached store prefetches their rows) and the ``preview``
    after those are previewed (their keys steer the lookahead cache; needs ``cache.preview`` >=
    ``preview`` in the store config). ``sparse(batch)`` picks the sparse features out of a batch
    (default: the batch itself). Batches submitted and never yielded (the loop stopped early) are
    discarded when the generator closes. ``ahead`` + 1 must not exceed ``cache.max_in_flight``."""
    if ahead < 0 or preview < 0:
        raise ValueError(f"ahead {ahead} and preview {preview} (expected >= 0)")
    pick = sparse if sparse is not None else (lambda b: b)
    it = iter(batches)
    window = collections.deque()  # [batch, SubmittedBatch or previewed id]
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
            batch, submitted = window.popleft()
            fill()
            yield batch, submitted
    finally:
        for _, entry in window:
            if hasattr(entry, "batch_id"):
                module.store.discard(entry.batch_id)
        module.store.drop_previews()
