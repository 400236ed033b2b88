"""Hints, each on a real run built to need it (CUDA through the fake device); numbers checked against the
readings written; `tbmem report` prints them; the module imports no torch."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
import torch

from tbmem import MemoryWriter
from tbmem.analysis import load_scalars
from tbmem._internal.analysis.hints import HINT_KINDS, find_hints, format_hints
from tbmem._internal.analysis.table import format_bytes
from tbmem._internal.cli import main
from tbmem._internal.forecast.budget import cpu_budget, cuda_budget
from tbmem._internal.forecast.report import FORECAST_TEXT_TAG
from tests.fake_cuda import FakeCuda, install_fake_cuda

GiB = 2**30
MB = 2**20


def _value(logdir, tag, step=None):
    df = load_scalars(logdir)
    rows = df[df["tag"] == tag]
    if step is not None:
        rows = rows[rows["step"] == step]
    return float(rows["value"].iloc[-1])


def _by_kind(hints):
    return {h.kind: h for h in hints}


def test_activations_dominating_the_peak(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with MemoryWriter(tmp_path, every=5, census_every=5, custom_layout=False) as w:
        w.watch(model, opt)
        for step in range(10):
            loss = model(torch.randn(4096, 64)).square().mean()
            w.log_memory(step, roots=(loss,))  # mid-step, as the trainers do: activations are alive
            opt.zero_grad()
            loss.backward()
            opt.step()
    hint = _by_kind(find_hints(tmp_path))["activation_checkpointing"]
    acts = _value(tmp_path, "Memory/Tensor_Category/activations_MB", hint.step)
    total = _value(tmp_path, "Memory/Tensor_Census/total_MB", hint.step)
    assert acts >= 0.5 * total and acts > 30  # 4096 x 1024 float32 activations: 16 MB each
    assert hint.saving_mb == pytest.approx(acts / 2)
    # sizes written as the report's table writes them (binary units that fit), never "MB" beside "MiB"
    assert f"saving about {format_bytes(acts / 2 * MB)}" in hint.advice and "torch.utils.checkpoint" in hint.advice
    assert not re.search(r"\d MB\b", hint.advice + hint.evidence)
    assert "activation_checkpointing" not in _by_kind(find_hints(tmp_path, min_saving_mb=acts))  # not worth it


def _adam_run(logdir, dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048)).to(dtype)
    opt = torch.optim.Adam(model.parameters())
    with MemoryWriter(logdir, every=2, census_every=2, custom_layout=False) as w:
        w.watch(model, opt)
        for step in range(4):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(8, 2048, dtype=dtype)).square().mean().backward()
            opt.step()
            w.log_memory(step)


def test_fp32_optimizer_state(tmp_path):
    _adam_run(tmp_path, torch.float32)
    hint = _by_kind(find_hints(tmp_path))["optimizer_precision"]
    state = _value(tmp_path, "Memory/Tensor_Category/optimizer_state_MB", hint.step)
    df = load_scalars(tmp_path)
    dtypes = df[(df["step"] == hint.step) & df["tag"].str.startswith("Memory/Tensor_DType/")]
    others = float(dtypes[dtypes["tag"] != "Memory/Tensor_DType/float32_MB"]["value"].sum())
    assert state == pytest.approx(2 * 2 * (2048 * 2048 + 2048) * 4 / MB, rel=0.01)  # exp_avg, exp_avg_sq
    assert hint.data["float32_lower_bound_mb"] == pytest.approx(state - others)
    assert hint.saving_mb == pytest.approx((state - others) / 2)
    assert "bfloat16 would save" in hint.advice


def test_bf16_optimizer_state_gets_no_precision_hint(tmp_path):
    _adam_run(tmp_path, torch.bfloat16)  # Adam keeps its moments in the parameters' dtype
    assert "optimizer_precision" not in _by_kind(find_hints(tmp_path))


def test_fragmentation_with_retries_suggests_expandable_segments(tmp_path, monkeypatch):
    fake = install_fake_cuda(monkeypatch, FakeCuda(allocated=2 * GiB, reserved=5 * GiB, retries=0))
    with MemoryWriter(tmp_path, every=10, census_every=0, custom_layout=False) as w:
        for step in range(100):
            fake.retries = step // 20  # the allocator keeps retrying
            w.log_memory(step)
    hint = _by_kind(find_hints(tmp_path))["expandable_segments"]
    assert hint.data["fragmentation_percent"] == pytest.approx(60.0)
    assert hint.saving_mb == pytest.approx(3 * 1024)
    assert hint.data["retries"] == 4 and hint.data["retries_rise"] == 4
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in hint.advice


def test_fragmentation_without_retries_gets_no_hint(tmp_path, monkeypatch):
    install_fake_cuda(monkeypatch, FakeCuda(allocated=2 * GiB, reserved=5 * GiB, retries=0))
    with MemoryWriter(tmp_path, every=10, census_every=0, custom_layout=False) as w:
        for step in range(50):
            w.log_memory(step)
    assert "expandable_segments" not in _by_kind(find_hints(tmp_path))


def test_growing_other_names_the_growing_storage(tmp_path):
    history = torch.zeros(0, 256)
    with MemoryWriter(tmp_path, every=10, census_every=10, custom_layout=False) as w:
        for step in range(200):
            history = torch.cat([history, torch.randn(64, 256)])  # a buffer that only grows
            w.log_memory(step)
    hint = _by_kind(find_hints(tmp_path))["growing_other"]
    assert hint.data["slope_mb_per_1k"] > 5.0
    shapes = [r["shape"] for r in hint.data["new_storages"]]
    assert f"{191 * 64}x256" in shapes  # the buffer as the last census (step 190) saw it
    assert "Storages in the census's largest-tensor table" in hint.advice


def test_growing_other_of_one_repeated_shape(tmp_path):
    kept = []
    with MemoryWriter(tmp_path, every=10, census_every=10, custom_layout=False) as w:
        for step in range(200):
            kept.append(torch.randn(64, 512))  # outputs stored for later
            w.log_memory(step)
    hint = _by_kind(find_hints(tmp_path))["growing_other"]
    # the rows are named after their holder (kept[0], kept[1], ...: one holder) or, unnamed, by their type
    assert re.search(r"full of `(kept\[\.\.\.\]|Tensor)` 64x512 float32 on cpu \(12\d KiB each, \d+ of its 10 rows\)",
                     hint.advice)


def test_headroom_from_a_logged_forecast(tmp_path):
    from tbmem.forecast import fit

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.Adam(model.parameters())

    def step(x):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    forecast = fit(step, lambda n: torch.randn(n, 64), batch_sizes=(8, 16, 32), model=model, optimizer=opt)
    with MemoryWriter(tmp_path, every=5, census_every=0, custom_layout=False) as w:
        w.add_text(FORECAST_TEXT_TAG, forecast.to_markdown(at=[32], budget_bytes=2**30, in_use=32), 0)
        for s in range(10):
            step(torch.randn(32, 64))
            w.log_memory(s)
    hint = _by_kind(find_hints(tmp_path))["batch_headroom"]
    available = _value(tmp_path, "System/ram_available_GB")
    budget = cpu_budget(available=int(available * GiB), resident=forecast.resident_bytes).bytes
    assert hint.data["budget_bytes"] == budget and hint.data["batch_size"] == 32
    assert abs(hint.data["max_batch_size"] - forecast.max_batch_size(budget)) <= 1
    assert "Batch size 32 peaks at" in hint.advice and f"up to {hint.data['max_batch_size']}" in hint.advice


def test_headroom_on_cuda_from_the_peak_and_the_config(tmp_path, monkeypatch):
    fake = install_fake_cuda(monkeypatch, FakeCuda(allocated=2 * GiB, peak_allocated=6 * GiB, reserved=8 * GiB,
                                                   free=60 * GiB, total=80 * GiB))
    model = torch.nn.Linear(1024, 1024)
    with MemoryWriter(tmp_path, every=5, census_every=5, custom_layout=False) as w:
        w.watch(model)
        w.add_text("config", "    " + json.dumps({"trainer_params": {"batch_size": 32}}, indent=1), 0)
        for step in range(10):
            fake.peak_allocated = 6 * GiB
            w.log_memory(step)
    hint = _by_kind(find_hints(tmp_path))["batch_headroom"]
    fixed = _value(tmp_path, "Memory/Tensor_Category/parameters_MB", 5) * MB
    per_sample = (6 * GiB - fixed) / 32
    budget = cuda_budget(free=60 * GiB, reserved=8 * GiB).bytes
    assert hint.data["batch_size"] == 32
    assert hint.data["max_batch_size"] == math.floor((budget - fixed) / per_sample)
    assert "assuming everything but the parameters" in hint.evidence


def test_report_prints_hints_and_puts_them_in_json(tmp_path, capsys):
    _adam_run(tmp_path / "adam", torch.float32)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "HINTS:" in out and "adam: at least" in out and "[optimizer_precision]" in out
    assert main(["report", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (hint,) = [h for h in doc["runs"][0]["hints"] if h["kind"] == "optimizer_precision"]
    assert hint["run"] == "adam" and hint["saving_mb"] > 0


def test_clean_run_has_no_hints_but_says_so(tmp_path):
    with MemoryWriter(tmp_path, every=1, census_every=0, custom_layout=False) as w:
        for step in range(5):
            w.log_memory(step)
    hints = find_hints(tmp_path)
    assert hints == [] and format_hints(hints).startswith("No hints")


def test_hints_import_no_torch():
    code = "import sys, tbmem._internal.analysis.hints; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False"]
    assert set(HINT_KINDS) == {"activation_checkpointing", "optimizer_precision", "expandable_segments",
                               "growing_other", "batch_headroom"}
