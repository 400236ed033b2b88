"""tbmem._safe_io's own appends write exactly the bytes TensorBoard's RecordWriter writes."""

from __future__ import annotations

import random

from tensorboard.compat.tensorflow_stub.io.gfile import GFile
from tensorboard.summary.writer.record_writer import RecordWriter

from tbmem._safe_io import FaultLedger, SafeRecordWriter


def _started(path) -> RecordWriter:
    writer = RecordWriter(GFile(str(path), "wb"))
    writer.write(b"first record, written by TensorBoard: the file exists")
    return writer


def test_appended_records_are_byte_identical_to_tensorboards_and_skip_its_per_record_open(tmp_path):
    theirs, ours = _started(tmp_path / "theirs"), _started(tmp_path / "ours")
    safe = SafeRecordWriter(ours, str(tmp_path / "ours"), FaultLedger(str(tmp_path)))

    class Refusing:
        def append(self, *args, **kwargs):
            raise AssertionError("LocalFileSystem.append was called: the record was not appended by tbmem")

    ours._writer.fs = Refusing()  # this GFile's only (TensorBoard shares one LocalFileSystem)
    rng = random.Random(0)
    for size in (0, 1, 15, 16, 17, 4095, 4096, 70_000, *(rng.randrange(1, 3000) for _ in range(50))):
        data = rng.randbytes(size)
        theirs.write(data)
        safe.write(data)
    safe.flush()
    safe.close()
    theirs.close()
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "theirs").read_bytes()
    assert safe._end == (tmp_path / "ours").stat().st_size


def test_a_closed_file_still_goes_to_tensorboard_and_is_counted_not_raised(tmp_path):
    ours = _started(tmp_path / "ours")
    ledger = FaultLedger(str(tmp_path))
    safe = SafeRecordWriter(ours, str(tmp_path / "ours"), ledger)
    before = (tmp_path / "ours").read_bytes()
    ours._writer.closed = True  # GFile.write raises on a closed file; the fast path must not write
    safe.write(b"after close")
    assert (tmp_path / "ours").read_bytes() == before
    assert ledger.dropped_events == 1
