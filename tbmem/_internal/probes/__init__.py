"""Probes: readings of host and device memory at one instant.

A probe has ``start()`` (begin a measurement window), ``read() -> dict`` (raw
readings keyed by :data:`tbmem.TAGS` keys, in bytes, percent or counts)
and ``stop()``.

Example:
    >>> from tbmem._internal.probes import HostProbe
    >>> readings = HostProbe().read()
    >>> readings["ram_rss"] > 0
    True
"""

from tbmem._internal.probes.base import Probe
from tbmem._internal.probes.device import CudaProbe, NvmlProbe
from tbmem._internal.probes.host import HostProbe
from tbmem._internal.probes.process_tree import ProcessTreeProbe

__all__ = ["Probe", "HostProbe", "CudaProbe", "NvmlProbe", "ProcessTreeProbe"]
