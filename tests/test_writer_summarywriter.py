"""A MemoryWriter is a SummaryWriter (a subclass, its methods its own), and it leaves every other
SummaryWriter of the process as TensorBoard made it: its CRC function, its record writer, its bytes."""

import inspect
import os
import struct
import typing

import numpy as np
import pytest
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as pure_python_crc32c
from tensorboard.summary.writer import record_writer
from torch.utils.tensorboard import SummaryWriter

from tbmem import MemoryWriter
from tbmem._internal import _fastcrc
from tests._events import read_events, scalars


def _record_writer(sw: SummaryWriter):
    return sw._get_file_writer().event_writer._async_writer._writer


def _masked(data: bytes) -> int:
    x = pure_python_crc32c(data) & 0xFFFFFFFF
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _records(folder) -> list[bytes]:
    """Every record of the event files in ``folder``, each CRC checked with TensorBoard's pure-Python CRC."""
    out = []
    for name in sorted(os.listdir(folder)):
        if not name.startswith("events.out.tfevents"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        at = 0
        while at < len(data):
            header = data[at:at + 8]
            (length,) = struct.unpack("<Q", header)
            (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
            body = data[at + 12:at + 12 + length]
            (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
            assert header_crc == _masked(header) and body_crc == _masked(body)
            out.append(body)
            at += 16 + length
    return out


def test_a_memory_writer_is_a_summary_writer_with_its_own_methods(tmp_path):
    with MemoryWriter(tmp_path, census_every=0) as writer:
        assert isinstance(writer, SummaryWriter)
        assert "__getattr__" not in vars(MemoryWriter)  # nothing forwarded: every name is the class's
        for name in ("add_scalar", "add_scalars", "add_histogram", "add_text", "add_image", "add_hparams"):
            assert name in vars(MemoryWriter) and name in dir(writer)
        # signatures as SummaryWriter's (IDEs and inspect see them), add_scalar's typed
        assert inspect.signature(MemoryWriter.add_histogram) == inspect.signature(SummaryWriter.add_histogram)
        hints = typing.get_type_hints(MemoryWriter.add_scalar)
        assert hints["tag"] is str and "global_step" in hints
        writer.add_scalar("Loss/train", 0.5, 3)
        writer.add_histogram("weights", np.arange(10.0), 3)
        assert writer.get_logdir() == writer.log_dir == str(tmp_path)
    acc = read_events(tmp_path)
    assert scalars(tmp_path, "Loss/train") == [(3, 0.5)]
    assert "weights" in acc.Tags()["histograms"]


def test_write_methods_are_guarded(tmp_path, tbmem_log):
    writer = MemoryWriter(tmp_path, census_every=0)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    writer.file_writer.add_summary = full  # where TensorBoard's writer thread was not guarded
    writer.add_histogram("weights", np.arange(4.0), 1)  # counted, not raised
    writer.add_scalar("Loss/train", 1.0, 1)
    assert writer.faults.dropped_events == 2
    del writer.file_writer.add_summary
    writer.close()
    tbmem_log.clear()
    writer.add_histogram("weights", np.arange(4.0), 2)
    writer.add_histogram("weights", np.arange(4.0), 3)
    assert [r.getMessage() for r in tbmem_log.records] == [
        f"tbmem: add_histogram() after close() of the MemoryWriter for {tmp_path} is ignored "
        "(as is every later write)"]
    files = [f for f in os.listdir(tmp_path) if f.startswith("events.out")]
    assert len(files) == 1  # no event file reopened after close


def test_writer_option_takes_over_the_summary_writers_files(tmp_path):
    inner = SummaryWriter(str(tmp_path))
    writer = MemoryWriter(writer=inner, every=1, census_every=0)
    assert writer.summary_writer is inner and writer.file_writer is inner.file_writer
    inner.add_scalar("Loss/train", 1.0, 0)
    writer.add_scalar("Loss/train", 0.5, 1)
    writer.log_memory(1)
    writer.close()
    assert inner.file_writer is None  # closed with it, as SummaryWriter.close leaves it
    assert len([f for f in os.listdir(tmp_path) if f.startswith("events.out")]) == 1
    assert scalars(tmp_path, "Loss/train") == [(0, 1.0), (1, 0.5)]


def test_a_users_summary_writers_before_and_after_are_untouched(tmp_path):
    tensorboards_crc = record_writer.masked_crc32c
    before = SummaryWriter(str(tmp_path / "before"))
    with MemoryWriter(tmp_path / "mine", every=1, census_every=0) as writer:
        after = SummaryWriter(str(tmp_path / "after"))
        writer.log_memory(0)
        writer.add_scalar("Loss/train", 0.5, 0)
        # TensorBoard's module-level CRC is its own; the users' files get TensorBoard's record writer
        assert record_writer.masked_crc32c is tensorboards_crc
        assert tensorboards_crc.__module__.startswith("tensorboard")
        for sw in (before, after):
            assert type(_record_writer(sw)) is record_writer.RecordWriter
            for step in range(3):
                sw.add_scalar("Loss/train", 0.25 * step, step, walltime=1000.0 + step)
            sw.close()
        # the MemoryWriter's own file is checksummed by the compiled CRC, where it is built
        if _fastcrc.available():
            assert _record_writer(writer)._crc is _fastcrc.masked_crc32c
    reference = SummaryWriter(str(tmp_path / "reference"))
    for step in range(3):
        reference.add_scalar("Loss/train", 0.25 * step, step, walltime=1000.0 + step)
    reference.close()
    # byte for byte what TensorBoard writes (the first record, the file version, holds its wall time)
    expected = _records(tmp_path / "reference")[1:]
    assert _records(tmp_path / "before")[1:] == expected == _records(tmp_path / "after")[1:]
    assert len(_records(tmp_path / "mine")) >= 3  # every CRC of tbmem's own file checks out too


@pytest.mark.parametrize("fast_crc", [True, False])
def test_memory_writer_files_are_valid_with_either_crc(tmp_path, fast_crc):
    with MemoryWriter(tmp_path, every=1, census_every=0, fast_crc=fast_crc, flush_each_record=False) as writer:
        for step in range(3):
            writer.log_memory(step)
            writer.add_scalar("Loss/train", 1.0 / (step + 1), step)
    assert len(_records(tmp_path)) >= 7
    assert [s for s, _ in scalars(tmp_path, "Loss/train")] == [0, 1, 2]
