"""``tbmem forecast``: the memory forecast of a trainer's config, before training it.

Composes the Hydra config as ``run.py`` would (``--config-dir``, ``--config-name`` and
overrides such as ``trainer_params.batch_size=64``), builds the SyntheticTrainer
(generating its simulations when they are not cached), fits the forecast of its
training step and prints the table: the probed sizes, the configured batch size,
the largest that fits the budget, and what ``batch_size=auto`` would choose.

Exit status: 0 the configured batch size fits (or is ``auto``); 1 it does not fit the
budget; 2 the config or the command line is invalid (one line on stderr).

The trainers are the repository's demo trainers (``trainers/`` beside ``conf/`` in a clone), not a
package of the wheel: the command finds them beside the config folder or in the working folder,
and says so in one line where neither holds them (an installed tbmem outside a clone).

Example:
    >>> from tbmem._internal.cli import main
    >>> main(["forecast", "--config-dir", "/nonexistent", "--config-name", "x"])
    2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

__all__ = ["add_parser", "forecast_command", "EXIT_DOES_NOT_FIT", "EXIT_ERROR"]

EXIT_DOES_NOT_FIT = 1
EXIT_ERROR = 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``forecast`` on the ``tbmem`` command line's subparsers."""
    p = subparsers.add_parser(
        "forecast", help="forecast a trainer config's peak memory and the largest batch size that fits",
        description="Fit the memory forecast of a trainer config's training step (SyntheticTrainer) on a few "
                    "small batch sizes and print the peak at the configured batch size, the largest that fits "
                    f"the budget and what batch_size=auto would choose. Exit status: 0 fits, {EXIT_DOES_NOT_FIT} "
                    f"the configured batch size does not fit, {EXIT_ERROR} invalid config or arguments.")
    p.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                   help="Hydra overrides, as for run.py (data=burgers_1d trainer_params.batch_size=64 ...)")
    p.add_argument("--config-dir", default="conf", help="the Hydra config folder (default: %(default)s)")
    p.add_argument("--config-name", default="burgers_experiment", help="the config (default: %(default)s)")
    p.add_argument("--sizes", type=_sizes, metavar="N,N,...",
                   help="batch sizes to probe, comma-separated (default: trainer_params.auto_batch_sizes)")
    p.add_argument("--at", type=_sizes, default=[], metavar="N,N,...",
                   help="also forecast these batch sizes, comma-separated")
    p.add_argument("--budget-gb", type=float, metavar="GB",
                   help="memory budget (default: auto_batch_budget_gb, else free device memory / available RAM "
                        "minus margins)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(func=forecast_command)
    return p


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected batch sizes like 16,32,64, got {text!r}") from None
    if not sizes or any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be integers >= 1, got {text!r}")
    return sizes


def _fail(message: str) -> int:
    print(f"tbmem forecast: {message}", file=sys.stderr)
    return EXIT_ERROR


def forecast_command(args: argparse.Namespace) -> int:
    """Run ``tbmem forecast``; returns the exit status."""
    from tbmem._internal._extras import MissingExtraError

    try:
        return _forecast(args)
    except MissingExtraError as exc:
        return _fail(str(exc))
    except ValueError as exc:  # trainers.config.ConfigError and bad option values
        return _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - Hydra's config errors have many types; one line, no traceback
        if type(exc).__module__.startswith(("hydra", "omegaconf")):  # one line: Hydra's first
            return _fail(f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}")
        raise


def _compose(config_dir: str, name: str, overrides: list[str]) -> Any:
    from tbmem._internal._extras import require

    require("hydra", extra="trainers")
    from hydra import compose, initialize_config_dir

    folder = os.path.abspath(config_dir)
    if not os.path.isdir(folder):
        raise ValueError(f"config folder {config_dir!r} does not exist (pass --config-dir)")
    if not os.path.isfile(os.path.join(folder, f"{name}.yaml")):
        have = sorted(n[:-5] for n in os.listdir(folder) if n.endswith(".yaml"))
        raise ValueError(f"no config {name!r} in {config_dir} (it has: {', '.join(have) or 'none'})")
    with initialize_config_dir(config_dir=folder, version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def _find_trainers(config_dir: str) -> None:
    """Make the clone's ``trainers`` importable: beside the config folder, or in the working folder."""
    import importlib.util

    if importlib.util.find_spec("trainers") is not None:
        return
    for root in (os.path.dirname(os.path.abspath(config_dir)), os.getcwd()):
        if os.path.isfile(os.path.join(root, "trainers", "__init__.py")):
            sys.path.insert(0, root)  # a command line's own process: run.py's layout, the clone's root first
            return
    raise ValueError("tbmem forecast runs the repository's demo trainers (trainers/ beside conf/), which a "
                     "wheel does not install: run it in a clone of tbmem, with --config-dir pointing at its conf/")


def _forecast(args: argparse.Namespace) -> int:
    if args.budget_gb is not None and not args.budget_gb > 0:
        raise ValueError(f"--budget-gb must be > 0, got {args.budget_gb}")
    _find_trainers(args.config_dir)
    cfg = _compose(args.config_dir, args.config_name, list(args.overrides))
    import dataclasses

    from trainers.config import ConfigError, validate

    run = validate(cfg)
    if run.trainer_type != "synthetic":
        raise ConfigError(f"trainer_type {run.trainer_type!r} has no batch size (L-BFGS-B optimises every "
                          "train_sim at once): tbmem forecast applies to the synthetic trainer")
    configured = run.trainer_params.batch_size
    params = dataclasses.replace(run.trainer_params, batch_size=1)  # the trainer must not fit by itself
    run = dataclasses.replace(run, trainer_params=params)
    from trainers.autobatch import choose_batch_size
    from trainers.data import select_backend_device
    from trainers.experiment import resolve_device
    from trainers.monitoring import TrainerMonitoring
    from trainers.synthetic import SyntheticTrainer

    import torch

    device = resolve_device(run.device)
    if run.threads:
        torch.set_num_threads(run.threads)
    select_backend_device(device.type)
    budget = None if args.budget_gb is None else int(args.budget_gb * 2**30)
    with tempfile.TemporaryDirectory(prefix="tbmem-forecast-") as tmp:
        mon = TrainerMonitoring.create(tmp, enabled=False, verbose_batches=0, tbmem_config=run.tbmem, device=device)
        try:
            trainer = SyntheticTrainer(run, monitoring=mon, device=device)
            if args.sizes:
                params = dataclasses.replace(params, auto_batch_sizes=list(args.sizes))
                trainer.params = params
            choice = choose_batch_size(trainer, budget_bytes=budget, quiet=True)
        finally:
            mon.close()
    f = choice.forecast
    at = sorted({*args.at, *([configured] if configured != "auto" else []), choice.batch_size})
    fits = configured == "auto" or choice.memory_limit is None or configured <= choice.memory_limit
    if args.json:
        doc = {**f.to_dict(), "budget_bytes": choice.budget_bytes, "budget": choice.budget_explanation,
               "max_batch_size": choice.memory_limit, "configured_batch_size": configured,
               "auto_batch_size": choice.batch_size, "auto_limited_by": choice.limited_by,
               "forecast": {str(n): f.peak_bytes(n) for n in at}, "fits": fits}
        print(json.dumps(doc, indent=2))
    else:
        print(f.table(at=at, budget_bytes=choice.budget_bytes, budget_explanation=choice.budget_explanation))
        print(choice.describe())
        if configured != "auto":
            from tbmem._internal.forecast.report import format_bytes

            verdict = "fits" if fits else "DOES NOT FIT"
            print(f"configured batch_size={configured}: forecast peak {format_bytes(f.peak_bytes(configured))}, "
                  f"{verdict} the budget of {format_bytes(choice.budget_bytes)}")
    return 0 if fits else EXIT_DOES_NOT_FIT
