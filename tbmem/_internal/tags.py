"""The one table that maps tbmem's readings to TensorBoard tags.

Tags are data: every scalar tbmem writes is named here, with its unit in the
name, so dashboards, the analysis code and the README table all read from one
place. ``GB`` and ``MB`` follow the design documents and PyTorch's own
``memory_allocated() / 1024**3`` convention: they are binary units
(1 GB = 2**30 bytes, 1 MB = 2**20 bytes).

Templated tags contain ``{name}`` (a category, dtype, module, operation or
device) and are filled with :func:`tag_for`.

Names put what a user looks for first, first. TensorBoard groups tags by their first
component and sorts each group (upper case before lower case, 12 charts to a page of the
Scalars tab), so the ``Memory`` group holds this process's memory and the census only:
``Memory/GPU/*`` (VRAM), ``Memory/Large_Tensors/*``, ``Memory/RAM/*`` (RSS),
``Memory/Tensor_*`` (the census; its categories on the first page of a CPU run); the
machine's readings are under ``System/``, speed under ``Perf/``, the console monitors'
under ``Monitor/``, snapshots under ``Snapshot/``. Never a CPU reading under a ``gpu``
name. The design documents' names are kept (``Memory/Tensor_Category/*_MB``,
``Memory/Large_Tensors/*``, ``Memory/fragmentation_percent``, ``vram_allocated`` ...);
tags renamed since are in :data:`RENAMED` and CHANGELOG.md, and logs written before read
back under the current names.

Example:
    >>> from tbmem import TAGS, tag_for
    >>> TAGS["vram_allocated"].tag
    'Memory/GPU/vram_allocated_GB'
    >>> tag_for("census_category", name="parameters")
    'Memory/Tensor_Category/parameters_MB'
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping, Sequence

__all__ = ["Tag", "TAGS", "GiB", "MiB", "tag_for", "ranks_tag", "RANK_STATS", "to_unit", "markdown_table",
           "x_axis", "RENAMED", "current_tag", "FRAMEWORK_LOSS_TAGS", "LOSS_TAGS_ENV", "env_loss_tags", "loss_tags",
           "is_loss_tag", "pool_name", "named_reading", "named_unit"]

GiB = float(2**30)
MiB = float(2**20)


@dataclass(frozen=True, kw_only=True)
class Tag:
    """One row of the tag table.

    Attributes:
        key: The reading's stable internal name.
        tag: The TensorBoard tag, possibly with a ``{name}`` placeholder.
        unit: The unit, also visible at the end of the tag.
        meaning: What the value is, in one sentence.
        when: Which component writes it, and how often.
        scale: Divisor from the raw reading (bytes, seconds, ...) to ``unit``.
        x: What the event's step counts: ``"step"`` (training steps, or loss evaluations),
            ``"epoch"`` (per-epoch tags) or ``"iteration"`` (L-BFGS-B iterations, from 1): series
            of two kinds never share an x axis.
    """

    key: str
    tag: str
    unit: str
    meaning: str
    when: str
    scale: float = 1.0
    x: str = "step"


_EVERY = "MemoryWriter, every `every` steps"
_SYSTEM = "MemoryWriter, every `every` steps, at most once per `system_every_s` (1 s)"
_EVERY_CUDA = "MemoryWriter, every `every` steps, when CUDA is initialised"
_CENSUS = "MemoryWriter, every `census_every` steps"
_RANKS = "MemoryWriter on rank 0 of a job with more than one rank, every `every` steps"
_LBFGS = "PhysicalTrainer, per L-BFGS-B iteration"

_ROWS: tuple[Tag, ...] = (
    # --- Memory/GPU/: this process's device memory (CUDA caching allocator), first in the Memory group ---
    Tag(key="vram_allocated", tag="Memory/GPU/vram_allocated_GB", unit="GB", scale=GiB,
        meaning="Bytes held by live tensors (torch.cuda.memory_allocated).", when=_EVERY_CUDA),
    Tag(key="vram_reserved", tag="Memory/GPU/vram_reserved_GB", unit="GB", scale=GiB,
        meaning="Bytes the caching allocator holds from the driver (memory_reserved).", when=_EVERY_CUDA),
    Tag(key="vram_peak_allocated", tag="Memory/GPU/vram_peak_allocated_GB", unit="GB", scale=GiB,
        meaning="Peak allocated bytes in the window since the last record (or whole run, peak_mode='run').",
        when=_EVERY_CUDA),
    Tag(key="vram_peak_reserved", tag="Memory/GPU/vram_peak_reserved_GB", unit="GB", scale=GiB,
        meaning="Peak reserved bytes in the window since the last record (or whole run).", when=_EVERY_CUDA),
    Tag(key="vram_percent", tag="Memory/GPU/vram_percent", unit="%",
        meaning="Reserved bytes as a percentage of the device's total memory.", when=_EVERY_CUDA),
    Tag(key="vram_ooms", tag="Memory/GPU/vram_ooms", unit="count",
        meaning="Out-of-memory errors raised by the allocator, since start.", when=_EVERY_CUDA),
    Tag(key="vram_outside_allocator", tag="Memory/GPU/vram_outside_allocator_GB", unit="GB", scale=GiB,
        meaning="Device memory in use (total minus free, from the CUDA driver's mem_get_info) minus what PyTorch's "
                "allocator reserved: outside PyTorch's allocator (CUDA context, NCCL, cuBLAS/cuDNN workspaces, "
                "other processes).", when=_EVERY_CUDA),
    Tag(key="vram_private_pools_reserved", tag="Memory/GPU/vram_private_pools_reserved_GB", unit="GB", scale=GiB,
        meaning="Device memory reserved by CUDA graphs' and MemPool private pools (part of vram_reserved; "
                "memory_stats reserved_bytes_by_private_pools).",
        when=_EVERY_CUDA + " and torch reports private pools"),
    Tag(key="vram_pool_reserved", tag="Memory/GPU/vram_pool_{name}_reserved_GB", unit="GB", scale=GiB,
        meaning="Device memory reserved by one CUDA graph's or MemPool's private pool, {name} its id (a, b) "
                "as a_b (memory_stats reserved_bytes_by_private_pools).",
        when=_EVERY_CUDA + " and torch reports private pools, one per pool"),
    Tag(key="vram_pool_allocated", tag="Memory/GPU/vram_pool_{name}_allocated_GB", unit="GB", scale=GiB,
        meaning="Bytes allocated in one private pool, {name} its id as a_b (the allocated_size of the pool's "
                "segments, torch.cuda.memory_snapshot(mempool_id=...)).",
        when=_EVERY_CUDA + " and torch reads one pool's segments, one per pool"),
    Tag(key="oom_text", tag="Memory/GPU/oom_explained", unit="text",
        meaning="Why a CUDA out-of-memory error happened, in numbers: reserved bytes by kind, the largest free "
                "block per pool and stream, live bytes by site, the allocator settings, advice (docs/snapshots.md).",
        when="MemoryWriter, at an out-of-memory error in monitored_step"),
    Tag(key="vram_alloc_retries", tag="Memory/GPU/vram_alloc_retries", unit="count",
        meaning="cudaMalloc retries after flushing the cache, since start (a sign of memory pressure).",
        when=_EVERY_CUDA),
    Tag(key="vram_active", tag="Memory/GPU/vram_active_GB", unit="GB", scale=GiB,
        meaning="Bytes in active blocks, including blocks awaiting stream sync.", when=_EVERY_CUDA),
    Tag(key="vram_inactive_split", tag="Memory/GPU/vram_inactive_split_GB", unit="GB", scale=GiB,
        meaning="Bytes in inactive, non-releasable split blocks (fragmentation).", when=_EVERY_CUDA),
    Tag(key="vram_nvml_used", tag="Memory/GPU/vram_nvml_used_GB", unit="GB", scale=GiB,
        meaning="Device memory used as nvidia-smi reports it, all processes and contexts included.",
        when="MemoryWriter, every `every` steps, with the `nvml` extra"),
    Tag(key="vram_nvml_process", tag="Memory/GPU/vram_nvml_process_GB", unit="GB", scale=GiB,
        meaning="Device memory NVML attributes to this process (nvmlDeviceGetComputeRunningProcesses): "
                "PyTorch's reserved bytes plus its CUDA context, NCCL and cuBLAS/cuDNN workspaces.",
        when="MemoryWriter, every `every` steps, with the `nvml` extra, where NVML lists this process's pid"),
    Tag(key="vram_nvml_other_processes", tag="Memory/GPU/vram_nvml_other_processes_GB", unit="GB", scale=GiB,
        meaning="Device memory NVML attributes to the other processes on this device (part of what is "
                "outside PyTorch's allocator).",
        when="MemoryWriter, every `every` steps, with the `nvml` extra, where NVML lists this process's pid"),
    Tag(key="fragmentation", tag="Memory/fragmentation_percent", unit="%",
        meaning="(reserved - allocated) / reserved * 100: reserved memory not holding tensors.",
        when=_EVERY_CUDA),
    # --- Memory/RAM/: this process's host memory --------------------------------------------------
    Tag(key="ram_rss", tag="Memory/RAM/process_rss_GB", unit="GB", scale=GiB,
        meaning="Resident set size of this process.", when=_EVERY),
    Tag(key="ram_peak_rss", tag="Memory/RAM/process_peak_rss_GB", unit="GB", scale=GiB,
        meaning="Peak RSS in the window since the last record (Linux VmHWM reset), else whole run.",
        when=_EVERY),
    Tag(key="ram_uss", tag="Memory/RAM/process_uss_GB", unit="GB", scale=GiB,
        meaning="Unique set size: memory freed if this process exited (costs ~4 ms).",
        when="MemoryWriter, every `every` steps, with uss=True"),
    Tag(key="ram_pinned_host", tag="Memory/RAM/cuda_pinned_host_MB", unit="MB", scale=MiB,
        meaning="Pinned (page-locked) host memory held by PyTorch's CUDA host allocator "
                "(torch.cuda.host_memory_stats allocated_bytes.current: pin_memory, non_blocking copies).",
        when="MemoryWriter, every `every` steps, when CUDA is initialised and torch has host_memory_stats"),
    Tag(key="ram_locked", tag="Memory/RAM/process_locked_MB", unit="MB", scale=MiB,
        meaning="This process's locked and pinned pages (/proc/self/status VmLck + VmPin: mlock, RDMA and "
                "driver-pinned buffers, NCCL's), whoever pinned them.",
        when="MemoryWriter, every `every` steps on Linux, once the process has locked or pinned pages"),
    Tag(key="ram_tree_rss", tag="Memory/RAM/process_tree_rss_GB", unit="GB", scale=GiB,
        meaning="RSS of this process plus all its descendants (DataLoader workers, ...), summed per "
                "process: pages processes share count once per process.", when=_EVERY),
    Tag(key="ram_tree_workers", tag="Memory/RAM/process_tree_workers", unit="count",
        meaning="Descendant processes counted in process_tree_rss (DataLoader workers and any other "
                "child process).", when=_EVERY),
    # --- Memory/Tensor_*, Memory/Large_Tensors/: the tensor census (design document 004's names) ---
    Tag(key="census_category", tag="Memory/Tensor_Category/{name}_MB", unit="MB", scale=MiB,
        meaning="Bytes of live tensor storage in one category (parameters, gradients, optimizer_state, "
                "buffers, activations, other), each storage counted once.", when=_CENSUS),
    Tag(key="census_unattributed", tag="Memory/Tensor_Category/unattributed_MB", unit="MB", scale=MiB,
        meaning="Allocator bytes on the device that no found tensor accounts for (CUDA only).",
        when=_CENSUS),
    Tag(key="census_total", tag="Memory/Tensor_Census/total_MB", unit="MB", scale=MiB,
        meaning="Sum of all categories.", when=_CENSUS),
    Tag(key="large_count", tag="Memory/Large_Tensors/count", unit="count",
        meaning="Number of storages at or above the large-tensor threshold: `large_tensor_mb`, or when "
                "unset 1% of the first census's total (at most 100 MB); the census table names it.",
        when=_CENSUS),
    Tag(key="large_total", tag="Memory/Large_Tensors/total_MB", unit="MB", scale=MiB,
        meaning="Total bytes of those large storages.", when=_CENSUS),
    Tag(key="census_dtype", tag="Memory/Tensor_DType/{name}_MB", unit="MB", scale=MiB,
        meaning="Bytes of live tensor storage by dtype.", when=_CENSUS),
    Tag(key="census_device", tag="Memory/Tensor_Device/{name}_MB", unit="MB", scale=MiB,
        meaning="Bytes of live tensor storage by device (numpy arrays count as cpu).", when=_CENSUS),
    Tag(key="census_module", tag="Memory/Tensor_Module/{name}_MB", unit="MB", scale=MiB,
        meaning="Parameters, gradients, optimizer state and buffers of one top-level submodule.",
        when=_CENSUS),
    # --- Memory/ text entries (add_text): read back by the Memory tab, `tbmem report` and the notebook ---
    Tag(key="census_text", tag="Memory/Large_Tensors/top_k", unit="text",
        meaning="The census's table of the largest storages (name, category, shape, dtype, device, MB); "
                "TensorBoard keeps 10 per run, plugins/tbmem/census.jsonl every census's.", when=_CENSUS),
    Tag(key="alerts_text", tag="Memory/Alerts", unit="text",
        meaning="The memory alerts that fired at this record, one line each, and the snapshot written.",
        when="MemoryWriter with `alerts`, at the record an alert fires"),
    Tag(key="forecast_text", tag="Memory/Forecast", unit="text",
        meaning="The memory forecast's table: the batch sizes probed, the peak forecast at each, the budget.",
        when="SyntheticTrainer with `batch_size: auto`, at step 0"),
    Tag(key="snapshot_files_text", tag="Memory/Snapshot/files", unit="text",
        meaning="The files of the snapshot written at this step, with their sizes.", when="each snapshot"),
    # --- Perf/: speed -----------------------------------------------------------------------------
    Tag(key="step_time", tag="Perf/step_time_ms", unit="ms", scale=1e-3,
        meaning="Mean wall time per step since the previous record.", when=_EVERY),
    Tag(key="cpu_percent", tag="Perf/process_cpu_percent", unit="%",
        meaning="CPU use of this process since the last record (100 = one core).", when=_EVERY),
    Tag(key="census_duration", tag="Perf/census_duration_ms", unit="ms", scale=1e-3,
        meaning="Wall time the census took.", when=_CENSUS),
    Tag(key="batch_time", tag="Perf/batch_time_s", unit="s",
        meaning="Wall time of one batch (EpochPerformanceMonitor).", when="per batch"),
    Tag(key="epoch_time", tag="Perf/epoch_time_s", unit="s",
        meaning="Wall time of one epoch.", when="per epoch", x="epoch"),
    Tag(key="op_time", tag="Perf/Operation/{name}_s", unit="s",
        meaning="Wall time of one tracked operation (PerformanceMonitor, track_performance).",
        when="per tracked operation"),
    # --- System/: the machine (other processes move these) ----------------------------------------
    Tag(key="ram_system_used", tag="System/ram_used_GB", unit="GB", scale=GiB,
        meaning="System RAM in use (psutil total - available).", when=_SYSTEM),
    Tag(key="ram_system_available", tag="System/ram_available_GB", unit="GB", scale=GiB,
        meaning="System RAM available to new allocations without swapping.", when=_SYSTEM),
    Tag(key="ram_system_percent", tag="System/ram_percent", unit="%",
        meaning="System RAM in use, percent.", when=_SYSTEM),
    Tag(key="ram_swap_used", tag="System/swap_used_GB", unit="GB", scale=GiB,
        meaning="Swap in use, system-wide.", when=_SYSTEM),
    Tag(key="vram_free", tag="System/vram_free_GB", unit="GB", scale=GiB,
        meaning="Free device memory as the driver sees it (cudaMemGetInfo).", when=_EVERY_CUDA),
    Tag(key="vram_total", tag="System/vram_total_GB", unit="GB", scale=GiB,
        meaning="Total device memory (cudaMemGetInfo).", when=_EVERY_CUDA),
    # --- Monitor/: the console monitors' readings (when given a writer) ---------------------------
    Tag(key="batch_gpu", tag="Monitor/batch_gpu_allocated_MB", unit="MB", scale=MiB,
        meaning="Allocated device memory at the end of a batch (EpochMemoryMonitor).", when="per batch"),
    Tag(key="batch_cpu", tag="Monitor/batch_cpu_rss_MB", unit="MB", scale=MiB,
        meaning="Process RSS at the end of a batch (EpochMemoryMonitor).", when="per batch"),
    Tag(key="batch_loss", tag="Loss/batch", unit="loss",
        meaning="Loss passed to on_batch_end.", when="per batch"),
    Tag(key="epoch_peak_gpu", tag="Monitor/epoch_gpu_peak_MB", unit="MB", scale=MiB,
        meaning="Peak allocated device memory in the epoch (GPU runs only).", when="per epoch", x="epoch"),
    Tag(key="epoch_peak_rss", tag="Monitor/epoch_cpu_peak_rss_MB", unit="MB", scale=MiB,
        meaning="Peak RSS of the process in the epoch (CPU runs).", when="per epoch", x="epoch"),
    Tag(key="op_cpu_delta", tag="Monitor/Operation/{name}_cpu_delta_MB", unit="MB", scale=MiB,
        meaning="RSS change over a tracked operation or checkpoint interval.", when="per tracked operation"),
    Tag(key="op_gpu_delta", tag="Monitor/Operation/{name}_gpu_delta_MB", unit="MB", scale=MiB,
        meaning="Allocated device memory change over a tracked operation.", when="per tracked operation"),
    # --- Snapshot/: memory snapshots --------------------------------------------------------------
    Tag(key="snapshot_events", tag="Snapshot/events", unit="count",
        meaning="Allocation/free events in the snapshot written at this step.", when="each snapshot"),
    Tag(key="snapshot_size", tag="Snapshot/file_MB", unit="MB", scale=MiB,
        meaning="Size of the snapshot file written at this step.", when="each snapshot"),
    # --- Anomalies/: what the spike detector found (tbmem._internal.spikes) -------------------------------
    Tag(key="spikes_text", tag="Anomalies/spikes", unit="text",
        meaning="A text entry per spike of a watched scalar (a loss, a gradient norm): the value, the rolling "
                "median it jumped above, the snapshot written; the Memory tab marks the step.",
        when="MemoryWriter with `spikes`, at a spike's step"),
    # --- Ranks/: cross-rank aggregates (rank 0 of a torch.distributed job) ------------------------
    Tag(key="ranks_max", tag="Ranks/{name}/max", unit="as {name}",
        meaning="Largest value of tag {name} over the ranks at this record.", when=_RANKS),
    Tag(key="ranks_min", tag="Ranks/{name}/min", unit="as {name}",
        meaning="Smallest value of tag {name} over the ranks at this record.", when=_RANKS),
    Tag(key="ranks_mean", tag="Ranks/{name}/mean", unit="as {name}",
        meaning="Mean of tag {name} over the ranks that reported it at this record.", when=_RANKS),
    Tag(key="ranks_argmax", tag="Ranks/{name}/argmax", unit="rank",
        meaning="The rank holding the largest value of tag {name} (the lowest such rank on a tie).",
        when=_RANKS),
    Tag(key="ranks_reporting", tag="Ranks/reporting", unit="count",
        meaning="Ranks that sent at least one value at this record (a rank whose probes are off sends "
                "none).", when=_RANKS),
    # --- trainers ---------------------------------------------------------------------------------
    Tag(key="train_loss", tag="Loss/train", unit="loss", meaning="Mean training loss of an epoch.",
        when="SyntheticTrainer, per epoch", x="epoch"),
    Tag(key="val_loss", tag="Loss/val", unit="loss", meaning="Validation loss.",
        when="SyntheticTrainer, per epoch", x="epoch"),
    Tag(key="learning_rate", tag="Train/learning_rate", unit="1", meaning="Learning rate.",
        when="SyntheticTrainer, per epoch", x="epoch"),
    Tag(key="grad_norm", tag="Train/grad_norm", unit="1",
        meaning="Euclidean norm of all the model's gradients after backward and the optimizer step (unscaled "
                "under AMP), before zero_grad.",
        when="SyntheticTrainer with memory monitoring on, every `tbmem.every` steps"),
    Tag(key="eval_loss", tag="Loss/evaluation", unit="loss",
        meaning="Loss of one L-BFGS-B loss evaluation (step = evaluation index).",
        when="PhysicalTrainer, per loss evaluation"),
    Tag(key="eval_param", tag="Physical/{name}", unit="1",
        meaning="Value of a learnable physical parameter at a loss evaluation.",
        when="PhysicalTrainer, per loss evaluation"),
    Tag(key="iteration_loss", tag="Loss/iteration", unit="loss",
        meaning="Loss at the iterate of an L-BFGS-B iteration (step = iteration, from 1; the last is "
                "SciPy's `nit`).", when=_LBFGS, x="iteration"),
    Tag(key="iteration_grad_norm", tag="LBFGS/grad_norm", unit="1",
        meaning="Euclidean norm of the loss's gradient at the iterate.", when=_LBFGS, x="iteration"),
    Tag(key="iteration_evaluations", tag="LBFGS/evaluations", unit="count",
        meaning="Loss evaluations so far (SciPy's `nfev` at this iteration; a line search evaluates the "
                "loss once or more per iteration).", when=_LBFGS, x="iteration"),
    Tag(key="iteration_time", tag="LBFGS/iteration_time_ms", unit="ms", scale=1e-3,
        meaning="Wall time of the iteration: its loss evaluations and SciPy's update.", when=_LBFGS,
        x="iteration"),
    Tag(key="iteration_rss", tag="LBFGS/process_rss_GB", unit="GB", scale=GiB,
        meaning="RSS of this process at the end of the iteration.",
        when=_LBFGS + ", with memory monitoring on", x="iteration"),
    Tag(key="iteration_vram", tag="LBFGS/vram_allocated_GB", unit="GB", scale=GiB,
        meaning="Bytes held by live tensors on the device at the end of the iteration.",
        when=_LBFGS + ", with memory monitoring on, when CUDA is initialised", x="iteration"),
)

TAGS: Mapping[str, Tag] = MappingProxyType({row.key: row for row in _ROWS})

#: Tags renamed in 0.2 (old -> new; templated ones with ``{name}``), so logs written before still
#: read back (:func:`current_tag`); CHANGELOG.md says why. ``Memory/Epoch/gpu_peak_MB`` held the
#: peak RSS on CPU runs: it maps to the GPU tag here, and :func:`tbmem.analysis.load_scalars`
#: reads it as ``Monitor/epoch_cpu_peak_rss_MB`` in runs without VRAM tags.
RENAMED: Mapping[str, str] = MappingProxyType({
    "Memory/vram_allocated_GB": "Memory/GPU/vram_allocated_GB",
    "Memory/vram_reserved_GB": "Memory/GPU/vram_reserved_GB",
    "Memory/vram_active_GB": "Memory/GPU/vram_active_GB",
    "Memory/vram_inactive_split_GB": "Memory/GPU/vram_inactive_split_GB",
    "Memory/vram_peak_allocated_GB": "Memory/GPU/vram_peak_allocated_GB",
    "Memory/vram_peak_reserved_GB": "Memory/GPU/vram_peak_reserved_GB",
    "Memory/vram_percent": "Memory/GPU/vram_percent",
    "Memory/vram_alloc_retries": "Memory/GPU/vram_alloc_retries",
    "Memory/vram_ooms": "Memory/GPU/vram_ooms",
    "Memory/vram_nvml_used_GB": "Memory/GPU/vram_nvml_used_GB",
    "Memory/vram_total_GB": "System/vram_total_GB",
    "Memory/vram_free_GB": "System/vram_free_GB",
    "Memory/RAM/system_used_GB": "System/ram_used_GB",
    "Memory/RAM/system_available_GB": "System/ram_available_GB",
    "Memory/RAM/system_percent": "System/ram_percent",
    "Memory/RAM/swap_used_GB": "System/swap_used_GB",
    "Memory/RAM/process_cpu_percent": "Perf/process_cpu_percent",
    "Memory/Tensor_Census/duration_ms": "Perf/census_duration_ms",
    "Memory/Batch/gpu_allocated_MB": "Monitor/batch_gpu_allocated_MB",
    "Memory/Batch/cpu_rss_MB": "Monitor/batch_cpu_rss_MB",
    "Memory/Epoch/gpu_peak_MB": "Monitor/epoch_gpu_peak_MB",
    "Memory/Operation/{name}_cpu_delta_MB": "Monitor/Operation/{name}_cpu_delta_MB",
    "Memory/Operation/{name}_gpu_delta_MB": "Monitor/Operation/{name}_gpu_delta_MB",
    "Memory/Snapshot/events": "Snapshot/events",
    "Memory/Snapshot/file_MB": "Snapshot/file_MB",
})


def current_tag(tag: str) -> str:
    """The tag's current name: ``tag`` itself, or what :data:`RENAMED` renamed it to.

    Example:
        >>> current_tag("Memory/vram_allocated_GB"), current_tag("Memory/Operation/load_cpu_delta_MB")
        ('Memory/GPU/vram_allocated_GB', 'Monitor/Operation/load_cpu_delta_MB')
    """
    new = RENAMED.get(tag)
    if new is not None:
        return new
    if tag.startswith("Memory/Operation/"):
        return "Monitor/Operation/" + tag[len("Memory/Operation/"):]
    return tag


def tag_for(key: str, name: str | None = None) -> str:
    """Return the TensorBoard tag for a reading, filling ``{name}`` if the tag has one.

    Raises:
        KeyError: ``key`` is not in the table.
        ValueError: the tag needs a name and none was given (or one was given it cannot take).
    """
    template = TAGS[key].tag
    if "{name}" in template:
        if not name:
            raise ValueError(f"tag {template!r} needs a name")
        return template.format(name=name.replace("/", "."))
    if name is not None:
        raise ValueError(f"tag {template!r} takes no name, got {name!r}")
    return template


def pool_name(pool: Sequence[int]) -> str:
    """The ``{name}`` of a memory pool's tags: its id ``(a, b)`` as ``"a_b"``, as ``memory_stats`` flattens it.

    Example:
        >>> tag_for("vram_pool_reserved", pool_name((0, 1)))
        'Memory/GPU/vram_pool_0_1_reserved_GB'
    """
    return "_".join(str(int(x)) for x in pool)


def named_reading(key: str, name: str) -> str:
    """The key of a probe's reading of a templated tag (one per pool): ``"<key>:<name>"``.

    Example:
        >>> named_unit(named_reading("vram_pool_reserved", "0_1"))
        ('Memory/GPU/vram_pool_0_1_reserved_GB', 1073741824.0)
    """
    if "{name}" not in TAGS[key].tag:
        raise ValueError(f"tag {TAGS[key].tag!r} takes no name")
    return f"{key}:{name}"


def named_unit(reading: str) -> tuple[str, float]:
    """(tag, scale) of a reading keyed by :func:`named_reading`.

    Raises:
        KeyError: not such a key, or its key is not in the table.
    """
    key, sep, name = reading.partition(":")
    if not sep or not name:
        raise KeyError(reading)
    return tag_for(key, name), TAGS[key].scale


#: The statistics rank 0 writes for each aggregated tag, as ``Ranks/<tag>/<stat>``.
RANK_STATS = ("max", "min", "mean", "argmax")


def ranks_tag(stat: str, tag: str) -> str:
    """The cross-rank aggregate tag of ``tag``: ``Ranks/<tag>/<stat>``, the tag kept whole.

    Example:
        >>> ranks_tag("max", "Memory/RAM/process_rss_GB")
        'Ranks/Memory/RAM/process_rss_GB/max'
    """
    if stat not in RANK_STATS:
        raise ValueError(f"stat must be one of {RANK_STATS}, got {stat!r}")
    return TAGS[f"ranks_{stat}"].tag.format(name=tag)


def x_axis(tag: str) -> str:
    """``"epoch"`` for a per-epoch tag of the table, ``"iteration"`` for a per-iteration one, else
    ``"step"`` (tags outside the table included).

    Example:
        >>> x_axis("Loss/train"), x_axis("Memory/RAM/process_rss_GB"), x_axis("Loss/my_own")
        ('epoch', 'step', 'step')
    """
    for row in _ROWS:
        if row.x != "step":
            prefix, templated, suffix = row.tag.partition("{name}")
            if tag == row.tag or (templated and tag.startswith(prefix) and tag.endswith(suffix)):
                return row.x
    return "step"


#: The per-step losses the frameworks log: the Hugging Face Trainer's ``train/loss``, Lightning's
#: ``train_loss`` (the name its examples ``self.log``), a bare ``loss`` (accelerate's examples).
FRAMEWORK_LOSS_TAGS = ("train/loss", "train_loss", "loss")


#: Comma-separated loss patterns added in whichever process reads it (the training process, TensorBoard's, ``tbmem
#: report``'s), on top of the run's own ``loss_tags`` (``MemoryWriterConfig.loss_tags``).
LOSS_TAGS_ENV = "TBMEM_LOSS_TAGS"


def env_loss_tags() -> tuple[str, ...]:
    """The patterns :data:`LOSS_TAGS_ENV` adds in this process (``"train/ce_loss,val/*_loss"``), read at each call.

    Example:
        >>> isinstance(env_loss_tags(), tuple)
        True
    """
    return tuple(p.strip() for p in os.environ.get(LOSS_TAGS_ENV, "").split(",") if p.strip())


def loss_tags(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The patterns (``fnmatch``) of the tags that are losses: ``Loss/*``, :data:`FRAMEWORK_LOSS_TAGS`, ``extra``
    (a run's own ``loss_tags``, as its writer recorded them: :mod:`tbmem._internal.logdir.settings`) and those
    ``TBMEM_LOSS_TAGS`` adds in this process (:func:`env_loss_tags`).

    Example:
        >>> loss_tags(["train/ce_loss"])[:2], loss_tags(["train/ce_loss"])[4]
        (('Loss/*', 'train/loss'), 'train/ce_loss')
    """
    return tuple(dict.fromkeys(("Loss/*", *FRAMEWORK_LOSS_TAGS, *extra, *env_loss_tags())))


def is_loss_tag(tag: str, patterns: Sequence[str] | None = None) -> bool:
    """Whether ``tag`` is a loss: one of ``patterns`` (a run's :func:`loss_tags`), or of :func:`loss_tags`'s defaults.

    Example:
        >>> is_loss_tag("train/loss"), is_loss_tag("Loss/batch"), is_loss_tag("train/grad_norm")
        (True, True, False)
        >>> is_loss_tag("train/ce_loss", loss_tags(["train/ce_*"]))
        True
    """
    return any(fnmatch.fnmatchcase(tag, p) for p in (loss_tags() if patterns is None else patterns))


def to_unit(key: str, raw: float) -> float:
    """Convert a raw reading (bytes, seconds, counts) to the unit its tag names."""
    return float(raw) / TAGS[key].scale


def markdown_table() -> str:
    """Render the table as Markdown, as shown in the README."""
    lines = ["| tag | unit | meaning | when |", "|---|---|---|---|"]
    lines += [f"| `{t.tag}` | {t.unit} | {t.meaning} | {t.when} |" for t in _ROWS]
    return "\n".join(lines)
