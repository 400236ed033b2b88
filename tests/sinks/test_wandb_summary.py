"""W&B's run summary means what the sink's ``define_metric`` says: a scalar tag's maximum, dotted names
(``Memory/Tensor_Module/model.encoder_MB``) included, and a census table's summary the table itself."""

from __future__ import annotations

import json
from pathlib import Path

from tbmem._internal.sinks import WandbSink
from tbmem._internal.tags import TAGS

from ._readers import wandb_records, wandb_run_files


def _summary(path: str) -> dict[tuple[str, ...], object]:
    """The run's final summary as W&B's core wrote it: ``{key path: value}``, the last update of each."""
    out: dict[tuple[str, ...], object] = {}
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                out[tuple(item.nested_key) or (item.key,)] = json.loads(item.value_json)
            for item in record.summary.remove:
                out.pop(tuple(item.nested_key) or (item.key,), None)
    return out


def test_summary_holds_the_max_of_dotted_tags_and_the_census_table(tmp_path: Path, offline: dict) -> None:
    dotted = TAGS["census_module"].tag.format(name="model.encoder")
    plain = TAGS["census_module"].tag.format(name="head")
    census = TAGS["census_text"].tag
    sink = WandbSink(name="summary")
    for step, mb in ((0, 1.0), (10, 7.5), (20, 2.0)):  # the peak is not the last value
        sink.log({dotted: mb, plain: mb / 2}, step=step)
    sink.log_text(census, "| # | name | MB |\n|---|---|---|\n| 1 | model.encoder.weight | 7.5 |", step=20)
    sink.close()

    (wandb_file,) = wandb_run_files(offline["wandb_dir"])
    summary = _summary(wandb_file)
    assert summary[(dotted,)] == {"max": 7.5}, summary.get((dotted,))
    assert summary[(plain,)] == {"max": 3.75}
    # the table's summary is the table (W&B's reference to its file), not a max of each of its fields
    table_fields = {key[1]: value for key, value in summary.items() if key[0] == census and len(key) == 2}
    assert table_fields["_type"] == "table-file" and table_fields["nrows"] == 1, table_fields
    assert not any(isinstance(v, dict) and "max" in v for v in table_fields.values()), table_fields
