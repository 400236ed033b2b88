"""Checks shared by tbmem's keyword-only configuration dataclasses.

Below every configuration class (:class:`tbmem.MemoryWriterConfig`,
:class:`tbmem.AlertConfig`, :class:`tbmem.RanksConfig`,
:class:`tbmem.SnapshotConfig`, :class:`tbmem.SpikeConfig`,
:class:`tbmem.ProfileConfig`), so that each can check its fields without importing
another (``MemoryWriterConfig`` builds the others from mappings), with the same messages.

Example:
    >>> from tbmem._internal._fields import seconds
    >>> seconds(2, "timeout_s")
    2.0
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

__all__ = ["seconds", "integer", "patterns", "flags", "unknown_keys", "optional_config"]


def seconds(value: Any, label: str, *, low: float = 0.0, hint: str = "") -> float:
    """``value`` as a float number of seconds; ValueError naming ``label`` when it is not a finite
    number >= ``low`` (a bool, a string, NaN, infinity).

    Example:
        >>> seconds(2, "timeout_s")
        2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise ValueError(f"{label} must be a number of seconds >= {low:g}{hint}, got {value!r}")
    return float(value)


def integer(value: Any, label: str, *, low: int = 0, what: str = "", hint: str = "") -> int:
    """``value`` when it is an int >= ``low`` (not a bool); else ValueError naming ``label``:
    ``"<label> must be <what: an integer >= low><hint>, got <value>"``.

    Example:
        >>> integer(3, "window", low=3)
        3
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{label} must be {what or f'an integer >= {low}'}{hint}, got {value!r}")
    return value


def patterns(value: Any, label: str) -> tuple[str, ...]:
    """``value`` (a list or tuple of non-empty strings: tag patterns) as a tuple; ValueError naming ``label``
    for anything else: one string (``"train/loss"`` would be read as its letters), an empty pattern, a number.

    Example:
        >>> patterns(["train/ce_loss", "val/*"], "loss_tags")
        ('train/ce_loss', 'val/*')
    """
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{label} must be a list of tag patterns (strings), got {value!r}")
    out = tuple(value)
    bad = [p for p in out if not isinstance(p, str) or not p.strip()]
    if bad:
        raise ValueError(f"{label} must be a list of non-empty tag patterns (strings), got {bad[0]!r} in {value!r}")
    return out


def flags(config: Any, *attrs: str) -> None:
    """ValueError naming the first of ``attrs`` of ``config`` that is not a bool (a YAML ``yes`` read
    as a string, a 1): ``"<Class>.<attr> must be true or false, got <value>"``.

    Example:
        >>> from tbmem._internal.ranks import RanksConfig
        >>> flags(RanksConfig(), "enabled", "aggregate")
    """
    for attr in attrs:
        value = getattr(config, attr)
        if not isinstance(value, bool):
            raise ValueError(f"{type(config).__name__}.{attr} must be true or false, got {value!r}")


def unknown_keys(cls: type, values: Mapping[str, Any] | Any) -> str | None:
    """A message naming the keys of ``values`` that ``cls`` has no field for, the closest match of
    each and every valid key; None when all are known.

    Example:
        >>> from tbmem._internal.config import MemoryWriterConfig
        >>> print(unknown_keys(MemoryWriterConfig, {"evry": 5}))  # doctest: +ELLIPSIS
        unknown MemoryWriterConfig key 'evry' (did you mean 'every'?); valid keys: alerts, census_every, ...
    """
    import difflib

    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(str(k) for k in values if k not in known)
    if not unknown:
        return None
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1)
        named.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return (f"unknown {cls.__name__} key{'s' if len(unknown) > 1 else ''} {', '.join(named)}; "
            f"valid keys: {', '.join(known)}")


def optional_config(cls: Any, value: Any, forms: str) -> Any:
    """The optional part of a configuration ``value`` names: None/False -> None (off), True -> ``cls()``
    (the defaults), an instance as it is, a mapping through ``cls.from_mapping``; ValueError
    ``"<forms>, got <value>"`` for anything else.

    Example:
        >>> from tbmem._internal.alerts import AlertConfig
        >>> optional_config(AlertConfig, None, "alerts: ..."), optional_config(AlertConfig, True, "alerts: ...")
        (None, AlertConfig(...))
    """
    if value is None or value is False:
        return None
    if value is True:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls.from_mapping(value)
    raise ValueError(f"{forms}, got {value!r}")
