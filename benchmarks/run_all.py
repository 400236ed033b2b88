"""Run every ``benchmarks/bench_*.py`` in its own process and print a table of the ratios.

Usage: ``python benchmarks/run_all.py [NAME_SUBSTRING ...]``. Exits non-zero if a benchmark
fails or a ratio exceeds its limit.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

_RESULT = re.compile(r"^RESULT name=(\S+) ratio=(\S+) limit=(\S+)$")


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    scripts = sorted(p for p in here.glob("bench_*.py") if not argv or any(a in p.name for a in argv))
    rows: list[tuple[str, float, str, str]] = []
    failed = False
    for script in scripts:
        print(f"\n=== {script.name}", flush=True)
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        print(proc.stdout, end="")
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            rows.append((script.name, float("nan"), "-", "FAILED"))
            failed = True
            continue
        for line in proc.stdout.splitlines():
            m = _RESULT.match(line.strip())
            if m:
                name, ratio, limit = m.group(1), float(m.group(2)), m.group(3)
                ok = limit == "-" or ratio <= float(limit)
                failed |= not ok
                rows.append((name, ratio, limit, "ok" if ok else "OVER LIMIT"))
    print("\n| benchmark | ratio (candidate / baseline) | limit | verdict |\n|---|---|---|---|")
    for name, ratio, limit, verdict in rows:
        print(f"| {name} | {ratio:.4f} | {limit} | {verdict} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
