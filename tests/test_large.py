"""The large-tensor threshold: relative to the run when the user sets none, said in the census table."""

from __future__ import annotations

import json

import torch

from tbmem import MemoryWriter
from tbmem._internal._large import AUTO_CAP_BYTES, LargeThreshold
from tbmem._internal.tags import TAGS
from tests._events import scalars, texts


def _two_censuses(log_dir, **options):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))  # 17 KiB of parameters
    with MemoryWriter(log_dir, every=1, census_every=1, custom_layout=False, **options) as writer:
        writer.watch(model)
        writer.log_memory(0, where="at the test's first record")
        model.extra = torch.nn.Linear(256, 256)  # the second census is larger: the threshold stays
        writer.log_memory(1)
    side = [json.loads(line) for line in (log_dir / "plugins" / "tbmem" / "census.jsonl").read_text().splitlines()]
    return side


def test_without_a_threshold_the_largest_tensors_of_a_small_model_count(tmp_path):
    side = _two_censuses(tmp_path)
    first, second = side
    assert first["large_tensor_bytes"] == int(first["total_bytes"] * 0.01)
    assert second["large_tensor_bytes"] == first["large_tensor_bytes"]  # fixed at the first census
    assert first["large_count"] >= 2  # the two weight matrices: 16 KiB and 2 KiB of a ~18 KiB census
    count = scalars(tmp_path, TAGS["large_count"].tag)
    assert [c for _, c in count] == [first["large_count"], second["large_count"]] and count[0][1] > 0
    (_, text), _ = texts(tmp_path, "Memory/Large_Tensors/top_k")
    assert "at or above the large-tensor threshold of" in text
    assert "(auto: 1% of the first census's" in text and "set large_tensor_mb to fix it" in text
    assert "Taken at the test's first record." in text


def test_a_threshold_the_user_sets_is_used_and_named(tmp_path):
    side = _two_censuses(tmp_path, large_tensor_mb=100)
    assert [s["large_tensor_bytes"] for s in side] == [100 * 2**20] * 2
    assert [s["large_count"] for s in side] == [0, 0]
    (_, text), (_, later) = texts(tmp_path, "Memory/Large_Tensors/top_k")
    assert "threshold of 100 MB (large_tensor_mb=100)" in text
    assert "Taken where the training loop called log_memory." in later


def test_the_relative_threshold_is_capped_at_the_design_documents_100_mb():
    assert LargeThreshold(None).choose(total_bytes=80 * 2**30)[0] == AUTO_CAP_BYTES
    empty = LargeThreshold(None)
    assert empty.choose(total_bytes=0)[0] == 1  # nothing counted yet: decided at the next census
    assert empty.choose(total_bytes=10_000)[0] == 100
