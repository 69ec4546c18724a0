"""A table's element types in torch: its dtype names (TableSpec's) and the exact conversions of its
rows between the store's float32 reads and writes and torch's half-size tensors.

The conversions work on the bits, never through torch's ``.to()``, which does not keep a NaN's sign
and payload (bf16 NaNs become one canonical NaN): a row read from a half-size table is a widened
half element (``core/half.hpp``), so its upper 16 bits (bf16) or NumPy's float16 narrowing (fp16,
which keeps the sign and payload as the store's own narrowing does) give back the stored bits, and
widening a half element is exact both ways.
"""

import numpy as np
import torch

# A table's dtype names -> torch's dtypes.
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def rows_as(rows, dtype):
    """float32 NumPy rows read from a table of torch dtype ``dtype`` as a tensor of that dtype, bit
    for bit (a bf16 row's low 16 bits are zero: it was widened from bf16)."""
    if dtype == torch.bfloat16:
        bits = (np.ascontiguousarray(rows, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    if dtype == torch.float16:
        return torch.from_numpy(rows.astype(np.float16))
    return torch.from_numpy(rows)


def float32_rows(t):
    """A host tensor of float32, bfloat16 or float16 as float32 NumPy rows, exactly (a bf16 element
    is the upper half of its float32)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    if t.dtype == torch.float16:
        return t.numpy().astype(np.float32)
    return t.numpy()
