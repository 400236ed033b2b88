"""A job of N ranks under ``torchrun --standalone`` (gloo, CPU) in a layout given on the command line.

    torchrun --standalone --nproc_per_node=N tests/distributed/_compact_job.py LAYOUT LOG_DIR STEPS

Every rank logs STEPS real records (``log_memory``) and, at steps 1000 + s, readings that depend
only on its rank and step (a record of raw readings, ``_write_readings``), so two jobs in two layouts can be compared value
by value. Rank 5 (or the last rank) holds 120 MB more than the others: it holds the peak RSS.
Rank 3 fires an alert (a host threshold of 0.1%). Rank 0 prints a JSON line of its paths.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from tbmem import MemoryWriter


def main(layout: str, log_dir: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    heavy = min(5, world - 1)
    held = bytearray(120 * 2**20) if rank == heavy else None
    if held is not None:
        for i in range(0, len(held), 4096):  # resident, every page
            held[i] = 1
    alerts = {"host_percent": 0.1, "device_percent": None, "growth_mb_per_1k": None,
              "rss_growth_mb_per_1k": None} if rank == 3 else None
    # system_every_s=0: the system readings at every record, so both layouts write the same tags
    with MemoryWriter(log_dir, every=1, census_every=0, alerts=alerts, system_every_s=0,
                      ranks={"layout": layout, "timeout_s": 60}) as w:
        for step in range(steps):
            w.log_memory(step)
            dist.barrier()
        for step in range(steps):
            w._write_readings({"ram_rss": (rank + 1) * 2**30 + step * 2**20, "step_time": 0.001 * (rank + step)},
                              1000 + step)
    if rank == 0:
        print(json.dumps({"log_dir": w.log_dir, "heavy": heavy}), flush=True)
    dist.destroy_process_group()
    del held


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
