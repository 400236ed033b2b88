"""The entry point TensorBoard loads (group ``tensorboard_plugins``): cheap, and never fatal.

TensorBoard imports every ``tensorboard_plugins`` entry point at start-up, and an
exception there stops TensorBoard. This module imports only TensorBoard's plugin base;
the plugin itself is imported in :meth:`MemoryPluginLoader.load`, and if that fails
(a broken install) the error is logged and TensorBoard starts without the Memory tab.

Example:
    >>> from tbmem._internal.plugin.loader import MemoryPluginLoader
    >>> from tensorboard.plugins import base_plugin
    >>> isinstance(MemoryPluginLoader(), base_plugin.TBLoader)
    True
"""

from __future__ import annotations

import logging
from typing import Any

from tensorboard.plugins import base_plugin

__all__ = ["MemoryPluginLoader"]


class MemoryPluginLoader(base_plugin.TBLoader):
    """Loads :class:`tbmem._internal.plugin.plugin.MemoryPlugin`; returns None (no tab) if it cannot be imported.

    Adds one flag to ``tensorboard``: ``--tbmem_snapshot_memory_mb`` (default 4096), the memory
    every snapshot conversion running at once may use together (docs/plugin.md).

    Example:
        >>> import tempfile
        >>> from tensorboard.plugins import base_plugin
        >>> MemoryPluginLoader().load(base_plugin.TBContext(logdir=tempfile.mkdtemp())).plugin_name
        'tbmem'
    """

    def define_flags(self, parser: Any) -> None:
        parser.add_argument_group("tbmem").add_argument(
            "--tbmem_snapshot_memory_mb", metavar="MB", type=int, default=4096,
            help="Memory tab: memory (MiB) that the snapshot conversions running at once may use together; "
                 "each runs in a child process limited to its share (default: %(default)s)")

    def fix_flags(self, flags: Any) -> None:
        if getattr(flags, "tbmem_snapshot_memory_mb", 4096) < 256:
            raise base_plugin.FlagsError("--tbmem_snapshot_memory_mb must be at least 256 (one conversion's base)")

    def load(self, context: Any) -> Any:
        try:
            from tbmem._internal.plugin.plugin import MemoryPlugin
        except Exception:  # noqa: BLE001 - a broken plugin must not stop TensorBoard
            logging.getLogger("tbmem").exception("tbmem: the Memory tab could not be loaded")
            return None
        return MemoryPlugin(context)
