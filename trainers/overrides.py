"""Command-line overrides checked against the trainers' schema before Hydra (or torch) starts.

Hydra answers a misspelt ``trainer_params.lerning_rate=0.1`` with "To append to your config
use +trainer_params.lerning_rate=0.1", advice that would add the typo. ``run.py`` calls
:func:`check_overrides` first: an override naming a key the schema
(:mod:`trainers.config`, and tbmem's ``MemoryWriterConfig`` under ``tbmem.``) does not have
stops the run with the closest valid name, in about a tenth of a second, before any folder is
made. A key the schema has is passed as ``++key=value`` (set it, adding it when no YAML file
names it), so every documented key can be set without Hydra's ``+``.

Left to Hydra as they are: flags (``--config-name=...``), config group choices
(``trainer=synthetic_with_memory``, ``hydra/job_logging=...``), ``hydra.*`` keys, overrides
that already start with ``+``, ``++`` or ``~``, and keys inside lists or free-form mappings.

Example:
    >>> from trainers.overrides import check_overrides
    >>> check_overrides(["--config-name=burgers_quick_test", "trainer=synthetic", "trainer_params.epochs=2"],
    ...                 groups={"trainer", "data", "model"})
    ['--config-name=burgers_quick_test', 'trainer=synthetic', '++trainer_params.epochs=2']
    >>> check_overrides(["trainer_params.lerning_rate=0.1"], groups=set())
    Traceback (most recent call last):
    ...
    trainers.config.ConfigError: unknown config key 'trainer_params.lerning_rate' (did you mean 'learning_rate'?)
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Collection, Sequence

from trainers.config import ConfigError, DataConfig, ModelConfig, RunConfig, TrainerParams

__all__ = ["check_overrides", "config_groups"]


def _schemas() -> dict[str, type]:
    """Dataclass of each mapping key, by dotted path (tbmem's sub-configs import no torch)."""
    from tbmem.alerts import AlertConfig
    from tbmem.config import MemoryWriterConfig
    from tbmem.ranks.config import RanksConfig
    from tbmem.snapshot.config import SnapshotConfig

    return {"": RunConfig, "data": DataConfig, "model": ModelConfig, "trainer_params": TrainerParams,
            "tbmem": MemoryWriterConfig, "tbmem.snapshot": SnapshotConfig, "tbmem.alerts": AlertConfig,
            "tbmem.ranks": RanksConfig}


def config_groups(conf_dir: str | Path) -> set[str]:
    """Config group names: the folders of ``conf_dir`` (``data``, ``model``, ``trainer``)."""
    return {p.name for p in Path(conf_dir).iterdir() if p.is_dir()}


def _fields(cls: type) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls))


def _elsewhere(name: str, schemas: dict[str, type]) -> str | None:
    """``trainer_params.epochs`` for a bare ``epochs``: the one section that has that key."""
    homes = [f"{path}.{name}" for path, cls in schemas.items() if path and name in _fields(cls)]
    return homes[0] if len(homes) == 1 else None


def _check_key(key: str, schemas: dict[str, type]) -> None:
    parts = key.split(".")
    for depth in range(len(parts)):
        section = ".".join(parts[:depth])
        cls = schemas.get(section)
        if cls is None:
            return  # inside a list or a free-form mapping: not ours to check
        name = parts[depth]
        known = _fields(cls)
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else None
        if hint is None and depth == 0:
            home = _elsewhere(name, schemas)
            hint = f" (did you mean '{home}'?)" if home else None
        if hint is None:
            hint = f"; valid keys{' of ' + section if section else ''}: {', '.join(known)}"
        raise ConfigError(f"unknown config key '{key}'{hint}")


def check_overrides(args: Sequence[str], *, groups: Collection[str]) -> list[str]:
    """Check ``key=value`` overrides against the schema; return the arguments to give Hydra.

    Raises:
        ConfigError: an override names a key the schema does not have (the message names the
            closest valid key, or every valid one).
    """
    schemas: dict[str, Any] | None = None
    out = []
    for arg in args:
        key, eq, value = arg.partition("=")
        plain = eq and not arg.startswith(("-", "+", "~")) and key and "[" not in key and "/" not in key
        if not plain or key.startswith("hydra.") or key == "hydra" or key in groups:
            out.append(arg)
            continue
        schemas = schemas if schemas is not None else _schemas()
        _check_key(key, schemas)
        out.append(f"++{key}={value}")
    return out
