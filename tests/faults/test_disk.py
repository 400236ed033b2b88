"""A full disk (a small tmpfs) and a read-only logdir (a bind mount remounted read-only).

Each case runs in a fresh process; outcomes are read back from disk and from what
the process printed.
"""

from __future__ import annotations

import os
import textwrap

from tbmem.analysis import load_scalars
from tbmem._internal.snapshot import load_snapshot
from tbmem._internal.snapshot.store import PLUGIN_DIR
from tests.faults._child import event_records, run_child, steps_of, tbmem_lines

RSS = "Memory/RAM/process_rss_GB"


def _script(body: str) -> str:
    return textwrap.dedent(body).replace("# FILL\n", _FILL)

_FILL = """
def fill(disk, leave=0):
    # Fill the filesystem with one file, then give back `leave` bytes.
    path = os.path.join(disk, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    size = 0
    try:
        while True:
            size += os.write(fd, b"\\0" * 65536)
    except OSError:
        pass
    if leave:
        os.ftruncate(fd, max(0, size - leave))
    os.close(fd)
    return path
"""


def test_full_disk_training_finishes_and_recovers_when_space_returns(mounts):
    disk = mounts("tmpfs", size_kb=512)
    proc = run_child(_script("""
        import os, sys
        import tbmem._internal._retry
        from tbmem import MemoryWriter
        # FILL
        clock = [0.0]  # the retries' clock (tbmem._internal._retry._now): 5 ms a step, and the wait below, without sleeping
        tbmem._internal._retry._now = lambda: clock[0]
        disk = sys.argv[1]
        w = MemoryWriter(os.path.join(disk, "run"), every=1, census_every=0, custom_layout=False)
        for step in range(120):
            if step == 30:
                w.flush()
                filler = fill(disk)
            if step == 60:
                os.unlink(filler)   # space returns
                clock[0] += 2.5     # the next retry is due by then
            w.add_scalar("Loss/train", 1.0 / (step + 1), step)   # the user's write, forwarded
            w.log_memory(step)                                   # tbmem's own
            clock[0] += 0.005
        w.close()
        print("finished", flush=True)
    """), str(disk))
    assert proc.returncode == 0, proc.stderr
    assert "finished" in proc.stdout and "Traceback" not in proc.stderr
    run = disk / "run"
    lines = tbmem_lines(proc.stderr)
    assert len(lines) == 2, lines
    (event_file,) = [n for n in os.listdir(run) if n.startswith("events.out")]
    assert f"cannot write to {run / event_file}: No space left on device [Errno 28]" in lines[0]
    dropped = int(lines[1].split("tbmem: ")[1].split()[0])
    assert "TensorBoard events could not be written" in lines[1] and str(run) in lines[1]
    # Every record on disk is complete (tbmem's loader checks every byte), and what was
    # dropped is exactly what is missing: 1 file-version event + 2 events per step were sent.
    df = load_scalars(run, on_error="raise")
    assert len(event_records(run)) + dropped == 1 + 2 * 120
    for tag in ("Loss/train", RSS):
        steps = set(df[df.tag == tag].step)
        assert set(range(30)) <= steps  # everything before the disk filled up
        assert set(range(60, 120)) <= steps  # everything after space returned
        assert 0 < 120 - len(steps) <= 30


def test_full_disk_is_one_line_for_every_component(mounts):
    # Events, census text, snapshots and the user's writes all hit the same full disk.
    disk = mounts("tmpfs", size_kb=512)
    proc = run_child(_script("""
        import os, sys
        import torch
        from tbmem import MemoryWriter
        # FILL
        disk = sys.argv[1]
        model = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        w = MemoryWriter(os.path.join(disk, "run"), every=1, census_every=5,
                         snapshot={"every": 5, "max_snapshots": 0})
        w.watch(model, opt)
        for step in range(40):
            if step == 10:
                w.flush()
                fill(disk)
            with w.monitored_step(step):
                loss = model(torch.randn(8, 64)).pow(2).mean()
                w.add_scalar("Loss/train", loss.item(), step)
                loss.backward(); opt.step(); opt.zero_grad()
        w.close()
        print("finished", flush=True)
    """), str(disk))
    assert proc.returncode == 0, proc.stderr
    assert "finished" in proc.stdout
    lines = tbmem_lines(proc.stderr)
    assert len(lines) == 2, lines  # the cause, then the count at close
    assert "No space left on device" in lines[0] and "training continues" in lines[0]
    assert "could not be written" in lines[1] and "memory snapshot" in lines[1]
    run = disk / "run"
    df = load_scalars(run, on_error="raise")
    assert set(range(10)) <= set(df[df.tag == RSS].step)
    assert not [n for n in os.listdir(run / PLUGIN_DIR) if n.startswith(".tmp-")]


