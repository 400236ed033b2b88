"""`tbmem compare` on runs whose files name modules (and whose folders are named) with terminal escapes:
a screen clear, an OSC 52 clipboard write and a bidi override reach the terminal only as visible escapes."""

from __future__ import annotations

import subprocess
import sys

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tests.faults._child import REPO, child_env

HOSTILE = "\x1b[2J\x1b]52;c;ZXZpbA==\x07\u202eevil"


def _run(folder, scale: float) -> None:
    writer = EventFileWriter(str(folder))
    for step in range(5):
        values = [summary_pb2.Summary.Value(tag="Memory/RAM/process_rss_GB", simple_value=scale + step * 0.01),
                  summary_pb2.Summary.Value(tag=f"Memory/Tensor_Module/{HOSTILE}_MB", simple_value=scale * 10)]
        writer.add_event(event_pb2.Event(step=step, wall_time=1.7e9 + step, summary=summary_pb2.Summary(value=values)))
    writer.close()


def test_compare_prints_names_from_files_only_as_visible_escapes(tmp_path):
    runs = [tmp_path / "a", tmp_path / f"b{HOSTILE}"]
    for i, run in enumerate(runs):
        _run(run, 1.0 + i)
    done = subprocess.run([sys.executable, "-m", "tbmem", "compare", *map(str, runs)], check=False,
                          capture_output=True, text=True, timeout=180, env=child_env(), cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "evil" in done.stdout  # the names are shown ...
    for raw in ("\x1b", "\x07", "\u202e"):  # ... with no character a terminal acts on
        assert raw not in out, f"{raw!r} reached the terminal"
    assert "\\x1b" in done.stdout
