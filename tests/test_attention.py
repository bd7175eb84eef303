"""The attention's two paths: the fused kernel (SDPA) and softmax(q k^T / sqrt(d)) v written out,
which bf16 on a CPU takes (it is faster there). Written out in training, the backward pass
recomputes the probabilities exactly, dropout mask included, and torch.func still works."""

import pytest
import torch
from torch.func import functional_call, grad

import vitzoo
from vitzoo.model import choose_attention


def perturbed(tiny, **options):
    model = vitzoo.create("vit_ti16", **tiny, **options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def kernels(model):
    return {block.attn.written_out for block in model.encoder.blocks}


@pytest.mark.parametrize("pos_embed", ["learned_1d", "relative"])
def test_bf16_on_the_cpu_is_written_out_and_computes_what_sdpa_computes(tiny, pos_embed):
    model = perturbed(tiny, pos_embed=pos_embed).eval().bfloat16()
    x = torch.randn(2, 3, 32, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        sdpa = model.forward_features(x)
        choose_attention(model, "cpu", torch.bfloat16)
        assert kernels(model) == {True}
        written_out = model.forward_features(x)
    torch.testing.assert_close(written_out, sdpa, atol=3e-2, rtol=2e-2)
    choose_attention(model, "cpu", None)
    assert kernels(model) == {False}


def test_for_inference_and_the_trainer_choose_the_kernel_of_their_precision(tiny, tmp_path):
    from vitzoo.inference import for_inference
    from vitzoo.train import TrainConfig, Trainer, distributed

    assert kernels(for_inference(vitzoo.create("vit_ti16", **tiny), "bf16").model) == {True}
    assert kernels(for_inference(vitzoo.create("vit_ti16", **tiny), "fp32").model) == {False}
    for precision, written_out in (("bf16", True), ("fp32", False)):
        options = {k: v for k, v in tiny.items() if k != "num_classes"}  # the data's
        cfg = TrainConfig(model="vit_ti16", model_options=options,
                          data="synthetic", train_limit=32, test_limit=16, batch_size=16, steps=1,
                          quiet=True, tensorboard=False, device="cpu", precision=precision,
                          model_ema=True, model_ema_warmup=True).resolved()
        trainer = Trainer(cfg, distributed.setup("cpu"))
        assert kernels(trainer.model) == kernels(trainer.ema.module) == {written_out}


def backward_and_saved(model, x):
    """The gradients of a bf16 training step, and the shapes of the tensors it saved."""
    shapes = []

    def pack(tensor):
        shapes.append(tuple(tensor.shape))
        return tensor

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().square().mean()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}, shapes


@pytest.mark.parametrize("options", [{"pos_embed": "relative"}, {"attn_dropout": 0.3}],
                         ids=["relative", "dropout"])
def test_bf16_training_recomputes_the_probabilities_exactly_and_torch_func_agrees(tiny, options):
    """No (B, heads, T, T) probabilities are kept for the backward pass; the gradients equal those
    of torch.func (which keeps them), bit for bit, the same dropout mask drawn in both."""
    model = perturbed(tiny, **options).train()
    choose_attention(model, "cpu", torch.bfloat16)
    x = torch.randn(3, 3, 32, 32)
    torch.manual_seed(1)
    recomputed, saved = backward_and_saved(model, x)
    assert not [s for s in saved if len(s) == 4 and s[:2] == (3, 2) and s[3] == 17]

    def loss(params):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return functional_call(model, params, (x,)).float().square().mean()

    torch.manual_seed(1)
    kept = grad(loss)({name: p.detach() for name, p in model.named_parameters()})
    for name, gradient in kept.items():
        torch.testing.assert_close(gradient, recomputed[name], atol=0, rtol=0, msg=name)
    if options.get("attn_dropout"):
        torch.manual_seed(2)
        other = backward_and_saved(model, x)[0]
        assert any(not torch.equal(other[n], g) for n, g in recomputed.items())
