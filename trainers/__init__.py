"""The two instrumented trainers of tbmem's demos: SyntheticTrainer (PyTorch) and PhysicalTrainer (PhiFlow).

Names are imported lazily so ``import trainers`` needs neither PhiFlow nor Hydra.

Example:
    >>> import trainers
    >>> trainers.SyntheticTrainer.__name__
    'SyntheticTrainer'
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SyntheticTrainer": "trainers.synthetic",
    "PhysicalTrainer": "trainers.physical",
    "HybridDataset": "trainers.dataset",
    "UNet": "trainers.models",
    "TrainerMonitoring": "trainers.monitoring",
    "ConfigError": "trainers.config",
    "validate": "trainers.config",
    "run_experiment": "trainers.experiment",
    "ensure_simulations": "trainers.data",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # PEP 562: the module of a name is imported on its first use
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(_EXPORTS)
