"""Under ``torchrun --standalone --nproc_per_node=2``: each rank logs records to its writer with W&B and
MLflow sinks in the mode given (``rank0`` or ``per_rank``).

    torchrun ... tests/sinks/_rank_job.py MODE LOG_DIR
"""

from __future__ import annotations

import sys

import torch.distributed as dist

from tbmem import MemoryWriter
from tbmem._internal.sinks import MlflowSink, WandbSink


def main(mode: str, log_dir: str) -> None:
    dist.init_process_group("gloo")
    name = log_dir.rstrip("/").rsplit("/", 1)[-1]
    sinks = [WandbSink(name=name, ranks=mode), MlflowSink(run_name=name, ranks=mode)]
    with MemoryWriter(log_dir, every=1, census_every=0, sinks=sinks, ranks={"timeout_s": 60}) as w:
        for step in range(6):
            w.log_memory(step)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
