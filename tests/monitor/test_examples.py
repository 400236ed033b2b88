"""The runnable examples (one function per approach of the two guides) run as scripts, print the
documented formats and write TensorBoard scalars."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._events import read_events

ROOT = Path(__file__).resolve().parents[2]
NUM = r"\d+\.\d"


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error"}
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _section(out: str, number: int) -> list[str]:
    match = re.search(rf"^=== {number}\. .*? ===$\n(.*?)(?=^=== |\Z)", out, re.M | re.S)
    assert match, f"section {number} missing"
    return [line for line in match.group(1).splitlines() if line]


def test_memory_examples(tmp_path):
    proc = _run("memory_monitoring_examples.py", "--logdir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    first = _section(out, 1)
    assert first[0] == "Memory monitoring enabled (verbose for first 3 batches)"
    batches = [line for line in first if line.startswith("Batch ")]
    assert len(batches) == 6 and all(
        re.fullmatch(rf"Batch [0-2]: GPU n/a, CPU {NUM} MB, loss=\d+\.\d{{6}}", b) for b in batches)
    assert sum(re.fullmatch(rf"Epoch end: GPU n/a, CPU {NUM} MB, peak CPU {NUM} MB", x) is not None
               for x in first) == 2
    assert re.fullmatch(rf"\[Memory\] loading dataset: CPU [+-]{NUM} MB, GPU n/a", _section(out, 2)[0])
    assert re.fullmatch(rf" {{9}}Peak CPU: {NUM} MB", _section(out, 2)[1])
    assert _section(out, 3)[0].startswith("[Memory] training epoch: CPU ")
    profile = _section(out, 4)
    assert profile.count("Memory profile:") == 2  # disabled after 2 batches
    assert all(re.fullmatch(rf"  \w+ → \w+: GPU n/a, CPU {NUM} MB \([+-]{NUM} MB\)", x)
               for x in profile if x != "Memory profile:")
    manual = _section(out, 5)
    assert re.fullmatch(rf"After model creation: CPU: {NUM} MB \| GPU Allocated: n/a \| GPU Reserved: n/a", manual[0])
    assert "MEMORY CHECKPOINTS" in manual and any(x.startswith("after_training ") for x in manual)
    tags = set(read_events(tmp_path).Tags()["scalars"])
    assert {"Loss/batch", "Monitor/batch_cpu_rss_MB", "Monitor/epoch_cpu_peak_rss_MB",
            "Monitor/Operation/loading_dataset_cpu_delta_MB",
            "Monitor/Operation/start_to_data_to_gpu_cpu_delta_MB"} <= tags
    assert not [t for t in tags if t.endswith(("gpu_peak_MB", "gpu_allocated_MB", "_gpu_delta_MB"))]  # CPU run


def test_performance_examples(tmp_path):
    proc = _run("performance_monitoring_examples.py", "--logdir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    basic = _section(out, 1)
    assert basic[1] == "PERFORMANCE SUMMARY"
    rows = {line[:30].rstrip(): line for line in basic[5:8]}
    assert set(rows) == {"data loading", "preprocessing", "model forward"}
    assert float(rows["data loading"][31:41]) >= 0.03  # it sleeps 30 ms
    assert re.fullmatch(r"TOTAL {25} +\d+\.\d{3}s", basic[9])
    agg = _section(out, 2)
    assert agg[1] == "AGGREGATE STATISTICS (for repeated operations)"
    assert re.match(r"batch_forward {18}10 {7}", agg[5]) and re.match(r"batch_backward {17}10 {7}", agg[6])
    perf = _section(out, 3)
    m = re.fullmatch(rf"\[Performance\] critical_operation: (\d+\.\d{{3}})s, CPU [+-]{NUM}MB, GPU n/a", perf[0])
    assert m and float(m.group(1)) >= 0.02
    assert re.fullmatch(rf" {{14}}CPU peak: {NUM}MB", perf[1])
    assert _section(out, 4)[0].startswith("[Performance] data processing: ")
    loop = _section(out, 5)
    batch = [x for x in loop if x.startswith("Batch ") and not x.startswith("Batch timing")]
    assert len(batch) == 4 and all(
        re.fullmatch(rf"Batch [01]: \d+\.\d{{3}}s, GPU n/a, CPU {NUM}MB, loss=\d+\.\d{{6}}", x) for x in batch)
    assert sum(re.fullmatch(r"Epoch end: \d+\.\d{3}s total, GPU n/a, CPU \d+\.\dMB, peak CPU \d+MB", x) is not None
               for x in loop) == 2
    assert sum(re.fullmatch(r"Batch timing: avg=\d+\.\d{3}s, min=\d+\.\d{3}s, max=\d+\.\d{3}s", x) is not None
               for x in loop) == 2
    assert "BOTTLENECK: model_forward" in "\n".join(_section(out, 6))
    tags = set(read_events(tmp_path).Tags()["scalars"])
    assert {"Perf/batch_time_s", "Perf/epoch_time_s", "Perf/Operation/data_loading_s",
            "Perf/Operation/batch_forward_s", "Perf/Operation/critical_operation_s"} <= tags


def test_examples_reject_an_unknown_approach():
    proc = _run("memory_monitoring_examples.py", "9")
    assert proc.returncode == 2 and "choose from [1, 2, 3, 4, 5]" in proc.stderr


@pytest.mark.gpu
def test_examples_on_a_gpu(tmp_path):
    proc = _run("memory_monitoring_examples.py", "1", "4")
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"^Batch 0: GPU {NUM} MB, CPU {NUM} MB, loss=", proc.stdout, re.M)
    assert re.search(rf"^Epoch end: GPU {NUM} MB allocated, {NUM} MB reserved, peak {NUM} MB$", proc.stdout, re.M)
    assert re.search(rf"^  start → data_to_gpu: GPU {NUM} MB \(\+{NUM} MB\)$", proc.stdout, re.M)


def test_the_memory_writer_quickstart_example_writes_what_the_tab_reads(tmp_path):
    from tbmem._internal.logdir import CensusLog, census_log_path

    proc = _run("memory_writer_quickstart.py", "--logdir", str(tmp_path), "--steps", "21")
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {tmp_path}/quickstart" in proc.stdout and "http://127.0.0.1:6006/#tbmem" in proc.stdout
    events = read_events(tmp_path / "quickstart")
    assert [e.step for e in events.Scalars("Loss/batch")] == list(range(21))
    assert [e.step for e in events.Scalars("Memory/RAM/process_rss_GB")] == [0, 5, 10, 15, 20]
    censuses = CensusLog().read(census_log_path(str(tmp_path / "quickstart")))
    assert sorted(censuses) == [0, 10, 20]
    assert censuses[10]["by_category"]["parameters"] == sum(4 * n for n in (8 * 9, 8, 10 * 8 * 14 * 14, 10))
