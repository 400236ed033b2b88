"""Snapshot capture, write and render at 10k / 100k / 1M events, with sizes next to torch's trace_plot.

Run: ``.venv/bin/python benchmarks/bench_snapshot.py [--sizes 10000 100000 1000000] [--no-browser]``

For each size it builds a snapshot dict in torch's format (``device_traces`` of
alloc / free_requested / free_completed with shared frame dicts, as
``torch.cuda.memory._snapshot()`` returns them), then times the conversion to
tbmem's schema ("capture"), the gzip JSON + HTML writes, and the page load in
headless Chromium (parse, aggregate, first draw) plus one hover. Sizes: the
pickle (protocol 4), tbmem's json.gz and HTML, and torch's trace_plot HTML.
Separately it times the every-device recorder against the same loop without it.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tbmem import _torch_private as tp  # noqa: E402
from tbmem.snapshot.cuda import convert_torch_snapshot  # noqa: E402
from tbmem.snapshot.schema import encode_json_gz  # noqa: E402
from tbmem.snapshot.viewer import render_html  # noqa: E402

__all__ = ["torch_format_snapshot", "main"]


def torch_format_snapshot(n_events: int, seed: int = 0) -> dict:
    """A torch-format snapshot with about ``n_events`` alloc/free events (a third each action)."""
    rng = random.Random(seed)
    files = [f"/home/user/project/models/module_{i}.py" for i in range(30)]
    frame_pool = [{"filename": rng.choice(files), "line": rng.randint(1, 900), "name": f"fn_{i}"}
                  for i in range(300)]
    stacks = [[rng.choice(frame_pool) for _ in range(rng.randint(6, 18))] for _ in range(200)]
    trace, live, t, addr = [], [], 1_700_000_000_000_000, 0x7F0000000000
    n_allocs = n_events // 3
    for _ in range(n_allocs):
        t += rng.randint(1, 50)
        if live and (len(live) > 2000 or rng.random() < 0.45):
            a, size, fr = live.pop(rng.randrange(len(live)))
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": a, "size": size, "stream": 0, "time_us": t,
                              "frames": list(fr)})
        addr += 512 * rng.randint(1, 4096)
        size = 512 * rng.randint(1, 8192)
        fr = rng.choice(stacks)
        trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": list(fr)})
        live.append((addr, size, fr))
    return {"segments": [], "device_traces": [trace[:n_events]]}


def _only(url: str):
    """A route handler that lets only ``url`` through (no network for the page)."""
    def handler(route) -> None:
        route.continue_() if route.request.url == url else route.abort()
    return handler


def _browser_times(paths: list[str]) -> dict[str, tuple[float, float]]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {}
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for path in paths:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            url = "file://" + path
            page.route("**/*", _only(url))
            t0 = time.perf_counter()
            page.goto(url, timeout=300_000)
            page.wait_for_function("window.tbmemViewer !== undefined", timeout=300_000)
            load = time.perf_counter() - t0
            pt = page.evaluate("window.tbmemViewer.peakPoint()")
            box = page.locator("#timeline").bounding_box()
            page.evaluate("document.getElementById('tooltip').hidden = true")
            t0 = time.perf_counter()
            page.mouse.move(box["x"] + pt["x"], box["y"] + pt["y"])
            page.wait_for_selector("#tooltip:not([hidden])", timeout=60_000)
            out[path] = (load, time.perf_counter() - t0)
            page.close()
        browser.close()
    return out


def _recorder_overhead(steps: int = 30) -> tuple[float, int]:
    import torch

    from tbmem.snapshot.recorder import DispatchRecorder

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters())

    def loop() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            model(torch.randn(64, 256)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        return time.perf_counter() - t0

    loop()
    base = min(loop() for _ in range(3))
    rec = DispatchRecorder(models=lambda: [model], optimizers=lambda: [opt])
    rec.start()
    recorded = min(loop() for _ in range(3))
    rec.stop()
    return recorded / base, rec.snapshot(kind="snapshot", step=0).n_events


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="tbmem-bench-")
    rows, html_paths = [], []
    for n in args.sizes:
        data = torch_format_snapshot(n)
        t0 = time.perf_counter()
        snap = convert_torch_snapshot(data, kind="snapshot", step=0)
        capture = time.perf_counter() - t0
        t0 = time.perf_counter()
        gz = encode_json_gz(snap)
        page = render_html(snap)
        write = time.perf_counter() - t0
        pickled = len(pickle.dumps(data, protocol=4))
        torch_html = tp.memory_viz_trace_plot(data)
        path = os.path.join(folder, f"snap_{n}.html")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page)
        html_paths.append(path)
        rows.append((n, snap.n_events, capture, write, len(gz), len(page.encode()), pickled,
                     len(torch_html) if torch_html else 0))
    browser = {} if args.no_browser else _browser_times(html_paths)
    print(f"{'torch entries':>13} {'tbmem events':>12} {'capture s':>9} {'write s':>8} {'load s':>7} {'hover s':>8} {'json.gz MB':>10} "
          f"{'html MB':>8} {'pickle MB':>9} {'torch html MB':>13} {'html/pickle':>11} {'torch/pickle':>12}")
    for (n, ne, cap, wr, gz, html, pk, th), path in zip(rows, html_paths):
        load, hover = browser.get(path, (float("nan"), float("nan")))
        print(f"{n:>13} {ne:>12} {cap:>9.2f} {wr:>8.2f} {load:>7.2f} {hover:>8.3f} {gz / 2**20:>10.2f} {html / 2**20:>8.2f} "
              f"{pk / 2**20:>9.2f} {th / 2**20:>13.2f} {html / pk:>11.2f} {th / pk:>12.2f}")
    for n, _ne, _cap, _wr, _gz, html, pk, th in rows:
        print(f"RESULT name=snapshot.html_vs_pickle_{n} ratio={html / pk:.4f} limit=1.0")
        if th:
            print(f"RESULT name=snapshot.torch_trace_plot_html_vs_pickle_{n} ratio={th / pk:.4f} limit=-")
    ratio, events = _recorder_overhead()
    print(f"\ndispatch recorder: training loop time x{ratio:.2f} while recording ({events} events, MLP on CPU)")
    print(f"RESULT name=snapshot.dispatch_recorder_step_vs_plain ratio={ratio:.4f} limit=-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
