import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import torch
from tensorboard.backend.event_processing import event_file_loader
from torch.utils.tensorboard import SummaryWriter

from tbmem import MemoryWriter, MemoryWriterConfig
from tbmem._internal.probes.base import Probe
from tbmem._internal.probes.guard import ProbeGuard
from tbmem._internal.tags import TAGS
from tests._events import read_events, scalars
from tests.fake_cuda import install_fake_cuda

RSS = TAGS["ram_rss"].tag


def _event_files(logdir):
    return [os.path.join(logdir, f) for f in os.listdir(logdir) if f.startswith("events.out.tfevents")]


def test_due_steps_exactly_and_rss_plausible(tmp_path):
    with MemoryWriter(tmp_path, every=3, census_every=0) as writer:
        for step in range(11):
            writer.log_memory(step)
        rss_now = psutil.Process().memory_info().rss
    points = scalars(tmp_path, RSS)
    assert [s for s, _ in points] == [0, 3, 6, 9]
    assert points[-1][1] * 2**30 == pytest.approx(rss_now, rel=0.1)
    steps_time = scalars(tmp_path, TAGS["step_time"].tag)
    assert [s for s, _ in steps_time] == [3, 6, 9]
    assert all(v >= 0 for _, v in steps_time)


def test_one_event_per_record(tmp_path):
    with MemoryWriter(tmp_path, every=1, census_every=0, custom_layout=False) as writer:
        writer.log_memory(0)
        writer.log_memory(1)
    (path,) = _event_files(tmp_path)
    events = [e for e in event_file_loader.EventFileLoader(path).Load() if e.HasField("summary")]
    assert len(events) == 2
    tags = {v.tag for v in events[0].summary.value}
    assert {TAGS[k].tag for k in ("ram_rss", "ram_peak_rss", "ram_system_used", "cpu_percent")} <= tags


def test_system_memory_is_written_once_per_system_every_s_and_at_every_record_with_0(tmp_path):
    used = TAGS["ram_system_used"].tag
    with MemoryWriter(tmp_path / "default", every=1, census_every=0) as writer:
        for step in range(5):  # well within a second
            writer.log_memory(step)
    assert [s for s, _ in scalars(tmp_path / "default", used)] == [0]
    assert [s for s, _ in scalars(tmp_path / "default", TAGS["ram_rss"].tag)] == [0, 1, 2, 3, 4]
    with MemoryWriter(tmp_path / "every", every=1, census_every=0, system_every_s=0) as writer:
        for step in range(5):
            writer.log_memory(step)
    assert [s for s, _ in scalars(tmp_path / "every", used)] == [0, 1, 2, 3, 4]


def test_begin_step_says_whether_log_memory_is_due_and_every_step_while_snapshots_need_them(tmp_path):
    from tbmem._internal.snapshot import SnapshotConfig

    with MemoryWriter(tmp_path / "plain", every=10, census_every=25) as writer:
        assert [s for s in range(60) if writer.begin_step(s)] == [0, 10, 20, 25, 30, 40, 50]
        for step in range(0, 60):  # logging only the due steps writes what logging every step writes
            if writer.begin_step(step):
                writer.log_memory(step)
        assert writer.last_step == 59  # begin_step noted every step, logged or not
    assert [s for s, _ in scalars(tmp_path / "plain", TAGS["ram_rss"].tag)] == [0, 10, 20, 30, 40, 50]
    assert [s for s, _ in scalars(tmp_path / "plain", "Memory/Tensor_Census/total_MB")] == [0, 25, 50]
    with MemoryWriter(tmp_path / "off", every=10, census_every=0, enabled=False) as writer:
        assert writer.begin_step(3)
    snapshots = SnapshotConfig(every=0, html=False, pickle=False)
    with MemoryWriter(tmp_path / "snap", every=10, census_every=0, snapshot=snapshots) as writer:
        assert writer.begin_step(3)  # the snapshot manager sees every step
    assert writer.begin_step(5)  # closed: each call says so


