"""The ``tbmem`` TensorBoard plugin: a Memory tab with the census over time, snapshots and leaks.

Installed with tbmem through the ``tensorboard_plugins`` entry point, so
``tensorboard --logdir runs`` shows it. Nothing here imports torch. The run's files are read
through :mod:`tbmem.logdir` (the census side file and snapshots: its reader half). See docs/plugin.md.

Example:
    >>> from tbmem.plugin import MemoryPluginLoader
    >>> MemoryPluginLoader.__name__
    'MemoryPluginLoader'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "MemoryPlugin": "tbmem.plugin.plugin",
    "MemoryPluginLoader": "tbmem.plugin.loader",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem.plugin.loader import MemoryPluginLoader
    from tbmem.plugin.plugin import MemoryPlugin


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
