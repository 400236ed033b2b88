import re
from pathlib import Path

import pytest

from tbmem._internal.tags import TAGS, markdown_table, tag_for, to_unit

README = Path(__file__).resolve().parents[1] / "README.md"


def test_tags_are_unique_and_name_their_unit():
    tags = [t.tag for t in TAGS.values()]
    assert len(tags) == len(set(tags))
    suffix = {"GB": "_GB", "MB": "_MB", "ms": "_ms", "s": "_s", "%": "percent"}
    for t in TAGS.values():
        if t.unit in suffix:
            assert t.tag.endswith(suffix[t.unit]), t.tag


def test_design_document_tags_are_kept():
    for tag in ("Memory/GPU/vram_allocated_GB", "Memory/GPU/vram_reserved_GB", "Memory/GPU/vram_percent",
                "Memory/fragmentation_percent", "Memory/Large_Tensors/count", "Memory/Large_Tensors/total_MB"):
        assert tag in {t.tag for t in TAGS.values()}
    assert tag_for("census_category", name="activations") == "Memory/Tensor_Category/activations_MB"
    assert tag_for("census_dtype", name="bfloat16") == "Memory/Tensor_DType/bfloat16_MB"


def test_tag_for_checks_names():
    with pytest.raises(ValueError):
        tag_for("census_category")
    with pytest.raises(ValueError):
        tag_for("vram_allocated", name="x")
    assert to_unit("vram_allocated", 3 * 2**30) == 3.0
    assert to_unit("step_time", 0.25) == pytest.approx(250.0)


def test_readme_shows_the_table_from_the_code():
    text = README.read_text()
    start = text.index("<!-- tags:start -->")
    end = text.index("<!-- tags:end -->")
    assert text[start:end].split("\n", 1)[1].strip() == markdown_table().strip(), (
        "README tag table is stale: regenerate it with `tbmem tags`")
    assert re.search(r"make demo", text) and re.search(r"make test", text)


def test_no_host_reading_under_a_gpu_name():
    from tbmem._internal.tags import x_axis  # noqa: F401 - the table's helpers import

    for t in TAGS.values():
        if re.search(r"gpu|vram", t.tag, re.I):
            assert re.search(r"CUDA|GPU|device|nvml|nvidia", t.when + " " + t.meaning), t.tag
    assert "CPU" not in TAGS["epoch_peak_gpu"].meaning.replace("GPU runs only", "")
    assert TAGS["epoch_peak_rss"].tag == "Monitor/epoch_cpu_peak_rss_MB"


def _tensorboard_order(tags):
    """The Scalars tab's order inside a group: character codes, upper case before lower case."""
    return sorted(tags)


def test_what_a_user_looks_for_first_is_on_the_first_page_of_the_memory_group(tmp_path):
    """A CPU run like the demo: RSS and the six census categories among the Memory group's first 12."""
    import torch

    from tbmem import MemoryWriter
    from tests._events import read_events

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16))
    opt = torch.optim.Adam(model.parameters())
    with MemoryWriter(tmp_path, every=1, census_every=1, snapshot={"every": 1, "window": 1}) as writer:
        writer.watch(model, opt)
        for step in range(3):
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            writer.log_memory(step)
    tags = read_events(tmp_path).Tags()["scalars"]
    memory = _tensorboard_order(t for t in tags if t.split("/")[0] == "Memory")
    first_page = memory[:12]
    assert TAGS["ram_rss"].tag in first_page and TAGS["ram_peak_rss"].tag in first_page
    categories = {tag_for("census_category", c) for c in
                  ("parameters", "gradients", "optimizer_state", "buffers", "activations", "other")}
    assert categories <= set(first_page), first_page
    groups = {t.split("/")[0] for t in tags}
    assert {"System", "Perf", "Snapshot"} <= groups  # the machine, speed and snapshots have groups of their own


def test_renamed_tags_map_to_current_ones():
    from tbmem._internal.tags import RENAMED, current_tag

    current = {t.tag for t in TAGS.values()}
    for old, new in RENAMED.items():
        assert new in current and old not in current
    assert current_tag("Memory/Operation/x_gpu_delta_MB") == "Monitor/Operation/x_gpu_delta_MB"
    assert current_tag("Memory/RAM/process_rss_GB") == "Memory/RAM/process_rss_GB"
