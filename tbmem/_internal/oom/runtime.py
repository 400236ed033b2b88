"""The out-of-memory error explained at the moment it is raised, from the live allocator.

At the error the allocator's segments (``torch.cuda.memory_snapshot()``: host objects only),
the driver's free and total bytes (``mem_get_info``), the allocator's retry count and the
settings in the environment are read; nothing is allocated on the device. The requested bytes
come from the error's message (torch prints them rounded to two decimals). :func:`report` is the
writer's one call at an OOM: it writes the block to the run's text tab and returns it for the
single stderr line the writer logs.

Example:
    >>> requested_from_message("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 1 has a total capacity")
    (21474836480, 1)
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from typing import Any

from tbmem._internal import _torch_private as tp
from tbmem._internal._log import report_once
from tbmem._internal.oom.explain import OomExplanation, explain_device
from tbmem._internal.oom.settings import AllocatorSettings
from tbmem._internal.oom.text import explanation_text
from tbmem._internal.snapshot.units import format_bytes
from tbmem._internal.tags import TAGS

__all__ = ["explain_now", "report", "requested_from_message"]

_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_ASK = re.compile(r"Tried to allocate ([0-9.]+) ?(B|bytes|KiB|MiB|GiB|TiB)")
_GPU = re.compile(r"GPU (\d+)")


def requested_from_message(message: str) -> tuple[int | None, int | None]:
    """(requested bytes, device index) as torch's out-of-memory message states them; None where absent."""
    ask = _ASK.search(message)
    gpu = _GPU.search(message)
    req = round(float(ask.group(1)) * _UNITS[ask.group(2)]) if ask else None
    return req, int(gpu.group(1)) if gpu else None


def _rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


#: How long after torch's out-of-memory observer fired its report may explain an error whose message names
#: no size (an OOM not from the caching allocator names none, and must not take an older report).
_OBSERVED_FRESH_S = 30.0


def _observed(index: int, message: str) -> tp.OomRequest | None:
    """The observer's report of this error: the exact bytes where its message's rounded size agrees."""
    seen = tp.take_oom_request(index)
    if seen is None:
        return None
    ask = _ASK.search(message)
    if ask is None:
        return seen if time.monotonic() - seen.at < _OBSERVED_FRESH_S else None
    unit = _UNITS[ask.group(2)]
    # torch prints two decimals of the unit: a report of another request differs by more than that rounding
    return seen if abs(seen.requested - float(ask.group(1)) * unit) <= 0.005 * unit + 1 else None


def _other_processes(x: OomExplanation, index: int) -> None:
    """Split what is outside the allocator into this process's and the other processes' bytes, where NVML
    attributes device memory per process; a note where it cannot."""
    from tbmem._internal._extras import MissingExtraError
    from tbmem._internal.probes.device import read_nvml_processes

    try:
        split = read_nvml_processes(index)
    except MissingExtraError:
        x.notes.append("other processes' memory on the device is not known: NVML is not installed "
                       "(pip install 'tbmem[nvml]')")
        return
    except Exception as err:  # noqa: BLE001 - an NVML error: the explanation goes on without it
        x.notes.append(f"other processes' memory on the device is not known: NVML failed ({type(err).__name__})")
        return
    if split.own is None:
        x.notes.append(f"NVML lists no process with this pid ({os.getpid()}, another pid namespace?): "
                       f"{split.others} bytes in {split.n_others} process(es) are not told apart from this one's")
        return
    x.other_processes_bytes = split.others
    x.process_device_bytes = split.own
    for advice in x.advice:
        if advice["kind"] == "outside_allocator" and split.others:
            advice["text"] += (f"; {format_bytes(split.others)} of it belong to {split.n_others} other "
                               "process(es) on the device (NVML): stop them or use another device")
    if split.not_reported:
        x.notes.append(f"NVML reports no bytes for {split.not_reported} process(es) on the device")


def explain_now(exc: BaseException, *, step: int | None = None, rank: int | None = None,
                census: Mapping[str, Any] | None = None) -> OomExplanation | None:
    """The explanation of ``exc`` from the allocator's state now; None without an initialised CUDA device.

    The requested bytes are torch's own where its out-of-memory observer reported this error
    (:func:`tbmem._internal._torch_private.watch_oom_requests`), else read from the message (rounded as torch
    prints them). ``census``: the census taken at the error (:func:`tbmem._internal.oom.census.take_at_oom`), if one was.
    """
    from tbmem._internal.snapshot.cuda import convert_torch_snapshot

    message = str(exc)
    requested, index = requested_from_message(message)
    index = tp.cuda_current_device() if index is None else index
    if index is None:
        return None
    segments = tp.cuda_segments(index)
    if segments is None:
        return None
    seen = _observed(index, message)
    rank = _rank() if rank is None else rank
    snap = convert_torch_snapshot([{**s, "device": index} for s in segments], kind="oom", step=step or 0, rank=rank)
    name = f"cuda:{index}"
    devs = [d for d in snap.devices if d.name == name]
    info = tp.cuda_mem_get_info(index)
    stats = tp.cuda_memory_stats(index) or {}
    retries = stats.get("num_alloc_retries")
    if not devs:  # no segment at all: an empty allocator
        import numpy as np

        from tbmem._internal.snapshot.model import COLUMNS, SEGMENT_COLUMNS, Device, empty_columns
        devs = [Device(name=name, time_us=np.zeros(0, dtype=np.int64), allocs=empty_columns(COLUMNS),
                       segs=empty_columns(SEGMENT_COLUMNS))]
    free = seen.device_free if seen is not None else None if info is None else info[0]
    x = explain_device(devs[0], {"requested_bytes": seen.requested if seen is not None else requested,
                                 "free_bytes": free},
                       categories=snap.categories, strings=snap.strings, frames=snap.frames, stacks=snap.stacks,
                       settings=AllocatorSettings.from_environment(), site_of_stack=_sites(snap), rank=rank,
                       step=step, device_total=None if info is None else info[1],
                       retries=None if retries is None else int(retries), census=census)
    if seen is not None:
        x.notes.append("the requested bytes and the driver's free bytes are torch's own, at the error "
                       "(its out-of-memory observer)")
    elif requested is not None:
        x.notes.append("the requested bytes are read from the error message (rounded as torch prints them)")
    if x.outside_allocator_bytes:
        _other_processes(x, index)
    return x


def _sites(snap: Any) -> Any:
    from tbmem._internal.snapshot.stats import attribution
    return attribution(snap)


def report(writer: Any, step: int, exc: BaseException, *, census: Mapping[str, Any] | None = None) -> str:
    """Explain ``exc``, write the block to ``writer``'s text tab (:data:`TAGS` ``oom_text``) and return it
    (with a leading newline) for the writer's one stderr line; ``""`` when it cannot be explained.
    Never raises: an OOM must reach the user whatever happens here."""
    try:
        x = explain_now(exc, step=step, census=census)
        if x is None:
            return ""
        text = explanation_text(x)
    except Exception as err:  # noqa: BLE001 - the OOM must reach the user, not this
        report_once("oom:explain", "tbmem: could not explain the out-of-memory error", exc=err)
        return ""
    try:
        writer.add_text(TAGS["oom_text"].tag, "```\n" + text + "\n```", step)
        writer.flush()
    except Exception as err:  # noqa: BLE001
        report_once("oom:text", "tbmem: could not write the out-of-memory explanation to the run", exc=err)
    return "\n" + text
