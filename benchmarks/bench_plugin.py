"""The Memory tab's first view on a run of 100,000 logged steps and 200 censuses.

Run: ``.venv/bin/python benchmarks/bench_plugin.py [--steps 100000] [--censuses 200] [--rounds 7] [--no-rust]``

The run is written as MemoryWriter writes it: one event per record with the host readings
(RSS, peak RSS, system RAM, swap, CPU, step time), a census every ``steps / censuses``
steps (categories, dtypes, devices, modules, totals) with its line in
``plugins/tbmem/census.jsonl``, and two snapshots.

**Python loader, TensorBoard's defaults** (``--load_fast=false``; TensorBoard keeps 1000
records per scalar tag): TensorBoard's multiplexer loads the run once in this process.
Each round builds a fresh plugin (empty caches) and times the requests of the tab's
first view (``runs``, ``overview``, ``snapshots``), interleaved with the baseline:
TensorBoard's own Scalars plugin fetching the same series (``tags`` plus one
``scalars`` request per tag the tab draws). Requests go through the WSGI apps with
werkzeug's test client, so HTTP overhead is not in either number.

**Rust loader, every record kept** (``--load_fast=true --samples_per_plugin
scalars=<steps>``): a real ``tensorboard`` on 127.0.0.1; after it loaded the run, the
first view over HTTP (cold caches), then warm views and the Scalars baseline over HTTP,
alternating. Repeated on fresh servers.

The page asks for the chart with ``quick=1``: a series longer than 8 records per pixel
column is then drawn first from a sample the data provider draws (cheap on the Rust
server; the Python loader never samples), and the exact chart follows.

RESULT lines: first view (chart drawn) / 1 s (the issue's budget, limit 1.0), the exact
chart / 1 s (no limit), and the exact first view / the Scalars plugin's fetch of the same
series.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import result_line  # noqa: E402

__all__ = ["write_run", "main"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "buffers", "activations", "other")
RUN = "big"


def write_run(logdir: Path, steps: int, censuses: int) -> Path:
    """Write the benchmark run with tbmem's writer path (batched Summary per record)."""
    import math

    from tbmem._internal.census.report import Census, TensorRecord
    from tbmem._internal.logdir.census_log import append_census
    from tbmem._internal.snapshot.schema import SnapshotBuilder, encode_json_gz
    from tbmem._internal.writer import MemoryWriter

    run = logdir / RUN
    every = max(1, steps // censuses)
    with MemoryWriter(run, custom_layout=False, census_every=0) as w:
        for s in range(steps):
            rss = 3.0 + 0.2 * math.sin(s / 997.0) + (0.5 if s % 7919 == 0 else 0.0)
            values = {"Memory/RAM/process_rss_GB": rss, "Memory/RAM/process_peak_rss_GB": rss + 0.05,
                      "System/ram_used_GB": 12.0, "System/ram_available_GB": 50.0,
                      "System/ram_percent": 19.0, "System/swap_used_GB": 0.0,
                      "Perf/process_cpu_percent": 100.0, "Perf/step_time_ms": 25.0}
            if s % every == 0:
                recs = [TensorRecord(name=f"layer{i}.weight", category=CATEGORIES[i % 6], shape=(1024, 256 * (i + 1)),
                                     dtype="float32" if i % 3 else "bfloat16", device="cpu",
                                     bytes=2**20 * (i + 1) + s, module=f"model.block{i % 3}") for i in range(12)]
                census = Census.from_records(recs, large_tensor_bytes=2**20, top_k=10, duration_s=0.006)
                values.update(census.scalars())
                append_census(str(run), s, census)
            w.write_scalars(values, s)
    for step in (steps // 3, 2 * steps // 3):
        b = SnapshotBuilder(source="dispatch", device="cpu")
        for i in range(200):
            b.alloc(4096 * (i + 1), stack=[("train.py", 10 + i % 7, "forward")], time_us=i)
        (run / "plugins" / "tbmem").mkdir(parents=True, exist_ok=True)
        (run / "plugins" / "tbmem" / f"snapshot_rank0_step{step:09d}.json.gz").write_bytes(
            encode_json_gz(b.build(kind="snapshot", step=step)))
    return run


def _drawn_tags() -> list[str]:
    return [f"Memory/Tensor_Category/{c}_MB" for c in CATEGORIES] + ["Memory/RAM/process_rss_GB",
                                                                     "Memory/RAM/process_peak_rss_GB"]


# --- Python loader, in process ------------------------------------------------------------
def _python_loader(logdir: Path, rounds: int) -> dict[str, float]:
    from tensorboard.backend.event_processing import data_ingester, plugin_event_multiplexer
    from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.scalar.scalars_plugin import ScalarsPlugin
    from werkzeug.test import Client

    from tbmem._internal._fastcrc import install_reader
    from tbmem._internal.plugin.plugin import MemoryPlugin

    install_reader()  # only to load the benchmark's logdir faster; the timed requests do not read files
    mux = plugin_event_multiplexer.EventMultiplexer(
        size_guidance=data_ingester.DEFAULT_SIZE_GUIDANCE,
        tensor_size_guidance=dict(data_ingester.DEFAULT_TENSOR_SIZE_GUIDANCE))
    t0 = time.perf_counter()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    print(f"python loader: TensorBoard loaded the run in {time.perf_counter() - t0:.1f} s "
          f"(keeps {len(mux.Tensors(RUN, 'Memory/RAM/process_rss_GB'))} of the RSS records)")
    provider = MultiplexerDataProvider(mux, str(logdir))

    def context() -> base_plugin.TBContext:
        return base_plugin.TBContext(data_provider=provider, multiplexer=mux, logdir=str(logdir),
                                     flags=argparse.Namespace(logdir=str(logdir), logdir_spec=""))

    def call(apps: dict, route: str, query: str) -> bytes:
        client = Client(apps[route])
        resp = client.get(f"{route}?{query}")
        assert resp.status_code == 200, (route, resp.status_code, resp.data[:300])
        return resp.data

    def first_view() -> None:
        apps = MemoryPlugin(context()).get_plugin_apps()  # a new plugin: nothing cached
        call(apps, "/runs", "")
        doc = json.loads(call(apps, "/overview", f"run={RUN}&breakdown=category&points=1400&quick=1"))
        assert doc["sampled"] == []  # the Python loader never samples
        call(apps, "/snapshots", f"run={RUN}")

    scalars_apps = ScalarsPlugin(context()).get_plugin_apps()

    def scalars_dashboard() -> None:
        call(scalars_apps, "/tags", "")
        for tag in _drawn_tags():
            call(scalars_apps, "/scalars", f"run={RUN}&tag={tag}")

    first_view()  # imports, first numpy use: not part of a round
    cold, base = [], []
    for _ in range(rounds):
        for fn, out in ((first_view, cold), (scalars_dashboard, base)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    plugin = MemoryPlugin(context())
    apps = plugin.get_plugin_apps()
    first_view_apps = apps
    call(first_view_apps, "/overview", f"run={RUN}&breakdown=category&points=1400")
    timings = {}
    for name, route, query in (("warm overview", "/overview", f"run={RUN}&breakdown=category&points=1400"),
                               ("breakdown switch (dtype)", "/overview", f"run={RUN}&breakdown=dtype&points=1400"),
                               ("census at a step", "/at", f"run={RUN}&step={12345}"),
                               ("findings (leaks + summary)", "/findings", f"run={RUN}")):
        start = time.perf_counter()
        call(apps, route, query)
        timings[name] = time.perf_counter() - start
    ratios = [c / b for c, b in zip(cold, base)]
    print("| python loader, TensorBoard defaults | median | min | max |\n|---|---|---|---|")
    print(f"| first view (runs + overview + snapshots), cold | {statistics.median(cold) * 1e3:.0f} ms "
          f"| {min(cold) * 1e3:.0f} ms | {max(cold) * 1e3:.0f} ms |")
    print(f"| Scalars plugin, same 8 series | {statistics.median(base) * 1e3:.0f} ms | {min(base) * 1e3:.0f} ms "
          f"| {max(base) * 1e3:.0f} ms |")
    print(f"| ratio per round | {statistics.median(ratios):.2f} | {min(ratios):.2f} | {max(ratios):.2f} |")
    for name, t in timings.items():
        print(f"| {name} | {t * 1e3:.0f} ms | | |")
    return {"cold": statistics.median(cold), "ratio": statistics.median(ratios)}


# --- Rust loader, real server ---------------------------------------------------------------
def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:
        return r.read()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rust_loader(logdir: Path, steps: int, servers: int, rounds: int) -> dict[str, float] | None:
    exe = Path(sys.executable).with_name("tensorboard")
    if not exe.exists():
        print("rust loader: no tensorboard executable next to this Python; skipped")
        return None
    cold, complete, warm, base = [], [], [], []
    for _ in range(servers):
        port = _free_port()
        base_url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([str(exe), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port),
                                 "--load_fast", "true", "--samples_per_plugin", f"scalars={steps}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            t0 = time.perf_counter()
            while True:  # loaded when every record of the last tag written is there
                try:
                    pts = json.loads(_get(f"{base_url}/data/plugin/scalars/scalars?run={RUN}&tag=Perf/step_time_ms"))
                    if len(pts) >= steps:
                        break
                except OSError:
                    pass
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError("the Rust data server did not load the run in 10 minutes")
                time.sleep(1)
            plugin = f"{base_url}/data/plugin/tbmem"

            def view() -> bool:
                """What the page does: runs, the quick chart, the snapshot list; then the exact chart if
                the quick one was drawn from a sample. Returns whether it was."""
                _get(f"{plugin}/runs")
                doc = json.loads(_get(f"{plugin}/overview?run={RUN}&breakdown=category&points=1400&quick=1"))
                _get(f"{plugin}/snapshots?run={RUN}")
                return bool(doc["sampled"])

            def exact() -> None:
                _get(f"{plugin}/overview?run={RUN}&breakdown=category&points=1400")

            def dashboard() -> None:
                _get(f"{base_url}/data/plugin/scalars/tags")
                for tag in _drawn_tags():
                    _get(f"{base_url}/data/plugin/scalars/scalars?run={RUN}&tag={urllib.request.quote(tag)}")

            start = time.perf_counter()
            was_sampled = view()
            cold.append(time.perf_counter() - start)
            if was_sampled:
                exact()
            complete.append(time.perf_counter() - start)
            for _ in range(rounds):
                for fn, out in ((view, warm), (dashboard, base)):
                    start = time.perf_counter()
                    fn()
                    out.append(time.perf_counter() - start)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"\n| rust loader, all {steps} records kept, over HTTP | median | min | max |\n|---|---|---|---|")
    for name, xs in (("first view, cold: chart drawn (one per server)", cold),
                     ("first view, cold: exact chart (one per server)", complete), ("view, warm", warm),
                     ("Scalars plugin, same 8 series", base)):
        print(f"| {name} | {statistics.median(xs) * 1e3:.0f} ms | {min(xs) * 1e3:.0f} ms | {max(xs) * 1e3:.0f} ms |")
    return {"cold": statistics.median(cold), "complete": statistics.median(complete),
            "ratio": statistics.median(complete) / statistics.median(base)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--censuses", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--no-rust", action="store_true")
    ap.add_argument("--no-python", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        t0 = time.perf_counter()
        write_run(logdir, args.steps, args.censuses)
        print(f"wrote {args.steps} records and {args.censuses} censuses in {time.perf_counter() - t0:.1f} s\n")
        py = None if args.no_python else _python_loader(logdir, args.rounds)
        rust = None if args.no_rust else _rust_loader(logdir, args.steps, args.servers, args.rounds)
    if py is not None:
        print(result_line(f"plugin.first_view_{args.steps}_steps_python_loader_vs_1s", py["cold"], 1.0))
        print(result_line("plugin.first_view_vs_scalars_plugin_python_loader", py["ratio"]))
    if rust is not None:
        print(result_line(f"plugin.first_view_{args.steps}_steps_all_kept_rust_vs_1s", rust["cold"], 1.0))
        print(result_line(f"plugin.exact_view_{args.steps}_steps_all_kept_rust_vs_1s", rust["complete"]))
        print(result_line("plugin.first_view_vs_scalars_plugin_all_kept_rust", rust["ratio"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
