"""Calls into probes that never raise: a failure is retried with backoff, then the probe is switched off.

One transient error (an ``EIO`` while reading /proc) must not lose a probe for a
multi-day run, and a probe that keeps failing must not cost a traceback per record.
:class:`ProbeGuard` retries a failed probe at the next record (one transient error
costs that record's readings, nothing more); after a second failure in a row it skips
the probe until its next retry is due (1 s, doubling to 60 s). It reports the first
failure once, and after :attr:`ProbeGuard.MAX_FAILURES` failures in a row removes the
probe, saying which.

Example:
    >>> from tbmem._internal.probes.base import Probe
    >>> from tbmem._internal.probes.guard import ProbeGuard
    >>> class Flaky(Probe):
    ...     name = "flaky"
    ...     def read(self):
    ...         raise OSError(5, "Input/output error")
    >>> probes = [Flaky()]
    >>> guard = ProbeGuard()
    >>> guard.call(probes, probes[0], probes[0].read) is None, len(probes)  # failed, kept for a retry
    (True, 1)
"""

from __future__ import annotations

from typing import Any, Callable

from tbmem._internal._log import logger, report_once
from tbmem._internal._retry import Backoff
from tbmem._internal.probes.base import Probe

__all__ = ["ProbeGuard"]


class ProbeGuard:
    """Retry state of the probes of one writer."""

    #: Failures in a row after which a probe is switched off.
    MAX_FAILURES = 5
    #: Wait before a retry after the second failure in a row, in seconds (the first is retried at the
    #: next record); each further failure in a row doubles it, up to CAP_S.
    BASE_S = 1.0
    CAP_S = 60.0

    def __init__(self) -> None:
        self._retry: dict[int, Backoff] = {}

    def call(self, probes: list[Probe], probe: Probe, fn: Callable[[], Any]) -> Any:
        """``fn()`` (a method of ``probe``), or None when it fails or waits for its retry.

        After :attr:`MAX_FAILURES` failures in a row ``probe`` is removed from ``probes``.
        """
        retry = self._retry.get(id(probe))
        if retry is not None and not retry.ready():
            return None
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - monitoring must never break training
            if retry is None:
                retry = self._retry[id(probe)] = Backoff(base_s=self.BASE_S, cap_s=self.CAP_S,
                                                         max_failures=self.MAX_FAILURES, at_once=1)
            failures = retry.failed()
            if retry.exhausted:
                report_once(f"probe-off:{probe.name}", f"tbmem: the {probe.name} probe failed {failures} times "
                            "in a row and is switched off", exc=exc)
                if probe in probes:
                    probes.remove(probe)
                del self._retry[id(probe)]
            elif retry.total_failures == 1:
                report_once(f"probe:{probe.name}", f"tbmem: the {probe.name} probe failed; its readings are "
                            f"skipped and it is retried (switched off after {self.MAX_FAILURES} failures in "
                            "a row)", exc=exc)
            return None
        if retry is not None and retry.failures:
            retry.succeeded()
            logger.info("tbmem: the %s probe works again", probe.name)
        return result
