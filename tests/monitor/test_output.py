"""The output helper (where lines go) and the number/loss rendering rules."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from tbmem._internal.monitor import MemoryMonitor, emit, redirect_output, set_output, silence_output
from tbmem._internal.monitor.formatting import NA, format_delta, format_loss, format_mb, loss_value, tag_name


def test_default_goes_to_stdout_at_call_time(capsys):
    emit("one", "two")
    assert capsys.readouterr().out == "one\ntwo\n"


def test_module_target_then_monitor_file_precedence(capsys):
    module_target, own = io.StringIO(), io.StringIO()
    with redirect_output(module_target):
        emit("to module")
        emit("to own", file=own)
    emit("back to stdout")
    assert module_target.getvalue() == "to module\n"
    assert own.getvalue() == "to own\n"
    assert capsys.readouterr().out == "back to stdout\n"


def test_silence_wins_over_everything(capsys):
    own = io.StringIO()
    with silence_output():
        emit("x", file=own)
        MemoryMonitor.print_memory_usage("silenced")
    assert own.getvalue() == "" and capsys.readouterr().out == ""


def test_set_output_rejects_a_non_stream():
    with pytest.raises(ValueError, match="file"):
        set_output(42)  # type: ignore[arg-type]


def test_a_broken_stream_is_reported_once_not_raised(tbmem_log):
    closed = io.StringIO()
    closed.close()
    emit("a", file=closed)
    emit("b", file=closed)
    messages = [r.getMessage() for r in tbmem_log.records]
    assert len(messages) == 1 and "could not write" in messages[0]


def test_megabytes_are_binary_and_missing_is_na():
    assert format_mb(int(23.1 * 2**20)) == "23.1 MB"
    assert format_mb(5 * 2**20, ".0f", "MB") == "5MB"
    assert format_mb(None) == NA == "n/a"
    assert format_delta(-3 * 2**20) == "-3.0 MB"
    assert format_delta(19 * 2**20, "MB") == "+19.0MB"


@pytest.mark.parametrize(
    ("loss", "text", "value"),
    [
        (0.00531, "0.005310", 0.00531),
        (3, "3.000000", 3.0),
        (torch.tensor(0.25), "0.250000", 0.25),
        (torch.tensor([[0.5]]), "0.500000", 0.5),
        (torch.tensor([0.1, 0.3]), "0.200000 (mean of 2)", 0.2),
        (np.float32(0.75), "0.750000", 0.75),
        (np.array([1.0, 2.0, 3.0]), "2.000000 (mean of 3)", 2.0),
        (1.23456e-7, "1.234560e-07", 1.23456e-7),
        (0.0, "0.000000", 0.0),
    ],
)
def test_loss_formats(loss, text, value):
    assert format_loss(loss) == text
    assert loss_value(loss) == pytest.approx(value)


def test_loss_requiring_grad_and_phiml_tensors():
    assert format_loss(torch.tensor(0.5, requires_grad=True) * 2) == "1.000000"
    math = pytest.importorskip("phiml.math")
    assert format_loss(math.tensor(288.75)) == "288.750000"  # exact in float32
    batched = math.tensor([1.0, 2.0, 6.0], math.batch("b"))
    assert format_loss(batched) == "3.000000 (mean of 3)"
    assert loss_value(batched) == pytest.approx(3.0)


def test_unconvertible_loss_falls_back_to_str():
    assert format_loss("diverged") == "diverged"
    assert loss_value("diverged") is None
    assert format_loss(None) == NA


def test_tag_names_are_sanitised():
    assert tag_name("data loading") == "data_loading"
    assert tag_name("start→data_to_gpu") == "start_data_to_gpu"
    assert tag_name("  ") == "unnamed"
