"""`for_inference` and the compiled paths compute what the plain model computes: within 1e-4 in
float32, within bf16's rounding in bf16; a precision follows the device's rule by default."""

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import vitzoo
from vitzoo import precision
from vitzoo.inference import compile_for_inference, compile_for_training, for_inference
from vitzoo.model import choose_attention

HYBRID = dict(stem="resnet", stem_options={"layers": (1,)}, patch_size=1)
BOTH = pytest.mark.parametrize("extra", [{}, HYBRID], ids=["vit", "hybrid"])
EAGER_AND_COMPILED = pytest.mark.parametrize("compile", [
    pytest.param(False, id="eager"), pytest.param(True, id="compiled", marks=pytest.mark.slow)])


def perturbed(options):
    model = vitzoo.create("vit_ti16", **options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def features_and_logits(model, x):
    """The normed tokens and the logits of a head of its own (the built model's zero-initialised
    classifier would give zeros whatever the tokens)."""
    with torch.inference_mode():
        tokens = model.forward_features(x)
        return torch.cat([tokens.flatten(1), model.forward_head(tokens)], dim=1).float()


@pytest.mark.slow
def test_inference_compiled_with_frozen_weights_is_one_graph_of_the_plain_model(tiny):
    model = perturbed(tiny).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        expected = model(x)
    counters.clear()
    fast = compile_for_inference(model, x)
    with torch.inference_mode():
        assert torch.allclose(fast(x), expected, atol=1e-4)
        fast(x)
    # compiled once: nothing the model does at a call breaks the graph
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["float32", "bf16"])
def test_training_compiled_gives_the_loss_and_gradients_of_eager_training(tiny, dtype):
    model = perturbed(tiny).train()
    choose_attention(model, "cpu", dtype)  # bf16: the attention written out, recomputed
    fast = compile_for_training(twin := copy.deepcopy(model))
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    losses = []
    for m in (model, fast):
        with precision.autocast("cpu", dtype):
            losses.append(F.cross_entropy(m(x), y))
        losses[-1].backward()
    tolerance = 1e-4 if dtype is None else 3e-2
    torch.testing.assert_close(losses[1], losses[0], atol=tolerance, rtol=tolerance)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert (p.grad - q.grad).norm() <= tolerance * p.grad.norm() + 1e-4, name


@EAGER_AND_COMPILED
@BOTH
def test_inference_in_float32_equals_the_plain_model(tiny, extra, compile):
    model = perturbed({**tiny, **extra}).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        expected = model(x)
    tokens = features_and_logits(model, x)
    fast = for_inference(model, torch.float32, compile=compile)
    assert torch.allclose(fast(x), expected, atol=1e-4)
    assert fast.describe() == f"float32: asked for; {'compiled' if compile else 'eager'}"
    assert torch.allclose(features_and_logits(fast.model, x), tokens, atol=1e-4)


@EAGER_AND_COMPILED
@BOTH
def test_inference_in_bf16_equals_the_autocast_model_within_bf16_rounding(tiny, extra, compile):
    """The weights cast to bf16 in place, once; what the plain model computes under bf16 autocast
    (and in float32) within bf16's rounding, from float32 images."""
    model = perturbed({**tiny, **extra}).eval()
    x = torch.randn(4, 3, 32, 32)
    exact = features_and_logits(model, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = features_and_logits(model, x)
    weights = {name: p.data_ptr() for name, p in model.named_parameters()}
    fast = for_inference(model, "bf16", compile=compile)
    assert fast.model is model and set(fast.state_dict()) == {f"model.{n}" for n in weights}
    for name, p in model.named_parameters():  # cast, not copied beside
        assert p.dtype == torch.bfloat16 and not p.requires_grad and p.data_ptr() != weights[name]
    logits = fast(x)
    assert logits.dtype == torch.bfloat16 and logits.shape == (4, tiny["num_classes"])
    got, scale = features_and_logits(model, x.bfloat16()), exact.abs().max()
    assert max((got - autocast).abs().max(), (got - exact).abs().max()) <= 0.03 * scale
    assert torch.allclose(logits.float(), got[:, -tiny["num_classes"]:], atol=0.03 * scale)


@pytest.mark.parametrize("asked", ["half", "int8", torch.int8, None])
def test_a_precision_for_inference_does_not_know_is_refused_naming_the_choices(tiny, asked):
    with pytest.raises(ValueError, match=r"use 'auto' or one of float32, bfloat16, float16, fp32, "
                                         r"bf16, fp16$"):
        for_inference(vitzoo.create("vit_ti16", **tiny), asked)


@pytest.mark.parametrize("flags, dtype", [({"amx_bf16"}, torch.bfloat16), (set(), torch.float32)])
def test_for_inference_computes_by_default_in_the_precision_of_the_device_rule(tiny, monkeypatch,
                                                                               flags, dtype):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    fast = for_inference(vitzoo.create("vit_ti16", **tiny))
    assert fast.dtype == dtype and all(p.dtype == dtype for p in fast.model.parameters())
    assert fast(torch.randn(2, 3, 32, 32)).dtype == dtype
    assert fast.describe() == f"{precision.fastest('cpu')}; eager"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_for_inference_on_a_gpu_infers_in_its_native_half_precision(tiny):
    model = perturbed(tiny).eval().cuda()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    with torch.inference_mode():
        exact = model(x)
    fast = for_inference(model)
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert fast.dtype == (torch.bfloat16 if native else torch.float16)
    logits = fast(x)
    assert logits.dtype == fast.dtype and torch.isfinite(logits).all()
    assert (logits.float() - exact).abs().max() <= 0.03 * exact.abs().max()


def test_the_readmes_line_runs_after_import_vitzoo_alone():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (line,) = re.findall(r"^fast = vitzoo\.inference\.for_inference\(model\).*$", readme, re.M)
    script = "\n".join([
        "import vitzoo",
        "model = vitzoo.create('vit_ti16', embed_dim=32, depth=1, num_heads=2, mlp_dim=64,"
        " img_size=32, patch_size=8)", line,
        "assert fast.describe() == f\"{vitzoo.precision.fastest('cpu')}; eager\", fast.describe()"])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
