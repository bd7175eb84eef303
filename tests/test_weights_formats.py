"""Foreign weights (timm, torchvision, transformers) give the reference library's logits.

The references are built with random init on their side (nothing is downloaded) and every parameter
is then randomised, so that zero-initialised heads or unit norms cannot hide a wrong mapping.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import vitzoo
from vitzoo.errors import CheckpointError
from vitzoo.checkpoints.sources import read_checkpoint

TOL = 1e-4


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if p.ndim == 1:  # norms and biases: around 1 for scales, around 0 otherwise
                p.copy_(noise * 0.1 + (1.0 if name.endswith("weight") else 0.0))
            else:
                p.copy_(noise * 0.02)
    return module.eval()


def save_safetensors(state_dict, path):
    save_file({k: v.contiguous().clone() for k, v in state_dict.items()}, str(path))
    return path


def assert_same_logits(ours: torch.nn.Module, theirs, x: torch.Tensor, take=lambda out: out):
    with torch.no_grad():
        expected = take(theirs(x))
        got = ours.eval()(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


# ---------------------------------------------------------------------------------------- timm
import timm  # noqa: E402  (test dependency: a missing one is an error, not a skip)


@pytest.mark.slow
def test_timm_vit_base_patch16_224_from_safetensors(tmp_path):
    reference = randomize(timm.create_model("vit_base_patch16_224", pretrained=False))
    path = save_safetensors(reference.state_dict(), tmp_path / "timm_b16.safetensors")
    model = vitzoo.from_pretrained(path)
    config = model.config
    assert (config.embed_dim, config.depth, config.num_heads, config.mlp_dim, config.patch_size) == (768, 12, 12, 3072, 16)
    assert (config.act, config.norm_eps, config.num_classes, config.img_size) == ("gelu", 1e-6, 1000, (224, 224))
    assert_same_logits(model, reference, torch.randn(2, 3, 224, 224))


@pytest.mark.slow
def test_timm_vit_small_global_average_pool_without_class_token(tmp_path):
    reference = randomize(timm.create_model("vit_small_patch16_224", pretrained=False, global_pool="avg", class_token=False))
    path = tmp_path / "timm_s16_gap.pth"
    torch.save(reference.state_dict(), path)
    model = vitzoo.from_pretrained(path)
    assert model.config.pool == "gap" and model.config.num_heads == 6 and model.cls_token is None
    assert_same_logits(model, reference, torch.randn(2, 3, 224, 224))


@pytest.mark.slow
def test_timm_hybrid_vit_base_r50_s16_224(tmp_path):
    reference = randomize(timm.create_model("vit_base_r50_s16_224", pretrained=False, num_classes=10))
    path = save_safetensors(reference.state_dict(), tmp_path / "timm_r50_b16.safetensors")
    model = vitzoo.from_pretrained(path)
    assert model.config.stem == "resnet" and model.config.stem_options["layers"] == [3, 4, 9] and model.config.patch_size == 1
    assert_same_logits(model, reference, torch.randn(2, 3, 224, 224))


@pytest.mark.slow
def test_timm_hybrid_weights_bring_timms_resnet_numerics(tmp_path):
    reference = timm.create_model("vit_base_r50_s16_224", pretrained=False, depth=1, num_classes=3)
    path = save_safetensors(reference.state_dict(), tmp_path / "hybrid.safetensors")
    checkpoint = read_checkpoint(path)
    assert checkpoint.format == "timm" and checkpoint.config["stem_options"] == {"numerics": "timm"}
    model = vitzoo.from_pretrained(path, num_heads=12)  # depth 1: not a shape of the paper's, so the count is given
    assert model.config.stem_options["numerics"] == "timm"
    assert model.stem.backbone.gn_root.eps == 1e-5


# ---------------------------------------------------------------------------------------- torchvision
@pytest.mark.slow
def test_torchvision_vit_b_16_from_pth(tmp_path):
    import torchvision
    reference = randomize(torchvision.models.vit_b_16())
    path = tmp_path / "vit_b_16.pth"
    torch.save(reference.state_dict(), path)
    model = vitzoo.from_pretrained(path)
    config = model.config
    assert (config.embed_dim, config.num_heads, config.norm_eps, config.act) == (768, 12, 1e-6, "gelu")
    assert config.mean == pytest.approx((0.485, 0.456, 0.406))
    assert_same_logits(model, reference, torch.randn(2, 3, 224, 224))


def test_torchvision_pre_logits_head(tmp_path):
    import torchvision
    reference = randomize(torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=7,
        representation_size=48))
    path = save_safetensors(reference.state_dict(), tmp_path / "tv.safetensors")
    model = vitzoo.from_pretrained(path, num_heads=4)
    assert model.config.head == "mlp" and model.config.head_options == {"representation_size": 48}
    assert_same_logits(model, reference, torch.randn(2, 3, 32, 32))


# ---------------------------------------------------------------------------------------- transformers
import transformers  # noqa: E402


def hf_config(**changes):
    options = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                   image_size=32, patch_size=8, num_labels=6)
    options.update(changes)
    return transformers.ViTConfig(**options)


def test_transformers_classifier_directory(tmp_path):
    reference = randomize(transformers.ViTForImageClassification(hf_config()))
    reference.save_pretrained(tmp_path / "hf")
    model = vitzoo.from_pretrained(tmp_path / "hf")
    config = model.config
    assert (config.num_heads, config.norm_eps, config.num_classes, config.img_size) == (4, 1e-12, 6, (32, 32))
    assert_same_logits(model, reference, torch.randn(2, 3, 32, 32), take=lambda out: out.logits)


def test_transformers_bare_state_dict_in_the_classic_layout(tmp_path):
    """Checkpoints on the Hub use the pre-v5 names (encoder.layer.N.attention.attention.query ...)."""
    reference = randomize(transformers.ViTForImageClassification(hf_config(hidden_act="gelu")))
    classic = {}
    for key, value in reference.state_dict().items():
        key = (key.replace("vit.layers.", "vit.encoder.layer.").replace("attention.q_proj", "attention.attention.query")
               .replace("attention.k_proj", "attention.attention.key").replace("attention.v_proj", "attention.attention.value")
               .replace("attention.o_proj", "attention.output.dense").replace("mlp.fc1", "intermediate.dense")
               .replace("mlp.fc2", "output.dense"))
        classic[key] = value
    assert "vit.encoder.layer.0.attention.attention.query.weight" in classic
    path = save_safetensors(classic, tmp_path / "hf_classic.safetensors")
    model = vitzoo.from_pretrained(path, num_heads=4)
    assert model.config.norm_eps == 1e-12  # transformers' default, without a config.json
    assert_same_logits(model, reference, torch.randn(2, 3, 32, 32), take=lambda out: out.logits)


def test_transformers_vit_model_pooler_is_the_pre_logits_layer(tmp_path):
    reference = randomize(transformers.ViTModel(hf_config()))
    reference.save_pretrained(tmp_path / "hf_model")
    model = vitzoo.from_pretrained(tmp_path / "hf_model")
    assert model.config.num_classes == 0 and model.config.head == "mlp"
    assert_same_logits(model, reference, torch.randn(2, 3, 32, 32), take=lambda out: out.pooler_output)


# ---------------------------------------------------------------------------------------- detection and safety
def test_unknown_keys_are_a_clear_error_listing_the_formats(tmp_path):
    path = save_safetensors({"foo.weight": torch.zeros(2)}, tmp_path / "other.safetensors")
    with pytest.raises(CheckpointError, match="not recognised.*supported sources"):
        vitzoo.from_pretrained(path)


def test_strict_loading_lists_every_unexpected_tensor(tmp_path):
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=32)
    state_dict = dict(reference.state_dict(), **{"extra.weight": torch.zeros(3)})
    path = save_safetensors(state_dict, tmp_path / "extra.safetensors")
    with pytest.raises(CheckpointError, match=r"unexpected \(1\): extra.weight"):
        vitzoo.from_pretrained(path)
    model = vitzoo.from_pretrained(path, strict=False)
    assert model.config.depth == 2


def test_pickled_code_never_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32)
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": reference.state_dict(), "payload": Payload()}, path)
    with pytest.raises(CheckpointError, match="weights_only"):
        vitzoo.from_pretrained(path)
    assert not marker.exists()


def test_nested_training_checkpoint_and_head_replacement(tmp_path):
    reference = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=32, num_classes=4))
    path = tmp_path / "train.bin"
    torch.save({"state_dict": reference.state_dict(), "epoch": 3}, path)
    model = vitzoo.from_pretrained(path, num_classes=9, img_size=64)
    assert model.config.num_classes == 9 and model.grid == (4, 4)
    assert torch.count_nonzero(model.head.fc.weight) == 0
    # under a zoo name: the weights decide GELU and eps, the name the rest
    named = vitzoo.create("vit_ti16", pretrained=path, depth=2, img_size=32, num_classes=4)
    assert (named.config.act, named.config.norm_eps) == ("gelu", 1e-6)
    assert_same_logits(named, reference, torch.randn(2, 3, 32, 32))


def test_convert_command_writes_a_vitzoo_directory(tmp_path, capsys):
    from vitzoo.cli import main

    reference = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=32, num_classes=4))
    path = save_safetensors(reference.state_dict(), tmp_path / "tiny.safetensors")
    assert main(["convert", str(path), str(tmp_path / "out")]) == 0
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"config.json", "model.safetensors", "README.md"}
    model = vitzoo.from_pretrained(tmp_path / "out")
    assert model.config.num_heads == 3 and model.config.act == "gelu"
    assert_same_logits(model, reference, torch.randn(2, 3, 32, 32))
    assert main(["convert", str(path), str(tmp_path / "bad"), "--model", "vit_b16"]) == 2
    assert "do not fit" in capsys.readouterr().err


def test_a_timm_hub_directory_brings_its_preprocessing(tmp_path):
    """timm's Hub repos: config.json with `architecture` and `pretrained_cfg`, and model.safetensors."""
    import json

    reference = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32, num_classes=4))
    (tmp_path / "repo").mkdir()
    save_safetensors(reference.state_dict(), tmp_path / "repo" / "model.safetensors")
    (tmp_path / "repo" / "config.json").write_text(json.dumps({
        "architecture": "vit_tiny_patch16_224", "num_classes": 4,
        "pretrained_cfg": {"input_size": [3, 32, 32], "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    }))
    model = vitzoo.from_pretrained(tmp_path / "repo")
    assert model.config.mean == pytest.approx((0.485, 0.456, 0.406)) and model.config.img_size == (32, 32)
    assert_same_logits(model, reference, torch.randn(2, 3, 32, 32))


def test_timm_average_pooling_beside_a_class_token_is_refused_clearly(tmp_path):
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32, global_pool="avg")
    path = save_safetensors(reference.state_dict(), tmp_path / "avg_cls.safetensors")
    with pytest.raises(CheckpointError, match="class token and fc_norm"):
        vitzoo.from_pretrained(path)


# ------------------------------------------------------------------ a plugin's weight format
class BackboneFormat(vitzoo.weights.WeightFormat):
    """A third-party format for the tests: vitzoo's names under a training framework's `backbone.`
    prefix, trained on images normalised to [-1, 1] (which the weights cannot say)."""

    name = "backbone"

    def recognises(self, keys, metadata):
        return bool(keys) and all(k.startswith("backbone.") for k in keys)

    def convert(self, state_dict, metadata):
        weights = {k.removeprefix("backbone."): v for k, v in state_dict.items()}
        side = vitzoo.weights.layout.square_side(weights["encoder.pos_embed.weight"].shape[1] - 1)
        return vitzoo.weights.ConvertedWeights(format=self.name, state_dict=weights, grid=(side, side))

    def hints(self, metadata):
        return {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}


class BackbonePlugin:
    @vitzoo.hookimpl
    def vitzoo_weight_formats(self):
        return {"backbone": BackboneFormat()}


class ClaimsVitzooPlugin:
    @vitzoo.hookimpl
    def vitzoo_weight_formats(self):
        format = BackboneFormat()
        format.recognises = lambda keys, metadata: "stem.proj.weight" in keys
        return {"backbone": format}


@pytest.fixture
def plugin():
    """Register a plugin in-process for one test, as an installed one would be."""
    registry = vitzoo.get_registry()
    names = []
    yield lambda obj: names.append(registry.register(obj, name=type(obj).__name__))
    for name in names:
        registry.unregister(name)


def test_a_plugin_weight_format_is_recognised_and_loads(tmp_path, plugin, tiny):
    """A format registered through vitzoo_weight_formats is found by its keys: the weights load into
    the model they came from, with the format's hints in the inferred config."""
    plugin(BackbonePlugin())
    model = vitzoo.create("vit_ti16", **tiny).eval()
    path = save_safetensors({f"backbone.{k}": v for k, v in model.state_dict().items()}, tmp_path / "w.safetensors")
    assert read_checkpoint(path).format == "backbone"
    loaded = vitzoo.from_pretrained(path, num_heads=tiny["num_heads"])
    assert loaded.config.mean == (0.5, 0.5, 0.5)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))


def test_without_the_plugin_its_weights_are_not_recognised(tmp_path, tiny):
    """The same file, no plugin: no built-in format claims it."""
    model = vitzoo.create("vit_ti16", **tiny)
    path = save_safetensors({f"backbone.{k}": v for k, v in model.state_dict().items()}, tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match="not recognised"):
        read_checkpoint(path)


def test_weights_two_formats_recognise_are_an_error_naming_both(tmp_path, plugin, tiny):
    """Formats must not overlap: which one converts is never decided by registration order."""
    plugin(ClaimsVitzooPlugin())
    path = save_safetensors(vitzoo.create("vit_ti16", **tiny).state_dict(), tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match="look like (vitzoo and like backbone|backbone and like vitzoo)"):
        read_checkpoint(path)


class MisnamedPlugin:
    @vitzoo.hookimpl
    def vitzoo_weight_formats(self):
        return {"other": BackboneFormat()}


def test_a_format_registered_under_another_name_is_an_error(tmp_path, plugin, tiny):
    """The registered name is the one checkpoints carry (`ConvertedWeights.format`): they must agree."""
    from vitzoo.errors import PluginError

    plugin(MisnamedPlugin())
    path = save_safetensors(vitzoo.create("vit_ti16", **tiny).state_dict(), tmp_path / "w.safetensors")
    with pytest.raises(PluginError, match="weight format 'other' must be a .*WeightFormat whose name is 'other'"):
        read_checkpoint(path)
