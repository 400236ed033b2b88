"""The two instrumented trainers of tbmem's demos: SyntheticTrainer (PyTorch) and PhysicalTrainer (PhiFlow).

Names are imported lazily so ``import trainers`` needs neither PhiFlow nor Hydra.

Example:
    >>> import trainers
    >>> trainers.SyntheticTrainer.__name__
    'SyntheticTrainer'
"""

from __future__ import annotations

from tbmem._lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
