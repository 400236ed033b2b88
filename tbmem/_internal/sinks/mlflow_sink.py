"""MLflow as a sink: tbmem's readings in batches on the training step, census tables and snapshots as artifacts.

Each interval the queued scalars go to the tracking store in ``log_batch`` calls (up to 1000
metrics each) with the training step as each metric's ``step`` and the time it was recorded as its
timestamp. A census table is a text artifact (``tbmem/<tag>/step_<step>.md``); a snapshot's files
and traces are artifacts under ``tbmem/<kind>/``. The run is ``MLFLOW_TRACKING_URI``'s (a file
store, SQLite, a server), in the experiment ``MLFLOW_EXPERIMENT_NAME`` (else ``"tbmem"``), or the
one whose ``run_id`` is passed, which is joined and left open at close. Everything runs on the
sink's thread (:class:`tbmem.BackgroundSink`): MLflow's client retries a refused
request with backoff for minutes, which must not stall training.

Example:
    >>> import os, tempfile
    >>> from tbmem._internal.sinks.mlflow_sink import MlflowSink
    >>> os.environ["MLFLOW_TRACKING_URI"] = "sqlite:///" + tempfile.mkdtemp() + "/mlflow.db"
    >>> sink = MlflowSink(run_name="doc")  # doctest: +SKIP
    >>> sink.log({"Memory/RAM/process_rss_GB": 1.5}, step=10)  # doctest: +SKIP
    >>> sink.close()  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from tbmem._internal._extras import require
from tbmem._internal.sinks.base import BackgroundSink, Item, rank_scope

__all__ = ["MlflowSink", "BATCH"]

#: Metrics per ``log_batch`` call (MLflow's limit).
BATCH = 1000
_BAD = re.compile(r"[^\w\-. :/]")


class MlflowSink(BackgroundSink):
    """Sends tbmem's records to an MLflow run.

    Args:
        run_id: An existing run to join; None creates one.
        tracking_uri: None: ``MLFLOW_TRACKING_URI`` (MLflow's own default where unset).
        experiment: The experiment of a new run (None: ``MLFLOW_EXPERIMENT_NAME``, else ``"tbmem"``).
        run_name: The new run's name (per rank: ``<run_name>-rank<r>``).
        ranks: ``"rank0"`` (only rank 0 sends) or ``"per_rank"`` (a run per rank, tagged ``tbmem.rank``).
        **options: :class:`BackgroundSink`'s (``flush_every_s``, ``close_timeout_s``).
    """

    name = "mlflow"

    def __init__(self, *, run_id: str | None = None, tracking_uri: str | None = None,
                 experiment: str | None = None, run_name: str | None = None, ranks: str = "rank0",
                 **options: Any) -> None:
        self.rank, active = rank_scope("MlflowSink", ranks, joined=run_id is not None)
        self.mlflow = require("mlflow", extra="mlflow")
        self.run_id = run_id
        self.joined = run_id is not None
        self._tracking_uri = tracking_uri
        self._experiment = experiment
        self._run_name = run_name
        self.ranks = ranks
        self.client: Any = None
        super().__init__(active=active, **options)

    def _open(self) -> None:
        from mlflow.tracking import MlflowClient

        self.client = client = MlflowClient(tracking_uri=self._tracking_uri)
        if self.run_id is not None:
            client.get_run(self.run_id)  # a run that does not exist fails here, once
            return
        name = self._experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "tbmem"
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(name)
        run_name, tags = self._run_name, {"tbmem.rank": str(self.rank.rank)}
        if self.ranks == "per_rank" and self.rank.distributed:
            run_name = f"{run_name or 'tbmem'}-rank{self.rank.rank}"
        self.run_id = client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id

    def log(self, values: dict[str, float], step: int) -> None:
        if not self.off:  # the time it was recorded, not the time it is sent
            self._queue.append(("scalars", (dict(values), int(time.time() * 1000)), int(step)))

    def _send(self, items: list[Item]) -> None:
        from mlflow.entities import Metric

        client, run_id = self.client, self.run_id
        metrics: list[Any] = []
        for kind, payload, step in items:
            if kind == "scalars":
                values, stamp = payload
                metrics.extend(Metric(_key(tag), float(v), stamp, step) for tag, v in values.items())
                continue
            self._send_metrics(metrics)  # in order: what came before the text or file goes first
            metrics = []
            if kind == "text":
                tag, text = payload
                client.log_text(run_id, text, f"tbmem/{_key(tag)}/step_{step:09d}.md")
            else:
                path, what, _original = payload
                client.log_artifact(run_id, path, artifact_path=f"tbmem/{what}")
        self._send_metrics(metrics)

    def _send_metrics(self, metrics: list[Any]) -> None:
        for start in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + BATCH], synchronous=True)

    def _finish(self) -> None:
        if not self.joined and self.run_id is not None:
            self.client.set_terminated(self.run_id)

    # no _abandon: after a failure the run is left as it is (ending it would wait on the same
    # network or disk, retried by MLflow's client for minutes)


def _key(tag: str) -> str:
    """An MLflow metric key for a tag (characters MLflow refuses become ``_``)."""
    return _BAD.sub("_", tag)
