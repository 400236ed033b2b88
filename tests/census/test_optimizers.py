"""Optimizer state is every tensor reachable from ``optimizer.state`` (issue 12: 7)."""

from __future__ import annotations

import gc

import torch
from torch import nn

from tbmem.census import take_census
from tests.census._model import storage_ptrs, tensors_in


def test_lbfgs_history_lists_are_optimizer_state() -> None:
    """Defect 7: LBFGS keeps ``old_dirs``, ``old_stps``, ``ro`` and ``al`` as lists of tensors."""
    gc.collect()
    torch.manual_seed(0)
    model = nn.Linear(64, 16)
    x, y = torch.randn(128, 64), torch.randn(128, 16)
    opt = torch.optim.LBFGS(model.parameters(), history_size=4, max_iter=7)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        return loss

    for _ in range(2):
        opt.step(closure)
    state = opt.state[next(iter(model.parameters()))]
    assert len(state["old_dirs"]) == 4 and all(isinstance(t, torch.Tensor) for t in state["al"])
    params = list(model.parameters())
    owned = storage_ptrs(params + [p.grad for p in params])
    spans = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors_in(dict(opt.state))}
    expected = sum(n for ptr, n in spans.items() if ptr not in owned)
    census = take_census(models=[model], optimizers=[opt])
    assert census.by_category["optimizer_state"] == expected
    names = {r.name for r in census.records if r.category == "optimizer_state"}
    assert "optimizer.state[weight].old_dirs[0]" in names and "optimizer.state[weight].prev_flat_grad" in names
