"""Numpy views of Arrow arrays, read from their buffers. Performs no I/O.

pyarrow's own conversions (``Array.to_numpy``, ``np.asarray(array)``, ``fill_null`` with a Python
value, ``pa.scalar``, ``pa.array``) first import pandas, when it is installed, to look for pandas
extension types: ~0.4 s of CPU, paid by every serving process at its first admission, although
nothing here needs pandas. The logical hash and the content rules read numbers through these
helpers instead; pyarrow's compute kernels on arrays (``is_valid``, ``cast``, ``list_flatten``,
``take``) do not import it.

Only fixed-width numeric arrays are viewed (every integer type, half, single and double floats);
the caller decides what a null slot means (its bytes in the data buffer are unspecified).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["float_values", "indices_array", "numeric_values", "valid_mask"]

#: Arrow type name -> the little-endian numpy dtype of its data buffer (Arrow's layout is
#: little-endian on every platform pyarrow ships for).
_DTYPES = {
    "int8": "<i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "<u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "halffloat": "<f2",
    "float": "<f4",
    "double": "<f8",
}


def numeric_values(arr: pa.Array) -> np.ndarray:
    """The values of an integer or floating array, a read-only view of its data buffer (no copy).

    Null slots hold unspecified values: mask them with :func:`valid_mask`.

    Raises:
        TypeError: ``arr`` is not of a fixed-width numeric type.
    """
    dtype = _DTYPES.get(str(arr.type))
    if dtype is None:
        raise TypeError(f"not a fixed-width numeric array: {arr.type}")
    n = len(arr)
    if n == 0:
        return np.empty(0, dtype=dtype)
    values = np.frombuffer(arr.buffers()[1], dtype=dtype, count=arr.offset + n)
    return values[arr.offset :]


def valid_mask(arr: pa.Array) -> np.ndarray:
    """One bool per slot, True where the slot holds a value (from the validity bitmap)."""
    n = len(arr)
    bitmap = arr.buffers()[0]
    if arr.null_count == 0 or bitmap is None:
        return np.ones(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[arr.offset : arr.offset + n].astype(bool)


def float_values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A numeric column as float64, nulls as NaN (what ``to_numpy`` gives for floats, and for
    integers with nulls), in one new array."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = []
    for chunk in chunks:
        values = numeric_values(chunk).astype(np.float64)
        if chunk.null_count:
            values[~valid_mask(chunk)] = np.nan
        parts.append(values)
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)


def indices_array(indices: np.ndarray) -> pa.Array:
    """Row indices for ``take``: an int64 Arrow array over their bytes (pyarrow keeps them alive)."""
    data = np.ascontiguousarray(indices, dtype="<i8")
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])
