"""Command-line overrides checked against the trainers' schema before Hydra (or torch) starts.

Hydra answers a misspelt ``trainer_params.lerning_rate=0.1`` with "To append to your config
use +trainer_params.lerning_rate=0.1", advice that would add the typo. ``run.py`` calls
:func:`check_overrides` first: an override naming a key the schema
(:mod:`trainers.config`, and tbmem's ``MemoryWriterConfig`` under ``tbmem.``) does not have
stops the run with the closest valid name, in about a tenth of a second, before any folder is
made. A key the schema has is passed as ``++key=value`` (set it, adding it when no YAML file
names it), so every documented key can be set without Hydra's ``+``.

A config group's choice (``trainer=synthetic_with_memroy``) and the config name
(``--config-name=burgers_quik_test``, ``-cn NAME``) get the same treatment when
:func:`config_groups` and :func:`config_names` are passed: a name with no YAML file stops the run
with the closest one (Hydra would answer with its own error and exit 1).

Left to Hydra as they are: other flags, Hydra's own groups (``hydra/job_logging=...``), ``hydra.*``
keys, overrides that already start with ``+``, ``++`` or ``~``, and keys inside lists or free-form
mappings.

Example:
    >>> from trainers.overrides import check_overrides
    >>> check_overrides(["--config-name=burgers_quick_test", "trainer=synthetic", "trainer_params.epochs=2"],
    ...                 groups={"trainer", "data", "model"})
    ['--config-name=burgers_quick_test', 'trainer=synthetic', '++trainer_params.epochs=2']
    >>> check_overrides(["trainer_params.lerning_rate=0.1"], groups=set())
    Traceback (most recent call last):
    ...
    trainers.config.ConfigError: unknown config key 'trainer_params.lerning_rate' (did you mean 'learning_rate'?)
    >>> check_overrides(["trainer=synthetc"], groups={"trainer": ("physical", "synthetic")})
    Traceback (most recent call last):
    ...
    trainers.config.ConfigError: unknown trainer 'synthetc' (did you mean 'synthetic'?)
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from trainers.config import ConfigError, DataConfig, ModelConfig, RunConfig, TrainerParams

__all__ = ["check_overrides", "config_groups", "config_names"]


def _schemas() -> dict[str, type]:
    """Dataclass of each mapping key, by dotted path (tbmem's sub-configs import no torch)."""
    from tbmem import AlertConfig, MemoryWriterConfig, RanksConfig, SnapshotConfig, SpikeConfig

    return {"": RunConfig, "data": DataConfig, "model": ModelConfig, "trainer_params": TrainerParams,
            "tbmem": MemoryWriterConfig, "tbmem.snapshot": SnapshotConfig, "tbmem.alerts": AlertConfig,
            "tbmem.spikes": SpikeConfig, "tbmem.ranks": RanksConfig}


def config_groups(conf_dir: str | Path) -> dict[str, tuple[str, ...]]:
    """Config groups and their choices: the folders of ``conf_dir`` (``data``, ``model``, ``trainer``) and
    the YAML files in each (``trainer``: ``physical``, ``synthetic_with_memory``, ...)."""
    return {p.name: tuple(sorted(f.stem for f in p.glob("*.yaml"))) for p in sorted(Path(conf_dir).iterdir())
            if p.is_dir()}


def config_names(conf_dir: str | Path) -> tuple[str, ...]:
    """What ``--config-name`` can name: the YAML files directly in ``conf_dir``."""
    return tuple(sorted(f.stem for f in Path(conf_dir).glob("*.yaml")))


def _unknown(what: str, name: str, known: Collection[str]) -> ConfigError:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f"; {what} is one of: {', '.join(sorted(known))}"
    return ConfigError(f"unknown {what} '{name}'{hint}")


def _check_config_name(args: Sequence[str], names: Collection[str]) -> None:
    for i, arg in enumerate(args):
        value = None
        if arg.startswith("--config-name=") or arg.startswith("-cn="):
            value = arg.partition("=")[2]
        elif arg in ("--config-name", "-cn") and i + 1 < len(args):
            value = args[i + 1]
        name = value[:-len(".yaml")] if value and value.endswith(".yaml") else value
        if name is not None and name not in names:
            raise _unknown("config name", name, names)


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


def check_overrides(args: Sequence[str], *, groups: Collection[str] | Mapping[str, Collection[str]],
                    configs: Collection[str] | None = None) -> list[str]:
    """Check ``key=value`` overrides against the schema; return the arguments to give Hydra.

    Args:
        args: The command line after the program name.
        groups: The config groups (passed to Hydra as they are); a mapping to each group's choices
            (:func:`config_groups`) has the choices checked too.
        configs: The config names ``--config-name`` may give (:func:`config_names`); None: not checked.

    Raises:
        ConfigError: an override names a key the schema does not have, a group choice or config name
            that has no YAML file (the message names the closest valid one, or every valid one).
    """
    if configs is not None:
        _check_config_name(args, configs)
    schemas: dict[str, Any] | None = None
    out = []
    for arg in args:
        key, eq, value = arg.partition("=")
        plain = eq and not arg.startswith(("-", "+", "~")) and key and "[" not in key and "/" not in key
        if plain and isinstance(groups, Mapping) and key in groups and not any(c in value for c in "[],"):
            if value not in groups[key] and value != "null":  # a choice with no YAML file in conf/<group>/
                raise _unknown(key, value, groups[key])
        if not plain or key.startswith("hydra.") or key == "hydra" or key in groups:
            out.append(arg)
            continue
        schemas = schemas if schemas is not None else _schemas()
        _check_key(key, schemas)
        out.append(f"++{key}={value}")
    return out
