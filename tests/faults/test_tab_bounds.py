"""The Memory tab's rank-table and trace routes on hostile files, through a real tensorboard on 127.0.0.1.

A rank value never sizes an allocation, a small file of millions of rows or a trace that inflates
costs the server bounded memory (measured: its peak RSS, /proc's VmHWM, across concurrent
requests), and a damaged node table hides only itself. The server runs under an address-space
limit, so a fault that would allocate gigabytes fails there instead of on the machine.
"""

from __future__ import annotations

import gzip
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="the rank tables need pyarrow (tbmem[ranks])")
pq = pytest.importorskip("pyarrow.parquet", reason="the rank tables need pyarrow (tbmem[ranks])")

from tbmem import MemoryWriter
from tbmem._internal.logdir.rank_table import rank_table_path, rank_table_schema
from tbmem._internal.logdir.traces import trace_name, trace_path
from tests.plugin._logdir import Server, get

VRAM = "Memory/GPU/vram_allocated_GB"
ROWS = 3_000_000  # more than the tab reads (tbmem._internal.plugin.rank_table.MAX_ROWS), in a file of kilobytes


def _run(folder: Path) -> None:
    with MemoryWriter(folder, every=1, census_every=0, custom_layout=False) as w:
        for step in range(2):
            w.log_memory(step)


def _table(job: Path, node: str, ranks, steps, values) -> None:
    path = Path(rank_table_path(str(job), node))
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(ranks)
    pq.write_table(pa.table({"rank": pa.array(ranks, pa.int32()), "step": pa.array(steps, pa.int64()),
                             "wall_time": pa.array(np.zeros(n)), VRAM: pa.array(values, pa.float64())},
                            schema=rank_table_schema([VRAM])), path, row_group_size=1 << 20)


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("hostile_tables")
    for job in ("wide", "negative", "rows", "damaged"):
        _run(logdir / job / "rank0")
    _table(logdir / "wide", "0", [0, 1, 2**31 - 1], [0, 0, 0], [1.0, 2.0, 3.0])
    _table(logdir / "negative", "0", [-1, 0, 1], [0, 0, 0], [1.0, 2.0, 3.0])
    _table(logdir / "rows", "0", np.repeat(np.arange(4, dtype=np.int32), ROWS // 4),
           np.tile(np.arange(ROWS // 4), 4), np.ones(ROWS))
    _table(logdir / "damaged", "0", [0, 1], [0, 0], [1.0, 2.0])
    Path(rank_table_path(str(logdir / "damaged"), "1")).write_bytes(b"PAR1" + b"\x07" * 4096)
    for run, text in (("deep", b"[" * 200_000 + b"]" * 200_000),
                      ("inflate", b'{"traceEvents":[' + b"0," * 25_000_000 + b'0],"tbmem":{"summary":{}}}')):
        _run(logdir / run)
        path = Path(trace_path(str(logdir / run), trace_name(rank=0, step=1)))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(text, compresslevel=9))
    tensorboard = shutil.which("tensorboard") or str(Path(__import__("sys").executable).with_name("tensorboard"))
    srv = Server(tmp_path_factory.mktemp("tb"), "--logdir", str(logdir), "--load_fast", "false", wait_run="rank0",
                 command=["prlimit", f"--as={8 << 30}", tensorboard])
    yield srv
    srv.stop()


def _get(srv, route):
    status, body, _ = get(f"{srv.base}/data/plugin/tbmem/{route}")
    return status, json.loads(body) if body.startswith(b"{") else body


def _peak_growth(srv, requests) -> int:
    pid = srv.proc.pid
    _get(srv, "ranks?group=damaged")  # warm: the routes' imports
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status(pid)["VmRSS"]
    requests()
    return _status(pid)["VmHWM"] - before


def test_a_huge_or_negative_rank_value_sizes_no_allocation(served):
    answers = {}

    def ask():
        for group in ("wide", "negative"):
            answers[group] = (_get(served, f"ranks?group={group}"), _get(served, f"heatmap?group={group}"))

    grown = _peak_growth(served, ask)
    (ranks, heat) = answers["wide"]
    assert ranks[0] == 200 and [r["rank"] for r in ranks[1]["ranks"]] == [0, 1, 2**31 - 1], ranks
    assert heat[0] == 200 and heat[1]["ranks"] == [0, 1, 2**31 - 1]
    (ranks, heat) = answers["negative"]
    assert ranks[0] == 200 and [r["rank"] for r in ranks[1]["ranks"]] == [0, 1], ranks  # rank -1: skipped
    assert heat[0] == 200 and heat[1]["ranks"] == [0, 1]
    assert grown < 64 * 2**20, f"the server's peak memory grew by {grown / 2**20:.0f} MiB"


def test_millions_of_rows_in_a_small_file_are_refused_once_for_concurrent_requests(served):
    answers: list = []

    def ask():
        threads = [threading.Thread(target=lambda route=route: answers.append(_get(served, route)))
                   for route in ("ranks?group=rows", "heatmap?group=rows", "ranks?group=rows", "heatmap?group=rows")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)

    grown = _peak_growth(served, ask)
    assert [a[0] for a in answers] == [413] * 4, answers
    assert all("rows" in a[1]["error"] for a in answers)
    assert grown < 64 * 2**20, f"the server's peak memory grew by {grown / 2**20:.0f} MiB"


def test_a_damaged_node_table_hides_only_itself(served):
    status, doc = _get(served, "ranks?group=damaged")
    assert status == 200, doc
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert [s["file"] for s in doc["skipped"]] == ["node1.parquet"]
    status, heat = _get(served, "heatmap?group=damaged")
    assert status == 200 and heat["ranks"] == [0, 1]


def test_a_trace_nested_deep_or_inflating_costs_the_server_nothing(served):
    name = trace_name(rank=0, step=1)
    answers = {}

    def ask():
        answers["deep"] = _get(served, f"profile?run=deep&name={name}")
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, _get(served, f"profile?run=inflate&name={name}")))
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(200)

    grown = _peak_growth(served, ask)
    assert answers["deep"][0] == 422 and "deep" in answers["deep"][1]["error"], answers["deep"]
    assert {answers[i][0] for i in range(2)} <= {413, 422}, answers  # 422: read, its empty summary refused
    assert grown < 64 * 2**20, f"the server's peak memory grew by {grown / 2**20:.0f} MiB"
