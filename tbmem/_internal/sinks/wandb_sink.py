"""Weights & Biases as a sink: tbmem's readings on the training step, census tables, snapshot artifacts.

Each value is logged with its training step as its x axis: tbmem writes tags on three axes (the
step, and for a few tags the epoch or the L-BFGS-B iteration: :func:`tbmem._internal.tags.x_axis`), and W&B's
own ``_step`` must only grow, which would drop an epoch's value logged after a later step's. So a
value carries its step as ``tbmem/step`` (``tbmem/epoch``, ``tbmem/iteration``), and
``define_metric`` makes that the x axis of its tag; each group of tbmem's tags (``Memory/...``,
``System/...``: :data:`tbmem.TAGS`) is a section of its own, as in TensorBoard. A scalar's
summary is its maximum: each scalar tag is defined on first sight by its own name, its dots escaped
(W&B's core reads an unescaped ``.`` as a nesting, so ``Memory/Tensor_Module/model.encoder_MB``
would match no definition and keep its last value), and no group-wide glob is defined, since a glob
also matches the fields a logged table is stored as (its summary would become ``top_k._type.max =
0``). A census table (a markdown text entry) becomes a ``wandb.Table``, its summary W&B's own (the
last table); a snapshot's files (its offline HTML page, its JSON) and traces become artifacts of
type ``tbmem-<kind>``.

A run passed in (``run=wandb.run``) is joined, not finished at close; its own ``_step`` is left
to its owner. Everything runs on the sink's thread (:class:`tbmem.BackgroundSink`).
Settings come from W&B's environment variables (``WANDB_MODE=offline``, ``WANDB_DIR``,
``WANDB_PROJECT``); ``ranks="rank0"`` (the default) logs from rank 0 only, ``"per_rank"`` opens one
run per rank, grouped by the job.

Example:
    >>> import os, tempfile
    >>> from tbmem._internal.sinks.wandb_sink import WandbSink
    >>> os.environ.update(WANDB_MODE="offline", WANDB_DIR=tempfile.mkdtemp(), WANDB_SILENT="true")
    >>> sink = WandbSink(name="doc")  # doctest: +SKIP
    >>> sink.log({"Memory/RAM/process_rss_GB": 1.5}, step=10)  # doctest: +SKIP
    >>> sink.close()  # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

from tbmem._internal._extras import require
from tbmem._internal.sinks.base import RANK_MODES, BackgroundSink, Item, SinkFailed, rank_scope
from tbmem._internal.sinks.tables import markdown_table
from tbmem._internal.tags import x_axis

__all__ = ["RANK_MODES", "STEP_METRIC", "WandbSink", "metric_name"]

#: The x axes of tbmem's metrics (a metric's own step metric: :func:`tbmem._internal.tags.x_axis`).
STEP_METRIC = "tbmem/step"
#: Free bytes under the run's folder below which W&B's writes fail (its file grows by records of a
#: few KiB; checked after each batch).
_FULL_BELOW = 256 * 2**10


class WandbSink(BackgroundSink):
    """Sends tbmem's records to a W&B run.

    Args:
        run: An existing ``wandb`` run to join; None starts one (``wandb.init``) on the sink's thread.
        project: The W&B project of a new run (None: ``WANDB_PROJECT``, else ``"tbmem"``).
        name: The new run's name (per rank: ``<name>-rank<r>``).
        ranks: ``"rank0"`` (only rank 0 sends) or ``"per_rank"`` (a run per rank, grouped by ``name``).
        init_kwargs: More keywords for ``wandb.init``.
        **options: :class:`BackgroundSink`'s (``flush_every_s``, ``close_timeout_s``).
    """

    name = "wandb"

    def __init__(self, *, run: Any = None, project: str | None = None, name: str | None = None,
                 ranks: str = "rank0", init_kwargs: dict[str, Any] | None = None, **options: Any) -> None:
        self.rank, active = rank_scope("WandbSink", ranks, joined=run is not None)
        self.wandb = require("wandb", extra="wandb")
        self.run = run
        self.joined = run is not None
        self._project = project
        self._run_name = name
        self._init_kwargs = dict(init_kwargs or {})
        self.ranks = ranks
        super().__init__(active=active, **options)

    def _open(self) -> None:
        wandb, rank = self.wandb, self.rank
        if self.run is None:
            kwargs: dict[str, Any] = {"project": self._project or os.environ.get("WANDB_PROJECT") or "tbmem",
                                      "name": self._run_name, "reinit": "create_new"}
            if self.ranks == "per_rank" and rank.distributed:
                kwargs.update(name=f"{self._run_name or 'tbmem'}-rank{rank.rank}", group=self._run_name)
            if "settings" not in self._init_kwargs and "WANDB_INIT_TIMEOUT" not in os.environ:
                # W&B waits 90 s for an unreachable server, on this thread: the interpreter's exit
                # waited for it a minute past close()'s limit. Given up within that limit instead.
                kwargs["settings"] = wandb.Settings(init_timeout=self.close_timeout_s)
            kwargs.update(self._init_kwargs)
            self.run = wandb.init(**kwargs)
        run = self.run
        self._axes: dict[str, str] = {}  # tag -> its step metric, defined on first sight
        for axis in ("step", "epoch", "iteration"):
            run.define_metric(f"tbmem/{axis}", hidden=True)

    def _check_open(self) -> None:
        run = self.run
        # W&B ignores a call on a finished run with a message of its own: make it a failure of this sink
        if run is None or getattr(run, "_is_finished", False):
            raise SinkFailed("the W&B run was finished before tbmem's records were sent")

    def _check_disk(self, first_step: int) -> None:
        """W&B's service meets a full disk in silence (``wandb.log`` neither raises nor returns
        anything): the free space under the run's folder is the only sign, read after each batch; the
        batch just sent is the first that may be missing."""
        folder = getattr(self.run, "dir", None)
        if not folder:
            return
        try:
            st = os.statvfs(folder)
        except OSError:
            return
        if st.f_bavail * st.f_frsize < _FULL_BELOW:
            raise SinkFailed(f"the disk under W&B's run folder {folder} is full (ENOSPC); W&B's records from "
                             f"step {first_step} on may be missing")

    def _send(self, items: list[Item]) -> None:
        self._check_open()
        try:
            self._send_items(items)
        except Exception:
            if items:
                self._check_disk(items[0][2])  # a full disk is what the user must hear, not its echo
            raise
        if items:
            self._check_disk(items[0][2])

    def _send_items(self, items: list[Item]) -> None:
        wandb, run = self.wandb, self.run
        for kind, payload, step in items:
            if kind == "scalars":
                self._log(payload, step, scalars=True)
            elif kind == "text":
                tag, text = payload
                table = markdown_table(text)
                if table is not None:
                    self._log({tag: wandb.Table(columns=table[0], data=table[1])}, step, scalars=False)
                else:
                    self._log({tag: wandb.Html(f"<pre>{_escape(text)}</pre>")}, step, scalars=False)
            else:
                path, what, original = payload
                name = os.path.basename(path)  # its name as kept: sent_name's
                artifact = wandb.Artifact(_artifact_name(name), type=f"tbmem-{what}", metadata={"path": original})
                artifact.add_file(path, name=name)
                run.log_artifact(artifact)

    def _log(self, values: dict[str, Any], step: int, *, scalars: bool) -> None:
        axes = self._axes
        by_axis: dict[str, dict[str, Any]] = {}
        for tag, value in values.items():
            axis = axes.get(tag)
            if axis is None:
                axis = axes[tag] = f"tbmem/{x_axis(tag)}"
                # a table's or a page's summary stays W&B's own (the last one): "max" of one is nonsense
                self.run.define_metric(metric_name(tag), step_metric=axis, summary="max" if scalars else None)
            by_axis.setdefault(axis, {})[tag] = value
        for axis, group in by_axis.items():
            self.run.log({**group, axis: step})

    def _finish(self) -> None:
        if not self.joined and self.run is not None:
            self.run.finish()

    def _abandon(self) -> None:
        if not self.joined and self.run is not None and not getattr(self.run, "_is_finished", False):
            self.run.finish(exit_code=1)


def metric_name(tag: str) -> str:
    """The name ``define_metric`` must be given for a logged key: W&B's core splits an unescaped
    ``.`` into nested keys, so a tag's dots are escaped (the logged key itself stays whole).

    Example:
        >>> metric_name("Memory/Tensor_Module/model.encoder_MB")
        'Memory/Tensor_Module/model\\\\.encoder_MB'
    """
    return tag.replace(".", "\\.")


def _artifact_name(path: str) -> str:
    """A W&B artifact name from a file name (letters, digits, ``-_.`` only)."""
    stem = os.path.basename(path)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
