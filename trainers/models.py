"""A small UNet for 1D or 2D periodic fields, predicting the next state.

Convolutions pad circularly because every simulation here is periodic.
With ``residual=True`` the network predicts the change of the state, which is
small for one time step and trains much faster than predicting the state.

Example:
    >>> import torch
    >>> from trainers.models import UNet
    >>> net = UNet(dim=2, channels=2, levels=2, filters=8)
    >>> net(torch.zeros(3, 2, 16, 16)).shape
    torch.Size([3, 2, 16, 16])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["UNet", "build_model"]


def _conv(dim: int, cin: int, cout: int) -> nn.Module:
    cls = nn.Conv1d if dim == 1 else nn.Conv2d
    return cls(cin, cout, kernel_size=3, padding=1, padding_mode="circular")


class _Block(nn.Sequential):
    def __init__(self, dim: int, cin: int, cout: int) -> None:
        super().__init__(_conv(dim, cin, cout), nn.GELU(), _conv(dim, cout, cout), nn.GELU())


class UNet(nn.Module):
    """Encoder-decoder with skip connections; spatial sizes must be divisible by ``2**(levels-1)``.

    Args:
        dim: 1 or 2 spatial dimensions.
        channels: Input and output channels.
        levels: Resolution levels (1 = no down-sampling).
        filters: Channels of the first level; doubled at each level down.
        residual: Predict ``x + net(x)`` instead of ``net(x)``.
    """

    def __init__(self, *, dim: int, channels: int, levels: int = 3, filters: int = 16,
                 residual: bool = True) -> None:
        super().__init__()
        if dim not in (1, 2):
            raise ValueError(f"UNet.dim must be 1 or 2, got {dim!r}")
        self.dim, self.residual, self.levels = dim, residual, levels
        widths = [filters * 2**i for i in range(levels)]
        self.down = nn.ModuleList()
        cin = channels
        for w in widths:
            self.down.append(_Block(dim, cin, w))
            cin = w
        self.up = nn.ModuleList(_Block(dim, widths[i] + widths[i + 1], widths[i]) for i in range(levels - 1))
        self.head = (nn.Conv1d if dim == 1 else nn.Conv2d)(widths[0], channels, kernel_size=1)
        pool = nn.AvgPool1d if dim == 1 else nn.AvgPool2d
        self.pool = pool(2)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predict the next state of ``x`` ``[B, C, *space]``."""
        skips = []
        h = x
        for i, block in enumerate(self.down):
            if i > 0:
                h = self.pool(h)
            h = block(h)
            skips.append(h)
        for i in reversed(range(self.levels - 1)):
            h = self.up[i](torch.cat([self.upsample(h), skips[i]], dim=1))
        out = self.head(h)
        return x + out if self.residual else out


def build_model(model_cfg: Any, *, dim: int, channels: int, resolution: int) -> UNet:
    """Build the configured network, checking that ``resolution`` suits its depth."""
    levels = int(model_cfg.levels)
    if resolution % 2 ** (levels - 1):
        raise ValueError(f"config key 'model.levels' = {levels} needs data.resolution divisible by "
                         f"{2 ** (levels - 1)}, got {resolution}")
    return UNet(dim=dim, channels=channels, levels=levels, filters=int(model_cfg.filters),
                residual=bool(model_cfg.residual))
