"""Argument checks for the monitors' constructors, and the one way a monitor reports its own failure.

Constructors raise ValueError naming the bad field (that is the user's code, before
training starts); hooks called during training never raise: :func:`hook_failed`
logs the failure once on the ``tbmem`` logger instead.

Example:
    >>> from tbmem._internal.monitor._checks import check_count
    >>> check_count(5, "verbose_batches")
    5
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence, TextIO, Union

import torch

from tbmem._internal._log import report_once

#: What a monitor's ``device=`` accepts.
DeviceLike = Union[int, str, torch.device, None]

__all__ = ["DeviceLike", "check_file", "check_count", "check_positive", "check_device", "check_label",
           "hook_failed", "old_positional"]


def check_file(file: TextIO | None, field: str = "file") -> TextIO | None:
    """A text stream with ``write()``, or None."""
    if file is not None and not callable(getattr(file, "write", None)):
        raise ValueError(f"{field} must be a text stream with a write() method or None, got {type(file).__name__}")
    return file


def check_count(value: Any, field: str) -> int:
    """A non-negative int (bools rejected: ``verbose_batches=True`` is a mistake)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be an int >= 0, got {value!r}")
    return value


def check_positive(value: Any, field: str) -> int:
    """An int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be an int >= 1, got {value!r}")
    return value


def check_device(value: Any, field: str = "device") -> int | None:
    """A CUDA device index: an int >= 0, a ``torch.device``/string such as ``"cuda:1"``
    (``"cuda"`` and ``"cpu"`` mean None: the current CUDA device when CUDA is in use), or None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{field} must be a CUDA device index >= 0, a torch.device or None, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{field} must be a CUDA device index >= 0, a torch.device or None, got {value!r}")
        return value
    try:
        device = torch.device(value)
    except (TypeError, RuntimeError, ValueError) as exc:
        raise ValueError(f"{field} must be a CUDA device index >= 0, a torch.device or None, got {value!r}") from exc
    return device.index if device.type == "cuda" else None


def check_label(value: Any, field: str = "label") -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a non-empty string, got {value!r}")
    return value


def hook_failed(where: str, exc: BaseException) -> None:
    """Log once that a monitor hook failed; training goes on."""
    report_once(f"monitor:{where}", f"tbmem: {where} failed; the monitor keeps going without it", exc=exc)


def old_positional(owner: str, names: Sequence[str], args: Sequence[Any], given: dict[str, Any]) -> list[Any]:
    """The values of ``names`` where a caller still passes them by position (the signature before
    0.2, where siblings disagreed): ``args`` fill ``names`` in order, with a DeprecationWarning; the
    others keep their keyword value from ``given``.

    Raises:
        TypeError: more positional arguments than the old signature had.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True):
        ...     warnings.simplefilter("always")
        ...     old_positional("PerformanceMonitor", ["device"], [1], {"device": None})
        [1]
    """
    if len(args) > len(names):
        raise TypeError(f"{owner}() takes at most {len(names)} more positional arguments, got {len(args)}")
    values = [given[n] for n in names]
    if args:
        moved = list(names[: len(args)])
        warnings.warn(f"{owner}(): pass {', '.join(n + '=' for n in moved)} by keyword; passing it by position "
                      "is deprecated and stops working in a later release", DeprecationWarning, stacklevel=3)
        for i, value in enumerate(args):
            values[i] = value
    return values
