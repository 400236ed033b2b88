"""The shape of a snapshot document, checked once where it is read.

:func:`tbmem._internal.snapshot.schema.from_json` checks the columns and indices it decodes; this
module checks the rest of the document: the fields that the summary (``tbmem snapshot
stats``), the viewer page and the Memory tab use as they are (categories, device names,
out-of-memory records, markers, ``meta``). A valid gzip JSON file with a number where a
list belongs, a list of numbers where paths belong, or a dict where a list belongs is
refused here with a ValueError that names the field, instead of failing later with a
TypeError deep inside a summary (a traceback in the CLI, an HTTP 500 in the tab).

Example:
    >>> from tbmem._internal.snapshot.shape import check_document
    >>> check_document({"categories": ["activation"], "meta": {}, "devices": []})
    >>> try:
    ...     check_document({"categories": 1.5, "devices": []})
    ... except ValueError as exc:
    ...     print(exc)
    snapshot field categories must be a list of strings
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["check_document"]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_or_none(x: Any) -> bool:
    return x is None or _is_int(x)


def _strings(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(s, str) for s in x)


def _need(ok: bool, field: str, what: str) -> None:
    if not ok:
        raise ValueError(f"snapshot field {field} must be {what}")


# meta keys the summary, the viewer and the tab read, with what each must be (others are kept as they are)
_META: dict[str, tuple[Callable[[Any], bool], str]] = {
    "library_roots": (_strings, "a list of strings"),
    "stdlib_roots": (_strings, "a list of strings"),
    "exception": (lambda x: isinstance(x, str), "a string"),
    "recorder": (lambda x: isinstance(x, str), "a string"),
    "torch": (lambda x: isinstance(x, str), "a string"),
    "unknown_event_keys": (_strings, "a list of strings"),
    "allocator_settings": (lambda x: isinstance(x, dict), "an object"),
    "oom_census": (lambda x: isinstance(x, dict), "an object"),
}

# fields of an out-of-memory record: (check, what it must be, required)
_OOM: dict[str, tuple[Callable[[Any], bool], str, bool]] = {
    "event": (_is_int, "an integer", True),
    "requested_bytes": (lambda x: _is_int(x) and x >= 0, "an integer >= 0", True),
    "free_bytes": (lambda x: x is None or (_is_int(x) and x >= 0), "an integer >= 0 or null", False),
    "time_us": (_int_or_none, "an integer or null", False),
    "pool": (lambda x: isinstance(x, list) and len(x) == 2 and all(_is_int(v) and v >= 0 for v in x),
             "a pair of integers >= 0 (the memory pool)", False),
}


# version 1 (one device, its out-of-memory records in meta.oom_events)
_V1_OOM: dict[str, tuple[Callable[[Any], bool], str, bool]] = {
    "size": (lambda x: _is_int(x) and x >= 0, "an integer >= 0", True),
    "device_free": (lambda x: x is None or (_is_int(x) and x >= 0), "an integer >= 0 or null", False),
}


def check_document(doc: dict[str, Any]) -> None:
    """Refuse a snapshot document (version 1 or 2) whose fields have the wrong types.

    Raises:
        ValueError: ``snapshot field <name> must be <what>``.
    """
    for key in ("source", "kind", "device"):
        if key in doc:
            _need(isinstance(doc[key], str), key, "a string")
    if doc.get("version") == 1:
        _check_v1(doc)
    _need(_strings(doc.get("categories", [])), "categories", "a list of strings")
    meta = doc.get("meta", {})
    _need(isinstance(meta, dict), "meta", "an object")
    for key, (ok, what) in _META.items():
        if key in meta:
            _need(ok(meta[key]), f"meta.{key}", what)
    devices = doc.get("devices")
    if not isinstance(devices, list):
        return  # from_json says so
    for i, dev in enumerate(devices):
        if not isinstance(dev, dict):
            continue  # from_json says so
        if "device" in dev:
            _need(isinstance(dev["device"], str), f"devices[{i}].device", "a string")
        if "has_time" in dev:
            _need(isinstance(dev["has_time"], bool), f"devices[{i}].has_time", "true or false")
        ooms = dev.get("ooms", [])
        _need(isinstance(ooms, list) and all(isinstance(o, dict) for o in ooms), f"devices[{i}].ooms",
              "a list of objects")
        n = dev.get("n_events", 0)
        for j, oom in enumerate(ooms):
            for key, (ok, what, required) in _OOM.items():
                if key in oom or required:
                    _need(key in oom and ok(oom[key]), f"devices[{i}].ooms[{j}].{key}", what)
            if _is_int(n):
                _need(-1 <= oom["event"] < max(n, 1), f"devices[{i}].ooms[{j}].event", "-1 or one of its events")
        markers = dev.get("markers", [])
        if isinstance(markers, list):
            for j, mark in enumerate(markers):
                if isinstance(mark, dict) and "kind" in mark:
                    _need(isinstance(mark["kind"], str), f"devices[{i}].markers[{j}].kind", "a string")


def _check_v1(doc: dict[str, Any]) -> None:
    meta = doc.get("meta", {})
    ooms = meta.get("oom_events", []) if isinstance(meta, dict) else []
    _need(isinstance(ooms, list) and all(isinstance(o, dict) for o in ooms), "meta.oom_events",
          "a list of objects")
    for j, oom in enumerate(ooms):
        for key, (ok, what, required) in _V1_OOM.items():
            if key in oom or required:
                _need(key in oom and ok(oom[key]), f"meta.oom_events[{j}].{key}", what)
    for key in ("reserved_bytes", "segments"):
        if isinstance(meta, dict) and key in meta:
            _need(_int_or_none(meta[key]), f"meta.{key}", "an integer or null")
    _need(isinstance(doc.get("time_us", []), (list, dict)), "time_us", "a list of integers or an encoded column")
