"""Tensor census: which tensors hold memory, by category, dtype, device and module.

``take_census`` finds every live tensor (gc scan, watched models and optimizers,
autograd graphs) and numpy array, and counts each underlying storage once, in
its highest-priority category: parameters, gradients, optimizer_state, buffers,
activations, other. See docs/census.md for the mechanism and its cost.

Example:
    >>> import torch
    >>> from tbmem._internal.census import take_census
    >>> emb = torch.nn.Embedding(100, 16)
    >>> head = torch.nn.Linear(16, 100, bias=False)
    >>> head.weight = emb.weight  # tied: one storage
    >>> model = torch.nn.ModuleDict({"emb": emb, "head": head})
    >>> census = take_census(models=[model])
    >>> [(r.name, r.bytes) for r in census.records if r.module is not None]  # the watched model's
    [('model.emb.weight', 6400)]
"""

from __future__ import annotations

from tbmem._internal.census.core import take_census
from tbmem._internal.census.report import CATEGORIES, Census, TensorRecord

__all__ = ["CATEGORIES", "Census", "TensorRecord", "take_census"]
