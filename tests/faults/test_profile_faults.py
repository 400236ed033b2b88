"""A profile window that fails is reported once and training goes on (docs/reliability.md)."""

from __future__ import annotations

import os

from tbmem._internal.logdir.traces import list_traces
from tests.faults._child import run_child, steps_of, tbmem_lines

RSS = "Memory/RAM/process_rss_GB"

_LOOP = """
import os, sys, torch
from tbmem import MemoryWriter
run = sys.argv[1]
model = torch.nn.Linear(64, 64)
w = MemoryWriter(run, every=1, census_every=0, custom_layout=False,
                 profile={"every": 5, "steps": 2, "start": 5})
def steps(a, b):
    for step in range(a, b):
        model(torch.randn(8, 64)).sum().backward()
        w.log_memory(step)
"""


def test_the_users_own_profiler_is_left_alone(tmp_path):
    # torch keeps one profiler session per process: a window started and stopped inside the user's
    # own profiler would end it, so the window is skipped, said once
    proc = run_child(_LOOP + """
with torch.profiler.profile() as own:
    steps(0, 30)
w.close()
print("finished", sum(a.count for a in own.key_averages() if a.key == "aten::addmm"), flush=True)
""", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert "finished 30" in proc.stdout  # every step's Linear, in the user's profile
    assert "Traceback" not in proc.stderr
    lines = tbmem_lines(proc.stderr)
    assert len(lines) == 1 and "is skipped: another torch.profiler is running" in lines[0], lines
    assert steps_of(tmp_path / "run", RSS) == list(range(30))
    assert list_traces(str(tmp_path / "run")) == []


def test_profiler_unavailable_is_one_line_and_training_goes_on(tmp_path):
    # a torch without Kineto cannot be installed here: its failure to start is what is planted
    proc = run_child("""
import torch.profiler
def unavailable(self):
    raise RuntimeError("Kineto is not available")
torch.profiler.profile.start = unavailable
""" + _LOOP + """
steps(0, 30)
w.close()
print("finished", flush=True)
""", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert "finished" in proc.stdout and "Traceback" not in proc.stderr
    lines = tbmem_lines(proc.stderr)
    assert len(lines) == 1 and "starting torch.profiler failed; profile windows are off" in lines[0], lines
    assert "Kineto is not available" in lines[0]
    assert steps_of(tmp_path / "run", RSS) == list(range(30))
    assert list_traces(str(tmp_path / "run")) == []


def test_full_disk_drops_the_trace_and_training_goes_on(mounts):
    disk = mounts("tmpfs", size_kb=1024)
    proc = run_child(_LOOP + """
steps(0, 4)
w.flush()
filler = os.path.join(os.path.dirname(run), "filler")
fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
try:
    while True:
        os.write(fd, b"\\0" * 4096)
except OSError:
    pass
os.close(fd)
steps(4, 12)
os.unlink(filler)
w.close()
print("finished", flush=True)
""", str(disk / "run"))
    assert proc.returncode == 0, proc.stderr
    assert "finished" in proc.stdout and "Traceback" not in proc.stderr
    lines = [line for line in tbmem_lines(proc.stderr) if "profile" in line]
    assert len(lines) == 1 and "No space left on device" in lines[0], tbmem_lines(proc.stderr)
    plugin = disk / "run" / "plugins" / "tbmem"
    assert not plugin.exists() or not [n for n in os.listdir(plugin) if "trace" in n]  # no partial file
