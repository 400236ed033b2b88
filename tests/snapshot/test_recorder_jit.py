"""The dispatch recorder must not break traced code (PhiFlow's jit_compile traces its steps)."""

from __future__ import annotations

import warnings

import pytest
import torch

from tbmem._internal.snapshot.recorder import DispatchRecorder


def _scaled(x: torch.Tensor) -> torch.Tensor:
    # Python numbers in traced code become "wrapped number" tensors, which reach a Python
    # dispatch mode as plain floats; torch then rejects them where the schema wants a Tensor.
    return x * 0.0024 + 1.0


def _scalar_read(x: torch.Tensor) -> torch.Tensor:
    return x * float(torch.equal(x, x * 1.0))


@pytest.mark.parametrize("fn", [_scaled, _scalar_read])
def test_traced_code_runs_while_recording(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace is deprecated; PhiFlow still uses it
        traced = torch.jit.trace(fn, torch.ones(4), check_trace=False)
    expected = fn(torch.arange(4.0))
    recorder = DispatchRecorder()
    recorder.start()
    try:
        result = traced(torch.arange(4.0))
    finally:
        recorder.stop()
    assert torch.equal(result, expected)
    assert recorder.failed is None


def test_the_users_own_errors_still_propagate():
    recorder = DispatchRecorder()
    recorder.start()
    try:
        with pytest.raises(RuntimeError, match="inconsistent tensor size"):
            torch.ones(3) @ torch.ones(4)
    finally:
        recorder.stop()
