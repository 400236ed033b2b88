"""Memory and time a real ``tensorboard`` spends on hostile files in the Memory tab (docs/reliability.md).

Run: ``.venv/bin/python benchmarks/measure_tab_memory.py --snapshot FILE [--concurrent 4]`` or
``... --census-gib 6``. Set ``PYTHONPATH`` to another checkout to measure its code (the server
inherits it).

``--snapshot``: FILE (a pickle or a tbmem ``.json.gz``) is hard-linked (else copied) into a run
of a fresh logdir; after a warm-up, ``--concurrent`` requests for its page start at once. Printed:
the statuses, the wall time until the last answer, the growth of the server's peak memory
(VmHWM, reset before the requests through ``/proc/PID/clear_refs``) and, sampled every 20 ms,
the conversion processes the server started and the largest peak among them.

``--census-gib``: the run's ``plugins/tbmem/census.jsonl`` gets that many GiB more without a
line end (a sparse file: no disk is used); three ``at`` requests are timed and the growth of
the server's peak memory printed.

Not a ratio benchmark (``run_all.py`` runs only ``bench_*.py``): these numbers are what the
fault table states.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _get(url: str, timeout: float = 600) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            pass
    return out


def _write_run(run: Path) -> None:
    import torch

    from tbmem import MemoryWriter

    model = torch.nn.Linear(8, 8)
    with MemoryWriter(run, every=1, census_every=1, custom_layout=False) as w:
        w.watch(model)
        for step in range(3):
            w.log_memory(step)


def _server(logdir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("tensorboard")
    with open(log, "wb") as sink:
        proc = subprocess.Popen([str(exe), "--logdir", str(logdir), "--load_fast", "false", "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if "r" in json.loads(_get(f"{base}/data/plugin/scalars/tags", 5)[1]):
                return proc, f"{base}/data/plugin/tbmem"
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"tensorboard did not start: {log.read_text()[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--snapshot")
    ap.add_argument("--concurrent", type=int, default=1)
    ap.add_argument("--census-gib", type=float)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tbmem-tab-"))
    try:
        run = tmp / "logs" / "r"
        _write_run(run)
        if args.snapshot:
            target = run / ("snap_step1" + "".join(Path(args.snapshot).suffixes))
            try:
                os.link(args.snapshot, target)
            except OSError:
                shutil.copyfile(args.snapshot, target)
        if args.census_gib:
            with open(run / "plugins" / "tbmem" / "census.jsonl", "ab") as fh:
                fh.truncate(fh.tell() + int(args.census_gib * 2**30))
        proc, url = _server(tmp / "logs", tmp / "tb.log")
        pid = proc.pid
        try:
            _get(f"{url}/at?run=r&step=0") if not args.census_gib else None
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            before = _kb(pid, "VmRSS")
            if args.snapshot:
                sid = json.loads(_get(f"{url}/snapshots?run=r")[1])[0]["id"]
                Path(f"/proc/{pid}/clear_refs").write_text("5")
                before = _kb(pid, "VmRSS")
                stop, peaks = threading.Event(), {}

                def watch() -> None:
                    while not stop.is_set():
                        for child in _children(pid):
                            try:
                                peaks[child] = max(peaks.get(child, 0), _kb(child, "VmHWM"))
                            except OSError:
                                pass
                        time.sleep(0.02)

                watcher = threading.Thread(target=watch)
                watcher.start()
                t = time.monotonic()
                with ThreadPoolExecutor(args.concurrent) as pool:
                    answers = list(pool.map(lambda _: _get(f"{url}/snapshot?run=r&id={sid}"),
                                            range(args.concurrent)))
                wall = time.monotonic() - t
                stop.set()
                watcher.join()
                print(f"snapshot {args.snapshot} ({os.path.getsize(args.snapshot) / 2**20:.1f} MiB), "
                      f"{args.concurrent} at once: statuses {[a[0] for a in answers]}, {wall:.1f} s")
                if answers[0][0] != 200:
                    print("  answer:", answers[0][1][:300].decode("utf-8", "replace"))
                print(f"  server peak memory +{(_kb(pid, 'VmHWM') - before) / 2**20:.0f} MiB; "
                      f"{len(peaks)} conversion process(es), largest peak "
                      f"{max(peaks.values(), default=0) / 2**20:.0f} MiB")
            else:
                times = []
                for _ in range(3):
                    t = time.monotonic()
                    status, _ = _get(f"{url}/at?run=r&step=1")
                    times.append(time.monotonic() - t)
                print(f"census.jsonl + {args.census_gib:g} GiB without a line end: `at` x3, statuses {status}, "
                      f"{', '.join(f'{x:.2f}' for x in times)} s; server peak memory "
                      f"+{(_kb(pid, 'VmHWM') - before) / 2**20:.0f} MiB")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
