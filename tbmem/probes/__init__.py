"""Probes: readings of host and device memory at one instant.

A probe has ``start()`` (begin a measurement window), ``read() -> dict`` (raw
readings keyed by :data:`tbmem.tags.TAGS` keys, in bytes, percent or counts)
and ``stop()``.

Example:
    >>> from tbmem.probes import HostProbe
    >>> readings = HostProbe().read()
    >>> readings["ram_rss"] > 0
    True
"""

from tbmem.probes.base import Probe
from tbmem.probes.device import CudaProbe, NvmlProbe
from tbmem.probes.host import HostProbe
from tbmem.probes.process_tree import ProcessTreeProbe

__all__ = ["Probe", "HostProbe", "CudaProbe", "NvmlProbe", "ProcessTreeProbe"]
