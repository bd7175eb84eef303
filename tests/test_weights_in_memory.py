"""Weights in memory (issue 35 item 8): `vitzoo.from_pretrained(state_dict)` or a module of a supported
format is converted in memory, and no error prints a tensor (a state dict's repr is megabytes)."""

from __future__ import annotations

import pytest
import torch

import vitzoo
from vitzoo.errors import CheckpointError

timm = pytest.importorskip("timm")


@pytest.fixture(scope="module")
def timm_vit():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, depth=2, img_size=32).eval()


def test_a_timm_state_dict_or_module_loads_in_memory(timm_vit):
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = timm_vit(x)
        for source in (timm_vit.state_dict(), timm_vit):
            model = vitzoo.from_pretrained(source, img_size=32).eval()
            assert (model(x) - expected).abs().max() < 1e-5
        tiny = vitzoo.create("vit_ti16", depth=1, num_classes=3, img_size=32).eval()
        again = vitzoo.from_pretrained(tiny).eval()  # a vitzoo model: its own config decides
        assert again.config == tiny.config and torch.equal(again(x), tiny(x))
        into_named = vitzoo.create("vit_ti16", pretrained=timm_vit.state_dict(), depth=2, num_classes=10, img_size=32).eval()
        assert (into_named(x) - expected).abs().max() < 1e-5


@pytest.mark.parametrize("bad", [torch.full((1000,), 0.123456), {"w": torch.full((50,), 0.123456)},
                                 {"w": "text"}, {}])
def test_no_error_prints_a_tensor(bad):
    with pytest.raises((vitzoo.ConfigError, CheckpointError)) as refused:
        vitzoo.from_pretrained(bad)
    with pytest.raises((vitzoo.ConfigError, CheckpointError)) as refused_too:
        vitzoo.create("vit_ti16", pretrained=bad)
    for message in (str(refused.value), str(refused_too.value)):
        assert "0.1235" not in message and "tensor(" not in message and len(message) < 2000, message


def test_an_option_given_a_tensor_is_refused_without_printing_it():
    with pytest.raises(vitzoo.ConfigError, match=r"embed_dim must be an int, got a Tensor of shape \(100,\)") as refused:
        vitzoo.create("vit_ti16", embed_dim=torch.full((100,), 0.123456))
    assert "0.1235" not in str(refused.value)
