"""Hydra entry point of the trainers.

Examples:
    python run.py --config-name=burgers_quick_test trainer=synthetic_with_memory
    python run.py --config-name=heat_physical_experiment trainer=physical_with_memory
    python run.py --config-name=burgers_experiment trainer_params.enable_memory_monitoring=true
    torchrun --standalone --nproc_per_node=2 run.py --config-name=burgers_quick_test trainer=synthetic_with_memory

A misspelt or invalid key stops the run before any work with a message naming it
(exit status 2). Outputs go to ``runs/<experiment>/<timestamp>/``; under torchrun every
rank agrees on that folder and writes its own ``rank<r>/`` in it.

A run that ends early says so in one line on stderr, with the step it reached and
where its (flushed) records are: Ctrl-C exits with status 130, an error in training
with status 1 (its traceback is saved to ``<run>/traceback.txt``).
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

__all__ = ["main"]


@hydra.main(version_base="1.3", config_path="conf", config_name="burgers_experiment")
def main(cfg: DictConfig) -> None:
    """Validate the composed config and run the experiment in Hydra's run directory."""
    from trainers.config import ConfigError
    from trainers.experiment import RunProgress, run_experiment

    # A full disk makes every log line to Hydra's run.log fail; logging would print a traceback
    # for each one. The records tbmem could not write are counted and reported instead.
    logging.raiseExceptions = False
    progress = RunProgress()
    try:
        run_experiment(cfg, log_dir=HydraConfig.get().runtime.output_dir, progress=progress)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(progress.interrupted_line(), file=sys.stderr, flush=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - one line here, the traceback in the run's folder
        print(progress.failed_line(exc, _save_traceback(progress.log_dir)), file=sys.stderr, flush=True)
        sys.exit(1)


def _save_traceback(log_dir: Path | None) -> Path | None:
    if log_dir is None:
        return None
    path = Path(log_dir) / "traceback.txt"
    try:
        path.write_text(traceback.format_exc())
    except OSError:
        return None
    return path


if __name__ == "__main__":
    from trainers.distributed import prepare_hydra

    try:
        # One Hydra run directory for a torchrun job: the ranks agree on it before Hydra composes it.
        sys.argv += prepare_hydra()
        main()
    except KeyboardInterrupt:  # during Hydra's start-up, before the run has a folder
        print("Interrupted (Ctrl-C) before the run started", file=sys.stderr)
        sys.exit(130)
