"""The README's Quickstart, runnable: a small CNN trained for a few steps under a :class:`tbmem.MemoryWriter`.

    .venv/bin/python examples/memory_writer_quickstart.py                   # writes runs/quickstart
    .venv/bin/python examples/memory_writer_quickstart.py --logdir /tmp/qs --steps 30
    .venv/bin/tensorboard --logdir runs      # then the Memory tab: http://127.0.0.1:6006/#tbmem

Memory is recorded every 5 steps (``every=5``) and the tensor census taken every 10 (``census_every=10``);
the loss goes to TensorBoard at every step, through the same writer (it is a ``SummaryWriter`` too).
On a CPU-only machine the device readings are left out, never zero-filled.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from tbmem import MemoryWriter

__all__ = ["main"]


def main(argv: list[str] | None = None) -> str:
    """Train for ``--steps`` steps into ``--logdir``/quickstart; return the run's folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", default="runs", help="TensorBoard's logdir (default: runs)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 14 * 14, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    run = f"{args.logdir}/quickstart"
    with MemoryWriter(run, every=5, census_every=10) as writer:   # a SummaryWriter too
        writer.watch(model, optimizer)                             # names parameters, gradients, optimizer state
        for step in range(args.steps):
            images = torch.randn(32, 1, 28, 28, device=device)
            labels = torch.randint(0, 10, (32,), device=device)
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            writer.add_scalar("Loss/batch", loss.item(), step)
            writer.log_memory(step)                                # a no-op on steps that are not due
            optimizer.zero_grad(set_to_none=True)
    print(f"wrote {run}: memory every 5 steps, a census every 10, the loss every step")
    print(f"view it: .venv/bin/tensorboard --logdir {args.logdir}  (the Memory tab: http://127.0.0.1:6006/#tbmem)")
    return run


if __name__ == "__main__":
    main()
