"""The optimizer and what moves with it: the recipes' optimizers, the learning-rate schedule,
layer-wise decay as timm groups it, and the moving average of the weights (`--model-ema`)."""

import copy
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from train_testing import TINY, tiny_config

import vitzoo
from vitzoo.cli import main
from vitzoo.train import Schedule, TrainConfig, loop, optim
from vitzoo.train.optim import EMA_WEIGHTS_NAME, ModelEMA


def test_linear_schedule_warmup_and_end():
    s = Schedule("linear", 10, total_steps=110)
    assert s.factor(0) == pytest.approx(0.1)
    assert s.factor(9) == 1.0  # warm-up end: the peak lr
    assert s.factor(60) == pytest.approx(0.5)
    assert s.factor(110) == 0.0  # the end
    assert s.factor(109) > 0.0  # the last update still moves
    c = Schedule("cosine", 0.1, total_steps=100)
    assert c.warmup_steps == 10 and c.factor(9) == 1.0 and c.factor(55) == pytest.approx(0.5) and c.factor(100) < 1e-12
    with pytest.raises(ValueError, match="does not fit"):
        Schedule("linear", 100, total_steps=50)

def test_time_budget_schedule_follows_the_clock():
    s = Schedule("linear", 4, budget_s=100.0)
    assert s.factor(3, 1.0) == 1.0
    assert s.factor(4, 2.0) == pytest.approx(1.0)  # decay starts where the warm-up ended
    assert s.factor(50, 51.0) == pytest.approx(0.5)
    assert s.factor(99, 100.0) == 0.0

def test_paper_pretrain_optimizer():
    cfg = tiny_config().resolved()
    assert (cfg.optimizer, cfg.weight_decay, tuple(cfg.betas), cfg.clip_grad, cfg.schedule) == ("adamw", 0.1, (0.9, 0.999), 1.0, "linear")
    model = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    opt = optim.build_optimizer(cfg, model, torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.999)
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    named = dict(model.named_parameters())
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0
    assert id(named["stem.proj.weight"]) in decayed and id(named["cls_token"]) not in decayed
    assert all(id(p) not in decayed for n, p in named.items() if n.endswith("bias") or "norm" in n)

@pytest.mark.parametrize("recipe", ["paper-pretrain", "paper-finetune"])
def test_optimizer_is_fused_on_cpu_and_steps_like_the_reference(recipe):
    cfg = tiny_config(recipe=recipe, lr=1e-2).resolved()
    torch.manual_seed(0)
    fused_model = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    plain_model = copy.deepcopy(fused_model)
    fused = optim.build_optimizer(cfg, fused_model, torch.device("cpu"))
    assert fused.defaults["fused"] is True
    twin = dict(zip(map(id, fused_model.parameters()), plain_model.parameters()))
    plain = type(fused)([{**{k: v for k, v in g.items() if k != "fused"}, "params": [twin[id(p)] for p in g["params"]]}
                         for g in fused.param_groups], foreach=False)  # the reference: a for-loop over parameters
    # the same gradients for both: through a backward pass Adam would amplify the rounding noise of the
    # gradients that are zero in exact arithmetic (the key bias)
    for _ in range(3):
        for a, b in zip(fused_model.parameters(), plain_model.parameters()):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        fused.step()
        plain.step()
    for (name, a), b in zip(fused_model.named_parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")

timm_optim = pytest.importorskip("timm.optim")

SMALL = dict(embed_dim=16, depth=3, num_heads=2, mlp_dim=32, img_size=32, patch_size=8, num_classes=5)

VARIANTS = {
    "learned 1-D, class token": {},
    "relative, gap, MLP head": dict(pos_embed="relative", pool="gap", head="mlp", head_options={"representation_size": 8}),
    "2-D, at every layer": dict(pos_embed="learned_2d", pos_embed_mode="every_layer"),
    "hybrid": dict(stem="resnet", stem_options={"layers": (1,), "width": 8}),
}

def groups_by_name(model: torch.nn.Module, groups: list[dict]) -> dict[str, tuple[float, float]]:
    """Each parameter's (learning-rate scale, weight decay), the scale to 12 digits (R ** k computed alike)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (round(g.get("lr_scale", 1.0), 12), g["weight_decay"]) for g in groups for p in g["params"]}

def partition(model: torch.nn.Module, groups: list[dict]) -> set[frozenset[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {frozenset(names[id(p)] for p in g["params"]) for g in groups if g["params"]}

@pytest.mark.parametrize("options", VARIANTS.values(), ids=VARIANTS.keys())
def test_layer_decay_makes_timms_groups_scales_and_weight_decays(options):
    """On the same vitzoo model, `--layer-decay 0.65` groups the parameters as timm's
    `create_optimizer_v2(model, layer_decay=0.65)` does, each with timm's scale and weight decay; without
    it, the two groups of weight decay (matrices; the rest) are timm's too."""
    model = vitzoo.create("vit_ti16", **{**SMALL, **options})
    cfg = TrainConfig(recipe="small", layer_decay=0.65, weight_decay=0.05).resolved()
    ours = optim.build_optimizer(cfg, model, torch.device("cpu")).param_groups
    theirs = timm_optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.65).param_groups
    assert groups_by_name(model, ours) == groups_by_name(model, theirs)
    assert partition(model, ours) == partition(model, theirs)
    scales = groups_by_name(model, ours)
    depth = len(model.encoder.blocks)
    assert scales["stem.proj.weight" if "stem" not in options else "stem.backbone.conv_root.weight"][0] == pytest.approx(0.65 ** (depth + 1))
    assert scales["encoder.blocks.0.attn.qkv.weight"][0] == pytest.approx(0.65 ** depth)
    assert scales["head.fc.weight"] == (1.0, 0.05) and scales["head.fc.bias"] == (1.0, 0.0)
    plain = optim.build_optimizer(dataclasses.replace(cfg, layer_decay=None), model, torch.device("cpu")).param_groups
    theirs = timm_optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05).param_groups
    assert groups_by_name(model, plain) == groups_by_name(model, theirs)

