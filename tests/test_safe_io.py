"""tbmem._internal._safe_io's own appends write exactly the bytes TensorBoard's RecordWriter writes."""

from __future__ import annotations

import random

from tensorboard.compat.tensorflow_stub.io.gfile import GFile
from tensorboard.summary.writer.record_writer import RecordWriter

from tbmem._internal._safe_io import FaultLedger, SafeRecordWriter


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


def test_held_records_reach_the_file_in_batches_and_at_close_byte_identical(tmp_path):
    theirs, ours = _started(tmp_path / "theirs"), _started(tmp_path / "ours")
    safe = SafeRecordWriter(ours, str(tmp_path / "ours"), FaultLedger(str(tmp_path)))
    safe.hold(10_000)
    first = (tmp_path / "ours").stat().st_size
    rng = random.Random(1)
    sizes = []
    for _ in range(40):
        data = rng.randbytes(rng.randrange(1, 900))
        theirs.write(data)
        safe.write(data)
        safe.flush()  # a held record stays held through a flush: nobody reads this file before close
        sizes.append((tmp_path / "ours").stat().st_size)
    assert sizes[0] == first  # the first record waits
    assert first < max(sizes) < (tmp_path / "theirs").stat().st_size  # some batches written, the last held
    assert len(set(sizes)) < 10  # in batches, not record by record
    safe.close()
    theirs.close()
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "theirs").read_bytes()
    assert safe._end == (tmp_path / "ours").stat().st_size


def test_held_records_lost_to_a_failing_write_are_counted_and_the_file_kept_whole(tmp_path, monkeypatch):
    import tbmem._internal._safe_io as safe_io

    ours = _started(tmp_path / "ours")
    ledger = FaultLedger(str(tmp_path))
    safe = SafeRecordWriter(ours, str(tmp_path / "ours"), ledger)
    safe.hold(1 << 20)
    before = (tmp_path / "ours").read_bytes()
    for i in range(7):
        safe.write(b"record %d" % i)

    def full(path, record):
        with open(path, "ab") as f:  # half of the batch reaches the disk, then the disk is full
            f.write(record[: len(record) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safe_io, "_append", full)
    safe.close()
    assert ledger.dropped_events == 7
    assert (tmp_path / "ours").read_bytes() == before  # truncated back to the last whole record
