"""Lazy imports of optional dependencies, with an error that names the extra to install.

Example:
    >>> from tbmem._internal._extras import require
    >>> math = require("math", extra="core")  # any importable module works
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require_extra", "MissingExtraError", "require"]


class MissingExtraError(ImportError):
    """An optional dependency is missing; the message names the pip extra that provides it."""


def require(module: str, *, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``tbmem[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{module!r} is not installed; it comes with tbmem's {extra!r} extra: "
            f"pip install 'tbmem[{extra}]'"
        ) from exc


#: The public name of :func:`require` (``tbmem.require_extra``): what an adapter imports its framework with.
require_extra = require