def test_read_only_logdir_oom_reaches_the_caller_unchanged(mounts):
    disk = mounts("bind")
    proc = run_child(_script("""
        import os, subprocess, sys
        import torch
        from tbmem import MemoryWriter
        disk = sys.argv[1]
        model = torch.nn.Linear(16, 16)
        w = MemoryWriter(os.path.join(disk, "run"), every=1, census_every=0, custom_layout=False,
                         snapshot={"start_step": 1, "every": 100})
        w.watch(model)

        def step(i):
            with w.monitored_step(i):
                model(torch.randn(4, 16)).sum().backward()

        for i in range(5):
            step(i)
        w.flush()
        subprocess.run(["mount", "-o", "remount,bind,ro", disk], check=True)
        err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        try:
            with w.monitored_step(5):
                raise err
        except BaseException as caught:
            print("same object:", caught is err, "context:", caught.__context__, "cause:", caught.__cause__,
                  flush=True)
        for i in range(6, 10):  # training goes on
            step(i)
        w.close()
        print("finished", flush=True)
    """), str(disk))
    assert proc.returncode == 0, proc.stderr
    assert "same object: True context: None cause: None" in proc.stdout
    assert "finished" in proc.stdout and "Traceback" not in proc.stderr
    lines = tbmem_lines(proc.stderr)
    assert len(lines) == 3, lines
    cause = [line for line in lines if "cannot write to" in line]
    assert len(cause) == 1 and "Read-only file system" in cause[0]
    oom = [line for line in lines if "out of memory" in line]
    assert len(oom) == 1
    assert oom[0].startswith("tbmem: out of memory at step 5 (OutOfMemoryError: CUDA out of memory.")
    assert "the snapshot could not be written (Read-only file system [Errno 30])" in oom[0]
    assert "could not be written to" in lines[-1]  # the count at close
    assert steps_of(disk / "run", RSS) == [0, 1, 2, 3, 4]  # everything before stays readable


def test_oom_message_names_the_snapshot_written_before_the_disk_filled(mounts):
    disk = mounts("tmpfs", size_kb=512)
    proc = run_child(_script("""
        import os, sys
        import torch
        from tbmem import MemoryWriter
        # FILL
        disk = sys.argv[1]
        model = torch.nn.Linear(32, 32)
        w = MemoryWriter(os.path.join(disk, "run"), every=1, census_every=0, custom_layout=False,
                         snapshot={"start_step": 1, "every": 100})
        w.watch(model)
        for i in range(3):
            with w.monitored_step(i):
                model(torch.randn(8, 32)).sum().backward()
        w.flush()
        fill(disk, leave=8192)  # room for the small .json.gz, not for the ~16 kB HTML viewer
        err = torch.OutOfMemoryError("out of memory")
        try:
            with w.monitored_step(3):
                raise err
        except BaseException as caught:
            print("same object:", caught is err, flush=True)
        w.close()
    """), str(disk))
    assert proc.returncode == 0, proc.stderr
    assert "same object: True" in proc.stdout
    folder = disk / "run" / PLUGIN_DIR
    assert sorted(os.listdir(folder)) == ["oom_rank0_step000000003.json.gz"]  # no HTML, no temp file
    assert load_snapshot(folder / "oom_rank0_step000000003.json.gz").kind == "oom"
    (oom,) = [line for line in tbmem_lines(proc.stderr) if "out of memory" in line]
    assert f"snapshot saved to {folder / 'oom_rank0_step000000003.json.gz'} (html not written: No space left" in oom
    assert "could not be written" not in oom
