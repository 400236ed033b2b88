"""The probe protocol shared by host and device probes.

Example:
    >>> from tbmem._internal.probes.base import Probe
    >>> class Constant(Probe):
    ...     name = "constant"
    ...     def read(self):
    ...         return {"ram_rss": 1.0}
    >>> Constant().read()
    {'ram_rss': 1.0}
"""

from __future__ import annotations

__all__ = ["Probe"]


class Probe:
    """Base class: a named source of raw readings.

    Subclasses override :meth:`read`; :meth:`start` and :meth:`stop` bracket a
    measurement window (for windowed peaks) and default to no-ops.
    """

    name: str = "probe"

    def start(self) -> None:
        """Begin a measurement window."""

    def read(self) -> dict[str, float]:
        """Return raw readings keyed by tag-table keys."""
        raise NotImplementedError

    def stop(self) -> None:
        """Release what the probe holds."""

    def __enter__(self) -> "Probe":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
