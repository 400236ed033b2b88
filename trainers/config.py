"""The trainers' configuration schema: every key is declared, typed and checked at start.

A Hydra config is composed from YAML files and command-line overrides; a
misspelt key in a YAML file would otherwise be ignored silently. :func:`validate`
turns the composed config into frozen dataclasses and raises
:class:`ConfigError` naming the first unknown or invalid key (with the closest
valid spelling), before any data is generated or any model is built.
tbmem's own keys (the ``tbmem:`` node) are checked by
``tbmem.MemoryWriterConfig.from_mapping``.

Example:
    >>> from trainers.config import validate, ConfigError
    >>> cfg = validate({"experiment": "demo", "trainer_type": "synthetic",
    ...                 "trainer_params": {"learning_rate": 1e-3}})
    >>> cfg.trainer_params.learning_rate
    0.001
    >>> try:
    ...     validate({"experiment": "demo", "trainer_params": {"lerning_rate": 1e-3}})
    ... except ConfigError as err:
    ...     print(err)
    unknown config key 'trainer_params.lerning_rate' (did you mean 'learning_rate'?)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["ConfigError", "DataConfig", "ModelConfig", "TrainerParams", "RunConfig", "validate"]


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; the message names the key."""


def _fail(path: str, message: str) -> None:
    raise ConfigError(f"config key '{path}' {message}")


