"""Tensors no model, optimizer or graph names are named after what holds them (issue 24, item 6).

``other`` was 72% of the demo's census, 9 of its 10 largest tensors named just ``Tensor``. Each test
holds its tensors where a user would, and expects the path a user would write.
"""

from __future__ import annotations

import gc

import torch
from torch import nn

from tbmem._internal.census import take_census


class Trainer:
    def __init__(self) -> None:
        self.model = nn.Sequential(nn.Linear(8, 8))
        self.model.cache = torch.zeros(1_501)  # a plain attribute of a module: neither parameter nor buffer
        self.val_batch = {"x": torch.zeros(1_502), "y": torch.zeros(1_503)}

    def fit(self) -> dict[int, str]:
        return _names(take_census(models=[self.model]))


class Data:
    def __init__(self) -> None:
        self.cache = [torch.zeros(100 + i) for i in range(5)]


def _names(census) -> dict[int, str]:
    return {r.bytes: r.name for r in census.records if r.category == "other"}


def test_anonymous_tensors_are_named_after_the_path_that_holds_them() -> None:
    gc.collect()
    trainer = Trainer()
    data = Data()
    batch = torch.zeros(1_504)
    names = _names(take_census(models=[trainer.model]))
    assert names[1_502 * 4] == "trainer.val_batch['x']" and names[1_503 * 4] == "trainer.val_batch['y']"
    assert names[1_501 * 4] == "trainer.model.cache"  # a submodule's attribute, as a user writes it
    assert names[103 * 4] == "data.cache[3]"
    assert names[1_504 * 4] == "batch"
    del batch, data


def test_inside_a_method_the_outer_variable_names_it_and_self_reads_as_its_class() -> None:
    gc.collect()
    trainer = Trainer()
    assert trainer.fit()[1_502 * 4] == "trainer.val_batch['x']"  # the outermost frame's name for it
    alone = Trainer().fit()  # held only by ``self`` inside fit()
    assert alone[1_502 * 4] == "Trainer.val_batch['x']"
    del trainer


def test_a_name_follows_the_tensor_from_census_to_census() -> None:
    gc.collect()
    holder = {"first": torch.zeros(2_345)}
    assert _names(take_census())[2_345 * 4] == "holder['first']"
    assert _names(take_census())[2_345 * 4] == "holder['first']"  # the remembered path, followed again
    holder["second"] = holder.pop("first")
    assert _names(take_census())[2_345 * 4] == "holder['second']"  # moved: found again


def test_the_table_names_them_and_explains_blind_spots_in_plain_words() -> None:
    import numpy as np

    gc.collect()
    sims = {3: torch.from_numpy(np.zeros(20_000, dtype=np.float32))}  # the array is held by the tensor only
    text = take_census(numpy_scan="off").to_markdown()
    assert "`sims[3]`" in text
    assert "Blind spots" in text and "foreign_memory_owner_not_found" not in text
    assert "tensors over memory torch did not allocate" in text or "tensor over memory torch did not allocate" in text
