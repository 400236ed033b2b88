"""How the console monitors render numbers: megabytes, "n/a" and losses.

Rendering rules (also in docs/console-api.md):

* Memory is shown in binary megabytes (1 MB = 2**20 bytes), like PyTorch's
  ``memory_allocated() / 1024**2``.
* A GPU number that cannot be read (no CUDA, or CUDA not initialised by the
  program) is shown as ``n/a`` without a unit: ``GPU n/a``. Never a fake 0.
* A loss is shown with 6 decimals (``0.005310``); values below 1e-4 or from
  1e6 up in scientific notation (``1.234560e-07``); a loss with more than one
  element shows its mean and the element count (``0.012345 (mean of 16)``).

Example:
    >>> from tbmem._internal.monitor.formatting import format_loss, format_mb
    >>> format_mb(3 * 2**20), format_mb(None)
    ('3.0 MB', 'n/a')
    >>> format_loss(0.00531)
    '0.005310'
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

import torch

__all__ = ["NA", "MiB", "to_mb", "format_mb", "format_delta", "format_number", "loss_summary",
           "loss_value", "render_loss", "format_loss", "tag_name"]

NA = "n/a"
MiB = float(2**20)


def to_mb(value: float | None) -> float | None:
    """Bytes to binary megabytes; None stays None."""
    return None if value is None else float(value) / MiB


def format_mb(value: float | None, spec: str = ".1f", unit: str = " MB") -> str:
    """``'23.1 MB'`` from bytes, or ``'n/a'``."""
    return NA if value is None else f"{float(value) / MiB:{spec}}{unit}"


def format_delta(value: float | None, unit: str = " MB") -> str:
    """A signed change in megabytes (``'+450.2 MB'``, ``'-3.0 MB'``) from bytes, or ``'n/a'``."""
    return NA if value is None else f"{float(value) / MiB:+.1f}{unit}"


def format_number(value: float) -> str:
    """Six decimals, or scientific notation for very small or very large magnitudes."""
    if math.isfinite(value) and value != 0.0 and not 1e-4 <= abs(value) < 1e6:
        return f"{value:.6e}"
    return f"{value:.6f}"


def _phiml_values(loss: Any) -> tuple[float, int] | None:
    """(mean, element count) of a phiml Tensor, or None if ``loss`` is not one."""
    if not type(loss).__module__.startswith("phiml") or "phiml.math" not in sys.modules:
        return None
    math_ = sys.modules["phiml.math"]
    count = int(loss.shape.volume)
    value = loss if count == 1 else math_.mean(loss, loss.shape)
    return float(value), count


def _values(loss: Any) -> tuple[float, int] | None:
    """(mean, element count) of a number, torch tensor, numpy array or phiml Tensor."""
    if loss is None:
        return None
    if isinstance(loss, (int, float)):
        return float(loss), 1
    phiml = _phiml_values(loss)  # first: phiml Tensors answer every attribute lookup
    if phiml is not None:
        return phiml
    if isinstance(loss, torch.Tensor):  # .item() syncs a CUDA tensor: called once
        count = loss.numel()
        data = loss.detach()
        return (float(data.item()) if count == 1 else float(data.float().mean().item())), count
    size = getattr(loss, "size", None)
    if isinstance(size, int) and hasattr(loss, "mean"):  # numpy array or scalar
        return float(loss.mean()), size
    return float(loss), 1


def loss_summary(loss: Any) -> tuple[float, int] | None:
    """(mean, element count) of a loss, converted once (one CUDA sync for a CUDA tensor);
    None for None or an object that does not convert to a number."""
    try:
        return _values(loss)
    except (TypeError, ValueError, RuntimeError, AttributeError):
        return None


def loss_value(loss: Any) -> float | None:
    """The loss as one float (the mean when it has several elements); None when not convertible."""
    values = loss_summary(loss)
    return None if values is None else values[0]


def render_loss(summary: tuple[float, int] | None, loss: Any = None) -> str:
    """Render a :func:`loss_summary`; ``str(loss)`` when it did not convert."""
    if summary is None:
        return NA if loss is None else str(loss)[:80]
    mean, count = summary
    return format_number(mean) if count == 1 else f"{format_number(mean)} (mean of {count})"


def format_loss(loss: Any) -> str:
    """Render a loss for a console line; never raises (falls back to ``str`` of the object)."""
    return render_loss(loss_summary(loss), loss)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


def tag_name(name: str) -> str:
    """An operation or checkpoint name made safe for a TensorBoard tag (``'data loading'`` -> ``'data_loading'``)."""
    return _UNSAFE.sub("_", name.strip()).strip("_") or "unnamed"
