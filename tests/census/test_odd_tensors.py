"""Tensors without a storage of their own (issue 26, item 6): MKL-DNN (oneDNN) tensors hold memory too.

``t.to_mkldnn()`` (and the weights inductor prepacks for CPU inference with ``freezing=True``) keep their
memory in oneDNN, not in a torch storage: the census counted them 0, with a note. Expected bytes come
from the tensors the test makes.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from tbmem._internal.census import take_census

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def test_mkldnn_tensors_count_their_bytes() -> None:
    gc.collect()
    dense = torch.randn(64, 32)
    packed = dense.to_mkldnn()
    assert packed.layout == torch._mkldnn
    census = take_census()
    rows = [(r.category, r.bytes, r.device, r.shape) for r in census.records if r.bytes == packed.numel() * 4
            and r.shape == (64, 32)]
    assert ("other", 64 * 32 * 4, "cpu", (64, 32)) in rows
    assert len(rows) == 2  # the dense tensor and its oneDNN copy: two blocks of memory
    assert census.notes == []


def test_a_mkldnn_parameter_counts_as_parameters() -> None:
    gc.collect()
    layer = nn.Module()
    layer.weight = nn.Parameter(torch.randn(48, 16).to_mkldnn(), requires_grad=False)
    census = take_census(models=[layer])
    assert census.by_category["parameters"] == layer.weight.numel() * layer.weight.element_size() == 48 * 16 * 4
