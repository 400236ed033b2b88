"""The trainers under ``torchrun``: the process group, each rank's device, one run folder per job.

``torchrun --standalone --nproc_per_node=N run.py ...`` starts N copies of ``run.py`` with
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and the job store's ``MASTER_ADDR``/``MASTER_PORT``.
:func:`setup` creates the process group (gloo on CPU, nccl on CUDA, device ``cuda:LOCAL_RANK``)
unless the script made one; :func:`prepare_hydra` makes every rank agree on the run folder
before Hydra composes its run directory (``${now:...}`` differs when ranks start in different
seconds).

Example:
    >>> from trainers.distributed import setup
    >>> ctx = setup("cpu", environ={})  # no torchrun: a single process
    >>> ctx.active, ctx.rank, ctx.is_root
    (False, 0, True)
    >>> ctx.all_reduce_sum([1.5, 2.0])
    [1.5, 2.0]
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import torch

from tbmem import RankInfo, detect_rank

__all__ = ["Distributed", "setup", "job_run_name", "prepare_hydra", "RUN_NAME_VAR"]


@dataclass
class Distributed:
    """This process's place in a (possibly single-process) job.

    Attributes:
        rank: Global rank. world_size: Ranks in the job. local_rank: Rank on this node.
        backend: ``"gloo"`` or ``"nccl"`` when a process group exists, else None.
        owns_group: Whether :func:`setup` created the group (and :meth:`close` destroys it).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    owns_group: bool = False

    @property
    def active(self) -> bool:
        """Whether more than one rank trains."""
        return self.world_size > 1

    @property
    def is_root(self) -> bool:
        """Whether this is rank 0 (it saves checkpoints and prints the summary)."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every rank (a no-op for one process)."""
        if self.active:
            import torch.distributed as dist

            dist.barrier()

    @contextlib.contextmanager
    def root_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. generating the shared data cache), then the others."""
        if not self.is_root:
            self.barrier()
        yield
        if self.is_root:
            self.barrier()

    def all_reduce_sum(self, values: Sequence[float], device: torch.device | None = None) -> list[float]:
        """Sum ``values`` over the ranks (float64; nccl needs them on this rank's GPU)."""
        if not self.active:
            return [float(v) for v in values]
        import torch.distributed as dist

        where = device if self.backend == "nccl" and device is not None else torch.device("cpu")
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=where)
        dist.all_reduce(t)
        return [float(v) for v in t.cpu()]

    def all_reduce_min(self, value: int, device: torch.device | None = None) -> int:
        """The smallest ``value`` over the ranks."""
        if not self.active:
            return int(value)
        import torch.distributed as dist

        where = device if self.backend == "nccl" and device is not None else torch.device("cpu")
        t = torch.tensor([int(value)], dtype=torch.int64, device=where)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def close(self, *, ended_cleanly: bool = True) -> None:
        """Destroy the process group if :func:`setup` created it.

        Args:
            ended_cleanly: Every rank reached the end of the job: they meet at a barrier first, so
                no rank tears its connections down while a peer still uses them (gloo's worker
                threads then stop at the same time on every rank). After an error no barrier: a
                failed peer would never arrive.
        """
        if self.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                if ended_cleanly and self.active:
                    dist.barrier()
                dist.destroy_process_group()
            self.owns_group = False


def _torchrun(environ: Mapping[str, str] | None) -> RankInfo:
    """The rank torchrun's variables give (read as tbmem reads them, so both agree on the job);
    the process group is not consulted: it may not exist yet."""
    return detect_rank(os.environ if environ is None else environ)


def setup(device: str, *, environ: Mapping[str, str] | None = None) -> Distributed:
    """Join the job torchrun started (``WORLD_SIZE`` > 1): create the process group if needed.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (the resolved device type): gloo or nccl.
        environ: Variables to read instead of ``os.environ``.
    """
    job = _torchrun(environ)
    if not job.distributed:
        return Distributed()
    import torch.distributed as dist

    local = job.local_rank or 0
    owns = False
    if not dist.is_initialized():
        if device == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
        owns = True
    return Distributed(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local,
                       backend=str(dist.get_backend()), owns_group=owns)


def job_run_name(default: str, *, environ: Mapping[str, str] | None = None) -> str:
    """The run folder name every rank of the job uses: the first rank to ask sets it.

    Agreed through the job's store (torchrun's, at ``MASTER_ADDR:MASTER_PORT``); without one,
    the start time of the launching torchrun process (the ranks' common parent on a node).
    A single process gets ``default``.
    """
    if not _torchrun(environ).distributed:
        return default
    try:
        from tbmem import JobStore

        store = JobStore.connect(environ=os.environ if environ is None else environ, timeout_s=120)
        if store is not None:
            return store.first("trainers/run_name", default)
    except Exception:  # noqa: BLE001 - fall back to the common parent's start time
        pass
    import psutil

    started = psutil.Process(os.getppid()).create_time()
    return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(started))


#: Set by :func:`prepare_hydra` for ``conf/base.yaml``'s ``run_name`` (``${oc.env:...}``).
RUN_NAME_VAR = "TRAINERS_RUN_NAME"


def prepare_hydra(*, environ: Mapping[str, str] | None = None) -> list[str]:
    """Make a torchrun job one Hydra run directory; return command-line overrides to add.

    Sets :data:`RUN_NAME_VAR` to the agreed run name (``conf/base.yaml`` uses it instead of
    ``${now:...}``, so a run name set in a YAML file or on the command line still wins). Ranks
    above 0 keep Hydra's ``.hydra/`` inside their own ``rank<r>/`` folder and log to
    ``run_rank<r>.log`` (Hydra opens it before it creates any folder), so no two ranks write
    the same file. A single process gets nothing.
    """
    job = _torchrun(environ)
    if not job.distributed:
        return []
    if environ is None and RUN_NAME_VAR not in os.environ:
        os.environ[RUN_NAME_VAR] = job_run_name(time.strftime("%Y-%m-%d_%H-%M-%S"))
    rank = job.rank
    if rank == 0:
        return []
    return [f"hydra.output_subdir=rank{rank}/.hydra",
            f"hydra.job_logging.handlers.file.filename=${{hydra.runtime.output_dir}}/run_rank{rank}.log"]
