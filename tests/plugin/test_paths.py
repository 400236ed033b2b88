"""Run names map to directories inside the logdir only; snapshots are found under their own run."""

from __future__ import annotations

import gzip
import os
from types import SimpleNamespace

from tbmem._internal.plugin.paths import RunDirs, spec_paths
from tbmem._internal.logdir.snapshots import find_snapshots


def _ctx(logdir="", spec="", multiplexer=None):
    return SimpleNamespace(logdir=logdir, flags=SimpleNamespace(logdir=logdir, logdir_spec=spec),
                           multiplexer=multiplexer)


def test_spec_paths_split_like_tensorboard():
    assert spec_paths("a:/x/y,/z:w,b:C:\\runs,gs://bucket/r") == ["/x/y", "/z:w", "C:\\runs", "gs://bucket/r"]


def test_run_dirs_refuse_names_and_symlinks_that_leave_the_logdir(tmp_path):
    logdir = tmp_path / "logs"
    (logdir / "exp" / "rank0").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, logdir / "escape")
    dirs = RunDirs(_ctx(str(logdir)))
    real = os.path.realpath(logdir)
    assert dirs.run_dir("exp/rank0") == (os.path.join(real, "exp", "rank0"), real)
    assert dirs.run_dir(".") == (real, real)
    for name in ("../outside", "exp/../../outside", "/etc", str(outside), "escape", "exp//rank0", "missing"):
        assert dirs.run_dir(name) is None, name


def test_run_dirs_use_the_multiplexer_paths_and_the_spec_roots(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    mux = SimpleNamespace(RunPaths=lambda: {"x/.": str(a), "y/.": str(b), "z": "/etc"})
    dirs = RunDirs(_ctx(spec=f"x:{a},y:{b}", multiplexer=mux))
    assert dirs.run_dir("x/.")[0] == os.path.realpath(a)
    assert dirs.run_dir("z") is None  # a path TensorBoard reports outside the spec's folders


def test_find_snapshots_prefers_json_over_the_pickle_twin_and_skips_other_runs(tmp_path):
    run = tmp_path / "run"
    plug = run / "plugins" / "tbmem"
    plug.mkdir(parents=True)
    for name in ("snapshot_rank0_step000000005.json.gz", "snapshot_rank0_step000000005.pickle",
                 "oom_rank1_step000000009.pickle", "snapshot_rank0_step000000005.html"):
        with gzip.open(plug / name, "wb") as fh:
            fh.write(b"{}")
    (run / "rank0").mkdir()
    (run / "rank0" / "events.out.tfevents.1.host").write_bytes(b"")
    (run / "rank0" / "theirs.pickle").write_bytes(b"")
    (run / "composer" / "memory_snapshots").mkdir(parents=True)
    (run / "composer" / "memory_snapshots" / "rank0_step300.pkl").write_bytes(b"")
    (run / ".hidden").mkdir()
    (run / ".hidden" / "x.pickle").write_bytes(b"")
    real = os.path.realpath(run)
    found = [(s.name, s.format, s.kind, s.rank, s.step) for s in find_snapshots(real, real)]
    assert found == [
        ("plugins/tbmem/snapshot_rank0_step000000005.json.gz", "tbmem", "snapshot", 0, 5),
        ("plugins/tbmem/oom_rank1_step000000009.pickle", "pickle", "oom", 1, 9),
        ("composer/memory_snapshots/rank0_step300.pkl", "pickle", "snapshot", None, 300),
    ]
