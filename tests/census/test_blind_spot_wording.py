"""The foreign-memory blind spot's sentence does not contradict itself (it said the tensors "are counted" and,
under a "Not counted:" label in the Memory tab, that memory "is not counted")."""

from __future__ import annotations

import gc

import numpy as np
import torch

from tbmem._internal.census import take_census


def test_the_foreign_memory_sentence_says_counted_once_only() -> None:
    gc.collect()
    sims = {3: torch.from_numpy(np.zeros(20_000, dtype=np.float32))}  # the array is held by the tensor only
    census = take_census(numpy_scan="off")
    sentence = next(n for n in census.notes if "torch did not allocate" in n)
    assert "in the table" in sentence and "missing from the census" in sentence
    assert "counted" not in sentence  # "counted, but ... not counted" read as a contradiction
    assert sentence in census.to_markdown()
    del sims
