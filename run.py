"""Hydra entry point of the trainers.

Examples:
    python run.py --config-name=burgers_quick_test trainer=synthetic_with_memory
    python run.py --config-name=heat_physical_experiment trainer=physical_with_memory
    python run.py --config-name=burgers_experiment trainer_params.enable_memory_monitoring=true
    torchrun --standalone --nproc_per_node=2 run.py --config-name=burgers_quick_test trainer=synthetic_with_memory

A misspelt or invalid key, config group choice (``trainer=synthetic_with_memroy``) or
``--config-name`` stops the run before any work with a message naming the closest valid one
(exit status 2): a key on the command line is checked against the schema before Hydra
starts (every documented key can be set without Hydra's ``+``), the composed config
before torch is imported, and a start that fails leaves no run folder behind. Outputs
go to ``runs/<experiment>/<timestamp>/``; under torchrun every rank agrees on that
folder and writes its own ``rank<r>/`` in it.

A run that ends early says so in one line on stderr, with the step it reached and
where its (flushed) records are: Ctrl-C exits with status 130, an error in training
with status 1 (its traceback is saved to ``<run>/traceback.txt``).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

__all__ = ["main"]

#: What Hydra writes into a run folder before the run starts: nothing else means nothing ran.
_HYDRA_FILES = {".hydra", "run.log"}


@hydra.main(version_base="1.3", config_path="conf", config_name="burgers_experiment")
def main(cfg: DictConfig) -> None:
    """Validate the composed config and run the experiment in Hydra's run directory."""
    from trainers.config import ConfigError, validate

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        validate(cfg)  # before torch is imported: a config error takes a second, not torch's import time
    except ConfigError as exc:
        _config_error(exc, run_dir)
    from trainers.experiment import RunProgress, run_experiment

    # A full disk makes every log line to Hydra's run.log fail; logging would print a traceback
    # for each one. The records tbmem could not write are counted and reported instead.
    logging.raiseExceptions = False
    progress = RunProgress()
    try:
        run_experiment(cfg, log_dir=run_dir, progress=progress)
    except ConfigError as exc:
        _config_error(exc, run_dir)
    except KeyboardInterrupt:
        _remove_unstarted(run_dir)
        print(progress.interrupted_line(), file=sys.stderr, flush=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - one line here, the traceback in the run's folder
        saved = _save_traceback(progress.log_dir)
        if saved is None:
            _remove_unstarted(run_dir)
        print(progress.failed_line(exc, saved), file=sys.stderr, flush=True)
        sys.exit(1)


def _config_error(exc: Exception, run_dir: Path) -> None:
    _remove_unstarted(run_dir)
    print(f"config error: {exc}", file=sys.stderr)
    sys.exit(2)


def _remove_unstarted(run_dir: Path) -> None:
    """Remove a run folder holding only what Hydra wrote before the start (``.hydra/``, an empty
    ``run.log``), and the experiment folder above it when that leaves it empty."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return  # the ranks share the folder; one of them may still be writing into it
    try:
        names = {p.name for p in run_dir.iterdir()}
        log = run_dir / "run.log"
        if not names <= _HYDRA_FILES or (log.exists() and log.stat().st_size > 0):
            return
        shutil.rmtree(run_dir)
        run_dir.parent.rmdir()  # only when empty: an experiment folder with earlier runs stays
    except OSError:
        pass


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
    from trainers.config import ConfigError
    from trainers.overrides import check_overrides, config_groups, config_names

    try:
        # before Hydra: a misspelt key, group choice or config name gets the closest valid name, not
        # Hydra's advice to append it or its own error
        conf = Path(__file__).with_name("conf")
        sys.argv[1:] = check_overrides(sys.argv[1:], groups=config_groups(conf), configs=config_names(conf))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        if "WORLD_SIZE" in os.environ:
            from trainers.distributed import prepare_hydra

            # One Hydra run directory for a torchrun job: the ranks agree on it before Hydra composes it.
            sys.argv += prepare_hydra()
        main()
    except KeyboardInterrupt:  # during Hydra's start-up, before the run has a folder
        print("Interrupted (Ctrl-C) before the run started", file=sys.stderr)
        sys.exit(130)
