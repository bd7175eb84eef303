"""The hybrid's BiT ResNet: TF "SAME" padding and weight standardization, as the official code."""

import torch
import torch.nn.functional as F

from vitzoo.layers.resnet import Bottleneck, ResNet, StdConv2d, pad_same


def test_same_padding_is_asymmetric_like_tensorflow():
    x = torch.ones(1, 1, 224, 224)
    padded = pad_same(x, kernel=7, stride=2)  # total 5: 2 before, 3 after
    assert padded.shape[-2:] == (229, 229)
    assert padded[0, 0, 2, 2] == 1 and padded[0, 0, 1, 1] == 0 and padded[0, 0, 226, 226] == 0
    pooled = pad_same(torch.ones(1, 1, 112, 112), kernel=3, stride=2, value=float("-inf"))  # 0 before, 1 after
    assert pooled.shape[-2:] == (113, 113) and pooled[0, 0, 0, 0] == 1 and pooled[0, 0, -1, -1] == float("-inf")
    assert pad_same(torch.ones(1, 1, 7, 7), kernel=1, stride=1).shape[-1] == 7


def test_output_size_is_ceil_of_input_over_stride():
    conv = StdConv2d(3, 4, 3, stride=2)
    for size in (15, 16, 17):
        assert conv(torch.randn(1, 3, size, size)).shape[-1] == -(-size // 2)


def test_weight_standardization_formula():
    conv = StdConv2d(3, 8, 3)
    w = conv.weight
    mean = w.mean(dim=(1, 2, 3), keepdim=True)
    std = ((w - mean) ** 2).mean(dim=(1, 2, 3), keepdim=True).sqrt()  # population std
    expected = (w - mean) / (std + 1e-5)
    assert torch.allclose(conv.standardized_weight(), expected, atol=1e-6)
    x = torch.randn(2, 3, 9, 9)
    assert torch.allclose(conv(x), F.conv2d(F.pad(x, (1, 1, 1, 1)), expected), atol=1e-5)


def test_standardized_weight_is_cached_in_eval_and_refreshed_when_the_weight_changes():
    conv = StdConv2d(3, 4, 1).eval()
    with torch.no_grad():
        first = conv.standardized_weight()
        assert conv.standardized_weight() is first
        conv.weight.mul_(2).add_(1)
        second = conv.standardized_weight()
    assert second is not first
    conv.train()
    assert conv.standardized_weight().requires_grad


def test_under_autocast_the_cached_weight_is_already_in_the_convolutions_dtype():
    """In eval mode under bf16 autocast the standardized weight is kept in bf16 (autocast would cast the
    float32 one at every call): the same bits autocast's cast gives, and float32 again outside it."""
    conv = StdConv2d(8, 16, 3).eval()
    x = torch.randn(2, 8, 9, 9)
    exact = conv.standardize(conv.weight.detach())
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        cached = conv.standardized_weight()
        assert cached.dtype == torch.bfloat16 and torch.equal(cached, exact.to(torch.bfloat16))
        assert conv.standardized_weight() is cached
        got = conv(x)
        assert torch.equal(got, F.conv2d(F.pad(x, (1, 1, 1, 1)), exact))  # autocast casts both to bf16
    with torch.no_grad():
        assert conv.standardized_weight().dtype == torch.float32


def test_bottleneck_projects_when_shape_changes_and_starts_as_identity_branch():
    unit = Bottleneck(128, 32, stride=1)
    assert not unit.needs_projection
    x = torch.rand(1, 128, 8, 8)
    assert torch.allclose(unit(x), F.relu(x))  # gn3 scale starts at zero
    assert Bottleneck(64, 32, stride=1).needs_projection and Bottleneck(128, 32, stride=2).needs_projection


def test_stage_widths_and_strides():
    net = ResNet(3, (1, 1, 1))
    assert net.out_channels == 1024 and net.stride == 16
    assert net(torch.randn(1, 3, 64, 64)).shape == (1, 1024, 4, 4)
    assert ResNet(3, ()).out_channels == 64
