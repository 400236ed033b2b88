"""Integer columns of the snapshot format: little-endian typed arrays in base64, and exact sums over them.

A column is ``{"dtype": "<i1"|"<i2"|"<i4"|"<f8", "b64": "..."}`` (``"z"`` instead of ``"b64"``:
zlib-compressed first, for the viewer page). The narrowest dtype that holds every value is
chosen; ``<f8`` holds values past 32 bits exactly up to 2**53, and larger values are refused.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.snapshot.columns import decode_column, encode_column
    >>> col = encode_column(np.array([3, -1, 2**40]))
    >>> col["dtype"], decode_column(col, "x").tolist()
    ('<f8', [3, -1, 1099511627776])
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

__all__ = ["encode_column", "decode_column", "sum_by", "dtype_for"]


def dtype_for(arr: np.ndarray) -> str:
    """The narrowest column dtype holding every value of ``arr``."""
    if arr.size == 0:
        return "<i4"
    lo, hi = int(arr.min()), int(arr.max())
    if -2**7 <= lo and hi < 2**7:
        return "<i1"
    if -2**15 <= lo and hi < 2**15:
        return "<i2"
    if -2**31 <= lo and hi < 2**31:
        return "<i4"
    if -2**53 <= lo and hi <= 2**53:
        return "<f8"
    raise ValueError("a column holds values beyond 2**53, which the format cannot store exactly")


def encode_column(arr: np.ndarray, *, compress: bool = False) -> dict[str, str]:
    """A column as ``{"dtype", "b64"}`` (or ``"z"``: zlib-compressed, for the viewer page)."""
    dtype = dtype_for(arr)
    raw = np.ascontiguousarray(arr, dtype=dtype).tobytes()
    if compress:
        import zlib

        return {"dtype": dtype, "z": base64.b64encode(zlib.compress(raw, 1)).decode("ascii")}
    return {"dtype": dtype, "b64": base64.b64encode(raw).decode("ascii")}


def decode_column(doc: Any, name: str, length: int | None = None) -> np.ndarray:
    """The int64 array of an encoded column (or a plain list of integers); ValueError names the field."""
    if isinstance(doc, list):
        try:
            arr: np.ndarray = np.asarray(doc, dtype=np.int64)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"snapshot field {name} must hold integers") from exc
        if arr.ndim != 1:
            raise ValueError(f"snapshot field {name} must be a flat list of integers")
    elif isinstance(doc, dict) and doc.get("dtype") in ("<i1", "<i2", "<i4", "<f8") and "b64" in doc:
        try:
            raw = base64.b64decode(doc["b64"], validate=True)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"snapshot field {name} is not valid base64") from exc
        width = int(doc["dtype"][2])
        if len(raw) % width:
            raise ValueError(f"snapshot field {name} has a partial value")
        arr = np.frombuffer(raw, dtype=doc["dtype"])
        if doc["dtype"] == "<f8":
            if not np.all(np.isfinite(arr)) or np.any(np.abs(arr) > 2**53) or np.any(arr != np.round(arr)):
                raise ValueError(f"snapshot field {name} holds values that are not exact integers")
        arr = arr.astype(np.int64)
    else:
        raise ValueError(f"snapshot field {name} must be a list of integers or an encoded column")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"snapshot field {name} has {arr.shape[0]} values, expected {length}")
    return arr


def sum_by(index: np.ndarray, values: np.ndarray, length: int) -> np.ndarray:
    """Exact int64 sums of ``values`` grouped by ``index`` (0 <= index < length).

    ``np.bincount`` would sum through float64, inexact past 2**53 bytes in total.
    """
    out = np.zeros(length, dtype=np.int64)
    if index.shape[0] == 0:
        return out
    if np.bincount(index, minlength=length).max() <= 1:  # each event starts or ends one allocation
        out[index] = values
        return out
    order = np.argsort(index, kind="stable")
    idx, vals = index[order], values[order]
    starts = np.flatnonzero(np.concatenate(([True], idx[1:] != idx[:-1])))
    out[idx[starts]] = np.add.reduceat(vals, starts)
    return out
