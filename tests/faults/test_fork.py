"""Forked children (os.fork, multiprocessing, DataLoader workers) and the writers they inherit.

Each case runs in a fresh Python with a timeout: a child that hangs fails the test instead of
blocking it. Records are counted in the parent's event file afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import time

import subprocess
import sys
import textwrap

from tests.faults._child import REPO, child_env, finish, start_child, steps_of, tbmem_lines, wait_for_line

RSS = "Memory/RAM/process_rss_GB"


def run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """:func:`tests.faults._child.run_child` in a session of its own: after a timeout every process of
    it is killed, the children it forked too (a hung forked child would otherwise outlive the test)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(), cwd=str(REPO),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # forked children still running after their parent ended
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_forked_child_that_exits_normally_ends_and_so_does_its_parent(tmp_path):
    # the child runs the at-exit work it inherited; it used to wait forever on TensorBoard's writer
    # thread, which fork() does not copy (a child of a plain SummaryWriter exits in about a second)
    done = run_child("""
        import json, os, sys, time
        from tbmem import MemoryWriter
        run = os.path.join(sys.argv[1], "run")
        with MemoryWriter(run, every=1, census_every=0, custom_layout=False) as w:
            for step in range(3):
                w.add_scalar("Loss/train", 1.0 / (step + 1), step)
                w.log_memory(step)
            w.add_scalar("Loss/train", 0.2, 4)  # queued for TensorBoard's thread when the fork comes
            t = time.monotonic()
            pid = os.fork()
            if pid == 0:
                sys.exit(0)  # leaves the with block too: close() runs in the child
            _, status = os.waitpid(pid, 0)
            waited = time.monotonic() - t
            w.log_memory(5)
        print(json.dumps({"status": status, "waited": waited}))
    """, str(tmp_path), timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == 0 and result["waited"] < 20
    assert steps_of(tmp_path / "run", RSS) == [0, 1, 2, 5]  # the parent's records, none of the child's
    assert steps_of(tmp_path / "run", "Loss/train") == [0, 1, 2, 4]
    assert tbmem_lines(done.stderr) == []


def test_pool_terminate_leaves_the_parents_event_file_to_the_parent(tmp_path):
    # multiprocessing's fork workers inherited tbmem's SIGTERM handler: on Pool.terminate() each wrote
    # its own RSS as a "final record" into the parent's event file
    done = run_child("""
        import multiprocessing as mp, os, sys, time
        from tbmem import MemoryWriter

        def work(i):
            time.sleep(60)

        if __name__ == "__main__":
            w = MemoryWriter(os.path.join(sys.argv[1], "run"), every=1, census_every=0, custom_layout=False)
            for step in range(10):
                w.log_memory(step)
            pool = mp.get_context("fork").Pool(3)
            pool.map_async(work, range(3))
            time.sleep(1.0)  # the workers are inside work()
            t = time.monotonic()
            pool.terminate()
            pool.join()
            print("terminated in", round(time.monotonic() - t, 2), flush=True)
            w.close()
    """, str(tmp_path), timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert steps_of(tmp_path / "run", RSS) == list(range(10))  # 10 logged, 10 on disk
    assert tbmem_lines(done.stderr) == []
    assert float(done.stdout.split("terminated in")[1]) < 5


def test_a_forked_child_dies_by_sigterm_at_once(tmp_path):
    # the child used to run the parent's SIGTERM work: 10 s waiting for the missing writer thread
    done = run_child("""
        import json, os, signal, sys, time
        from tbmem import MemoryWriter
        w = MemoryWriter(os.path.join(sys.argv[1], "run"), every=1, census_every=0, custom_layout=False)
        for step in range(3):
            w.log_memory(step)
        w.add_scalar("Loss/train", 0.5, 3)
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        time.sleep(0.5)
        t = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        waited = time.monotonic() - t
        w.log_memory(4)
        w.close()
        print(json.dumps({"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, "waited": waited}))
    """, str(tmp_path), timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["signal"] == signal.SIGTERM
    assert result["waited"] < 3
    assert steps_of(tmp_path / "run", RSS) == [0, 1, 2, 4]
    assert tbmem_lines(done.stderr) == []


def test_writes_in_a_forked_child_are_ignored_with_one_line(tmp_path):
    done = run_child("""
        import os, sys
        from tbmem import MemoryWriter
        w = MemoryWriter(os.path.join(sys.argv[1], "run"), every=1, census_every=0, custom_layout=False)
        w.log_memory(0)
        pid = os.fork()
        if pid == 0:
            for step in range(1, 4):
                w.add_scalar("Loss/train", 1.0, step)
                w.log_memory(step)
            w.close()
            os._exit(0)
        os.waitpid(pid, 0)
        w.log_memory(5)
        w.close()
    """, str(tmp_path), timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert steps_of(tmp_path / "run", RSS) == [0, 5]
    assert steps_of(tmp_path / "run", "Loss/train") == []
    (line,) = tbmem_lines(done.stderr)
    assert line.startswith("tbmem: add_scalar() in a process forked from the one that opened the MemoryWriter for ")


_DATALOADER_JOB = """
    import os, sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    from tbmem import MemoryWriter
    from tbmem._internal import _signals

    # a finish that takes a while (a slow network filesystem): a worker dies of the same SIGTERM meanwhile
    finish = _signals.finish_writer
    def slow_finish(writer, reason):
        time.sleep(1.0)
        finish(writer, reason)
    _signals.finish_writer = slow_finish

    class Data(Dataset):
        def __len__(self):
            return 10**9
        def __getitem__(self, i):
            time.sleep(0.005)
            return torch.zeros(8)

    if __name__ == "__main__":
        w = MemoryWriter(os.path.join(sys.argv[1], "run"), every=5, census_every=0, custom_layout=False)
        loader = DataLoader(Data(), batch_size=4, num_workers=2)
        batches = iter(loader)
        print("workers", *[p.pid for p in batches._workers], flush=True)
        for step, batch in enumerate(batches):
            w.add_scalar("Loss/train", float(batch.sum()), step)
            w.log_memory(step)
            print("step", step, flush=True)
"""


def test_sigterm_to_a_job_with_dataloader_workers_ends_it_by_sigterm(tmp_path):
    # the scheduler signals every process of the job; DataLoader's SIGCHLD handler raised inside
    # tbmem's SIGTERM handler when a worker died first: exit status 1 and a traceback
    proc = start_child(_DATALOADER_JOB, str(tmp_path))
    lines = wait_for_line(proc, lambda line: line == "step 12")
    workers = [int(pid) for pid in next(x for x in lines if x.startswith("workers")).split()[1:]]
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # tbmem's handler is finishing the writer
    for pid in workers:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    out, err = finish(proc)
    assert proc.returncode == -signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err
    (line,) = tbmem_lines(err)
    final = int(line.split("final record at step ")[1].split()[0])
    assert steps_of(tmp_path / "run", RSS)[-1] == final
