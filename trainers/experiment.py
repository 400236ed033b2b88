"""Run one experiment from a composed config: validate, pick the device, train, report.

``run.py`` (the Hydra entry point) calls :func:`run_experiment`; tests call it
with a config composed by ``hydra.compose`` and a temporary log directory.

Example:
    >>> import tempfile
    >>> from trainers.experiment import run_experiment
    >>> out = run_experiment({"experiment": "doc", "trainer_type": "physical",
    ...     "data": {"resolution": 32, "num_frames": 5, "num_sims": 1, "cache_dir": tempfile.mkdtemp(),
    ...              "progress": False},
    ...     "trainer_params": {"train_sim": [0], "learnable_parameters": [
    ...         {"name": "viscosity", "initial_guess": 0.02}]}}, log_dir=tempfile.mkdtemp())
    ... # doctest: +ELLIPSIS
    physical trainer on cpu, logging to ...
    SOLVE INFO (L-BFGS-B)
    ...
    >>> out.result.converged
    True
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from trainers.config import ConfigError, RunConfig, validate

__all__ = ["Outcome", "RunProgress", "run_experiment", "resolve_device", "default_log_dir", "tensorboard_command"]


@dataclass
class Outcome:
    """The log directory and the trainer's result."""

    log_dir: Path
    result: Any
    seconds: float


@dataclass
class RunProgress:
    """Where a run is, filled in by :func:`run_experiment` as it goes.

    ``run.py`` keeps one, so that a run ended early (Ctrl-C, an error in training) is
    reported in one line that says how far it got and where its records are.
    """

    log_dir: Path | None = None
    writer: Any = None

    @property
    def step(self) -> int | None:
        """The last step (batch, or loss evaluation) the run's writer logged."""
        return getattr(self.writer, "last_step", None)

    def _where(self) -> str:
        at = "before its first step" if self.step is None else f"at step {self.step}"
        if self.log_dir is None:
            return f"{at}; nothing was written"
        return f"{at}; its records are flushed to {self.log_dir}"

    def interrupted_line(self) -> str:
        """The line shown on Ctrl-C."""
        return f"Interrupted (Ctrl-C): the run stopped {self._where()}"

    def failed_line(self, exc: BaseException, traceback_file: Path | None = None) -> str:
        """The line shown when training raised ``exc``."""
        first = (str(exc).strip().splitlines() or [""])[0]
        where = f" (traceback in {traceback_file})" if traceback_file is not None else ""
        return f"error: {type(exc).__name__}: {first}; the run stopped {self._where()}{where}"


def resolve_device(choice: str) -> torch.device:
    """``auto`` picks CUDA when it is available, else CPU; ``cuda`` without a GPU is an error.

    Under torchrun each rank takes the GPU of its ``LOCAL_RANK``.
    """
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("config key 'device' is 'cuda' but no CUDA device is available")
        local = os.environ.get("LOCAL_RANK", "")
        if local.isdigit() and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            return torch.device("cuda", int(local))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def default_log_dir(cfg: RunConfig) -> Path:
    """``<runs_dir>/<experiment>/<run_name or a timestamp>``."""
    return Path(cfg.runs_dir) / cfg.experiment / (cfg.run_name or time.strftime("%Y-%m-%d_%H-%M-%S"))


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_experiment(cfg: Mapping[str, Any], *, log_dir: str | os.PathLike[str] | None = None,
                   progress: RunProgress | None = None) -> Outcome:
    """Validate ``cfg``, train with the configured trainer and print the TensorBoard command.

    Args:
        cfg: The composed config.
        log_dir: The run's directory (default: ``runs_dir/experiment/run_name``).
        progress: Filled in with the log directory and writer, to say where a run that
            ends early stopped. The event files are flushed and closed however it ends.

    Raises:
        ConfigError: a key is unknown or a value invalid (raised before any work starts).
        KeyboardInterrupt: Ctrl-C (the PhysicalTrainer's L-BFGS-B finishes its evaluation first).
    """
    from trainers.distributed import setup

    run = validate(cfg)
    device = resolve_device(run.device)
    path = Path(log_dir) if log_dir is not None else default_log_dir(run)
    dist = setup(device.type)  # under torchrun: the process group (gloo on CPU, nccl on CUDA)
    try:
        outcome = _run(run, device, path, dist, progress)  # the trainer and its DDP wrapper are gone on return
    except BaseException:
        dist.close(ended_cleanly=False)
        raise
    dist.close()
    return outcome


