"""The sink protocol inside MemoryWriter: names checked, objects called, a failing sink switched off once."""

from __future__ import annotations

import builtins
import gc
from pathlib import Path

import pytest

from tbmem import MemoryWriter, MemoryWriterConfig
from tbmem._internal._extras import MissingExtraError
from tbmem._internal._log import forget_reports
from tbmem._internal.sinks import BackgroundSink, TensorBoardSink
from tbmem._internal.tags import TAGS

from tests._events import texts

from ._readers import same_as_float32, tensorboard_series

RSS = "Memory/RAM/process_rss_GB"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.closed = 0

    def log(self, values, step):
        self.calls.append(("log", dict(values), step))

    def log_text(self, tag, text, step):
        self.calls.append(("text", tag, step))

    def log_artifact(self, path, kind):
        self.calls.append(("artifact", Path(path).name, kind))

    def close(self):
        self.closed += 1


class Broken(Recorder):
    def log(self, values, step):
        raise ConnectionError("no route to host")


def test_a_sink_object_gets_every_record_census_table_and_snapshot(tmp_path: Path) -> None:
    sink = Recorder()
    with MemoryWriter(str(tmp_path / "run"), every=1, census_every=2, sinks=[sink],
                      snapshot={"every": 2, "window": 1}) as w:
        for step in range(4):
            w.add_scalar("Loss/train", 1.0, step)
            w.log_memory(step)
    assert sink.closed == 1
    sent = {}
    for call in sink.calls:
        if call[0] == "log":
            for tag, value in call[1].items():
                sent.setdefault(tag, {})[call[2]] = value
    tb = tensorboard_series(str(tmp_path / "run"))
    assert "Loss/train" not in sent  # the user's own add_scalar: TensorBoard only
    assert sent.keys() == tb.keys() - {"Loss/train"}
    assert all(same_as_float32(sent[tag], tb[tag]) for tag in sent)
    # every text entry of the run (the census tables, the snapshots' file lists) on the same steps: one output path
    sent_texts = sorted((c[1], c[2]) for c in sink.calls if c[0] == "text")
    written = sorted((tag, step) for tag in (TAGS["census_text"].tag, TAGS["snapshot_files_text"].tag)
                     for step, _ in texts(tmp_path / "run", tag))
    assert sent_texts == written
    assert [st for st in sent_texts if st[0] == TAGS["census_text"].tag] == [(TAGS["census_text"].tag, s) for s in (0, 2)]
    assert any(tag == TAGS["snapshot_files_text"].tag for tag, _ in sent_texts)
    artifacts = [c for c in sink.calls if c[0] == "artifact"]
    assert {c[1].rsplit(".", 1)[-1] for c in artifacts} == {"html", "gz"} and {c[2] for c in artifacts} == {"snapshot"}


def test_a_failing_sink_is_one_line_and_switched_off_the_others_go_on(tmp_path: Path, tbmem_log) -> None:
    forget_reports()
    broken, good = Broken(), Recorder()
    with MemoryWriter(str(tmp_path / "run"), every=1, census_every=0, sinks=[broken, good]) as w:
        for step in range(5):
            w.log_memory(step)
    lines = [r.getMessage() for r in tbmem_log.records if "Broken.log failed" in r.getMessage()]
    assert len(lines) == 1 and "no route to host" in lines[0] and "switched off" in lines[0]
    assert broken.closed == 1  # closed once, when it was switched off
    assert sorted({c[2] for c in good.calls if c[0] == "log"}) == list(range(5))
    assert sorted(tensorboard_series(str(tmp_path / "run"))[RSS]) == list(range(5))


def test_background_sink_failure_drops_its_queue_and_reports_once(tbmem_log) -> None:
    forget_reports()

    class Refusing(BackgroundSink):
        name = "refusing"

        def _send(self, items):
            raise RuntimeError("HTTP 429 Too Many Requests")

    sink = Refusing(flush_every_s=0.01)
    for step in range(100):
        sink.log({RSS: 1.0}, step)
    sink.close()
    assert sink.off and "429" in sink.error
    sink.log({RSS: 1.0}, 101)  # ignored once off
    assert len(sink._queue) == 0
    assert sum("refusing sink failed" in r.getMessage() for r in tbmem_log.records) == 1


