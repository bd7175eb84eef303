"""The example plugins of plugins/, installed like any third-party package (`./run.sh setup`):
`vitzoo-sincos` adds pos_embed "sincos_2d", `vitzoo-convstem` stem "convstem". They are found
through the entry-point group "vitzoo" (VITZOO_DISABLE_PLUGIN_AUTOLOAD=1 hides them); a plugin that
fails to import is a warning naming it, a misspelled hook an error naming it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import TINY
from torch import nn

import vitzoo
from vitzoo import registry
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError, PluginError
from vitzoo.registry import DISABLE_AUTOLOAD_ENV, ENTRY_POINT_GROUP, get_registry

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = {"vitzoo-sincos": "vitzoo_sincos", "vitzoo-convstem": "vitzoo_convstem"}


@pytest.fixture(scope="module", autouse=True)
def _plugins_installed():
    """Each plugin installed from this checkout, its entry point in group vitzoo its module."""
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for dist, module in PLUGINS.items():
        spec, source = importlib.util.find_spec(module), (ROOT / "plugins" / dist).resolve()
        origin = Path(spec.origin if spec else "/").resolve()
        if found.get(dist) != module or source not in origin.parents:
            pytest.fail(f"{dist} is not installed from {source} with the entry point {dist} = "
                        f"{module}: run ./run.sh setup (pip install --no-deps -e plugins/*)",
                        pytrace=False)


@pytest.fixture
def plugins(monkeypatch):
    """A fresh process-wide registry with the entry points loaded, whatever the environment."""
    fresh = registry.Registry(autoload=True)
    monkeypatch.setattr(registry, "_REGISTRY", fresh)
    return fresh


def run_python(code: str, pythonpath: Path) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON document as its last line."""
    environment = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(pythonpath), environment.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fake_distribution(root: Path, name: str, source: str) -> None:
    """An installed package `name` whose entry point in group vitzoo is its module."""
    module = name.replace("-", "_")
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[vitzoo]\n{name} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))


