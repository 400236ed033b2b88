"""Snapshot reading at scale: a synthetic torch snapshot pickle of 1M / 3M / 10M trace entries through
``tbmem snapshot stats`` and ``html``, with the page's first draw and hover in headless Chromium.

Run: ``.venv/bin/python benchmarks/bench_snapshot.py [--sizes 1000000 3000000 10000000] [--no-browser]``
(``--write-only N PATH`` just writes the pickle). The pickles go to a temporary folder, never
the repository; 10M entries take about 4 minutes to write.

The generator (``benchmarks/_snapshot_pickle.py``) writes protocol-4 pickle opcodes directly (a 10M-entry dict would take 6 GB to
build in Python), byte for byte what CPython's pickler writes for the same objects
(tests/snapshot/test_synthetic.py checks that): a training loop of forward, backward and
optimizer phases whose allocations carry realistic stacks (user modules calling torch's
``nn.Module`` machinery, 5-15 frames; ``--cpp`` adds C++ frames as ``stacks="all"`` does; backward
allocations have the empty stacks of the autograd engine's threads), frees with their own
free-site stacks shared by ``free_requested``/``free_completed`` as torch shares them, address
reuse, segment events, memory allocated before the trace, a final ``oom``, ``time_us`` and
``compile_context`` fields. Each size runs ``stats --json`` and ``html`` in a fresh process
with its wall and CPU time (``resource``) and its own peak RSS (``VmHWM`` of the command's process, not the
``ru_maxrss`` Linux carries over from the process that generated the pickle).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

__all__ = ["PickleWriter", "write_torch_pickle", "simulate", "main", "browser_times"]

from benchmarks._snapshot_pickle import PickleWriter, simulate, write_torch_pickle  # noqa: E402

# The command's own peak: VmHWM, the high-water mark of this process's memory map, which exec starts afresh.
# Not ru_maxrss: Linux carries it across fork and exec, so each child reported the peak of the process that
# generated the pickle (3.32 GiB for `stats` at 10M entries, where the command itself peaks at 0.99 GiB).
_RUNNER = ("import atexit, runpy, sys; "
           "atexit.register(lambda: print('MAXRSS_KB=%s' % [l.split()[1] for l in open('/proc/self/status') "
           "if l.startswith('VmHWM:')][0], file=sys.stderr)); "
           "sys.argv = ['tbmem'] + sys.argv[1:]; runpy.run_module('tbmem._internal.cli', run_name='__main__')")


def _run(args: list[str]) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS GiB, stdout) of ``tbmem ARGS`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _RUNNER, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"tbmem {' '.join(args)} failed: {proc.stderr[-2000:]}")
    rss_kb = int(proc.stderr.rsplit("MAXRSS_KB=", 1)[1].split()[0])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, rss_kb / 2**20, proc.stdout


def _only(url: str):
    def handler(route) -> None:
        route.continue_() if route.request.url == url else route.abort()
    return handler


def browser_times(path: str) -> dict[str, float]:
    """Seconds from navigation to the first drawn timeline and to the exact one, and milliseconds of
    the worst hover around the peak, of a redraw zoomed into 1/1000 of the trace (and the worst of
    five zoom steps), and of the allocator view at the peak and at four other events, in headless
    Chromium (the page's own clock, performance.now())."""
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests._browser import wait_until

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        url = "file://" + path
        page.route("**/*", _only(url))
        page.goto(url, timeout=300_000)
        wait_until(page, "window.tbmemViewer !== undefined && window.tbmemViewer.exact && "
                         "window.tbmemViewer.state.allocDrawn === true", timeout_s=300)
        timing = page.evaluate("window.tbmemViewer.timing")
        out = {"first": timing.get("overview", timing["drawn"]) / 1000, "exact": timing["drawn"] / 1000}
        pt = page.evaluate("window.tbmemViewer.peakPoint()")
        out["hover_ms"] = max(page.evaluate("""([x, y]) => window.tbmemViewer.timeHover(x, y)""", [pt["x"] + dx, pt["y"]])
                              for dx in (0, -3, 3, -6, 6))
        v = page.evaluate("window.tbmemViewer.view()")["full"]
        span = v["x1"] - v["x0"]
        out["zoom_ms"] = max(page.evaluate(f"window.tbmemViewer.setView({v['x0'] + span * f}, "
                                           f"{v['x0'] + span * (f + 0.001)})") for f in (0.1, 0.3, 0.5, 0.7, 0.9))
        out["full_ms"] = page.evaluate(f"window.tbmemViewer.setView({v['x0']}, {v['x1']})")
        n = page.evaluate("window.tbmemViewer.head.snapshots[0].devices[0].n_events")
        peak = page.evaluate("window.tbmemViewer.stats().peakEvent")
        out["alloc_ms"] = max(page.evaluate(f"window.tbmemViewer.timeAllocator({e})")
                              for e in (peak, n // 5, n // 2, n * 4 // 5, n - 1))
        browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    """Write each size, run stats and html on it, print the table and RESULT lines."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--cpp", action="store_true", help="C++ frames in the stacks, as stacks='all'")
    ap.add_argument("--write-only", nargs=2, metavar=("N", "PATH"))
    ap.add_argument("--folder", default=None, help="where the pickles go (default: a temporary folder)")
    # the dispatch recorder's cost moved to bench_recorder.py (interleaved rounds); accepted for old commands
    ap.add_argument("--no-recorder", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write_only:
        with open(args.write_only[1], "wb") as fh:
            facts = write_torch_pickle(fh, int(args.write_only[0]), cpp=args.cpp)
        print(json.dumps(facts))
        return 0
    folder = args.folder or tempfile.mkdtemp(prefix="tbmem-bench-")
    rows = []
    for n in args.sizes:
        path = os.path.join(folder, f"synthetic_{n}.pickle")
        if not os.path.exists(path):
            with open(path, "wb") as fh:
                write_torch_pickle(fh, n, cpp=args.cpp)
        stats_s, stats_cpu, stats_gb, out = _run(["snapshot", "stats", path, "--json"])
        peak = json.loads(out)["devices"][0]["peak_bytes"]
        html = path[:-7] + ".html"
        html_s, html_cpu, html_gb, _ = _run(["snapshot", "html", path, "-o", html])
        nan = float("nan")
        b = {k: nan for k in ("first", "exact", "hover_ms", "zoom_ms", "full_ms", "alloc_ms")} if args.no_browser \
            else browser_times(html)
        rows.append((n, os.path.getsize(path), (stats_s, stats_cpu), stats_gb, (html_s, html_cpu), html_gb,
                     os.path.getsize(html), b, peak))
    print(f"load average (1 min) before the last run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'entries':>10} {'pickle MB':>9} {'stats s (cpu)':>14} {'stats GiB':>9} {'html s (cpu)':>13} "
          f"{'html GiB':>8} {'page MB':>8} {'first s':>7} {'exact s':>7} {'hover ms':>8} {'zoom ms':>7} "
          f"{'full ms':>7} {'alloc ms':>8}")
    for n, size, ss, sg, hs, hg, page, b, _peak in rows:
        print(f"{n:>10} {size / 2**20:>9.0f} {ss[0]:>6.1f} ({ss[1]:>5.1f}) {sg:>9.2f} {hs[0]:>5.1f} ({hs[1]:>5.1f}) "
              f"{hg:>8.2f} {page / 2**20:>8.1f} {b['first']:>7.2f} {b['exact']:>7.2f} {b['hover_ms']:>8.1f} "
              f"{b['zoom_ms']:>7.1f} {b['full_ms']:>7.1f} {b['alloc_ms']:>8.1f}")
    for n, size, ss, sg, hs, hg, page, b, _peak in rows:
        print(f"RESULT name=snapshot.html_vs_pickle_bytes_{n} ratio={page / size:.4f} limit=1.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
