"""The entry point TensorBoard loads (group ``tensorboard_plugins``): cheap, and never fatal.

TensorBoard imports every ``tensorboard_plugins`` entry point at start-up, and an
exception there stops TensorBoard. This module imports only TensorBoard's plugin base;
the plugin itself is imported in :meth:`MemoryPluginLoader.load`, and if that fails
(a broken install) the error is logged and TensorBoard starts without the Memory tab.

Example:
    >>> from tbmem.plugin.loader import MemoryPluginLoader
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
    """Loads :class:`tbmem.plugin.plugin.MemoryPlugin`; returns None (no tab) if it cannot be imported.

    Example:
        >>> import tempfile
        >>> from tensorboard.plugins import base_plugin
        >>> MemoryPluginLoader().load(base_plugin.TBContext(logdir=tempfile.mkdtemp())).plugin_name
        'tbmem'
    """

    def load(self, context: Any) -> Any:
        try:
            from tbmem.plugin.plugin import MemoryPlugin
        except Exception:  # noqa: BLE001 - a broken plugin must not stop TensorBoard
            logging.getLogger("tbmem").exception("tbmem: the Memory tab could not be loaded")
            return None
        return MemoryPlugin(context)
