"""The SyntheticTrainer under torchrun (gloo, CPU); prints each rank's parameter checksum as JSON.

    torchrun --standalone --nproc_per_node=2 tests/trainers/_ddp_job.py WORK_DIR
"""

from __future__ import annotations

import gc
import hashlib
import json
import sys

import torch
import torch.distributed as dist

from trainers.config import validate
from trainers.distributed import setup
from trainers.monitoring import TrainerMonitoring
from trainers.synthetic import SyntheticTrainer


def main() -> None:
    work = sys.argv[1]
    cfg = validate({"experiment": "ddp", "data": {"resolution": 16, "num_frames": 10, "num_sims": 3,
                                                  "cache_dir": f"{work}/cache", "progress": False},
                    "model": {"levels": 2, "filters": 4},
                    "trainer_params": {"epochs": 2, "batch_size": 4, "train_sim": [0, 1], "val_sim": [2],
                                       "progress": False, "gradient_accumulation_steps": 2}})
    ctx = setup("cpu")
    with ctx.root_first():
        from trainers.data import ensure_simulations

        ensure_simulations(cfg.data)
    mon = TrainerMonitoring.create(f"{work}/run", enabled=False, verbose_batches=0, tbmem_config=cfg.tbmem)
    trainer = SyntheticTrainer(cfg, monitoring=mon, device=torch.device("cpu"), distributed=ctx)
    before = torch.cat([p.detach().flatten() for p in trainer.net.parameters()]).clone()
    result = trainer.train()
    mon.close()
    after = torch.cat([p.detach().flatten() for p in trainer.net.parameters()])
    rows = [None] * ctx.world_size
    digest = hashlib.sha256(after.numpy().tobytes()).hexdigest()
    dist.all_gather_object(rows, {"rank": ctx.rank, "sha256": digest,
                                  "moved": float((after - before).abs().max()), "steps": result.steps,
                                  "val": result.val_losses, "checkpoints": [str(p) for p in result.checkpoints]})
    if ctx.is_root:
        print("RESULT " + json.dumps(rows), flush=True)
    # DDP's reducer holds the process group: released first, so its teardown is not left to
    # whichever reference goes last after the group is shut down (as run.py's trainer is).
    del trainer
    gc.collect()
    ctx.close()


if __name__ == "__main__":
    main()
