"""Screenshots of the Memory tab on the demo's logdir: the first view, a clicked step, an opened snapshot.

Run: ``.venv/bin/python scripts/memory_tab_screenshot.py [--logdir runs] [--out-dir DIR] [--docs]``

The logdir is ``make demo``'s ``runs/`` (written first by make demo's own commands into a temporary
folder when ``--logdir`` does not exist). Starts ``tensorboard`` on 127.0.0.1, opens the Memory tab
in headless Chromium with every non-local request blocked, and saves ``memory-tab-first.png`` (what
a new user sees), ``memory-tab-step.png`` (a step clicked: the census and readings there) and
``memory-tab-snapshot.png`` (a snapshot opened in the viewer) into ``--out-dir``; ``--docs`` also
writes the clicked-step view to docs/img/memory-tab.png as a palette PNG (Pillow), so the committed
file stays small.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _tab(page, part: str = "plugin_entry.html"):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tab = next((f for f in page.frames if part in f.url), None)
        if tab is not None:
            return tab
        page.wait_for_timeout(200)
    raise RuntimeError(f"no frame {part!r} appeared")


def shoot(logdir: Path, out_dir: Path, tmp: Path) -> dict[str, Path]:
    """The three screenshots of the tab on ``logdir``, written into ``out_dir``."""
    from playwright.sync_api import sync_playwright

    from tests._browser import wait_until
    from tests.plugin._logdir import Server

    out_dir.mkdir(parents=True, exist_ok=True)
    runs = sorted(str(p.parent.relative_to(logdir)) for p in logdir.rglob("events.out.tfevents*"))
    srv = Server(tmp, "--logdir", str(logdir), wait_run=runs[-1])
    shots = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(srv.base) else r.abort())
            page.goto(f"{srv.base}/#tbmem")
            tab = _tab(page)
            wait_until(tab, "() => window.tbmemMemoryTab && window.tbmemMemoryTab.chart && window.tbmemMemoryTab.overview")
            page.wait_for_timeout(500)
            shots["first"] = out_dir / "memory-tab-first.png"
            page.screenshot(path=str(shots["first"]))
            box = tab.locator("#chart .u-over").first.bounding_box()
            page.mouse.click(box["x"] + box["width"] * 0.62, box["y"] + box["height"] * 0.5)
            tab.wait_for_selector("#at-box:not([hidden]) .census-table")
            page.mouse.move(box["x"] + box["width"] * 0.62, box["y"] + box["height"] * 0.4)
            page.wait_for_timeout(500)
            shots["step"] = out_dir / "memory-tab-step.png"
            page.screenshot(path=str(shots["step"]))
            tab.locator("#snapshots button.open").last.click()
            tab.wait_for_selector("#viewer-box:not([hidden])")
            viewer = _tab(page, "/data/plugin/tbmem/snapshot?")  # the frame appears once the page has loaded
            wait_until(viewer, "() => window.tbmemViewer !== undefined && window.tbmemViewer.exact", timeout_s=60)
            tab.locator("#viewer").scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            shots["snapshot"] = out_dir / "memory-tab-snapshot.png"
            page.screenshot(path=str(shots["snapshot"]))
            browser.close()
    finally:
        srv.stop()
    return shots


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logdir", default=str(ROOT / "runs"), help="make demo's runs/ (default)")
    ap.add_argument("--out-dir", default=".", help="where the three PNGs go (default: here)")
    ap.add_argument("--docs", action="store_true", help="also write docs/img/memory-tab.png")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(args.logdir)
        if not logdir.is_dir():
            from tests._demo import write_demo_logdir

            logdir = write_demo_logdir(Path(tmp))
        shots = shoot(logdir, Path(args.out_dir), Path(tmp))
    for path in shots.values():
        print(f"wrote {path}")
    if args.docs:
        from PIL import Image

        image = Image.open(io.BytesIO(shots["step"].read_bytes())).convert("RGB")
        image = image.quantize(colors=64, method=Image.Quantize.MEDIANCUT)
        out = ROOT / "docs" / "img" / "memory-tab.png"
        image.save(out, optimize=True)
        print(f"wrote {out} ({os.path.getsize(out) / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
