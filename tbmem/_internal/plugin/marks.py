"""The step marks of the Memory tab's timeline: snapshots, out-of-memory errors and loss spikes.

Spikes come from the run's side file :data:`tbmem._internal.logdir.layout.SPIKES_LOG` (what the writer's spike
detector found, with the snapshot it wrote); a spike's snapshot is not marked a second time: its
spike mark opens it.

Example:
    >>> import os, tempfile
    >>> from tbmem._internal.plugin.marks import spike_marks
    >>> run = os.path.realpath(tempfile.mkdtemp())
    >>> os.makedirs(f"{run}/plugins/tbmem")
    >>> with open(f"{run}/plugins/tbmem/spikes.jsonl", "w") as fh:
    ...     _ = fh.write('{"tag": "Loss/batch", "step": 37, "confirmed_step": 37, "ratio": 21.5, "kind": "spike"}\\n')
    >>> spike_marks(run, run, [])
    [{'step': 37, 'kind': 'spike', 'id': None, 'label': 'spike of Loss/batch (21.5x its median)'}]
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from tbmem._internal.logdir.spikes import read_spikes, spikes_log_path

__all__ = ["spike_marks", "snapshot_marks"]


def spike_marks(run_dir: str, root: str, snapshots: Sequence[Any]) -> list[dict[str, Any]]:
    """One mark per step with spikes in ``run_dir``'s side file (read only when it lies inside ``root``);
    spikes of several tags at one step (a loss and its gradient norm) share it."""
    if not os.path.isfile(spikes_log_path(run_dir)):
        return []
    ids = {(e.step, e.kind): e.id for e in snapshots if e.step is not None}
    by_step: dict[int, dict[str, Any]] = {}
    for spike in read_spikes(run_dir, root=root):  # no symlink below the logdir followed
        ratio = spike.get("ratio")
        what = f"{spike['tag']} ({ratio:.3g}x its median)" if isinstance(ratio, (int, float)) else \
            f"{spike['tag']} ({spike.get('value')})"
        mark = by_step.get(spike["step"])
        if mark is None:
            confirmed = spike.get("confirmed_step", spike["step"])
            by_step[spike["step"]] = {"step": spike["step"], "kind": "spike",
                                      "id": ids.get((confirmed, "spike")), "label": f"spike of {what}"}
        else:
            mark["label"] += f", {what}"
    return list(by_step.values())


def snapshot_marks(snapshots: Sequence[Any], taken: set[str]) -> list[dict[str, Any]]:
    """One mark per snapshot with a step, except those in ``taken`` (a spike mark opens them)."""
    return [{"step": e.step, "kind": "oom" if e.kind == "oom" else "snapshot", "id": e.id,
             "label": f"{e.kind} {e.name}"} for e in snapshots if e.step is not None and e.id not in taken]
