"""Optimizer state is every tensor reachable from ``optimizer.state`` (issue 12: 7), however it is wrapped
(issue 26, item 3: ZeroRedundancyOptimizer's inner optimizer, a dataclass in the state)."""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from tbmem._internal.census import take_census
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
    assert "optimizer.state[model.weight].old_dirs[0]" in names and "optimizer.state[model.weight].prev_flat_grad" in names


@dataclass
class Precond:
    """A preconditioner an optimizer keeps per parameter (Shampoo-like): a dataclass, not a tensor."""

    L: torch.Tensor
    R: torch.Tensor


class Preconditioned(torch.optim.Optimizer):
    """SGD with a left/right preconditioner pair kept in ``state[p]["precond"]``."""

    def __init__(self, params, lr: float = 0.1) -> None:  # noqa: ANN001
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201
        for group in self.param_groups:
            for p in group["params"]:
                rows, cols = p.shape if p.dim() == 2 else (p.numel(), 1)
                state = self.state[p]
                if "precond" not in state:
                    state["precond"] = Precond(L=torch.eye(rows), R=torch.eye(cols))
                p.add_(p.grad, alpha=-group["lr"])


def _state_bytes(state: dict, exclude: set[int]) -> int:
    spans = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _state_tensors(state)}
    return sum(n for ptr, n in spans.items() if ptr not in exclude)


def _state_tensors(value):  # noqa: ANN001, ANN202
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Precond):
        yield value.L
        yield value.R
    elif isinstance(value, dict):
        for item in value.values():
            yield from _state_tensors(item)


def test_state_held_in_a_dataclass_is_optimizer_state() -> None:
    gc.collect()
    model = nn.Sequential(nn.Linear(24, 40), nn.Linear(40, 8))
    opt = Preconditioned(model.parameters())
    model(torch.randn(5, 24)).sum().backward()
    opt.step()
    params = list(model.parameters())
    expected = _state_bytes(dict(opt.state), storage_ptrs(params + [p.grad for p in params]))
    assert expected == ((40 * 40 + 24 * 24) + (40 * 40 + 1) + (8 * 8 + 40 * 40) + (8 * 8 + 1)) * 4
    census = take_census(models=[model], optimizers=[opt])
    assert census.by_category["optimizer_state"] == expected
    names = {r.name for r in census.records if r.category == "optimizer_state"}
    assert "optimizer.state[model.0.weight].precond.L" in names



def test_zero_redundancy_optimizer_state_is_optimizer_state(gloo_world_of_one) -> None:
    """ZeroRedundancyOptimizer keeps the state in ``opt.optim.state``; ``opt.state`` stays empty."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its import scripts functional optimizers (torch.jit is deprecated)
        from torch.distributed.optim import ZeroRedundancyOptimizer

    gc.collect()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    model(torch.randn(8, 32)).square().mean().backward()
    opt.step()
    assert not opt.state and opt.optim.state
    params = list(model.parameters())
    expected = _state_bytes(dict(opt.optim.state), storage_ptrs(params + [p.grad for p in params]))
    assert expected >= 2 * sum(p.numel() * 4 for p in params)  # exp_avg and exp_avg_sq
    census = take_census(models=[model], optimizers=[opt])
    assert census.by_category["optimizer_state"] == expected
    assert "optimizer.optim.state[model.0.weight].exp_avg" in {r.name for r in census.records}