def _check_type(path: str, value: Any, kind: str) -> None:
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        "str": isinstance(value, str),
        "str?": value is None or isinstance(value, str),
        "int|auto": value == "auto" or (isinstance(value, int) and not isinstance(value, bool)),
        "float?": value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                    and math.isfinite(value)),
        "list": isinstance(value, (list, tuple)),
        "mapping": value is None or isinstance(value, Mapping),
    }[kind]
    if not ok:
        expected = "an integer or 'auto'" if kind == "int|auto" else f"of type {kind.rstrip('?')}"
        _fail(path, f"must be {expected}, got {value!r}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def _from_mapping(cls: type, path: str, values: Mapping[str, Any] | None) -> Any:
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f"; valid keys: {sorted(fields)}"
            raise ConfigError(f"unknown config key '{_join(path, key)}'{hint}")
    for key, value in values.items():
        _check_type(_join(path, key), value, fields[key].metadata["kind"])
    obj = cls(**values)
    obj.check(path)
    return obj


def _f(default: Any, kind: str) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"kind": kind})
    return field(default=default, metadata={"kind": kind})


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """What to simulate and how to cache and load it (``data:``). See docs/trainers.md."""

    pde: str = _f("burgers", "str")
    dim: int = _f(1, "int")
    resolution: int = _f(64, "int")
    domain_size: float = _f(2 * math.pi, "float")
    dt: float = _f(0.01, "float")
    num_frames: int = _f(50, "int")
    num_sims: int = _f(8, "int")
    nu: float = _f(0.05, "float")
    substeps: int = _f(1, "int")
    amplitude: float = _f(1.0, "float")
    noise_scale: float = _f(1.0, "float")
    noise_smoothness: float = _f(2.0, "float")
    seed: int = _f(0, "int")
    cache_dir: str = _f(".cache/simulations", "str")
    max_cached_sims: int = _f(5, "int")
    pin_memory: bool = _f(False, "bool")
    progress: bool = _f(True, "bool")

    def check(self, path: str) -> None:
        """Raise ConfigError naming the first invalid value."""
        if self.pde not in ("burgers", "heat"):
            _fail(f"{path}.pde", f"must be 'burgers' or 'heat', got {self.pde!r}")
        if self.dim not in (1, 2):
            _fail(f"{path}.dim", f"must be 1 or 2, got {self.dim!r}")
        for name in ("resolution", "num_frames", "num_sims", "substeps", "max_cached_sims"):
            if getattr(self, name) < 1:
                _fail(f"{path}.{name}", f"must be >= 1, got {getattr(self, name)!r}")
        for name in ("domain_size", "dt", "nu", "amplitude", "noise_scale"):
            if getattr(self, name) <= 0:
                _fail(f"{path}.{name}", f"must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The network of the SyntheticTrainer (``model:``)."""

    name: str = _f("unet", "str")
    levels: int = _f(3, "int")
    filters: int = _f(16, "int")
    residual: bool = _f(True, "bool")

    def check(self, path: str) -> None:
        """Raise ConfigError naming the first invalid value."""
        if self.name != "unet":
            _fail(f"{path}.name", f"must be 'unet', got {self.name!r}")
        if not 1 <= self.levels <= 6:
            _fail(f"{path}.levels", f"must be in 1..6, got {self.levels!r}")
        if self.filters < 1:
            _fail(f"{path}.filters", f"must be >= 1, got {self.filters!r}")


@dataclass(frozen=True, kw_only=True)
class TrainerParams:
    """Keys of ``trainer_params:`` for both trainers (the physical ones are ignored by the other)."""

    learning_rate: float = _f(1e-3, "float")
    batch_size: int | str = _f(16, "int|auto")  # "auto": the largest that fits (trainers/autobatch.py)
    auto_batch_sizes: list = _f([4, 8, 16], "list")
    auto_batch_max: int = _f(1024, "int")
    auto_batch_budget_gb: float | None = _f(None, "float?")
    epochs: int = _f(10, "int")
    num_predict_steps: int = _f(4, "int")
    train_sim: list = _f([0], "list")
    val_sim: list = _f([], "list")
    use_sliding_window: bool = _f(True, "bool")
    enable_memory_monitoring: bool = _f(False, "bool")
    memory_monitor_batches: int = _f(5, "int")
    census_at: str = _f("after_backward", "str")  # or before_backward: where a step's census is taken
    optimizer: str = _f("adam", "str")
    scheduler: str = _f("cosine", "str")
    weight_decay: float = _f(0.0, "float")
    save_interval: int = _f(0, "int")
    save_best_only: bool = _f(True, "bool")
    gradient_accumulation_steps: int = _f(1, "int")
    use_amp: bool = _f(False, "bool")
    num_workers: int = _f(0, "int")
    progress: bool = _f(True, "bool")
    # PhysicalTrainer
    learnable_parameters: list = _f([], "list")
    method: str = _f("L-BFGS-B", "str")
    abs_tol: float = _f(1e-6, "float")
    max_iterations: int = _f(100, "int")

    def check(self, path: str) -> None:
        """Raise ConfigError naming the first invalid value."""
        for name in ("learning_rate", "batch_size", "epochs", "num_predict_steps",
                     "gradient_accumulation_steps", "max_iterations", "auto_batch_max"):
            if getattr(self, name) != "auto" and getattr(self, name) <= 0:
                _fail(f"{path}.{name}", f"must be > 0, got {getattr(self, name)!r}")
        sizes = self.auto_batch_sizes
        if len(set(sizes)) < 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            _fail(f"{path}.auto_batch_sizes", f"must list two or more different batch sizes >= 1, got {sizes!r}")
        if self.auto_batch_budget_gb is not None and self.auto_batch_budget_gb <= 0:
            _fail(f"{path}.auto_batch_budget_gb", f"must be > 0 (or null: free memory), got "
                  f"{self.auto_batch_budget_gb!r}")
        for name in ("memory_monitor_batches", "save_interval", "num_workers", "weight_decay", "abs_tol"):
            if getattr(self, name) < 0:
                _fail(f"{path}.{name}", f"must be >= 0, got {getattr(self, name)!r}")
        if self.optimizer not in ("adam", "adamw", "sgd"):
            _fail(f"{path}.optimizer", f"must be 'adam', 'adamw' or 'sgd', got {self.optimizer!r}")
        if self.census_at not in ("after_backward", "before_backward"):
            _fail(f"{path}.census_at", f"must be 'after_backward' or 'before_backward', got {self.census_at!r}")
        if self.scheduler not in ("cosine", "step", "none"):
            _fail(f"{path}.scheduler", f"must be 'cosine', 'step' or 'none', got {self.scheduler!r}")
        for name in ("train_sim", "val_sim"):
            for i in getattr(self, name):
                if isinstance(i, bool) or not isinstance(i, int) or i < 0:
                    _fail(f"{path}.{name}", f"must list simulation indices >= 0, got {i!r}")
        for i, p in enumerate(self.learnable_parameters):
            where = f"{path}.learnable_parameters[{i}]"
            if not isinstance(p, Mapping) or set(p) - {"name", "initial_guess"} or "name" not in p:
                _fail(where, f"must be a mapping with keys 'name' and 'initial_guess', got {p!r}")
            guess = p.get("initial_guess")
            if guess is not None and (isinstance(guess, bool) or not isinstance(guess, (int, float))):
                _fail(f"{where}.initial_guess", f"must be a number, got {guess!r}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """The whole experiment: top-level keys plus the validated groups."""

    experiment: str = _f("experiment", "str")
    run_name: str | None = _f(None, "str?")
    runs_dir: str = _f("runs", "str")
    device: str = _f("auto", "str")
    seed: int = _f(0, "int")
    threads: int = _f(0, "int")
    trainer_type: str = _f("synthetic", "str")
    data: Any = _f(None, "mapping")
    model: Any = _f(None, "mapping")
    trainer_params: Any = _f(None, "mapping")
    tbmem: Any = _f(None, "mapping")

    def check(self, path: str) -> None:
        """Raise ConfigError naming the first invalid value."""
        if self.device not in ("auto", "cpu", "cuda"):
            _fail("device", f"must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.trainer_type not in ("synthetic", "physical"):
            _fail("trainer_type", f"must be 'synthetic' or 'physical', got {self.trainer_type!r}")
        if self.threads < 0:
            _fail("threads", f"must be >= 0 (0: torch's default), got {self.threads!r}")
        if not self.experiment or "/" in self.experiment:
            _fail("experiment", f"must be a non-empty name without '/', got {self.experiment!r}")


def validate(cfg: Mapping[str, Any]) -> RunConfig:
    """Check a composed config (a dict or an OmegaConf DictConfig) and return it as dataclasses.

    Raises:
        ConfigError: a key is unknown or a value invalid; the message names the key.
    """
    if not isinstance(cfg, dict):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    values = {k: v for k, v in dict(cfg).items() if k != "hydra"}
    top = _from_mapping(RunConfig, "", values)
    tbmem_cfg = _tbmem_config(dict(top.tbmem or {}))
    run = dataclasses.replace(
        top,
        data=_from_mapping(DataConfig, "data", top.data),
        model=_from_mapping(ModelConfig, "model", top.model),
        trainer_params=_from_mapping(TrainerParams, "trainer_params", top.trainer_params),
        tbmem=tbmem_cfg,
    )
    # across groups, here rather than in the trainers: a start that fails leaves nothing behind
    keys = ("train_sim", "val_sim") if run.trainer_type == "synthetic" else ("train_sim",)
    for key in keys:
        bad = [i for i in getattr(run.trainer_params, key) if i >= run.data.num_sims]
        if bad:
            _fail(f"trainer_params.{key}", f"names simulations {bad} but data.num_sims is {run.data.num_sims}")
    return run


def _tbmem_config(values: dict[str, Any]) -> Any:
    from tbmem import MemoryWriterConfig

    try:
        return MemoryWriterConfig.from_mapping(values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"config key 'tbmem' is invalid: {exc}") from exc
