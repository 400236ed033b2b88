"""A tiny compact job under ``torchrun --standalone`` (gloo, CPU) that trains and logs its loss.

    torchrun --standalone --nproc_per_node=N tests/interop/_compact_trace_job.py LOG_DIR STEPS

Every rank trains a tiny model of its own (seeded by its rank) for STEPS steps, records memory at each
step (``log_memory``), writes its batch loss with ``write_scalars`` (``Loss/batch``) and with
``add_scalar`` (``train/loss``, a framework's loss tag), and prints one JSON line of the losses it wrote.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from tbmem import MemoryWriter


def main(log_dir: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    losses = []
    with MemoryWriter(log_dir, every=1, census_every=0, system_every_s=0,
                      ranks={"layout": "compact", "timeout_s": 60}) as w:
        for step in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = float(loss.item())
            losses.append(value)
            w.write_scalars({"Loss/batch": value}, step)
            w.add_scalar("train/loss", value, step)
            w.log_memory(step)
            dist.barrier()
    print(json.dumps({"rank": rank, "losses": losses, "log_dir": w.log_dir}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
