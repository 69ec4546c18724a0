"""Strata: an embedding store for recommender models, from Python.

``strata.Store(config)`` is the C++ Store (see ``help(strata.Store)``); ``strata.torch`` holds the
PyTorch module ``EmbeddingBagCollection`` and the pipelining helper (it imports torch, so it is a
separate import).

Keys are NumPy arrays or CPU torch tensors of int64 (int32 is accepted and widened; other dtypes
raise TypeError); weights, outputs and gradients are float32. Strided inputs are read with one
copy; what Strata writes into (``forward(outputs=...)``, ``read_rows(out=...)``) must be a NumPy
array or a CPU tensor (anything else, a list, is a TypeError), C-contiguous, writable float32, else
ValueError; the store writes into it with the GIL released, so no other thread may resize or free
it during the call. Bad input raises ValueError or TypeError (and
RuntimeError for calls in the wrong state or device errors) with the C++ Status message, and
changes nothing.
"""

from strata._strata import Store

__all__ = ["Store"]
