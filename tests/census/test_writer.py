"""The census through MemoryWriter: tags and the top-K text read back from the event files."""

from __future__ import annotations

import gc

import torch
import torch.nn.functional as F

from tbmem import MemoryWriter
from tbmem._internal.tags import tag_for
from tests._events import read_events, scalars, texts
from tests.census._model import VOCAB, TiedNet

MB = 2.0**20


def test_census_tags_and_top_k_text_in_event_files(tmp_path) -> None:
    gc.collect()
    torch.manual_seed(0)
    model = TiedNet()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randint(0, VOCAB, (8,))
    y = torch.randint(0, VOCAB, (8,))
    params = list({id(p): p for p in model.parameters()}.values())
    n_param_bytes = sum(p.numel() * p.element_size() for p in params)
    with MemoryWriter(tmp_path, every=100, census_every=2, top_k=3) as writer:
        writer.watch(model, opt)
        for step in range(5):
            loss = F.cross_entropy(model(x), y)
            writer.log_memory(step, roots=[loss])
            opt.zero_grad()
            loss.backward()
            opt.step()
    cat = tag_for("census_category", "parameters")
    assert [s for s, _ in scalars(tmp_path, cat)] == [0, 2, 4]
    assert all(abs(v - n_param_bytes / MB) < 1e-9 for _, v in scalars(tmp_path, cat))
    grads = scalars(tmp_path, tag_for("census_category", "gradients"))
    assert grads[0][1] == 0.0 and abs(grads[1][1] - n_param_bytes / MB) < 1e-9  # no grads before step 0's backward
    state = scalars(tmp_path, tag_for("census_category", "optimizer_state"))
    assert abs(state[2][1] - (2 * n_param_bytes + 4 * len(params)) / MB) < 1e-9
    assert all(v > 0 for _, v in scalars(tmp_path, tag_for("census_category", "activations")))
    tags = set(read_events(tmp_path).Tags()["scalars"])
    assert {tag_for("census_dtype", "float32"), tag_for("census_device", "cpu"),
            tag_for("census_module", "model.emb"), tag_for("census_total"), tag_for("census_duration"),
            tag_for("large_count"), tag_for("large_total")} <= tags
    assert tag_for("census_unattributed") not in tags  # CPU only
    text = texts(tmp_path, "Memory/Large_Tensors/top_k/text_summary")  # add_text appends /text_summary
    assert [s for s, _ in text] == [0, 2, 4]
    table = text[-1][1]
    assert "| 1 | `model.emb.weight` | parameters | 50x16 | float32 | cpu |" in table
    assert table.count("\n| ") == 1 + 3  # header row + top_k rows
