"""PhiML's backend profiler around the PhysicalTrainer's loss evaluations inside tbmem's profile windows.

While a profile window of the run's :class:`tbmem.MemoryWriter` is open (``tbmem.profile``), each loss
evaluation runs inside ``phiml.backend.profile(trace=False)``: every call PhiML makes to its backend
(torch), with its time and inputs. The calls go into the window's trace as a process of their own
(``PhiML backend``), on the window's clock (PhiML stamps calls with ``time.perf_counter``, tbmem's clock;
``subtract_trace_time=False`` keeps them real), each with the bytes torch.profiler saw allocated while it
ran (``profile_memory``). PhiFlow's field operations (:data:`FIELD_OPERATIONS`: ``diffuse.explicit``,
``advect.differential``, ``math.l2_loss``, ...) are wrapped, for the evaluation only, in torch.profiler
ranges named ``phiflow::<module>.<function>``: each call's time and the bytes allocated inside it
(a window's summary lists them by name, under ``field_operations``). One trace then shows which PhiFlow operation costs
time and memory.

Why not PhiML's own grouping of backend calls by function (``trace=True``): it takes a Python stack per
backend call, 1.2 s instead of 0.05 s for one loss evaluation of the quick config in a plain script and
about a minute under pytest's deeper stacks. torch.profiler's Python tracer (``with_stack: true``) names
every function too, but inside ``math.minimize`` it made the quick config's run take 289 s instead of
8.5 s, with 17 MB traces (measured here).

What PhiML's profiler does not measure: device time. A backend call's duration is the Python call's
wall time; on a GPU the kernels it launches run asynchronously, so it shows launch cost unless the call
synchronises (PhiML adds no synchronisation). It does not see memory, nor torch operations that bypass
PhiML's backend (a network run by ``field.native_call``; autograd's backward pass) except as time inside
the enclosing call. Its stack tracing costs time inside the window (outside windows nothing is wrapped).

Nothing here raises: it runs inside a PhiFlow loss function, where an exception hangs SciPy's worker.

Example:
    >>> from trainers.phiml_profile import profiled
    >>> profiled(None, lambda: 41 + 1)  # no writer, or no window open: the call alone
    42
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, TypeVar

from tbmem import report_once

__all__ = ["profiled", "FIELD_OPERATIONS"]

T = TypeVar("T")

#: PhiFlow's field operations wrapped in a named torch.profiler range during a profiled loss evaluation.
FIELD_OPERATIONS = (("phi.physics.diffuse", ("explicit", "implicit", "fourier")),
                    ("phi.physics.advect", ("semi_lagrangian", "mac_cormack", "differential", "points")),
                    ("phiml.math", ("l2_loss", "sum", "mean")))


def _named(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    from torch.profiler import record_function

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _wrap_field_operations() -> list[tuple[Any, str, Any]]:
    """Wrap :data:`FIELD_OPERATIONS` in place; returns what to put back (module, name, original)."""
    import importlib

    undo = []
    for module_name, names in FIELD_OPERATIONS:
        module = importlib.import_module(module_name)
        short = module_name.rsplit(".", 1)[-1]
        for name in names:
            fn = getattr(module, name, None)
            if callable(fn):
                setattr(module, name, _named(f"phiflow::{short}.{name}", fn))
                undo.append((module, name, fn))
    return undo


def profiled(writer: Any, fn: Callable[[], T]) -> T:
    """``fn()``, inside PhiML's backend profiler while ``writer``'s profile window is open; its calls
    are then added to the window. ``fn``'s own exceptions go on unchanged; the profiler's are reported once."""
    windows = getattr(writer, "profile", None)
    if windows is None or windows.window is None:
        return fn()
    cm, undo = None, []
    try:
        from phiml.backend import profile

        undo = _wrap_field_operations()
        cm = profile(trace=False, subtract_trace_time=False)
        prof = cm.__enter__()
    except Exception as exc:  # noqa: BLE001 - inside a loss function nothing may raise
        _restore(undo)
        report_once("trainers:phiml-profile", "trainers: PhiML's backend profiler could not start; the "
                    "profile windows go on without PhiFlow's operations", exc=exc)
        return fn()
    try:
        return fn()
    finally:
        _restore(undo)
        try:
            cm.__exit__(None, None, None)
            windows.add_perf_counter_events(_events(prof), source="PhiML")
        except Exception as exc:  # noqa: BLE001 - inside a loss function nothing may raise
            report_once("trainers:phiml-profile", "trainers: PhiML's backend profile could not be added to "
                        "the profile window", exc=exc)


def _restore(undo: list[tuple[Any, str, Any]]) -> None:
    for module, name, fn in reversed(undo):
        setattr(module, name, fn)


def _events(prof: Any) -> list[dict[str, Any]]:
    """The profile's trace events, through its public ``save`` (ts and dur in perf_counter microseconds)."""
    with tempfile.TemporaryDirectory(prefix="tbmem-phiml-") as tmp:
        path = os.path.join(tmp, "phiml.json")
        prof.save(path)
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