@pytest.mark.parametrize("bad, message", [
    (["neptune"], "unknown sink 'neptune'"),
    ("wandb", "must be a list"),
    ([object()], "is not a sink"),
])
def test_sink_names_and_objects_are_checked(bad, message) -> None:
    with pytest.raises(ValueError, match=message):
        MemoryWriterConfig(sinks=bad)


def test_a_missing_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(__import__("sys").modules, "wandb", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(MissingExtraError, match=r"pip install 'tbmem\[wandb\]'"):
        MemoryWriter(str(tmp_path / "run"), sinks=["wandb"])
    # the half-built writer left nothing running: the census's gc hook is off again
    from tbmem._internal.census import heap

    assert heap._hook is None
    assert not [cb for cb in gc.callbacks if getattr(cb, "args", ())[:1] == (heap._on_collection,)]


def test_tensorboard_sink_writes_what_the_writer_writes(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    sink = TensorBoardSink(SummaryWriter(str(tmp_path / "copy")))
    with MemoryWriter(str(tmp_path / "run"), every=1, census_every=0, sinks=[sink]) as w:
        for step in range(3):
            w.log_memory(step)
    assert tensorboard_series(str(tmp_path / "copy")) == tensorboard_series(str(tmp_path / "run"))


def test_a_census_table_has_one_type_per_column() -> None:
    """A W&B table refuses a column of numbers and strings: a bias's shape ``64`` beside ``64x32``."""
    from tbmem._internal.sinks.tables import markdown_table

    text = "| # | name | shape | MB |\n|---|---|---|---|\n| 1 | `w` | 64x32 | 0.008 |\n| 2 | `b` | 64 | 0.000 |"
    columns, rows = markdown_table(text)
    assert columns == ["#", "name", "shape", "MB"]
    assert rows == [[1.0, "w", "64x32", 0.008], [2.0, "b", "64", 0.0]]


def test_the_writer_writes_its_event_file_only_through_its_tensorboard_sink(tmp_path: Path, monkeypatch) -> None:
    from tests._events import read_events

    through: list[tuple[str, str, int]] = []
    real_log, real_text = TensorBoardSink.log, TensorBoardSink.log_text

    def log(self, values, step, walltime=None):
        through.extend(("scalar", tag, step) for tag in values)
        real_log(self, values, step, walltime)

    def log_text(self, tag, text, step):
        through.append(("text", tag, step))
        real_text(self, tag, text, step)

    monkeypatch.setattr(TensorBoardSink, "log", log)
    monkeypatch.setattr(TensorBoardSink, "log_text", log_text)
    quiet = {"device_percent": None, "growth_mb_per_1k": None, "rss_growth_mb_per_1k": None,
             "alloc_retries": False, "host_percent": 0.1}
    with MemoryWriter(str(tmp_path), every=1, census_every=2, custom_layout=False, alerts=quiet,
                      spikes={"window": 5, "min_history": 3}, snapshot={"every": 2, "window": 1}) as w:
        assert isinstance(w._tensorboard, TensorBoardSink) and w._sinks.tensorboard is w._tensorboard
        for step, loss in enumerate([1.0, 1.0, 1.0, 1.0, 9.0]):
            w.add_scalar("Loss/train", loss, step)  # the user's own: SummaryWriter's path, not a sink's
            w.log_memory(step)
    acc = read_events(tmp_path)
    in_file = {("scalar", tag, e.step) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    in_file |= {("text", tag.removesuffix("/text_summary"), e.step) for tag in acc.Tags()["tensors"]
                for e in acc.Tensors(tag)}
    assert in_file - set(through) == {("scalar", "Loss/train", s) for s in range(5)}
    assert set(through) <= in_file
    kinds = {tag for kind, tag, _ in through if kind == "text"}
    # the components' text entries: the census table, the alert, the spike, the snapshots' file list
    assert {TAGS["census_text"].tag, TAGS["alerts_text"].tag, TAGS["spikes_text"].tag,
            TAGS["snapshot_files_text"].tag} <= kinds