def sincos_reference(grid: tuple[int, int], dim: int, prefix: int) -> torch.Tensor:
    """MoCo v3 / Simple ViT, from the formula, one number at a time: a zero row per class token,
    then for each patch (y, x), row-major, [sin(y w_k)..., cos(y w_k)..., sin(x w_k)...,
    cos(x w_k)...] with w_k = 10000 ** (-k / (dim / 4))."""
    freqs = [10000.0 ** (-k / (dim // 4)) for k in range(dim // 4)]
    rows = [[0.0] * dim for _ in range(prefix)]
    for y in range(grid[0]):
        for x in range(grid[1]):
            rows.append([f(v * w) for v in (y, x) for f in (math.sin, math.cos) for w in freqs])
    return torch.tensor(rows, dtype=torch.float64)


def sincos(plugins, grid, prefix: int = 1, **changes) -> nn.Module:
    return plugins.get("pos_embed", "sincos_2d")(ViTConfig(**{**TINY, **changes}), grid, prefix)


# ---------------------------------------------------------------------------------- discovery
def test_a_fresh_interpreter_finds_both_plugins_trains_with_them_and_warns_of_a_broken_one(
        tmp_path):
    fake_distribution(tmp_path, "vitzoo-broken-fake",
                      'raise ImportError("vitzoo_broken_fake needs frobnicate")\n')
    result = run_python("""
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, vitzoo
            components = vitzoo.list_components()
        model = vitzoo.create("vit_s16", stem="convstem", pos_embed="sincos_2d", img_size=64,
                              num_classes=10)
        features = model.forward_features(torch.randn(2, 3, 64, 64))
        # the zero classifier sends no gradient to the body: a loss on the features too
        (model.forward_head(features).sum() + features.square().mean()).backward()
        print(json.dumps({"warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                          "components": components, "grid": list(model.grid),
                          "features": list(features.shape),
                          "pos_embed_params": len(list(model.encoder.pos_embed.parameters())),
                          "stem_learns": all(p.grad.any() for p in model.stem.parameters())}))
    """, pythonpath=tmp_path)
    (broken,) = [w for w in result["warnings"] if "vitzoo-broken-fake" in w]
    assert broken.startswith("RuntimeWarning") and "frobnicate" in broken
    assert {"convstem", "patch"} <= set(result["components"]["stem"])
    assert {"sincos_2d", "learned_1d"} <= set(result["components"]["pos_embed"])
    assert result["grid"] == [4, 4] and result["features"] == [2, 17, 384]
    assert result["pos_embed_params"] == 0 and result["stem_learns"]


def test_disabling_autoload_hides_the_plugins_and_reset_registry_finds_them(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", None)  # as a fresh interpreter's
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    with pytest.raises(ConfigError, match="unknown stem 'convstem'"):
        vitzoo.create("vit_s16", stem="convstem", img_size=64)
    assert "sincos_2d" not in vitzoo.list_components()["pos_embed"]
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV)
    registry.reset_registry()
    model = vitzoo.create("vit_s16", stem="convstem", pos_embed="sincos_2d", img_size=32, depth=1)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)
    assert "convstem" not in registry.reset_registry(autoload=False).names("stem")


def test_a_plugin_with_a_misspelled_hook_is_an_error_at_load_time(tmp_path, monkeypatch):
    source = """
        import vitzoo
        from torch import nn

        @vitzoo.hookimpl
        def HOOK():
            return {"fake_pool": nn.Identity}
    """
    monkeypatch.syspath_prepend(str(tmp_path))  # where importlib.metadata finds the entry point
    fake_distribution(tmp_path, "vitzoo-misspelled-fake", source.replace("HOOK", "vitzoo_pool"))
    try:
        with pytest.raises(PluginError, match="plugin 'vitzoo-misspelled-fake'.*'vitzoo_pool' "
                                              "is not a vitzoo hook. Did you mean 'vitzoo_pools'"):
            registry.Registry(autoload=True)
        sys.modules.pop("vitzoo_misspelled_fake", None)
        (tmp_path / "vitzoo_misspelled_fake.py").write_text(
            textwrap.dedent(source.replace("HOOK", "vitzoo_pools")))
        assert "fake_pool" in registry.Registry(autoload=True).names("pool")
    finally:
        sys.modules.pop("vitzoo_misspelled_fake", None)


# ---------------------------------------------------------------------------------- sincos_2d
def test_sincos_is_the_formula_a_fixed_buffer_nothing_saves(plugins):
    for prefix in (1, 0):
        module = sincos(plugins, (2, 3), prefix, embed_dim=8, img_size=(8, 12), patch_size=4)
        added = module(torch.zeros(1, prefix + 6, 8), (2, 3))[0].double()
        torch.testing.assert_close(added, sincos_reference((2, 3), 8, prefix), atol=1e-6, rtol=0)
    # worked by hand: patch (y=1, x=2), second frequency 1/100: sin(2/100) in column 5
    assert added[1 * 3 + 2, 5].item() == pytest.approx(math.sin(0.02), abs=1e-7)
    model = vitzoo.create("vit_ti16", **TINY, pos_embed="sincos_2d")
    assert model.no_weight_decay() == {"cls_token"}  # no parameter, nothing saved
    assert not any(key.startswith("encoder.pos_embed") for key in model.state_dict())
    plain = vitzoo.create("vit_ti16", **TINY, pos_embed="none")
    assert vitzoo.count_params(model) == vitzoo.count_params(plain)


def test_sincos_works_for_any_grid_and_resamples_in_place(plugins):
    module = sincos(plugins, (4, 4))
    before = module.embedding.clone()
    out = module(torch.zeros(1, 1 + 3 * 5, 32), (3, 5))
    torch.testing.assert_close(out[0].double(), sincos_reference((3, 5), 32, 1), atol=1e-6, rtol=0)
    assert torch.equal(module.embedding, before)  # forward on another grid changes nothing
    module.resample((3, 5))
    torch.testing.assert_close(module.embedding[0].double(), sincos_reference((3, 5), 32, 1),
                               atol=1e-6, rtol=0)
    model = vitzoo.create("vit_ti16", **TINY, pos_embed="sincos_2d", dynamic_img_size=True)
    assert model(torch.randn(1, 3, 48, 64)).shape == (1, 5)
    model.set_img_size(48)
    assert model.encoder.pos_embed.grid == (6, 6) and model(torch.randn(1, 3, 48, 48)).shape[1] == 5


def test_sincos_every_layer_is_every_layer_shared(plugins):
    x, out = torch.randn(2, 3, 32, 32), []
    for mode in ("every_layer", "every_layer_shared"):
        torch.manual_seed(0)
        out.append(vitzoo.create("vit_ti16", **TINY, pos_embed="sincos_2d", pos_embed_mode=mode)(x))
    torch.testing.assert_close(out[0], out[1])


def test_sincos_refuses_an_embed_dim_not_divisible_by_4_and_saves_and_loads(plugins, tmp_path):
    with pytest.raises(ConfigError, match=r"sincos_2d.*embed_dim=30 is not divisible by 4"):
        vitzoo.create("vit_ti16", **{**TINY, "embed_dim": 30}, pos_embed="sincos_2d")
    model = vitzoo.create("vit_ti16", **TINY, stem="convstem", pos_embed="sincos_2d").eval()
    model.save_pretrained(tmp_path)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(vitzoo.from_pretrained(tmp_path).eval()(x), model(x))
    larger = vitzoo.from_pretrained(tmp_path, img_size=48)  # the table computed for its grid
    assert larger.encoder.pos_embed.embedding.shape == (1, 37, 32)


# ---------------------------------------------------------------------------------- convstem
@pytest.mark.parametrize("patch_size, suggested", [(12, "8 or patch_size=16"), (14, "8 or "),
                                                   (1, "2 or patch_size=4")])
def test_convstem_refuses_a_patch_size_that_is_not_a_power_of_two(plugins, patch_size, suggested):
    with pytest.raises(ConfigError, match=rf"power of two.*got patch_size={patch_size}; use "
                                          rf"patch_size={suggested}"):
        vitzoo.create("vit_s16", stem="convstem", patch_size=patch_size, img_size=48)


@pytest.mark.parametrize("embed_dim, patch_size, channels", [
    (384, 16, [48, 96, 192, 384]), (192, 16, [24, 48, 96, 192]),
    (384, 32, [24, 48, 96, 192, 384]), (32, 2, [32])])
def test_convstem_is_log2_p_stride_2_convs_doubling_to_d_then_a_1x1_conv(plugins, embed_dim,
                                                                         patch_size, channels):
    config = ViTConfig(**{**TINY, "embed_dim": embed_dim, "patch_size": patch_size})
    stem = plugins.get("stem", "convstem")(config)
    convs = [m for m in stem.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == channels + [embed_dim]
    assert all(c.kernel_size == (3, 3) and c.stride == (2, 2) for c in convs[:-1])
    assert convs[-1].kernel_size == (1, 1) and stem.stride == (patch_size, patch_size)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in stem.modules()) == len(channels)
    assert stem(torch.randn(2, 3, patch_size * 2, patch_size * 3)).shape == (2, 6, embed_dim)


def test_convstem_tokens_are_row_major_on_the_patch_stems_grid(plugins):
    """A pixel at the centre of patch (r, c) is seen by token r * w + c alone."""
    stem = plugins.get("stem", "convstem")(ViTConfig(**{**TINY, "img_size": (32, 64)})).eval()
    base = torch.randn(1, 3, 32, 64)
    with torch.no_grad():
        reference = stem(base)
        for r, c in [(1, 6), (3, 2), (0, 7)]:
            x = base.clone()
            x[0, :, 8 * r, 8 * c] += 10.0
            changed = ((stem(x) - reference)[0].abs().amax(dim=-1) > 1e-4).nonzero().flatten()
            assert changed.tolist() == [r * 8 + c]
    assert vitzoo.create("vit_ti16", **TINY, stem="convstem").grid == (4, 4)
