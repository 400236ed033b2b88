"""A small multi-rank job run by the tests under ``torchrun --standalone`` (gloo on CPU).

    torchrun --standalone --nproc_per_node=N tests/distributed/_job.py SCENARIO LOG_DIR [STEPS]

Scenarios:
    aggregate      every rank logs STEPS records; the last rank holds 80 MB more than the others
    failing_probe  rank 1's host probe raises: it is switched off there, the job still ends
    oom            a DDP model; rank 1 raises torch.OutOfMemoryError inside monitored_step at step 3
    skew           rank 1 logs one record fewer than the others and ends (ranks out of step)
    linger         rank 1 logs one record fewer, closes its writer and goes on "training" (no collective)
    shifted        rank 1 logs the same number of records at other steps (step + 1)
    rank0_only     a DDP model; only rank 0 opens a MemoryWriter (the usual SummaryWriter pattern)
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from tbmem import MemoryWriter
from tbmem._internal.probes import HostProbe


def _hold_mb(mb: int) -> bytearray:
    block = bytearray(mb * 2**20)
    for i in range(0, len(block), 4096):  # touch every page: it must be resident
        block[i] = 1
    return block


def aggregate(log_dir: str, steps: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    held = _hold_mb(80) if rank == world - 1 else None
    with MemoryWriter(log_dir, every=1, census_every=0, ranks={"timeout_s": 60}) as w:
        for step in range(steps):
            time.sleep(0.01 * (1 + rank))  # ranks out of phase: the gathers must still pair by step
            w.log_memory(step)
    del held


def failing_probe(log_dir: str, steps: int) -> None:
    if dist.get_rank() == 1:
        def boom(self):  # noqa: ANN001
            raise OSError("simulated: /proc is gone")
        HostProbe.read = boom
    with MemoryWriter(log_dir, every=1, census_every=0, ranks={"timeout_s": 60}) as w:
        for step in range(steps):
            w.log_memory(step)


def oom(log_dir: str, steps: int) -> None:
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = MemoryWriter(log_dir, every=2, census_every=0, snapshot={"html": False},
                     ranks={"timeout_s": 60, "oom_wait_s": 60})
    w.watch(model.module, opt)
    for step in range(steps):
        with w.monitored_step(step):
            loss = model(torch.randn(8, 64)).square().mean()
            if rank == 1 and step == 3:
                raise torch.OutOfMemoryError("simulated: CUDA out of memory. Tried to allocate 2.00 GiB")
            loss.backward()
            opt.step()
            opt.zero_grad()
    w.close()


def skew(log_dir: str, steps: int) -> None:
    rank = dist.get_rank()
    with MemoryWriter(log_dir, every=1, census_every=0, ranks={"timeout_s": 30}) as w:
        for step in range(steps):
            if rank == 1 and step == steps - 1:
                continue  # rank 1 ends one record early
            w.log_memory(step)
    print(json.dumps({"rank": rank, "ended": True}), flush=True)


def linger(log_dir: str, steps: int) -> None:
    rank = dist.get_rank()
    with MemoryWriter(log_dir, every=1, census_every=0, ranks={"timeout_s": 120}) as w:
        for step in range(steps - (1 if rank == 1 else 0)):
            w.log_memory(step)
    if rank == 1:
        time.sleep(15)  # alive, group intact, but never joins rank 0's last gather
    dist.barrier()


def shifted(log_dir: str, steps: int) -> None:
    rank = dist.get_rank()
    with MemoryWriter(log_dir, every=1, census_every=0, ranks={"timeout_s": 60}) as w:
        for step in range(steps):
            w.log_memory(step + (1 if rank == 1 else 0))
    dist.barrier()


def rank0_only(log_dir: str, steps: int) -> None:
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    writer = MemoryWriter(log_dir, every=1, census_every=0) if rank == 0 else None
    for step in range(steps):
        model(torch.randn(4, 16)).square().mean().backward()  # an all-reduce every step
        if writer is not None:
            writer.log_memory(step)
    if writer is not None:
        writer.close()


SCENARIOS = {"aggregate": aggregate, "failing_probe": failing_probe, "oom": oom, "skew": skew, "linger": linger,
             "shifted": shifted, "rank0_only": rank0_only}


def main() -> None:
    scenario, log_dir = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    dist.init_process_group("gloo")
    finished = False
    try:
        SCENARIOS[scenario](log_dir, steps)
        finished = True
    finally:
        if scenario != "oom":
            if finished:
                # Every rank's collectives done before the group goes, and the DDP model released:
                # gloo's threads keep finished work objects holding tensors, and dropping those at
                # interpreter exit aborts the process ("terminate called without an active
                # exception"), as trainers/distributed.py's close() explains. Skipped after an
                # error: a rank that failed would never arrive.
                gc.collect()
                dist.barrier()
            dist.destroy_process_group()
    print(f"rank {os.environ['RANK']} done", flush=True)


if __name__ == "__main__":
    main()
