"""The files of a run in its logdir: a relative logdir and os.chdir, planted symlinks, partial lines, temp files."""

from __future__ import annotations

import json
import signal

import pytest

from tests.faults._child import finish, run_child, start_child, steps_of, tbmem_lines, wait_for_line

RSS = "Memory/RAM/process_rss_GB"


def test_a_relative_logdir_stays_where_it_was_after_chdir(tmp_path):
    # records, census lines and snapshots after an os.chdir went to a new folder below the new directory
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    done = run_child("""
        import os, sys, torch
        from tbmem import MemoryWriter
        from tbmem._internal.snapshot import SnapshotConfig
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


def test_a_planted_census_symlink_is_not_followed(tmp_path):
    # census.jsonl has a fixed name: in a shared logdir anyone could plant it as a link to a victim's file
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own file\n")
    victim_dir = tmp_path / "victim_dir"
    victim_dir.mkdir()
    (tmp_path / "a" / "plugins" / "tbmem").mkdir(parents=True)
    (tmp_path / "a" / "plugins" / "tbmem" / "census.jsonl").symlink_to(victim)
    (tmp_path / "b" / "plugins").mkdir(parents=True)
    (tmp_path / "b" / "plugins" / "tbmem").symlink_to(victim_dir)
    done = run_child("""
        import os, sys, torch
        from tbmem import MemoryWriter
        model = torch.nn.Linear(8, 8)
        for run in ("a", "b"):
            with MemoryWriter(os.path.join(sys.argv[1], run), every=1, census_every=1, custom_layout=False) as w:
                w.watch(model)
                for step in range(3):
                    w.log_memory(step)
                print(run, w.faults.dropped_census_lines)
    """, str(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert victim.read_text() == "the victim's own file\n"
    assert list(victim_dir.iterdir()) == []
    assert done.stdout.split() == ["a", "3", "b", "3"]
    lines = tbmem_lines(done.stderr)
    assert any(f"cannot write to {tmp_path / 'a' / 'plugins' / 'tbmem' / 'census.jsonl'}: it is a symlink, "
               "which tbmem does not follow" in line for line in lines), lines
    assert any(f"cannot write to {tmp_path / 'b' / 'plugins' / 'tbmem'}: it is a symlink" in line for line in lines)
    assert steps_of(tmp_path / "a", RSS) == [0, 1, 2]  # training and its records went on


def test_a_census_line_cut_short_by_a_full_disk_is_removed(tmp_path, mounts):
    # a line the disk cut short stayed in census.jsonl and swallowed the next one
    disk = mounts("tmpfs", size_kb=1024)
    done = run_child("""
        import errno, os, sys, torch
        from tbmem import MemoryWriter
        from tbmem._internal.logdir.census_log import CensusLog
        run = os.path.join(sys.argv[1], "run")
        layers = [torch.nn.Linear(16, 16) for _ in range(40)]  # 80 tensors: lines of about 9 KiB
        side = os.path.join(run, "plugins", "tbmem", "census.jsonl")

        def fill():  # every free page of the disk, to its last byte
            with open(os.path.join(sys.argv[1], "filler"), "wb", buffering=0) as fh:
                for size in (1 << 16, 1 << 12, 1 << 8, 1):
                    try:
                        while True:
                            fh.write(b"x" * size)
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC

        with MemoryWriter(run, every=1, census_every=1, top_k=80, large_tensor_mb=0.0001,
                          custom_layout=False) as w:
            w.watch(*layers)
            w.log_memory(0)
            before = os.path.getsize(side)
            fill()
            w.log_memory(1)  # only the rest of census.jsonl's last page is free: a short write
            after = os.path.getsize(side)
            os.unlink(os.path.join(sys.argv[1], "filler"))
            w.log_memory(2)
            print(before, after, w.faults.dropped_census_lines)
        print(sorted(CensusLog().read(side)))
    """, str(disk), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    sizes, steps = done.stdout.splitlines()[-2:]
    before, after, dropped = map(int, sizes.split())
    assert 4096 < before and after == before  # the cut line was removed
    assert dropped == 1
    assert steps == "[0, 2]"


_SLOW_SNAPSHOT_WRITE = """
    import os, sys, time
    from tbmem import MemoryWriter
    from tbmem._internal.snapshot.store import SnapshotStore
    run = os.path.join(sys.argv[1], "run")
    w = MemoryWriter(run, every=1, census_every=0, custom_layout=False)  # tbmem's SIGTERM handler
    w.log_memory(0)
    store = SnapshotStore(run, rank=0, max_snapshots=0, max_disk_mb=0)

    def fill(fh):  # a large snapshot being written
        fh.write(b"x" * 65536)
        fh.flush()
        print("writing", flush=True)
        time.sleep(60)

    store.write_files("snapshot", 1, [("json.gz", fill)])
"""


def _temps(run):
    return sorted(p.name for p in (run / "plugins" / "tbmem").glob(".tmp-*.part"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_temp_files_of_a_snapshot_write_ended_by_a_signal_are_removed(tmp_path, sig):
    # .tmp-*.part files left by SIGKILL and SIGTERM during a snapshot write were never cleaned up
    run = tmp_path / "run"
    proc = start_child(_SLOW_SNAPSHOT_WRITE, str(tmp_path))
    wait_for_line(proc, lambda line: line == "writing")
    assert len(_temps(run)) == 1
    proc.send_signal(sig)
    _, err = finish(proc)
    assert proc.returncode == -sig
    if sig == signal.SIGTERM:  # tbmem's handler removed the file being written before the process died
        assert _temps(run) == []
        assert tbmem_lines(err) == [f"tbmem: SIGTERM: final record at step 0 written, {run} closed"]
        return
    assert len(_temps(run)) == 1  # nothing runs at a SIGKILL: the next writer with snapshots removes it
    done = run_child("""
        import os, sys
        from tbmem import MemoryWriter
        from tbmem._internal.snapshot import SnapshotConfig
        with MemoryWriter(os.path.join(sys.argv[1], "run"), every=1, census_every=0,
                          snapshot=SnapshotConfig(steps=(1,), window=1, html=False)) as w:
            for step in range(3):
                w.log_memory(step)
    """, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert _temps(run) == []
    assert (run / "plugins" / "tbmem" / "snapshot_rank0_step000000001.json.gz").is_file()
