"""The files of a run in its logdir: a relative logdir and os.chdir, planted symlinks, partial lines, temp files."""

from __future__ import annotations

import json

from tests.faults._child import run_child, steps_of, tbmem_lines

RSS = "Memory/RAM/process_rss_GB"


def test_a_relative_logdir_stays_where_it_was_after_chdir(tmp_path):
    # records, census lines and snapshots after an os.chdir went to a new folder below the new directory
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    done = run_child("""
        import os, sys, torch
        from tbmem import MemoryWriter
        from tbmem.snapshot import SnapshotConfig
        os.chdir(os.path.join(sys.argv[1], "a"))
        model = torch.nn.Linear(8, 8)
        with MemoryWriter("runs/x", every=1, census_every=2, custom_layout=False,
                          snapshot=SnapshotConfig(steps=(1, 5), window=1, html=False)) as w:
            w.watch(model)
            for step in range(8):
                if step == 3:
                    os.chdir(os.path.join(sys.argv[1], "b"))
                model(torch.randn(4, 8)).sum().backward()
                w.add_scalar("Loss/train", 1.0, step)
                w.log_memory(step)
            print(w.log_dir)
    """, str(tmp_path), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "a" / "runs" / "x"
    assert done.stdout.split() == [str(run)]
    assert list((tmp_path / "b").iterdir()) == []
    assert steps_of(run, RSS) == list(range(8))
    assert steps_of(run, "Loss/train") == list(range(8))
    census = [json.loads(line)["step"] for line in (run / "plugins" / "tbmem" / "census.jsonl").read_text().splitlines()]
    assert census == [0, 2, 4, 6]
    snaps = sorted(p.name for p in (run / "plugins" / "tbmem").glob("*.json.gz"))
    assert snaps == ["snapshot_rank0_step000000001.json.gz", "snapshot_rank0_step000000005.json.gz"]
    assert tbmem_lines(done.stderr) == []