def test_deprecated_step_calls_warn_naming_the_replacement_and_still_work(tmp_path):
    with MemoryWriter(tmp_path, every=10, census_every=25, custom_layout=False) as writer:
        with pytest.warns(DeprecationWarning, match=r"next_due is deprecated; call begin_step\(step\)"):
            assert [writer.next_due(s) for s in (0, 1, 10, 11, 21, 26, 50)] == [0, 10, 10, 20, 25, 30, 50]
        with pytest.warns(DeprecationWarning, match=r"write_readings is deprecated; use write_scalars"):
            writer.write_readings({"ram_rss": 2**30}, step=3)
        with pytest.warns(DeprecationWarning, match=r"handle_oom is deprecated; use step_failed\(step, exc\)"):
            writer.handle_oom(4, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert scalars(tmp_path, TAGS["ram_rss"].tag)[0] == (3, 1.0)  # in the tag's unit, GB
    assert [s for s, _ in scalars(tmp_path, TAGS["ram_rss"].tag)] == [3, 4]  # the OOM's record


def test_cpu_run_never_initialises_cuda_and_writes_no_vram(tmp_path):
    with MemoryWriter(tmp_path, every=1, census_every=0) as writer:
        writer.log_memory(0)
    assert not torch.cuda.is_initialized()
    assert not [t for t in read_events(tmp_path).Tags()["scalars"] if "vram" in t]


def test_import_does_not_initialise_cuda_or_import_phiflow():
    code = "import sys, tbmem, torch; tbmem.MemoryWriter; print(torch.cuda.is_initialized(), 'phi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_vram_tags_with_a_fake_device(tmp_path, monkeypatch):
    fake = install_fake_cuda(monkeypatch)
    with MemoryWriter(tmp_path, every=1, census_every=0) as writer:
        writer.log_memory(0)
    acc = read_events(tmp_path)
    value = {t: acc.Scalars(t)[0].value for t in acc.Tags()["scalars"]}
    assert value["Memory/GPU/vram_allocated_GB"] == pytest.approx(fake.allocated / 2**30)
    assert value["Memory/GPU/vram_reserved_GB"] == pytest.approx(4.0)
    assert value["Memory/fragmentation_percent"] == pytest.approx(25.0)
    assert value["Memory/GPU/vram_percent"] == pytest.approx(5.0)


def test_wraps_an_existing_summary_writer(tmp_path):
    inner = SummaryWriter(str(tmp_path))
    writer = MemoryWriter(writer=inner, every=1, census_every=0)
    assert writer.log_dir == str(tmp_path)
    writer.add_scalar("Loss/train", 0.5, 0)  # SummaryWriter API forwarded unchanged
    writer.add_text("notes", "hello", 0)
    writer.log_memory(0)
    writer.close()
    acc = read_events(tmp_path)
    assert acc.Scalars("Loss/train")[0].value == pytest.approx(0.5)
    assert RSS in acc.Tags()["scalars"]


def test_disabled_writer_logs_no_memory(tmp_path):
    with MemoryWriter(tmp_path, enabled=False) as writer:
        assert writer.log_memory(0) is False
        writer.add_scalar("Loss/train", 1.0, 0)
    tags = read_events(tmp_path).Tags()["scalars"]
    assert tags == ["Loss/train"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("every", 0), ("every", -5), ("census_every", -1), ("peak_mode", "sometimes"), ("top_k", 0),
     ("large_tensor_mb", 0), ("device", -1), ("system_every_s", -1), ("system_every_s", "1s")],
)
def test_bad_config_names_the_field(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        MemoryWriter(tmp_path, **{field: value})


def test_unknown_mapping_key_is_named():
    with pytest.raises(ValueError, match="evrey"):
        MemoryWriterConfig.from_mapping({"evrey": 10})


def test_unwritable_log_dir_raises_oserror(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match="log_dir"):
        MemoryWriter(blocker / "logs")


def test_misspelt_keyword_names_the_closest_and_every_valid_key(tmp_path):
    with pytest.raises(TypeError) as info:
        MemoryWriter(tmp_path / "x", evry=5)
    message = str(info.value)
    assert "'evry' (did you mean 'every'?)" in message
    assert all(name in message for name in ("census_every", "large_tensor_mb", "snapshot", "top_k"))
    assert not (tmp_path / "x").exists()  # nothing created for a writer that never started


def test_mapping_with_misspelt_keys_names_each(tmp_path):
    with pytest.raises(ValueError, match=r"'cencus_every' \(did you mean 'census_every'\?\), 'zzz';"):
        MemoryWriterConfig.from_mapping({"zzz": 1, "cencus_every": 5})


def test_log_dir_that_cannot_be_created_is_one_clear_error(tmp_path):
    with pytest.raises(OSError) as info:
        MemoryWriter("/proc/forbidden")
    assert str(info.value).endswith("MemoryWriter cannot write event files to log_dir '/proc/forbidden': "
                                    "No such file or directory")
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained traceback
    # what the user sees: the traceback ends in that one line, with no "direct cause" above it
    out = subprocess.run([sys.executable, "-c", "from tbmem import MemoryWriter; MemoryWriter('/proc/forbidden')"],
                         capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert out.returncode == 1
    assert "direct cause" not in out.stderr and "During handling" not in out.stderr
    assert out.stderr.count("Traceback") == 1
    assert out.stderr.rstrip().splitlines()[-1].startswith("FileNotFoundError: [Errno 2] MemoryWriter cannot write")


class _Clock:
    """A monotonic clock the test moves by hand (the probe retry's backoff reads it)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_failing_probe_is_retried_with_backoff_then_switched_off_naming_it(tmp_path, tbmem_log, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr("tbmem._internal._retry._now", clock)

    class Broken(Probe):
        name = "broken"
        calls = 0

        def read(self):
            Broken.calls += 1
            raise RuntimeError("sensor unplugged")

    with MemoryWriter(tmp_path, every=1, census_every=0) as writer:
        writer._probes.append(Broken())
        for step in range(40):
            writer.log_memory(step)
            clock.now += 1.0  # one second per step: retried at once, then after 1, 2, 4 s
    # tries at steps 0, 1, 2, 4, 8: the fifth failure in a row switches it off
    assert Broken.calls == ProbeGuard.MAX_FAILURES == 5
    messages = [r.getMessage() for r in tbmem_log.records if "broken" in r.getMessage()]
    assert len(messages) == 2
    assert "the broken probe failed; its readings are skipped and it is retried" in messages[0]
    assert "the broken probe failed 5 times in a row and is switched off" in messages[1]
    assert "sensor unplugged" in messages[1]
    assert [s for s, _ in scalars(tmp_path, RSS)] == list(range(40))  # the other probes went on


def test_a_transient_probe_error_costs_one_record_not_the_probe(tmp_path, tbmem_log, monkeypatch):
    import errno

    from tbmem._internal.probes import host

    clock = _Clock()
    monkeypatch.setattr("tbmem._internal._retry._now", clock)
    real_fields = host._proc_fields
    failures = iter([False, True])  # one EIO while reading /proc (step 1), as a flaky filesystem gives

    def flaky(path, wanted):
        if path == host._STATUS and next(failures, False):
            raise OSError(errno.EIO, "Input/output error")
        return real_fields(path, wanted)

    monkeypatch.setattr(host, "_proc_fields", flaky)
    with MemoryWriter(tmp_path, every=1, census_every=0) as writer:
        for step in range(6):
            writer.log_memory(step)
            clock.now += 1.0
    assert [s for s, _ in scalars(tmp_path, RSS)] == [0, 2, 3, 4, 5]  # only step 1's reading is lost
    (message,) = [r.getMessage() for r in tbmem_log.records]
    assert "the host probe failed; its readings are skipped and it is retried" in message
    assert "Input/output error" in message


def test_a_transient_probe_error_costs_one_record_at_ten_records_a_second(tmp_path, tbmem_log, monkeypatch):
    # at 0.1 s per step the first retry used to wait a second: ten records lost their RSS, not one
    import errno

    from tbmem._internal.probes import host

    clock = _Clock()
    monkeypatch.setattr("tbmem._internal._retry._now", clock)
    real_fields = host._proc_fields
    failures = iter([False, True])

    def flaky(path, wanted):
        if path == host._STATUS and next(failures, False):
            raise OSError(errno.EIO, "Input/output error")
        return real_fields(path, wanted)

    monkeypatch.setattr(host, "_proc_fields", flaky)
    with MemoryWriter(tmp_path, every=1, census_every=0) as writer:
        for step in range(20):
            writer.log_memory(step)
            clock.now += 0.1
    assert [s for s, _ in scalars(tmp_path, RSS)] == [0] + list(range(2, 20))  # only step 1's reading is lost
    assert len(tbmem_log.records) == 1


def test_writes_after_close_are_ignored_with_one_warning(tmp_path, tbmem_log):
    writer = MemoryWriter(tmp_path, every=1, census_every=0, custom_layout=False)
    writer.log_memory(0)
    writer.close()
    files = _event_files(tmp_path)
    assert writer.log_memory(1) is False
    writer.add_scalar("Loss/train", 0.5, 2)
    writer.write_scalars({"Loss/train": 0.25}, 3)
    writer.add_text("notes", "late", 4)
    writer.flush()
    assert _event_files(tmp_path) == files  # no second event file was opened
    assert [s for s, _ in scalars(tmp_path, RSS)] == [0]
    assert "Loss/train" not in read_events(tmp_path).Tags()["scalars"]
    (message,) = [r.getMessage() for r in tbmem_log.records]
    assert message == (f"tbmem: log_memory() after close() of the MemoryWriter for {tmp_path} is ignored "
                       "(as is every later write)")


def test_psutil_access_denied_degrades_like_any_failing_probe(tmp_path, tbmem_log, monkeypatch):
    import psutil

    from tbmem._internal.probes import host

    def denied(*args, **kwargs):
        raise psutil.AccessDenied(os.getpid())

    # /proc unreadable too: only psutil could read the host, and it refuses (a locked-down container)
    monkeypatch.setattr(host.psutil, "Process", denied)
    monkeypatch.setattr(host, "_STATUS", "/nonexistent/status")
    writer = MemoryWriter(tmp_path, every=1, census_every=0)
    for step in range(3):
        writer.add_scalar("Loss/train", 1.0, step)
        writer.log_memory(step)
    writer.close()
    assert [s for s, _ in scalars(tmp_path, "Loss/train")] == [0, 1, 2]
    messages = [r.getMessage() for r in tbmem_log.records]
    assert len(messages) == 1 and "host probe failed" in messages[0] and "AccessDenied" in messages[0]


def test_oom_with_a_failing_flush_still_reraises_the_original_object(tmp_path, monkeypatch):
    writer = MemoryWriter(tmp_path, every=100, census_every=0)

    def read_only(*args):
        raise OSError(30, "Read-only file system")

    # TensorBoard's writer without tbmem's guard (its internals changed): flush raises
    monkeypatch.setattr(writer.summary_writer, "flush", read_only)
    error = torch.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(torch.OutOfMemoryError) as caught:
        with writer.monitored_step(3):
            raise error
    assert caught.value is error
    assert error.__context__ is None and error.__cause__ is None
    monkeypatch.undo()
    writer.close()


def test_out_of_memory_in_a_monitored_step_is_recorded_and_reraised(tmp_path):
    writer = MemoryWriter(tmp_path, every=100, census_every=0)
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    with pytest.raises(torch.OutOfMemoryError) as caught:
        with writer.monitored_step(7):
            raise error
    assert caught.value is error
    # the record at the failing step is on disk before close
    assert [s for s, _ in scalars(tmp_path, RSS)] == [7]
    writer.close()


def test_monitored_step_logs_when_due(tmp_path):
    with MemoryWriter(tmp_path, every=2, census_every=0) as writer:
        for step in range(4):
            with writer.monitored_step(step):
                pass
    assert [s for s, _ in scalars(tmp_path, RSS)] == [0, 2]


def test_monitored_step_without_logging_still_handles_oom(tmp_path):
    writer = MemoryWriter(tmp_path, every=1, census_every=0)
    with writer.monitored_step(0, log=False):
        pass  # the step logs itself (with census roots), so nothing is written here
    with pytest.raises(torch.OutOfMemoryError):
        with writer.monitored_step(1, log=False):
            raise torch.OutOfMemoryError("out of memory")
    assert [s for s, _ in scalars(tmp_path, RSS)] == [1]
    writer.close()


@pytest.mark.parametrize("death", ["exception", "sigkill"])
def test_a_run_that_dies_keeps_its_records(tmp_path, death):
    ending = "raise RuntimeError('diverged')" if death == "exception" else "os.kill(os.getpid(), signal.SIGKILL)"
    script = textwrap.dedent(f"""
        import os, signal
        from tbmem import MemoryWriter
        writer = MemoryWriter({str(tmp_path)!r}, every=5, census_every=0)
        for step in range(23):
            writer.add_scalar("Loss/train", 1.0 / (step + 1), step)
            writer.log_memory(step)
        {ending}
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode != 0
    assert [s for s, _ in scalars(tmp_path, RSS)] == [0, 5, 10, 15, 20]


def test_custom_scalars_layout_is_written(tmp_path):
    from tests.test_layout import layouts

    with MemoryWriter(tmp_path, census_every=0) as writer:
        writer.log_memory(0)
    (layout,) = layouts(tmp_path)
    assert "tbmem: memory" in layout and not [c for c in layout if "GPU" in c]  # a CPU run


def test_watch_holds_models_weakly(tmp_path):
    with MemoryWriter(tmp_path) as writer:
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        writer.watch(model, opt)
        assert writer.watched_models == [model] and writer.watched_optimizers == [opt]
        del model, opt
        import gc

        gc.collect()
        assert writer.watched_models == [] and writer.watched_optimizers == []
        with pytest.raises(TypeError, match="watch"):
            writer.watch("not a model")
