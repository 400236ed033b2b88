"""Each adapter under ``torchrun --nproc_per_node=2`` (gloo, CPU): every rank its own folder of the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed._torchrun import torchrun
from tests.integrations._counts import censuses, scalar_steps

JOB = Path(__file__).with_name("_job.py")


@pytest.mark.parametrize(("framework", "below", "loss", "steps"), [
    ("hf", "tbmem", "train/loss", [1, 2, 3, 4]),
    ("lightning", "tbmem", "train_loss", [0, 1, 2, 3]),
    ("accelerate", "tbmem", "loss", [0, 1, 2, 3]),
])
def test_each_rank_follows_the_ranks_layout(tmp_path, framework, below, loss, steps):
    pytest.importorskip({"hf": "transformers"}.get(framework, framework))
    proc = torchrun(2, JOB, framework, str(tmp_path), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    job = tmp_path / below
    assert sorted(p.name for p in job.iterdir() if p.is_dir()) == ["rank0", "rank1"]
    census_steps = [s for s in steps if s % 2 == 0]
    for rank in (0, 1):
        run = job / f"rank{rank}"
        assert sorted(censuses(run)) == census_steps, rank
        assert scalar_steps(run, "Memory/RAM/process_rss_GB") == steps, rank
        if rank == 0 or framework != "accelerate":  # accelerate logs on the main process only
            assert scalar_steps(run, loss) == steps, rank
