"""Regenerate docs/img/memory-tab.png: a short CPU training run under MemoryWriter, shown in the Memory tab.

Run: ``.venv/bin/python scripts/memory_tab_screenshot.py [--out docs/img/memory-tab.png]``

Writes a run (census every 10 steps with activations, a cache that grows by 256 KiB per
step, two snapshots), starts ``tensorboard`` on 127.0.0.1, opens the Memory tab in
headless Chromium with every non-local request blocked, clicks the chart and saves a
palette PNG (Pillow) so the committed file stays small.
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


def write_demo(run_dir: Path, steps: int = 120) -> None:
    import torch

    from tbmem import MemoryWriter
    from tbmem.snapshot import SnapshotConfig

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                                torch.nn.GELU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cache = []
    cfg = SnapshotConfig(steps=(40, 90), window=2, html=False)
    with MemoryWriter(run_dir, every=1, census_every=10, top_k=8, snapshot=cfg) as writer:
        writer.watch(model, opt)
        for step in range(steps):
            x = torch.randn(256, 512)
            loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (256,)))
            writer.log_memory(step, roots=(loss,))  # mid-step: the census sees the saved activations
            opt.zero_grad()
            loss.backward()
            opt.step()
            cache.append(torch.zeros(64 * 1024))  # the "leak": 256 KiB kept per step
            writer.add_scalar("Loss/train", loss.item(), step)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "memory-tab.png"))
    args = ap.parse_args()
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from tests.plugin._logdir import Server

    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp) / "runs"
        write_demo(logdir / "demo")
        srv = Server(Path(tmp), "--logdir", str(logdir), wait_run="demo")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(srv.base) else r.abort())
                page.goto(f"{srv.base}/#tbmem")
                deadline = time.monotonic() + 60
                tab = None
                while tab is None and time.monotonic() < deadline:
                    tab = next((f for f in page.frames if "plugin_entry.html" in f.url), None)
                    page.wait_for_timeout(200)
                tab.wait_for_selector("#chart canvas", timeout=60_000)
                box = tab.locator("#chart .u-over").bounding_box()
                page.mouse.click(box["x"] + box["width"] * 0.62, box["y"] + box["height"] * 0.5)
                tab.wait_for_selector("#at-box:not([hidden]) .top-table")
                page.mouse.move(box["x"] + box["width"] * 0.62, box["y"] + box["height"] * 0.4)
                page.wait_for_timeout(500)
                png = page.screenshot()
                browser.close()
        finally:
            srv.stop()
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    image.save(args.out, optimize=True)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
