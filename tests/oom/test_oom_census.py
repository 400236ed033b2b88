"""Live memory at an out-of-memory error by category, from a census taken at the error (it allocates host
memory only): in the stderr block, the run's text tab and ``tbmem snapshot stats --json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tbmem._internal.oom.census import census_doc, elsewhere, on_device
from tbmem._internal.oom.explain import explain_device
from tbmem._internal.oom.text import explanation_text
from tbmem._internal.snapshot.readers import load_snapshot
from tbmem._internal.tags import TAGS
from tests._events import texts

GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def oom_run(tmp_path_factory):
    """The child's logdir and its own count of parameters, gradients and optimizer state."""
    logdir = tmp_path_factory.mktemp("oom") / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-W", "error", "-m", "tests.oom._census_child", str(logdir)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    counted = json.loads(done.stdout.strip().splitlines()[-1])
    assert min(counted.values()) > 0
    return logdir, counted, done.stderr


def test_the_block_names_the_categories_the_test_counted(oom_run):
    _logdir, counted, stderr = oom_run
    [block] = [b for b in stderr.split("tbmem: out of memory at step")[1:]]
    assert "live on cuda:0 by category (census at the error): no tensor found; unattributed (allocated, no " \
           "tensor found for it) 3.0 GiB" in block  # the fake device's 3 GiB allocated: no CPU tensor is on it
    line = next(x for x in block.splitlines() if x.startswith("  census on cpu: "))
    from tbmem._internal.snapshot.units import format_bytes
    for cat in ("parameters", "gradients", "optimizer_state"):
        assert f"{cat} {format_bytes(counted[cat])}" in line


def test_the_text_tab_and_stats_json_carry_the_census(oom_run):
    logdir, counted, _stderr = oom_run
    [(step, text)] = texts(logdir, TAGS["oom_text"].tag)
    assert step == 5 and "census on cpu: " in text
    [gz] = sorted(logdir.rglob("*oom*.json.gz"))
    doc = load_snapshot(gz).meta["oom_census"]
    assert {c: doc["devices"]["cpu"][c] for c in counted} == counted  # the exact bytes, not rounded
    out = subprocess.run([sys.executable, "-m", "tbmem", "snapshot", "stats", "--json", str(gz)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    [oom] = [o for d in json.loads(out)["devices"] for o in d["ooms"]]
    assert oom["census"]["unattributed"] == 3 * GiB and oom["census"]["parameters"] == 0
    assert {c: oom["census_elsewhere"]["cpu"][c] for c in counted} == counted


def test_census_doc_counts_each_device_and_category():
    class R:
        def __init__(self, device, category, nbytes):
            self.device, self.category, self.bytes = device, category, nbytes

    class C:
        records = [R("cuda:0", "parameters", 4096), R("cuda:0", "gradients", 4096), R("cuda:0", "parameters", 512),
                   R("cpu", "other", 64)]
        unattributed_bytes = 1000
        duration_s = 0.01

    doc = census_doc(C(), device="cuda:0")
    assert on_device(doc, "cuda:0") == {"parameters": 4608, "gradients": 4096, "optimizer_state": 0, "buffers": 0,
                                        "activations": 0, "other": 0, "unattributed": 1000}
    assert elsewhere(doc, "cuda:0") == {"cpu": {"other": 64}}
    # a file's values are not trusted: what is not an integer is dropped
    assert on_device({"devices": {"cuda:0": {"parameters": "x", "other": True}}}, "cuda:0")["parameters"] == 0


def test_the_advice_to_free_memory_names_the_largest_category():
    from tbmem._internal.snapshot.model import SEG_LARGE, Device
    a = {"start": np.array([-1]), "end": np.array([-1]), "size": np.array([18 << 20]), "addr": np.array([1 << 30]),
         "stack": np.array([-1]), "category": np.array([0]), "flags": np.array([0]), "freereq": np.array([-1]),
         "round": np.array([0])}
    s = {"addr": np.array([1 << 30]), "size": np.array([20 << 20]), "start": np.array([-1]), "end": np.array([-1]),
         "stream": np.array([0]), "pool": np.array([0]), "stack": np.array([-1]), "flags": np.array([SEG_LARGE])}
    dev = Device(name="cuda:0", time_us=np.zeros(0, dtype=np.int64), allocs=a, segs=s, streams=[0], pools=[[0, 0]])
    census = {"devices": {"cuda:0": {"optimizer_state": 12 << 20, "parameters": 6 << 20}}}
    x = explain_device(dev, {"requested_bytes": 8 << 20, "free_bytes": 0}, categories=["python code"], strings=[],
                       frames=[], stacks=[], census=census)
    assert x.verdict == "device_full"
    [reduce] = [adv for adv in x.advice if adv["kind"] == "reduce_live"]
    assert reduce["text"].endswith("the largest category is optimizer_state (12.0 MiB)")
    assert "live on cuda:0 by category (census at the error): optimizer_state 12.0 MiB, parameters 6.0 MiB" in \
        explanation_text(x)
