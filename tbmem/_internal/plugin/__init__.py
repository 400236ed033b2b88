"""The ``tbmem`` TensorBoard plugin: a Memory tab with the census over time, snapshots and leaks.

Installed with tbmem through the ``tensorboard_plugins`` entry point, so
``tensorboard --logdir runs`` shows it. Nothing here imports torch. The run's files are read
through :mod:`tbmem._internal.logdir` (the census side file and snapshots: its reader half). See docs/plugin.md.

Example:
    >>> from tbmem._internal.plugin import MemoryPluginLoader
    >>> MemoryPluginLoader.__name__
    'MemoryPluginLoader'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._internal._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "MemoryPlugin": "tbmem._internal.plugin.plugin",
    "MemoryPluginLoader": "tbmem._internal.plugin.loader",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.plugin.loader import MemoryPluginLoader
    from tbmem._internal.plugin.plugin import MemoryPlugin


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
