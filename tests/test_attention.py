"""The attention's two paths: the fused kernel (SDPA) and softmax(q k^T / sqrt(d)) v written out,
which bfloat16 on the CPU takes (it is faster there). Written out in training, the backward pass
recomputes the probabilities exactly, as the flash kernel does, unless the model stores them."""

import pytest
import torch

import vitzoo
from vitzoo.layers import attention


def perturbed(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def bf16_tokens(tiny, pos_embed, images):
    """A perturbed bf16 model and the embedded tokens of `images` random images."""
    model = perturbed(vitzoo.create("vit_ti16", **tiny, pos_embed=pos_embed)).bfloat16()
    with torch.no_grad():
        tokens, grid = model.embed(torch.randn(images, 3, 32, 32, dtype=torch.bfloat16))
    return model, tokens, grid


@pytest.mark.parametrize("pos_embed", ["learned_1d", "relative"])
def test_bf16_on_the_cpu_is_written_out_and_computes_what_sdpa_computes(tiny, pos_embed,
                                                                        monkeypatch):
    model, tokens, grid = bf16_tokens(tiny, pos_embed, 2)
    assert attention.written_out_is_faster(tokens)
    assert not attention.written_out_is_faster(tokens.float())
    with torch.no_grad():
        written_out = model.encoder(tokens, grid)
        monkeypatch.setattr(attention, "written_out_is_faster", lambda q: False)
        sdpa = model.encoder(tokens, grid)
    torch.testing.assert_close(written_out, sdpa, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("pos_embed", ["learned_1d", "relative"])
def test_bf16_inference_writes_large_batches_out_in_chunks_with_the_same_tokens(tiny, pos_embed,
                                                                              monkeypatch):
    model, tokens, grid = bf16_tokens(tiny, pos_embed, 5)
    with torch.inference_mode():
        whole = model.encoder(tokens, grid)
        chunk_sizes = []
        monkeypatch.setattr(attention, "CHUNK_LOGITS", 2 * 2 * 17 * 17)  # 2 images, 2 heads, 17 tokens
        original = attention.Attention.softmax_attention
        monkeypatch.setattr(attention.Attention, "softmax_attention",
                            lambda self, q, *args: chunk_sizes.append(len(q)) or original(self, q, *args))
        chunked = model.encoder(tokens, grid)
    assert chunk_sizes == [2, 2, 1] * model.config.depth
    torch.testing.assert_close(chunked, whole, atol=0, rtol=0)


def attention_ops(model, x, autocast_dtype):
    """The attention operators in the graph torch.compile traces of a training forward pass."""
    ops = set()

    def record(gm, example_inputs):
        ops.update(str(n.target) for n in gm.graph.nodes
                   if "attention" in str(n.target) or "softmax" in str(n.target))
        return gm.forward

    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_dtype is not None):
        torch.compile(model.train(), backend=record)(x)
    torch._dynamo.reset()
    return ops


@pytest.mark.parametrize("stored", [False, True])
@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, None], ids=["bf16", "float32"])
def test_a_compiled_training_step_takes_the_path_of_its_precision(tiny, stored, autocast_dtype):
    model = vitzoo.create("vit_ti16", **tiny)
    model.set_attention_probabilities_stored(stored)
    ops = attention_ops(model, torch.randn(2, 3, 32, 32), autocast_dtype)
    assert any("scaled_dot_product_attention" in op for op in ops) == (autocast_dtype is None), ops


def saved_for_backward(model, x):
    """The shapes of the floating-point tensors a bf16 training forward pass keeps for its backward
    pass, and the gradients of that pass."""
    shapes = []

    def pack(tensor):
        if tensor.is_floating_point():  # not the relative position bias's index of offsets
            shapes.append(tuple(tensor.shape))
        return tensor

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.train()(x).float().square().mean()
    loss.backward()
    return shapes, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("pos_embed", ["learned_1d", "relative"])
def test_bf16_training_stores_the_probabilities_only_when_asked_and_recomputes_them_exactly(
        tiny, pos_embed):
    model = perturbed(vitzoo.create("vit_ti16", **tiny, pos_embed=pos_embed, attn_dropout=0.0))
    x = torch.randn(3, 3, 32, 32)  # (3, 2, 17, 17) probabilities per layer

    def probabilities(shapes):
        return [s for s in shapes if len(s) == 4 and s[:2] == (3, 2) and s[3] == 17]

    recomputed, recomputed_grads = saved_for_backward(model, x)
    model.set_attention_probabilities_stored(True)
    stored, stored_grads = saved_for_backward(model, x)
    assert probabilities(recomputed) == [] and len(probabilities(stored)) >= model.config.depth
    for name, grad in stored_grads.items():
        torch.testing.assert_close(recomputed_grads[name], grad, atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("pos_embed", ["learned_1d", "relative"])
def test_bf16_gradients_under_torch_func_are_those_of_backward(tiny, pos_embed):
    from torch.func import functional_call, grad

    model = perturbed(vitzoo.create("vit_ti16", **tiny, pos_embed=pos_embed)).train()
    x = torch.randn(3, 3, 32, 32)
    _, expected = saved_for_backward(model, x)

    def loss(params):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return functional_call(model, params, (x,)).float().square().mean()

    gradients = grad(loss)({name: p.detach() for name, p in model.named_parameters()})
    assert gradients.keys() == expected.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, expected[name], atol=0, rtol=0, msg=name)


def test_bf16_training_with_attention_dropout_recomputes_the_same_mask(tiny):
    model = perturbed(vitzoo.create("vit_ti16", **tiny, attn_dropout=0.3))
    x = torch.randn(3, 3, 32, 32)
    torch.manual_seed(1)
    _, recomputed = saved_for_backward(model, x)
    model.set_attention_probabilities_stored(True)
    torch.manual_seed(1)
    _, stored = saved_for_backward(model, x)
    torch.manual_seed(2)
    _, other_mask = saved_for_backward(model, x)
    for name, grad in stored.items():
        torch.testing.assert_close(recomputed[name], grad, atol=0, rtol=0, msg=name)
    assert any(not torch.equal(other_mask[name], grad) for name, grad in stored.items())
