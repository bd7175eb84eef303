"""The hybrid's BiT ResNet: TF "SAME" padding and weight standardization, as the official code."""

import torch
import torch.nn.functional as F

from vitzoo.layers.resnet import Bottleneck, ResNet, StdConv2d, pad_same


def test_same_padding_is_asymmetric_like_tensorflow():
    padded = pad_same(torch.ones(1, 1, 224, 224), kernel=7, stride=2)  # 5: 2 before, 3 after
    assert padded.shape[-2:] == (229, 229) and padded[0, 0, 2, 2] == 1
    assert padded[0, 0, 1, 1] == 0 and padded[0, 0, 226, 226] == 0
    pooled = pad_same(torch.ones(1, 1, 112, 112), kernel=3, stride=2, value=float("-inf"))
    assert pooled.shape[-2:] == (113, 113) and pooled[0, 0, 0, 0] == 1  # 0 before, 1 after
    assert pooled[0, 0, -1, -1] == float("-inf")
    conv = StdConv2d(3, 4, 3, stride=2)
    assert [conv(torch.randn(1, 3, n, n)).shape[-1] for n in (15, 16, 17)] == [8, 8, 9]


def test_weight_standardization_is_per_filter_with_the_population_std():
    conv = StdConv2d(3, 8, 3)
    w = conv.weight
    mean = w.mean(dim=(1, 2, 3), keepdim=True)
    expected = (w - mean) / (((w - mean) ** 2).mean(dim=(1, 2, 3), keepdim=True).sqrt() + 1e-5)
    assert torch.allclose(conv.standardized_weight(), expected, atol=1e-6)
    x = torch.randn(2, 3, 9, 9)
    assert torch.allclose(conv(x), F.conv2d(F.pad(x, (1, 1, 1, 1)), expected), atol=1e-5)


def test_bottlenecks_start_as_the_identity_and_stages_halve_the_resolution():
    unit = Bottleneck(128, 32, stride=1)
    x = torch.rand(1, 128, 8, 8)
    assert not unit.needs_projection and torch.allclose(unit(x), F.relu(x))  # gn3 scale at zero
    assert Bottleneck(64, 32, stride=1).needs_projection
    assert Bottleneck(128, 32, stride=2).needs_projection
    net = ResNet(3, (1, 1, 1))
    assert net.out_channels == 1024 and net.stride == 16
    assert net(torch.randn(1, 3, 64, 64)).shape == (1, 1024, 4, 4)
    assert ResNet(3, ()).out_channels == 64
