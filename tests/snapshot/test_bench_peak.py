"""benchmarks/bench_snapshot.py reports the peak memory of the command it measures, not the one Linux
carries over (``ru_maxrss`` survives fork and exec) from the process that made the pickle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="VmHWM is Linux's")
def test_the_command_peak_is_its_own_after_a_larger_parent():
    script = textwrap.dedent("""
        import json, resource, sys
        sys.path.insert(0, sys.argv[1])
        big = bytearray(600 * 2**20)
        big[::4096] = b"x" * len(big[::4096])  # resident: the generating process's peak, 600 MiB
        del big
        from benchmarks.bench_snapshot import _run
        wall, cpu, peak_gib, out = _run(["tags"])
        print(json.dumps({"parent_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                          "command_gib": peak_gib, "printed": "Memory/RAM/process_rss_GB" in out}))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["printed"] and got["parent_gib"] > 0.58
    assert 0.01 < got["command_gib"] < 0.45, got  # `tbmem tags` alone; ru_maxrss said >= 0.58
