"""tbmem._internal._direct_events: events encoded by hand are byte-identical to protobuf's."""

from __future__ import annotations

import math
import random
import struct

from tbmem._internal._direct_events import encode_event, make_event
from tests._events import read_events


def _tag(rng: random.Random) -> str:
    return "".join(rng.choice("abcXYZ/_. é漢\x00") for _ in range(rng.randrange(0, 300)))


def test_encoded_events_are_the_bytes_protobuf_writes():
    rng = random.Random(1)
    specials = [0.0, -0.0, 1e38, 3.5e38, 1e300, -1e300, 1e-45, 1e-40, math.inf, -math.inf, math.nan, 7, True]
    for _ in range(5000):
        values = {_tag(rng): rng.choice([rng.uniform(-1e6, 1e6), rng.random(), *specials])
                  for _ in range(rng.randrange(1, 20))}
        step = rng.choice([0, 1, 127, 128, rng.randrange(1 << 40), -1, -rng.randrange(1 << 62),
                           (1 << 63) - 1, -(1 << 63)])
        wall = rng.choice([0.0, -0.0, rng.uniform(0, 2e9), 1, 1.7e9])
        assert encode_event(values, step, wall) == make_event(values, step, wall).SerializeToString()


def test_write_scalars_queues_events_tensorboard_reads_back(tmp_path):
    from tbmem import MemoryWriter

    with MemoryWriter(tmp_path, enabled=False, custom_layout=False, flush_each_record=False) as writer:
        assert writer._tensorboard.events.queue({"Loss/train": 0.25}, 0)  # TensorBoard's own writer: queued as bytes
        for step in range(1, 5):
            writer.write_scalars({"Loss/train": 1.0 / step, "Perf/batch_time_s": step * 0.5}, step)
    acc = read_events(tmp_path)
    float32 = struct.Struct("<f")
    assert [(e.step, e.value) for e in acc.Scalars("Loss/train")] == [
        (0, 0.25), *((s, float32.unpack(float32.pack(1.0 / s))[0]) for s in range(1, 5))]
    assert [(e.step, e.value) for e in acc.Scalars("Perf/batch_time_s")] == [(s, s * 0.5) for s in range(1, 5)]


def test_with_flush_each_record_write_scalars_writes_on_the_calling_thread_after_queued_events(tmp_path):
    import threading

    from tbmem import MemoryWriter

    with MemoryWriter(tmp_path, enabled=False, custom_layout=False) as writer:
        record_writer = writer.summary_writer._get_file_writer().event_writer._async_writer._writer
        threads: list[threading.Thread] = []
        real = record_writer.write
        record_writer.write = lambda data: (threads.append(threading.current_thread()), real(data))[1]
        writer.add_scalar("Loss/user", 3.0, 0)  # queued for TensorBoard's writer thread
        writer.write_scalars({"Perf/batch_time_s": 0.5}, 1)
        assert len(threads) == 2 and threads[0] is not threading.current_thread()
        assert threads[1] is threading.current_thread()  # no hand-over to the writer thread
        acc = read_events(tmp_path)  # on disk before any flush or close, in the order written
        assert [(e.step, e.value) for e in acc.Scalars("Loss/user")] == [(0, 3.0)]
        assert [(e.step, e.value) for e in acc.Scalars("Perf/batch_time_s")] == [(1, 0.5)]


def test_the_census_table_is_written_on_the_calling_thread_as_add_text_would(tmp_path):
    import threading

    import torch
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from torch.utils.tensorboard.summary import text as text_summary

    from tbmem import MemoryWriter

    model = torch.nn.Linear(8, 8)
    with MemoryWriter(tmp_path, every=1, census_every=1, custom_layout=False) as writer:
        writer.watch(model)
        record_writer = writer.summary_writer._get_file_writer().event_writer._async_writer._writer
        threads: list[threading.Thread] = []
        real = record_writer.write
        record_writer.write = lambda data: (threads.append(threading.current_thread()), real(data))[1]
        writer.log_memory(0)
        assert threads and all(t is threading.current_thread() for t in threads)
        (path,) = tmp_path.glob("events.out.tfevents.*")
        events = [e for e in map(Event.FromString, RawEventFileLoader(str(path)).Load())
                  if any(v.tag == "Memory/Large_Tensors/top_k/text_summary" for v in e.summary.value)]
        assert len(events) == 1 and events[0].step == 0  # in the file before any flush or close
        table = events[0].summary.value[0].tensor.string_val[0].decode()
        assert "weight" in table
        assert events[0].summary.SerializeToString() == text_summary("Memory/Large_Tensors/top_k", table) \
            .SerializeToString()
