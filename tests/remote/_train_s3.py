"""A small training loop writing its run to a URL (tests/remote/test_s3.py).

    python tests/remote/_train_s3.py URL STEPS [PAUSE_FILE]

Every step trains a tiny model and logs memory (a census every 2 steps, a snapshot every 4). With
PAUSE_FILE, after step 4 it writes PAUSE_FILE.ready and waits until PAUSE_FILE exists (the test
stops the storage server meanwhile), then trains on. Prints "done <steps>" at the end.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from tbmem import MemoryWriter


def main(url: str, steps: int, pause: str | None) -> None:
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with MemoryWriter(url, every=1, census_every=2, snapshot={"every": 4, "window": 1, "html": True}) as w:
        w.watch(model, opt)
        for step in range(steps):
            with w.monitored_step(step):
                loss = model(torch.randn(8, 32)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            w.add_scalar("Loss/train", float(loss), step)
            if pause and step == 4:
                w.flush()
                time.sleep(1.5)  # an upload round (TBMEM_REMOTE_EVERY_S) after the flush
                open(pause + ".ready", "w").close()
                while not os.path.exists(pause):
                    time.sleep(0.05)
    print("done", steps, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
