"""The checks of ``scripts/gpu_check.sh`` that need more than pytest: each writes one JSON file.

Run on a machine with CUDA (``--device cpu`` rehearses the same code on the CPU, where the
checks that need the caching allocator are reported as skipped)::

    python scripts/gpu_check.py trainer  OUT_DIR   # SyntheticTrainer run: snapshot vs memory_stats, census
    python scripts/gpu_check.py oom      OUT_DIR   # a real out-of-memory error inside monitored_step
    python scripts/gpu_check.py forecast OUT_DIR   # predicted vs measured peak at a held-out batch size

Each subcommand prints one line per check (``PASS``/``FAIL``/``SKIP``), writes
``OUT_DIR/<subcommand>.json`` and exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

__all__ = ["main"]


class Checks:
    """Named results of one subcommand, printed as they come and saved as JSON."""

    def __init__(self, name: str, out: Path) -> None:
        self.name, self.out = name, out
        self.results: list[dict[str, Any]] = []
        self.facts: dict[str, Any] = {}

    def check(self, what: str, ok: bool | None, **detail: Any) -> None:
        status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        self.results.append({"check": what, "status": status, **detail})
        print(f"{status} {self.name}: {what} {json.dumps(detail, default=str)}", flush=True)

    def save(self) -> int:
        failed = [r for r in self.results if r["status"] == "FAIL"]
        doc = {"subcommand": self.name, "facts": self.facts, "results": self.results, "failed": len(failed)}
        (self.out / f"{self.name}.json").write_text(json.dumps(doc, indent=1, default=str))
        return 1 if failed else 0


def _environment(device: str) -> dict[str, Any]:
    import torch

    env = {"torch": torch.__version__, "python": sys.version.split()[0], "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, total_memory=props.total_memory, cuda=torch.version.cuda,
                   capability=f"{props.major}.{props.minor}")
    return env


def _stats_json(path: str) -> dict[str, Any]:
    """``tbmem snapshot stats --json PATH``, as a user would run it."""
    proc = subprocess.run([sys.executable, "-m", "tbmem", "snapshot", "stats", "--json", path],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"tbmem snapshot stats {path} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


# --- trainer --------------------------------------------------------------------------------------

def trainer(out: Path, device: str) -> int:
    """A SyntheticTrainer run with monitoring, a census every 10 steps and a snapshot window at
    steps 20-21; torch's ``memory_stats()`` is read right after every ``log_memory`` call, so the
    snapshot and each census can be compared with the allocator at the same moment."""
    import torch
    from hydra import compose, initialize_config_dir

    from trainers.config import validate
    from trainers.monitoring import TrainerMonitoring
    from trainers.synthetic import SyntheticTrainer

    checks = Checks("trainer", out)
    checks.facts.update(_environment(device))
    work = out / "trainer_run"
    shutil.rmtree(work, ignore_errors=True)  # a second run would get "-2" snapshot names
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = validate(compose(config_name="burgers_quick_test", overrides=[
            "trainer=synthetic_with_memory", f"data.cache_dir={work / 'cache'}", "data.progress=false",
            "trainer_params.progress=false", "trainer_params.epochs=2", "tbmem.every=1",
            "tbmem.census_every=10", "tbmem.snapshot.every=20", "tbmem.snapshot.window=2"]))
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.zeros(1, device=dev)  # the program initialises CUDA, as the trainer's data loading would
    mon = TrainerMonitoring.create(work / "run", enabled=True, verbose_batches=2, tbmem_config=cfg.tbmem,
                                   device=dev)
    allocator: dict[int, dict[str, int]] = {}
    real_log = mon.writer.log_memory

    def log_and_read(step: int, *args: Any, **kwargs: Any) -> bool:
        result = real_log(step, *args, **kwargs)
        if device == "cuda":
            stats = torch.cuda.memory_stats(dev)
            allocator[step] = {k: int(stats.get(k, 0)) for k in (
                "allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current",
                "inactive_split_bytes.all.current", "num_ooms")}
        return result

    mon.writer.log_memory = log_and_read  # type: ignore[method-assign]
    started = time.perf_counter()
    result = SyntheticTrainer(cfg, monitoring=mon, device=dev).train()
    mon.close()
    checks.facts["train_seconds"] = round(time.perf_counter() - started, 2)
    checks.facts["final_loss"] = getattr(result, "final_loss", None)
    folder = work / "run" / "plugins" / "tbmem"
    snaps = sorted(glob.glob(str(folder / "snapshot_rank0_step*.json.gz")))
    checks.check("snapshot window written", bool(snaps), files=[os.path.basename(s) for s in snaps])
    if not snaps:
        return checks.save()
    for path in snaps:
        _check_snapshot(checks, path, cfg.tbmem.snapshot.window, allocator, device)
    _check_census(checks, folder / "census.jsonl", allocator, device)
    _check_vram_tags(checks, work / "run", allocator, device)
    return checks.save()


def _check_snapshot(checks: Checks, first: str, window: int, allocator: dict[int, dict[str, int]],
                    device: str) -> None:
    """One snapshot window's files against the allocator read right after the window's last step."""
    window_start = int(first.rsplit("step", 1)[1].split(".")[0])
    dumped_at = window_start + window - 1  # written at the end of the window's last step
    name = os.path.basename(first)
    dev_doc = _stats_json(first)["devices"][0]
    checks.facts.setdefault("snapshot_stats", {})[name] = dev_doc
    checks.check(f"{name}: source device", dev_doc["device"].startswith(device),
                 device=dev_doc["device"], trace_events=dev_doc.get("trace_events"))
    if device != "cuda":
        checks.check(f"{name}: vs memory_stats", None, reason="no caching allocator on the CPU")
        return
    now = allocator.get(dumped_at)
    pickle_path = first.replace(".json.gz", ".pickle")
    checks.check(f"{name}: raw CUDA pickle written next to it", os.path.exists(pickle_path))
    for path, label in ((first, "json.gz"), (pickle_path, "pickle")):
        if not os.path.exists(path):
            continue
        d = dev_doc if path == first else _stats_json(path)["devices"][0]
        for key, stat in (("reserved_bytes", "reserved_bytes.all.current"),
                          ("allocated_bytes", "allocated_bytes.all.current")):
            checks.check(f"{name} ({label}): {key} == memory_stats {stat} after step {dumped_at}",
                         now is not None and d[key] == now[stat], snapshot=d[key], torch=now and now[stat])
        checks.check(f"{name} ({label}): peak >= allocated at the end", d["peak_bytes"] >= d["allocated_bytes"],
                     peak=d["peak_bytes"], allocated=d["allocated_bytes"])


def _check_census(checks: Checks, path: Path, allocator: dict[int, dict[str, int]], device: str) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    checks.check("census side file has censuses", bool(lines), steps=[c["step"] for c in lines])
    for c in lines:
        if device != "cuda":
            checks.check(f"census step {c['step']}: no unattributed reading on the CPU",
                         c.get("unattributed_bytes") is None)
            continue
        on_device = sum(v for k, v in c["by_device"].items() if k.startswith("cuda"))
        torch_now = allocator.get(c["step"], {}).get("allocated_bytes.all.current")
        checks.check(f"census step {c['step']}: census on cuda + unattributed == memory_stats allocated",
                     torch_now is not None and on_device + (c["unattributed_bytes"] or 0) == torch_now,
                     census_cuda=on_device, unattributed=c["unattributed_bytes"], torch=torch_now,
                     by_category=c["by_category"])
        checks.check(f"census step {c['step']}: unattributed >= 0", (c["unattributed_bytes"] or 0) >= 0,
                     unattributed=c["unattributed_bytes"])


def _check_vram_tags(checks: Checks, run: Path, allocator: dict[int, dict[str, int]], device: str) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    vram = "Memory/GPU/vram_allocated_GB"
    if device != "cuda":
        checks.check("no VRAM tags on a CPU run", vram not in tags)
        return
    values = {e.step: e.value for e in acc.Scalars(vram)} if vram in tags else {}
    worst = max((abs(values[s] * 2**30 - a["allocated_bytes.all.current"]) / max(a["allocated_bytes.all.current"], 1)
                 for s, a in allocator.items() if s in values), default=None)
    # float32 scalars: about 7 significant digits
    checks.check("Memory/GPU/vram_allocated_GB equals memory_stats at every record (float32)",
                 worst is not None and worst < 1e-6, records=len(values), worst_relative_error=worst)


# --- oom ------------------------------------------------------------------------------------------

def oom(out: Path, device: str) -> int:
    """A real allocator out-of-memory error inside ``monitored_step``: the OOM snapshot is written
    and the very exception object reaches the caller, without a ``__context__`` from tbmem."""
    import torch

    from tbmem import MemoryWriter
    from tbmem._internal.snapshot import SnapshotConfig

    checks = Checks("oom", out)
    checks.facts.update(_environment(device))
    if device != "cuda":
        checks.check("real out-of-memory error", None, reason="needs the CUDA caching allocator")
        return checks.save()
    dev = torch.device("cuda", 0)
    model = torch.nn.Linear(1024, 1024).to(dev)
    logdir = out / "oom_run"
    shutil.rmtree(logdir, ignore_errors=True)
    raised: list[BaseException] = []
    caught: BaseException | None = None
    with MemoryWriter(logdir, every=1, census_every=0, snapshot=SnapshotConfig(every=1000)) as writer:
        writer.watch(model)
        for step in range(6):
            try:
                with writer.monitored_step(step):
                    model(torch.randn(64, 1024, device=dev)).sum().backward()
                    if step == 5:
                        try:
                            torch.empty(4 * torch.cuda.get_device_properties(dev).total_memory, dtype=torch.uint8,
                                        device=dev)
                        except torch.OutOfMemoryError as exc:
                            raised.append(exc)
                            raise
            except torch.OutOfMemoryError as exc:
                caught = exc
    checks.check("the allocator raised OutOfMemoryError", bool(raised), message=str(raised[0])[:300] if raised else None)
    checks.check("the same exception object reached the caller", caught is not None and raised and caught is raised[0])
    checks.check("no __context__ added by tbmem", caught is not None and caught.__context__ is None)
    files = sorted(os.listdir(logdir / "plugins" / "tbmem")) if (logdir / "plugins" / "tbmem").is_dir() else []
    oom_snap = logdir / "plugins" / "tbmem" / "oom_rank0_step000000005.json.gz"
    checks.check("oom snapshot written", oom_snap.exists(), files=files)
    if oom_snap.exists():
        d = _stats_json(str(oom_snap))["devices"][0]
        checks.check("the snapshot's trace holds the OOM event", bool(d.get("ooms")), ooms=d.get("ooms"))
        with gzip.open(oom_snap, "rt") as fh:
            meta = json.load(fh).get("meta", {})
        checks.check("the snapshot names the exception", "OutOfMemoryError" in str(meta.get("exception", "")),
                     exception=str(meta.get("exception", ""))[:200])
    return checks.save()


# --- forecast -------------------------------------------------------------------------------------

def forecast(out: Path, device: str) -> int:
    """Fit at batch sizes 16, 32, 64 and measure a real step at 512 (held out)."""
    import torch

    from tbmem.forecast import fit

    checks = Checks("forecast", out)
    checks.facts.update(_environment(device))
    torch.manual_seed(0)
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                                torch.nn.GELU(), torch.nn.Linear(4096, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters())

    def step(batch: Any) -> None:
        x, y = batch
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev)).backward()
        opt.step()

    make: Callable[[int], Any] = lambda n: (torch.randn(n, 1024), torch.randint(0, 10, (n,)))  # noqa: E731
    started = time.perf_counter()
    f = fit(step, make, batch_sizes=(16, 32, 64), model=model, optimizer=opt)
    checks.facts["fit_seconds"] = round(time.perf_counter() - started, 2)
    checks.facts["forecast"] = f.to_dict()
    for held_out in (512, 2048):
        m = f.measure(held_out)
        checks.check(f"predicted peak within 5% of measured at batch {held_out}",
                     m.error is not None and abs(m.error) < 0.05, predicted=m.predicted_bytes,
                     measured=m.peak_bytes, allocator_peak=m.allocator_peak_bytes, error=m.error,
                     before=m.before, step_peak=m.step_peak_bytes, at_peak=m.at_peak,
                     allocator_overhead=m.allocator_overhead_bytes, breakdown=f.breakdown(held_out))
    if device == "cuda":
        # The allocator's own history of one more step at the largest size: what the forecast's
        # recorder saw against every block the caching allocator handed out.
        from tbmem._internal import _torch_private as tp

        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        tp.record_memory_history(stacks="python", max_entries=200_000)
        step(make(2048))
        torch.cuda.synchronize(dev)
        raw = tp.cuda_snapshot()
        tp.stop_memory_history()
        if raw is not None:
            tp.dump_snapshot_pickle(raw, str(out / "forecast_2048_snapshot.pickle"))
        checks.facts["history_step_2048_peak_allocated"] = torch.cuda.max_memory_allocated(dev)
    checks.facts["table"] = f.table(at=[512, 2048])
    print(checks.facts["table"])
    return checks.save()


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; 1 when one of its checks failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=("trainer", "oom", "forecast"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    return {"trainer": trainer, "oom": oom, "forecast": forecast}[args.check](args.out, args.device)


if __name__ == "__main__":
    raise SystemExit(main())
