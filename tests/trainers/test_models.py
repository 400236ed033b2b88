"""The UNet: shapes, periodicity and the residual connection."""

from __future__ import annotations

import pytest
import torch

from trainers.config import ModelConfig
from trainers.models import UNet, build_model


@pytest.mark.parametrize("dim, shape", [(1, (2, 3, 32)), (2, (2, 2, 16, 16))])
def test_shapes(dim, shape):
    net = UNet(dim=dim, channels=shape[1], levels=3, filters=4)
    assert net(torch.randn(shape)).shape == shape


def test_periodic_equivariance():
    # Circular padding and pooling by 2: shifting the input by 4 cells shifts the output by 4.
    torch.manual_seed(0)
    net = UNet(dim=1, channels=1, levels=3, filters=4)
    x = torch.randn(1, 1, 32)
    torch.testing.assert_close(net(torch.roll(x, 4, -1)), torch.roll(net(x), 4, -1))


def test_residual_predicts_the_change():
    net = UNet(dim=1, channels=1, levels=2, filters=4, residual=True)
    torch.nn.init.zeros_(net.head.weight)
    torch.nn.init.zeros_(net.head.bias)
    x = torch.randn(2, 1, 16)
    torch.testing.assert_close(net(x), x)


def test_resolution_must_suit_the_depth():
    with pytest.raises(ValueError, match="model.levels"):
        build_model(ModelConfig(levels=4), dim=1, channels=1, resolution=36)
