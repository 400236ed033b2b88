"""A new user's first install, measured: ``make demo`` and then ``make install`` (the test stack of
``make test``) in a fresh clone, each phase's time, and the disk each leaves; the record goes to
``benchmarks/install.json``, which the README quotes (``tests/test_first_hour.py`` checks that they agree).

Run with the system Python from the repository root, on a committed tree (the clone is of HEAD)::

    python3 benchmarks/bench_install.py --clone /tmp/fh-clone

Standard library only: nothing is installed when it starts. It uses the machine's pip configuration
(here a local package mirror with torch's CPU wheel on local disk); a download from PyPI adds its time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "install.json"


def disk_bytes(path: Path) -> int:
    """Bytes on disk under ``path`` (``du``'s count: blocks, hard links once)."""
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) * 1024


def timed_make(clone: Path, target: str, log: Path) -> tuple[float, float, dict[str, dict[str, float]]]:
    """Run ``make <target>`` in ``clone`` (output to ``log`` and the console); its wall and CPU seconds
    (its processes', all cores) and each phase's (scripts/phase.py's ``== n/m ...`` and ``done in`` lines)."""
    start, cpu = time.monotonic(), _children_cpu()
    with log.open("wb") as sink:
        proc = subprocess.Popen(["make", target], cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[attr-defined,union-attr]
            sink.write(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    if proc.wait():
        raise SystemExit(f"make {target} failed ({proc.returncode}); see {log}")
    wall, cpu = time.monotonic() - start, _children_cpu() - cpu
    text = log.read_text(errors="replace")
    phases, current = {}, None
    for line in text.splitlines():
        head = re.match(r"^== (\d+/\d+) (.+?) \(usually about", line)
        if head:
            current = f"{head[1]} {head[2]}"
        done = re.match(r"^   done in ([\d.]+) s \(CPU ([\d.]+) s\)", line)
        if done and current:
            phases[current], current = {"wall_s": float(done[1]), "cpu_s": float(done[2])}, None
    return wall, cpu, phases


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    """Measure and write the record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clone", type=Path, default=Path("/tmp/tbmem-install-bench"))
    parser.add_argument("--machine", default="VM, 2 shared cores")
    parser.add_argument("--no-test-install", action="store_true", help="measure make demo only")
    args = parser.parse_args()
    if args.clone.exists():
        shutil.rmtree(args.clone)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(args.clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.clone, capture_output=True,
                            text=True, check=True).stdout.strip()
    load = os.getloadavg()[0]
    wall, cpu, phases = timed_make(args.clone, "demo", args.clone.parent / (args.clone.name + "-demo.log"))
    venv, cache, runs = (disk_bytes(args.clone / p) for p in (".venv", ".cache", "runs"))
    record = {
        "date": datetime.date.today().isoformat(), "commit": commit, "machine": args.machine,
        "load_at_start": round(load, 1),
        "load_at_end": round(os.getloadavg()[0], 1),
        "demo": {"command": "make demo", "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "phases": phases,
                 "venv_bytes": venv, "cache_bytes": cache, "runs_bytes": runs,
                 "total_bytes": venv + cache + runs},
    }
    if not args.no_test_install:
        wall, cpu, phases = timed_make(args.clone, "install", args.clone.parent / (args.clone.name + "-install.log"))
        venv_all = disk_bytes(args.clone / ".venv")
        record["test_install"] = {"command": "make install (make test's install, after make demo)",
                                  "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "phases": phases,
                                  "venv_bytes": venv_all, "load_at_end": round(os.getloadavg()[0], 1),
                                  "added_bytes": venv_all - venv}
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