def test_layer_decay_scales_every_steps_learning_rate(tmp_path):
    """In training, each group learns at the scheduled rate times its scale: at a constant rate, the
    head at --lr, block i of L at lr * R**(L-i), the embedding at lr * R**(L+1), as timm's scheduler sets
    them; the logged rate is the scheduled one."""
    trainer = loop.Trainer.from_config(tiny_config(tmp_path, steps=2, layer_decay=0.5, schedule="constant", warmup=1))
    trainer.run()
    theirs = timm_optim.create_optimizer_v2(trainer.model, "adamw", lr=3e-3, weight_decay=0.0, layer_decay=0.5)
    want = {name: 3e-3 * scale for name, (scale, _) in groups_by_name(trainer.model, theirs.param_groups).items()}
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    got = {names[id(p)]: g["lr"] for g in trainer.optimizer.param_groups for p in g["params"]}
    assert got == pytest.approx(want)
    assert got["head.fc.weight"] == pytest.approx(3e-3) and got["cls_token"] == pytest.approx(3e-3 * 0.5 ** 3)
    logged = [json.loads(line)["lr"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"lr"' in line]
    assert logged == pytest.approx([3e-3, 3e-3])

def test_the_ema_update_is_the_formula():
    """ema = decay * ema + (1 - decay) * weights for every floating-point tensor; an integer buffer is the
    model's own; with the warm-up, update t's decay is min(decay, (1 + t) / (10 + t))."""
    torch.manual_seed(0)
    model = vitzoo.create("vit_ti16", **{**SMALL, "pos_embed": "relative"})
    ema = ModelEMA(model, decay=0.9)
    assert all(torch.equal(a, b) for a, b in zip(ema.state_dict().values(), model.state_dict().values()))
    before = {k: v.clone() for k, v in ema.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    ema.update(model, updates=0)
    weights = model.state_dict()
    floating = [k for k, v in before.items() if v.is_floating_point()]
    assert len(floating) == len(list(model.parameters()))
    for name in floating:
        torch.testing.assert_close(ema.state_dict()[name], 0.9 * before[name] + 0.1 * weights[name], rtol=1e-6, atol=1e-7)
        assert not torch.equal(ema.state_dict()[name], weights[name])
    assert all(not p.requires_grad for p in ema.module.parameters()) and not ema.module.training
    warm = ModelEMA(model, decay=0.9998, warmup=True)
    assert [warm.decay_at(t) for t in (0, 8, 10**6)] == pytest.approx([0.1, 0.5, 0.9998])

def test_the_ema_is_trained_saved_evaluated_and_read_by_eval_ema(tmp_path, capsys):
    """--model-ema: model_ema.safetensors beside model.safetensors (and in each checkpoint), weights
    other than the raw ones; summary.json's ema_* scores are the EMA weights' (measured again by
    `vitzoo eval RUN --ema`), and `vitzoo eval RUN` still measures the raw weights."""
    summary = loop.fit(tiny_config(tmp_path, steps=6, model_ema=True, model_ema_decay=0.7, precision="fp32",
                                   eval_every=3, checkpoint_every=3, keep_checkpoints=2))
    run = tmp_path / "run"
    raw, averaged = load_file(run / "model.safetensors"), load_file(run / EMA_WEIGHTS_NAME)
    assert raw.keys() == averaged.keys()
    assert not torch.equal(raw["head.fc.weight"], averaged["head.fc.weight"])
    for step in ("step_00000003", "step_00000006"):
        assert (run / "checkpoints" / step / EMA_WEIGHTS_NAME).is_file()
    assert all(torch.equal(averaged[k], v) for k, v in load_file(run / "checkpoints" / "step_00000006" / EMA_WEIGHTS_NAME).items())
    assert summary["ema_test_loss"] != summary["test_loss"]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "ema_eval_loss" in r] == [3, 6]
    for ema, expected in ((True, summary["ema_test_loss"]), (False, summary["test_loss"])):
        assert main(["eval", str(run), "--json", "--device", "cpu", "--test-limit", "128"] + ["--ema"] * ema) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["weights"] == ("ema" if ema else "raw")
        assert result["test_loss"] == pytest.approx(expected, rel=1e-5)

def test_eval_ema_of_a_run_without_one_names_the_fix(tmp_path, capsys):
    model = vitzoo.create("vit_ti16", **SMALL)
    model.save_pretrained(tmp_path / "saved")
    assert main(["eval", str(tmp_path / "saved"), "--ema", "--data", "synthetic"]) != 0
    err = capsys.readouterr().err
    assert "holds no moving average of the weights (model_ema.safetensors); train with --model-ema" in err
    assert "Traceback" not in err

def test_an_ema_longer_than_the_run_is_said(tmp_path):
    """timm's default decay, 0.9998, averages about 5000 steps: on a run of 8 it would be its initial
    weights, and a warning says so and how to fix it; the warm-up (or a lower decay) silences it."""
    with pytest.warns(UserWarning, match=r"averages about the last 5000 steps, more than this run's 8.*--model-ema-warmup"):
        loop.Trainer.from_config(tiny_config(tmp_path / "a", model_ema=True))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loop.Trainer.from_config(tiny_config(tmp_path / "b", model_ema=True, model_ema_warmup=True))
