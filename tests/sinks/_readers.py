"""Read back what the trackers stored: W&B's offline run file, MLflow's store, TensorBoard's events.

W&B 0.31 writes its offline run (``run-<id>.wandb``) from its Go core; the Python reader it had
(``wandb.sdk.internal.datastore``) is gone, so :func:`wandb_records` reads the file's framing
itself (LevelDB's log format: a 7-byte ``:W&B`` header, 32 KiB blocks, records with a 7-byte
header of checksum, length and type, split across blocks as FIRST/MIDDLE/LAST) and parses each
record with W&B's own protobuf (``wandb.proto.wandb_internal_pb2.Record``).
"""

from __future__ import annotations

import glob
import json
import os
import struct
from collections import defaultdict
from typing import Any

import numpy as np

__all__ = ["wandb_run_files", "wandb_records", "wandb_history", "wandb_artifacts", "mlflow_series",
           "tensorboard_series"]

_BLOCK = 32 * 1024
_HEADER = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_run_files(wandb_dir: str) -> list[str]:
    """The ``.wandb`` files of the offline runs under ``WANDB_DIR``, complete: W&B's service is ended
    first (after ``run.finish()`` it may still be writing the file's last records)."""
    import wandb

    wandb.teardown()
    return sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb")))


def wandb_records(path: str) -> list[Any]:
    """Every record of a ``.wandb`` file, as W&B's own ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:4] == b":W&B" and data[4:6] == b"\xe1\xbe", f"{path} is not a W&B run file"
    pos, out, parts = 7, [], []
    while pos + _HEADER.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER.size:  # a block's tail too small for a header is padding
            pos += left
            continue
        _crc, length, kind = _HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:
            break
        chunk = data[pos + _HEADER.size: pos + _HEADER.size + length]
        pos += _HEADER.size + length
        parts.append(chunk)
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            out.append(record)
            parts = []
        else:
            assert kind in (_FIRST, _MIDDLE), f"record type {kind} at byte {pos}"
    return out


STEP_KEYS = ("tbmem/step", "tbmem/epoch", "tbmem/iteration")


def wandb_history(path: str) -> dict[str, dict[int, Any]]:
    """``{key: {step: value}}`` of every history row of a run file (values decoded from JSON), on the
    row's tbmem step metric (else W&B's ``_step``)."""
    series: dict[str, dict[int, Any]] = defaultdict(dict)
    for record in wandb_records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            value = json.loads(item.value_json)
            if item.key or len(item.nested_key) == 1:
                row[item.key or item.nested_key[0]] = value
            else:  # a logged object (a table) arrives as its fields: [key, field, ...]
                node = row.setdefault(item.nested_key[0], {})
                for part in item.nested_key[1:-1]:
                    node = node.setdefault(part, {})
                node[item.nested_key[-1]] = value
        keys = [k for k in STEP_KEYS if k in row]
        assert len(keys) <= 1, row
        step_key = keys[0] if keys else "_step"
        step = int(row[step_key]) if step_key in row else record.history.step.num
        for key, value in row.items():
            if not key.startswith("_") and key not in STEP_KEYS:
                assert step not in series[key], f"{key} twice at step {step}"
                series[key][step] = value
    return dict(series)


def wandb_artifacts(path: str) -> list[Any]:
    """The artifact records of a run file."""
    return [r.artifact for r in wandb_records(path) if r.WhichOneof("record_type") == "artifact"]


def mlflow_series(client: Any, run_id: str) -> dict[str, dict[int, float]]:
    """``{key: {step: value}}`` of every metric of an MLflow run (``get_metric_history``)."""
    run = client.get_run(run_id)
    out: dict[str, dict[int, float]] = {}
    for key in run.data.metrics:
        history = client.get_metric_history(run_id, key)
        out[key] = {m.step: m.value for m in history}
        assert len(out[key]) == len(history), f"{key}: a step twice"
    return out


def tensorboard_series(run_dir: str) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of every scalar in a run's event files."""
    from tbmem._internal.logdir.events import event_files, records, scalar_value

    out: dict[str, dict[int, float]] = defaultdict(dict)
    for ef in event_files(run_dir):
        for event in records(ef):
            for value in event.summary.value:
                number = scalar_value(value)
                if number is not None:
                    assert event.step not in out[value.tag], f"{value.tag} twice at step {event.step}"
                    out[value.tag][event.step] = number
    return dict(out)


def same_as_float32(ours: dict[int, float], tensorboard: dict[int, float]) -> bool:
    """Whether two series have the same steps and values (TensorBoard stores float32)."""
    return ours.keys() == tensorboard.keys() and all(
        np.float32(ours[s]) == np.float32(tensorboard[s]) for s in ours)
