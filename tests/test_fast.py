"""Fast paths compute what the plain model computes (float32, within 1e-4)."""

import copy

import pytest
import torch
from torch._dynamo.utils import counters

import vitzoo
from vitzoo.fast import compile_for_inference, compile_for_training

HYBRID = dict(stem="resnet", resnet_layers=(1,), patch_size=1)


def perturbed(options):
    model = vitzoo.create("vit_ti16", **options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("extra", [{}, HYBRID], ids=["vit", "hybrid"])
def test_inference_compiled_with_frozen_weights_equals_the_plain_model(tiny, extra):
    model = perturbed({**tiny, **extra}).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        expected = model(x)
    counters.clear()
    fast = compile_for_inference(model, x)
    with torch.inference_mode():
        assert torch.allclose(fast(x), expected, atol=1e-4)
        fast(x)
    # one whole graph, compiled once: nothing the model does at a call (e.g. caching its standardized
    # weights) breaks the graph or invalidates it
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


def test_training_compiled_gives_the_same_loss_and_gradients(tiny):
    model = perturbed(tiny).train()
    twin = copy.deepcopy(model)
    fast = compile_for_training(twin)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    fast_loss = torch.nn.functional.cross_entropy(fast(x), y)
    fast_loss.backward()
    assert torch.allclose(loss, fast_loss, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-4), name
