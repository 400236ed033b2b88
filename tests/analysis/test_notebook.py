"""notebooks/memory_analysis.ipynb runs top to bottom (nbclient, python3 kernel) on a fresh logdir."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.analysis._loops import train

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "memory_analysis.ipynb"


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts.extend(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "".join(parts)


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert "parameters" in code[0].metadata.get("tags", [])
    assert "TBMEM_LOGDIR" in code[0].source and '"runs"' in code[0].source


def test_notebook_executes_against_a_fresh_logdir(tmp_path, monkeypatch):
    logdir = tmp_path / "runs"
    train(logdir / "clean", snapshot={"every": 100, "window": 1, "html": True})
    train(logdir / "leaky", leak="keep_activations")
    monkeypatch.setenv("TBMEM_LOGDIR", str(logdir))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=180,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError on any failing cell
    outputs = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert f"analysing {logdir}" in outputs
    assert "runs: clean, leaky" in outputs
    assert "leaky: Memory/Tensor_Category/activations_MB grows +500.0 MB/1k steps" in outputs
    assert "clean: Memory" not in outputs.split("LEAKS:")[1].split("\n\n")[0]  # the clean run is not flagged
    assert "clean: snapshot_rank0_step000000100.json.gz" in outputs
    images = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert images >= 6  # VRAM/RAM, categories, dtypes, large tensors, 2x loss+memory, leaks


def test_notebook_executes_on_a_run_with_a_single_record(tmp_path, monkeypatch):
    """One record: every chart has its point or bar in view (plot functions tested in test_plot.py)."""
    import torch

    from tbmem import MemoryWriter

    model = torch.nn.Linear(8, 8)
    with MemoryWriter(tmp_path / "runs" / "one", every=1, census_every=1) as writer:
        writer.watch(model)
        model(torch.randn(2, 8)).sum().backward()
        writer.add_scalar("Loss/train", 0.5, 0)
        writer.log_memory(0)
    monkeypatch.setenv("TBMEM_LOGDIR", str(tmp_path / "runs"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=180,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert "runs: one" in outputs
    images = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert images >= 5  # RAM, categories, dtypes, large tensors, loss and memory
