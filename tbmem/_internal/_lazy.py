"""Lazy re-exports for package ``__init__`` modules (PEP 562).

Packages list their public names and the modules defining them; a name is imported on first
use and then cached in the package, so importing the package stays cheap (no torch for
``tbmem report``, no PhiFlow for ``import trainers``).

Example:
    >>> from tbmem._internal._lazy import lazy_exports
    >>> getattr_, dir_ = lazy_exports("tbmem", {"tag_for": "tbmem._internal.tags"})
    >>> getattr_("tag_for").__name__
    'tag_for'
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Module-level ``__getattr__`` and ``__dir__`` for ``package``, exporting ``exports``.

    Args:
        package: The package's ``__name__``.
        exports: Public name -> module that defines it, or ``"module:name"`` where the module
            calls it otherwise (``"mark_snapshot": "tbmem._internal.snapshot.markers:mark"``).
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = module.partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
