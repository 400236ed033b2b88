"""Hydra entry point of the trainers.

Examples:
    python run.py --config-name=burgers_quick_test trainer=synthetic_with_memory
    python run.py --config-name=heat_physical_experiment trainer=physical_with_memory
    python run.py --config-name=burgers_experiment trainer_params.enable_memory_monitoring=true
    torchrun --standalone --nproc_per_node=2 run.py --config-name=burgers_quick_test trainer=synthetic_with_memory

A misspelt or invalid key stops the run before any work with a message naming it
(exit status 2). Outputs go to ``runs/<experiment>/<timestamp>/``; under torchrun every
rank agrees on that folder and writes its own ``rank<r>/`` in it.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

__all__ = ["main"]


@hydra.main(version_base="1.3", config_path="conf", config_name="burgers_experiment")
def main(cfg: DictConfig) -> None:
    """Validate the composed config and run the experiment in Hydra's run directory."""
    from trainers.config import ConfigError
    from trainers.experiment import run_experiment

    try:
        run_experiment(cfg, log_dir=HydraConfig.get().runtime.output_dir)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    from trainers.distributed import prepare_hydra

    # One Hydra run directory for a torchrun job: the ranks agree on it before Hydra composes it.
    sys.argv += prepare_hydra()
    main()
