"""Logdirs for the plugin tests, written by MemoryWriter on CPU (census, snapshots) plus PyTorch snapshot
pickles recorded by the test (tests/_torch_snapshot.py): nothing from outside the clone."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import torch

from tbmem import MemoryWriter
from tbmem._internal.snapshot import SnapshotConfig
from tests._servers import Server
from tests._torch_snapshot import write_torch_pickle

__all__ = ["SECRET_FRAME", "SPIKE", "OOM_STEP", "Planted", "write_oom", "write_training_run", "write_ranks", "write_long",
           "build_logdir", "build_logdir_isolated", "Server",
           "get", "get_json", "MARKER"]

#: A file name in every stack of the pickle outside the logdir: no response may ever contain it.
SECRET_FRAME = "OUTSIDE-SECRET-FRAME.py"
#: The file the planted pickle's __reduce__ would create if it ever ran.
MARKER = "PLANTED_PICKLE_RAN"


class Planted:
    """Pickled, this object's __reduce__ asks the unpickler to call os.system to create MARKER."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def write_training_run(run_dir: Path, *, steps: int = 30, census_every: int = 10, leak: bool = False,
                       snapshots: bool = True) -> None:
    """A small CPU training loop under MemoryWriter: records every step, censuses, two snapshots."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept = []
    cfg = SnapshotConfig(steps=(10, 20), window=2, html=False) if snapshots else None
    with MemoryWriter(run_dir, every=1, census_every=census_every, top_k=5, large_tensor_mb=0.01,
                      snapshot=cfg) as writer:
        writer.watch(model, opt)
        for step in range(steps):
            x = torch.randn(32, 64)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if leak:
                kept.append(torch.zeros(64 * 1024))  # 256 KiB per step, never freed
            writer.add_scalar("Loss/train", loss.item(), step)
            writer.log_memory(step)


def write_ranks(group_dir: Path, ranks: int = 2, steps: int = 12) -> None:
    """One run per rank, ``<group>/rank<r>``, the later ranks holding more memory."""
    for r in range(ranks):
        with MemoryWriter(group_dir / f"rank{r}", every=1, census_every=4, custom_layout=False) as w:
            big = [torch.zeros(256 * 1024 * (r + 1))]  # rank r holds (r + 1) MiB more
            for step in range(steps):
                w.log_memory(step)
            del big


#: The one spike of the long run: (step, RSS in GB).
SPIKE = (777, 9.0)


def write_long(run_dir: Path, steps: int = 1000) -> None:  # TensorBoard keeps 1000 per tag
    """A run of ``steps`` records with flat RSS and one spike (SPIKE): thinning must keep it."""
    with MemoryWriter(run_dir, custom_layout=False, census_every=0) as w:
        for step in range(steps):
            rss = SPIKE[1] if step == SPIKE[0] else 1.0 + (step % 10) * 1e-3
            w.write_scalars({"Memory/RAM/process_rss_GB": rss, "Memory/RAM/process_peak_rss_GB": rss,
                             # CUDA readings as a GPU run writes them; the allocator counted an OOM at 500
                             "Memory/GPU/vram_allocated_GB": 2.0, "Memory/GPU/vram_reserved_GB": 3.0,
                             "Memory/GPU/vram_peak_allocated_GB": 2.5, "Memory/GPU/vram_ooms": float(step >= 500)}, step)


#: The step at which write_oom's run runs out of memory.
OOM_STEP = 6


def write_oom(run_dir: Path, steps: int = 10) -> None:
    """A CPU run whose step OOM_STEP raises torch's OutOfMemoryError inside monitored_step."""
    from tbmem._internal import _torch_private as tp

    with MemoryWriter(run_dir, every=1, census_every=0, custom_layout=False,
                      snapshot=SnapshotConfig(html=False)) as w:
        for step in range(steps):
            try:
                with w.monitored_step(step):
                    x = torch.randn(128, 128) @ torch.randn(128, 128)
                    if step == OOM_STEP:
                        raise tp.OutOfMemoryError("CUDA out of memory (simulated on CPU)")
                    del x
            except tp.OutOfMemoryError:
                pass


def build_logdir(root: Path) -> dict[str, Path]:
    """The logdir of the plugin tests, and things around it a server must never serve.

    Layout: ``logs/train`` (MemoryWriter run: census, tbmem snapshots, a PyTorch snapshot pickle
    recorded here under ``memory_snapshot/iteration_20/``, a planted malicious pickle, symlinks to a
    secret outside), ``logs/leaky`` (a census every step, 256 KiB kept per step), ``logs/exp/rank0``,
    ``logs/exp/rank1``; ``outside/secret.pickle`` (its stacks name SECRET_FRAME) and
    ``outside/secret.txt`` next to the logdir; ``facts.json`` (the pickle's peak bytes, computed
    from its events) beside them.
    """
    paths = _paths(root)
    logdir, train, real, outside, marker = (paths[k] for k in ("logdir", "train", "real", "outside", "marker"))
    write_training_run(train)
    with MemoryWriter(train, custom_layout=False, census_every=0) as w:  # a diverged loss: NaN at step 5
        w.write_scalars({"Loss/diverged": float("nan")}, 5)
    write_training_run(logdir / "leaky", steps=40, census_every=1, leak=True, snapshots=False)
    write_ranks(logdir / "exp")
    write_long(logdir / "long")
    write_oom(logdir / "oom")
    peak = write_torch_pickle(real)
    outside.mkdir()
    secret = outside / "secret.pickle"
    write_torch_pickle(secret, origin="/outside/" + SECRET_FRAME)
    paths["facts"].write_text(json.dumps({"real_peak_bytes": peak}))
    (outside / "secret.txt").write_text("TOP-SECRET-CONTENT")
    os.symlink(secret, train / "linked_secret.pickle")
    os.symlink(outside, train / "linked_dir")
    with open(train / "evil_step5.pickle", "wb") as fh:
        pickle.dump(Planted(str(marker)), fh)
    return paths


def build_logdir_isolated(root: Path) -> dict[str, Path]:
    """build_logdir run in a fresh interpreter, so its censuses see only its own tensors."""
    repo = Path(__file__).resolve().parents[2]
    code = ("import sys; from pathlib import Path; from tests.plugin._logdir import build_logdir; "
            "build_logdir(Path(sys.argv[1]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-W", "error", "-c", code, str(root)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"building the plugin logdir failed:\n{done.stdout}\n{done.stderr}")
    return _paths(root)


def _paths(root: Path) -> dict[str, Path]:
    """The places :func:`build_logdir` writes under ``root``, by name."""
    train = root / "logs" / "train"
    return {"logdir": root / "logs", "train": train, "outside": root / "outside", "marker": root / MARKER,
            "facts": root / "facts.json", "real": train / "memory_snapshot" / "iteration_20" / "rank0_memory_snapshot.pickle"}


def get(url: str) -> tuple[int, bytes, dict]:
    """(status, body, headers) of a GET; HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def get_json(url: str):
    import json

    status, body, _ = get(url)
    assert status == 200, (url, status, body[:500])
    return json.loads(body)
