import re
from pathlib import Path

import pytest

from tbmem.tags import TAGS, markdown_table, tag_for, to_unit

README = Path(__file__).resolve().parents[1] / "README.md"


def test_tags_are_unique_and_name_their_unit():
    tags = [t.tag for t in TAGS.values()]
    assert len(tags) == len(set(tags))
    suffix = {"GB": "_GB", "MB": "_MB", "ms": "_ms", "s": "_s", "%": "percent"}
    for t in TAGS.values():
        if t.unit in suffix:
            assert t.tag.endswith(suffix[t.unit]), t.tag


def test_design_document_tags_are_kept():
    for tag in ("Memory/vram_allocated_GB", "Memory/vram_reserved_GB", "Memory/vram_percent",
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
