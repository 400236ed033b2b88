"""Where an incremental census spends its time inside a training loop: each phase timed in place.

One SyntheticTrainer process with a census every 50 steps (``bench_trainer_overhead.py``'s
``census_50`` variant); the census's phases (``tbmem._internal.census.core._guarded``), its heap pass,
``take_census`` and ``CensusComponent.take`` (the census plus what the writer writes: scalars,
the markdown table's text event, the Memory tab's ``census.jsonl`` line) are wrapped with
``perf_counter``. They run with the caches a training step leaves them, at two to three times what
they cost in a loop. Prints the median per incremental census (the first census, a full scan, left
out). Not a ``bench_*`` script: it prints times, not a ratio, and ``make bench`` does not run it;
compare code by running it alternately from a copy of each tree (the machine's load moves it by 10%).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/profile_census_phases.py --epochs 20
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_trainer_overhead import VARIANTS, _trainer  # noqa: E402

__all__ = ["main"]


def _wrap(times: dict[str, list[float]], owner: Any, attr: str, key: str | None) -> None:
    """Time each call of ``owner.attr`` under ``key`` (None: the call's second argument, a phase's name)."""
    real, clock = getattr(owner, attr), time.perf_counter

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return real(*args, **kwargs)
        finally:
            times[key if key is not None else args[1]].append(clock() - start)

    setattr(owner, attr, timed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="72 steps each: 20 epochs make 29 censuses")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    trainer, _ = _trainer(VARIANTS["census_50"], Path(tempfile.mkdtemp()), "run", 4, args.epochs)

    import tbmem._internal.census
    from tbmem._internal.census import core, heap
    from tbmem._internal._writer_components import CensusComponent

    times: dict[str, list[float]] = defaultdict(list)
    _wrap(times, core, "_guarded", None)
    _wrap(times, heap, "find_instances", "heap pass (find_instances)")
    _wrap(times, core, "take_census", "take_census")
    tbmem._internal.census.take_census = core.take_census  # the writer imports it from the package per call
    _wrap(times, CensusComponent, "take", "CensusComponent.take")
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    medians = {key: statistics.median(spent[1:]) * 1e3 for key, spent in times.items() if len(spent) > 1}
    censuses = len(times["take_census"])
    print(f"{censuses} censuses; median of the {censuses - 1} incremental ones, ms:")
    for key, ms in medians.items():
        print(f"  {key:28s} {ms:6.2f}")
    writer = medians["CensusComponent.take"] - medians["take_census"]
    print(f"  {'writer side (difference)':28s} {writer:6.2f}")


if __name__ == "__main__":
    main()