def _run(run: RunConfig, device: torch.device, path: Path, dist: Any, progress: RunProgress | None) -> Outcome:
    from trainers.data import ensure_simulations, select_backend_device
    from trainers.monitoring import TrainerMonitoring

    _seed(run.seed)
    if run.threads:
        # Small convolutions gain little from intra-op threads and lose a lot on a busy machine.
        torch.set_num_threads(run.threads)
    select_backend_device(device.type)
    if dist.active:
        with dist.root_first():  # rank 0 simulates the shared cache, the others then read it
            ensure_simulations(run.data)
    p = run.trainer_params
    mon = TrainerMonitoring.create(path, enabled=p.enable_memory_monitoring,
                                   verbose_batches=p.memory_monitor_batches, tbmem_config=run.tbmem,
                                   device=device, census_at=p.census_at)
    if progress is not None:
        progress.log_dir, progress.writer = path, mon.writer
    start = time.perf_counter()
    try:
        mon.writer.add_text("config", "    " + json.dumps(_plain(run), indent=1).replace("\n", "\n    "), 0)
        where = f"rank {dist.rank} of {dist.world_size}, " if dist.active else ""
        print(f"{run.trainer_type} trainer on {device}, {where}logging to {mon.writer.log_dir}", flush=True)
        if run.trainer_type == "synthetic":
            from trainers.synthetic import SyntheticTrainer

            result: Any = SyntheticTrainer(run, monitoring=mon, device=device, distributed=dist).train()
        else:
            from trainers.physical import PhysicalTrainer

            result = PhysicalTrainer(run, monitoring=mon).train()
    except BaseException:
        mon.close()  # inside the handler: tbmem does not wait for ranks that may never come
        raise
    mon.close()
    seconds = time.perf_counter() - start
    shown = path.parent
    with contextlib.suppress(ValueError):
        shown = path.parent.resolve().relative_to(Path.cwd())
    if dist.is_root and os.environ.get("TBMEM_DEMO") == "1":  # make demo prints one command for its runs
        print(f"Done in {seconds:.1f} s.", flush=True)
    elif dist.is_root:
        print(f"Done in {seconds:.1f} s. View the run with:\n  {tensorboard_command()} --logdir {shown}", flush=True)
    return Outcome(log_dir=path, result=result, seconds=seconds)


def tensorboard_command() -> str:
    """How to start this environment's ``tensorboard`` from the shell the user is in.

    ``tensorboard`` when that name on PATH is the one beside this Python; else the path of
    the one beside it (``.venv/bin/tensorboard``: a venv that was never activated), relative
    when it lies under the working directory.
    """
    import shlex
    import shutil
    import sys

    beside = Path(sys.executable).with_name("tensorboard")  # the venv's bin/, symlinks not followed
    if not beside.exists():
        return "tensorboard"
    found = shutil.which("tensorboard")
    if found is not None and Path(found).resolve() == beside.resolve():
        return "tensorboard"
    shown = beside
    with contextlib.suppress(ValueError):
        shown = beside.relative_to(Path.cwd())
    return shlex.quote(str(shown))


def _plain(run: RunConfig) -> dict[str, Any]:
    out = {k: v for k, v in asdict(run).items() if k != "tbmem"}
    out["tbmem"] = {k: (v if isinstance(v, (int, float, str, bool, type(None))) else repr(v))
                    for k, v in asdict(run.tbmem).items()}
    return out
