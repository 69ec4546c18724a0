"""Strata: an embedding store for recommender models, from Python.

``strata.Store(config)`` is the C++ Store (see ``help(strata.Store)``); ``strata.torch`` holds the
PyTorch module ``EmbeddingBagCollection`` and the pipelining helper (it imports torch, so it is a
separate import).

Keys and offsets are NumPy arrays or CPU torch tensors of int64 or int32 (int32 ones are read as
int32 by the store, not widened; lengths are summed into int64 offsets; other dtypes raise
TypeError); weights are float32, and outputs and gradients float32 or, for a table with a
half-size ``output_dtype``, float16 or bfloat16 (a ``torch.bfloat16`` CPU tensor, or its bits as
int16: NumPy has no bfloat16; host memory only). Strided inputs are read with one copy; what Strata
writes into (``forward(outputs=...)``, ``read_rows(out=...)``) must be a NumPy array or a CPU tensor
(anything else, a list, is a TypeError), C-contiguous, aligned and writable, else ValueError; the
store writes into it with the GIL released, so no other thread may resize or free it during the
call.

Outputs and gradients may also live in the store's device memory: objects with
``__cuda_array_interface__`` (CUDA tensors, CuPy arrays, ``strata.DeviceArray`` from
``Store.device_array``), float32 and C-contiguous (strided ones are refused: no hidden copy), as
README's "Outputs and gradients on the device" describes. ``forward``/``backward`` take an
optional ``stream=``: a ``strata.Stream`` (``Store.stream()``), a CUDA stream handle as an int
(``torch.cuda.current_stream().cuda_stream``) or a ``torch.cuda.Stream``; with one they are the
stream-ordered calls, without one the synchronous calls. Keys stay host memory: keys on a CUDA
device are refused (ValueError), not copied. Bad input raises ValueError or TypeError (and
RuntimeError for calls in the wrong state or device errors) with the C++ Status message, and
changes nothing; an argument of a wrong type raises TypeError naming it and what was expected
("batch_id is a float (expected an int)"). Ints may be NumPy integers, numbers NumPy floats or 0-d
tensors, paths str, bytes or os.PathLike; bools are neither ints nor numbers.

A world over torch.distributed: ``strata.Store(config, process_group=pg, timeout=None)`` with a
``torch.distributed.ProcessGroup`` (e.g. ``torch.distributed.group.WORLD`` after
``init_process_group``) makes the store this process's rank of a Strata world over the group's
ranks; its ``gpu`` and ``hybrid`` tables are sharded by each table's ``sharding`` plan, each rank
submits its own batches, and each row's update is the sum of every rank's gradients. Every rank
makes the same store calls in the same order (they are collectives; a rank out of step is named);
the collectives go through the group from Python (``strata._process_group``; gloo moves host bytes;
a group with NCCL moves CUDA buffers of its GPU in place, so rows and gradients stay on the GPU;
emu buffers, and CUDA buffers over gloo, are staged through host memory). ``timeout`` (seconds or a timedelta; None:
torch's default_pg_timeout) bounds how long a call waits for the other ranks: RuntimeError "timed
out after N ms", or "a peer left the process group" when a rank's process exited. ``Store.world``
says which rank this is; ``Store.shard_info``/``read_shard``/``write_shard`` read and write this
rank's shard locally; ``Store.close()`` (collective) ends the store on every rank: destroying a
world's store at garbage collection would be a collective at times that differ per rank (once
the interpreter is exiting, its collectives are refused instead, so nothing waits at exit).
torch is imported only when a group is given.
"""

from strata._strata import DeviceArray, Store, Stream

__all__ = ["DeviceArray", "Store", "Stream"]
