"""The optimizer and what moves with it: the learning-rate schedule, the recipes' optimizers,
layer-wise decay as timm groups it, and the moving average of the weights (`--model-ema`)."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file
from train_testing import TINY, lines, tiny_config

import vitzoo
from vitzoo.cli import main
from vitzoo.train import Schedule, TrainConfig, Trainer, fit
from vitzoo.train.optim import ModelEMA, build_optimizer

timm_optim = pytest.importorskip("timm.optim")
SMALL = dict(embed_dim=16, depth=3, num_heads=2, mlp_dim=32, img_size=32, patch_size=8,
             num_classes=5)
CPU = torch.device("cpu")


def test_the_schedule_warms_up_then_decays_over_steps_or_over_the_clock():
    s = Schedule("linear", 10, total_steps=110)
    assert [s.factor(i) for i in (0, 9, 60, 110)] == pytest.approx([0.1, 1.0, 0.5, 0.0])
    assert s.factor(109) > 0.0  # the last update still moves
    c = Schedule("cosine", 0.1, total_steps=100)  # a fraction of the run
    assert c.warmup_steps == 10 and c.factor(55) == pytest.approx(0.5) and c.factor(100) < 1e-12
    with pytest.raises(ValueError, match="does not fit"):
        Schedule("linear", 100, total_steps=50)
    t = Schedule("linear", 4, budget_s=100.0)  # the decay starts where the warm-up ended
    assert [t.factor(3, 1.0), t.factor(4, 2.0), t.factor(50, 51.0), t.factor(99, 100.0)
            ] == pytest.approx([1.0, 1.0, 0.5, 0.0])


@pytest.mark.parametrize("recipe, kind", [("paper-pretrain", torch.optim.AdamW),
                                          ("paper-finetune", torch.optim.SGD)])
def test_the_recipes_optimizer_is_fused(recipe, kind):
    model = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    fused = build_optimizer(tiny_config(recipe=recipe, lr=1e-2).resolved(), model, CPU)
    assert fused.defaults["fused"] is True and type(fused) is kind


def by_name(model: torch.nn.Module, groups: list[dict]) -> dict[str, tuple[float, float]]:
    """Each parameter's (learning-rate scale to 12 digits, weight decay)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (round(g.get("lr_scale", 1.0), 12), g["weight_decay"])
            for g in groups for p in g["params"]}


@pytest.mark.parametrize("options", [{}, dict(pos_embed="relative", pool="gap", head="mlp",
                                              head_options={"representation_size": 8}),
                                     dict(pos_embed="learned_2d", pos_embed_mode="every_layer"),
                                     dict(stem="resnet", stem_options=dict(layers=(1,), width=8))],
                         ids=["class token", "gap and MLP head", "2-D at every layer", "hybrid"])
def test_the_groups_are_timms_with_and_without_layer_decay(options):
    """Weight decay on matrices only, not on the class token or position embedding; with
    `--layer-decay 0.65` the groups, scales and decays of timm's create_optimizer_v2."""
    model = vitzoo.create("vit_ti16", **{**SMALL, **options})
    for decay in (None, 0.65):
        cfg = TrainConfig(recipe="small", layer_decay=decay, weight_decay=0.05).resolved()
        ours = by_name(model, build_optimizer(cfg, model, CPU).param_groups)
        theirs = timm_optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05,
                                                layer_decay=decay)
        assert ours == by_name(model, theirs.param_groups)
    assert ours["head.fc.weight"] == (1.0, 0.05) and ours["head.fc.bias"] == (1.0, 0.0)
    assert ours["encoder.blocks.0.attn.qkv.weight"][0] == pytest.approx(0.65 ** 3)
    if not options:
        assert ours["stem.proj.weight"][0] == pytest.approx(0.65 ** 4)
        assert ours["cls_token"][1] == 0.0


def test_in_a_run_each_group_learns_at_the_scheduled_rate_times_its_scale(tmp_path):
    trainer = Trainer.from_config(tiny_config(tmp_path, steps=2, layer_decay=0.5,
                                              schedule="constant", warmup=1))
    trainer.run()
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    got = {names[id(p)]: g["lr"] for g in trainer.optimizer.param_groups for p in g["params"]}
    assert got["head.fc.weight"] == pytest.approx(3e-3)
    assert got["cls_token"] == pytest.approx(3e-3 * 0.5 ** 3)  # depth 2: the embedding's R**(L+1)
    assert [r["lr"] for r in lines(tmp_path / "run") if "lr" in r] == pytest.approx([3e-3] * 2)


def test_the_moving_average_is_the_formula():
    """ema = decay * ema + (1 - decay) * weights for every floating-point tensor; an integer
    buffer is the model's own; with the warm-up, update t's decay is min(decay, (1+t)/(10+t))."""
    model = vitzoo.create("vit_ti16", **{**SMALL, "pos_embed": "relative"})
    ema = ModelEMA(model, decay=0.9)
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    ema.update(model, updates=0)
    for name, value in ema.module.state_dict().items():
        expected = 0.9 * before[name] + 0.1 * model.state_dict()[name]
        if value.is_floating_point():
            torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(value, model.state_dict()[name])
    assert not any(p.requires_grad for p in ema.module.parameters()) and not ema.module.training
    warm = ModelEMA(model, decay=0.9998, warmup=True)
    assert [warm.decay_at(t) for t in (0, 8, 10**6)] == pytest.approx([0.1, 0.5, 0.9998])


def test_the_average_is_trained_saved_evaluated_and_read_by_eval_ema(tmp_path, capsys):
    summary = fit(tiny_config(tmp_path, steps=6, model_ema=True, model_ema_decay=0.7,
                              eval_every=3, checkpoint_every=3, keep_checkpoints=2))
    run = tmp_path / "run"
    raw, averaged = load_file(run / "model.safetensors"), load_file(run / "model_ema.safetensors")
    assert raw.keys() == averaged.keys() and not torch.equal(raw["head.fc.weight"],
                                                             averaged["head.fc.weight"])
    for step in (3, 6):
        saved = load_file(run / "checkpoints" / f"step_{step:08d}" / "model_ema.safetensors")
        assert step == 3 or all(torch.equal(averaged[k], v) for k, v in saved.items())
    assert [r["step"] for r in lines(run) if "ema_eval_loss" in r] == [3, 6]
    for ema, expected in ((True, summary["ema_test_loss"]), (False, summary["test_loss"])):
        argv = ["eval", str(run), "--json", "--device", "cpu", "--test-limit", "128"]
        assert main(argv + ["--ema"] * ema) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["weights"] == ("ema" if ema else "raw")
        assert result["test_loss"] == pytest.approx(expected)
    assert summary["test_loss"] != summary["ema_test_loss"]


def test_eval_ema_of_a_model_without_an_average_names_the_fix(tmp_path, capsys):
    vitzoo.create("vit_ti16", **SMALL).save_pretrained(tmp_path / "saved")
    assert main(["eval", str(tmp_path / "saved"), "--ema", "--data", "synthetic"]) == 2
    assert "cannot read" in (err := capsys.readouterr().err) and "model_ema.safetensors" in err


def test_an_average_longer_than_the_run_is_said_unless_it_warms_up(tmp_path):
    with pytest.warns(UserWarning, match=r"averages about the last 5000 steps, more than this "
                                         r"run's 8.*--model-ema-warmup"):
        Trainer.from_config(tiny_config(tmp_path / "a", model_ema=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer.from_config(tiny_config(tmp_path / "b", model_ema=True, model_ema_warmup=True))
