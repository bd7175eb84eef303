"""The example plugins of plugins/, installed like any third-party package.

- `vitzoo-sincos` adds pos_embed "sincos_2d" and `vitzoo-convstem` adds stem "convstem"; both are
  found through the entry-point group "vitzoo" by a fresh interpreter, and the model that uses both
  builds, runs and trains (gradients reach the stem).
- VITZOO_DISABLE_PLUGIN_AUTOLOAD=1 hides them.
- sincos_2d is a fixed buffer (no parameters), deterministic, equal to the formula of MoCo v3 /
  Simple ViT computed independently here, works for any grid, and supports the three modes.
- convstem is log2(P) stride-2 3x3 convs (BN, ReLU) and a 1x1 conv, gives row-major tokens, and
  rejects a patch size that is not a power of two with a clear message.
- A plugin that fails to import is a warning naming it; the built-ins and the other plugins still work.
- An installed plugin with a misspelled hook is an error at load time naming it and the hook it meant.
- Two plugins giving one name is an error naming both.

The plugins must be installed (`./run.sh setup` does it); if they are not, these tests fail, saying so.
"""

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
from torch import nn

import vitzoo
from vitzoo import registry
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError, PluginError
from vitzoo.registry import DISABLE_AUTOLOAD_ENV, ENTRY_POINT_GROUP, get_registry

ROOT = Path(__file__).resolve().parents[1]
# distribution (= entry-point name) -> (module, kind, component name)
PLUGINS = {
    "vitzoo-sincos": ("vitzoo_sincos", "pos_embed", "sincos_2d"),
    "vitzoo-convstem": ("vitzoo_convstem", "stem", "convstem"),
}
SETUP_HINT = (
    "run `./run.sh setup` (it installs every plugins/*/ with `pip install --no-deps -e`), or by hand: "
    f"{sys.executable} -m pip install --no-deps -e plugins/vitzoo-sincos -e plugins/vitzoo-convstem"
)
TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=8, num_classes=5)


# ---------------------------------------------------------------------------------------- helpers
def installation_problems() -> list[str]:
    """Why the example plugins are not usable from this checkout ([] when they are)."""
    entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    problems = []
    for dist, (module, _, _) in PLUGINS.items():
        ep = entry_points.get(dist)
        if ep is None:
            problems.append(f"{dist} is not installed (no entry point {dist!r} in group {ENTRY_POINT_GROUP!r})")
            continue
        if ep.value != module:
            problems.append(f"entry point {dist!r} points to {ep.value!r}, expected {module!r}")
            continue
        spec = importlib.util.find_spec(module)
        source = ROOT / "plugins" / dist
        if spec is None or spec.origin is None or source.resolve() not in Path(spec.origin).resolve().parents:
            where = spec.origin if spec is not None else "nowhere"
            problems.append(f"{module} is imported from {where}, not from {source} (install it editable from this checkout)")
    return problems


@pytest.fixture(scope="module", autouse=True)
def _plugins_installed():
    problems = installation_problems()
    if problems:
        pytest.fail("the example plugins are not installed: " + "; ".join(problems) + ". " + SETUP_HINT, pytrace=False)


@pytest.fixture
def plugin_registry(monkeypatch):
    """A fresh process-wide registry with the entry points loaded (whatever the environment says),
    restored after the test."""
    fresh = registry.Registry(autoload=True)
    monkeypatch.setattr(registry, "_REGISTRY", fresh)
    return fresh


def run_python(code: str, *, env: dict[str, str] | None = None, pythonpath: Path | None = None) -> dict:
    """Run `code` in a fresh interpreter of this venv; it prints one JSON document as its last line."""
    environment = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    environment.update(env or {})
    if pythonpath is not None:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), environment.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


def sincos_reference(grid: tuple[int, int], dim: int, num_prefix_tokens: int) -> torch.Tensor:
    """MoCo v3 / Simple ViT, from the formula, one number at a time: a zero row per class token, then
    for each patch (y, x) in row-major order [sin(y w_k)..., cos(y w_k)..., sin(x w_k)..., cos(x w_k)...]
    with w_k = 10000 ** (-k / (dim / 4))."""
    quarter = dim // 4
    freqs = [10000.0 ** (-k / quarter) for k in range(quarter)]
    rows = [[0.0] * dim for _ in range(num_prefix_tokens)]
    for y in range(grid[0]):
        for x in range(grid[1]):
            rows.append(
                [math.sin(y * f) for f in freqs] + [math.cos(y * f) for f in freqs]
                + [math.sin(x * f) for f in freqs] + [math.cos(x * f) for f in freqs]
            )
    return torch.tensor(rows, dtype=torch.float64)


def tiny_config(**changes) -> ViTConfig:
    return ViTConfig(**{**TINY, **changes})


# ---------------------------------------------------------------------------------------- packaging
def test_the_example_plugins_are_installed():
    assert installation_problems() == [], SETUP_HINT


@pytest.mark.parametrize("dist", sorted(PLUGINS))
def test_each_plugin_is_a_package_with_an_entry_point_in_group_vitzoo(dist):
    import tomllib  # Python >= 3.11, as the project requires for its tests
    directory = ROOT / "plugins" / dist
    project = tomllib.loads((directory / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert project["project"]["name"] == dist
    assert project["project"]["entry-points"]["vitzoo"] == {dist: PLUGINS[dist][0]}
    assert all(dep.startswith("vitzoo") for dep in project["project"].get("dependencies", []))
    assert (directory / "README.md").is_file()


# ---------------------------------------------------------------------------------------- discovery
def test_a_fresh_interpreter_discovers_both_plugins_and_trains_the_model_using_them():
    result = run_python(
        """
        import json, torch, vitzoo
        import torch.nn.functional as F
        from vitzoo.registry import get_registry

        torch.manual_seed(0)
        model = vitzoo.create("vit_s16", stem="convstem", pos_embed="sincos_2d", img_size=64, num_classes=10)
        x = torch.randn(2, 3, 64, 64)
        features = model.forward_features(x)
        logits = model.forward_head(features)
        # the classifier starts at zero, so the loss on the logits alone sends no gradient to the body
        (F.cross_entropy(logits, torch.tensor([1, 7])) + features.square().mean()).backward()
        stem = [p.grad for p in model.stem.parameters()]
        pm = get_registry().pm
        print(json.dumps({
            "components": vitzoo.list_components(),
            "plugins": {name: getattr(pm.get_plugin(name), "__name__", None) for name in ("vitzoo-sincos", "vitzoo-convstem")},
            "failed": sorted(get_registry().failed_plugins),
            "stem_module": type(model.stem).__module__,
            "pos_embed_module": type(model.encoder.pos_embed).__module__,
            "grid": list(model.grid),
            "features": list(features.shape),
            "logits": list(logits.shape),
            "pos_embed_params": sum(p.numel() for p in model.encoder.pos_embed.parameters()),
            "all_grads": all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters()),
            "stem_grads_nonzero": all(g is not None and g.abs().sum().item() > 0 for g in stem),
        }))
        """
    )
    assert "convstem" in result["components"]["stem"] and "patch" in result["components"]["stem"]
    assert "sincos_2d" in result["components"]["pos_embed"] and "learned_1d" in result["components"]["pos_embed"]
    assert result["plugins"] == {"vitzoo-sincos": "vitzoo_sincos", "vitzoo-convstem": "vitzoo_convstem"}
    assert not {"vitzoo-sincos", "vitzoo-convstem"} & set(result["failed"])
    assert (result["stem_module"], result["pos_embed_module"]) == ("vitzoo_convstem", "vitzoo_sincos")
    assert result["grid"] == [4, 4]
    assert result["features"] == [2, 1 + 16, 384] and result["logits"] == [2, 10]
    assert result["pos_embed_params"] == 0
    assert result["all_grads"] and result["stem_grads_nonzero"]


def test_disabling_autoload_hides_the_plugins():
    result = run_python(
        """
        import json, vitzoo
        try:
            vitzoo.create("vit_s16", stem="convstem", img_size=64)
            error = None
        except vitzoo.ConfigError as exc:
            error = str(exc)
        print(json.dumps({"components": vitzoo.list_components(), "error": error}))
        """,
        env={DISABLE_AUTOLOAD_ENV: "1"},
    )
    assert "convstem" not in result["components"]["stem"] and "patch" in result["components"]["stem"]
    assert "sincos_2d" not in result["components"]["pos_embed"] and "learned_1d" in result["components"]["pos_embed"]
    assert result["error"] is not None and "unknown stem 'convstem'" in result["error"]


def test_in_process_reset_registry_sees_the_plugins(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", None)  # restored afterwards
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    registry.reset_registry()
    model = vitzoo.create("vit_s16", stem="convstem", pos_embed="sincos_2d", img_size=32, depth=1)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)
    without = registry.reset_registry(autoload=False)
    assert "convstem" not in without.names("stem") and "sincos_2d" not in without.names("pos_embed")


def test_a_plugin_that_fails_to_import_is_a_warning_naming_it_and_the_rest_still_works(tmp_path):
    dist_info = tmp_path / "vitzoo_broken_fake-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vitzoo-broken-fake\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[vitzoo]\nvitzoo-broken-fake = vitzoo_broken_fake\n")
    (tmp_path / "vitzoo_broken_fake.py").write_text(
        'raise ImportError("vitzoo_broken_fake needs the library frobnicate, which is not installed")\n'
    )
    result = run_python(
        """
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, vitzoo
            from vitzoo.registry import get_registry
            components = vitzoo.list_components()
        model = vitzoo.create("vit_ti16", embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32,
                              patch_size=8, num_classes=5)
        print(json.dumps({
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
            "failed": get_registry().failed_plugins,
            "components": components,
            "logits": list(model(torch.randn(1, 3, 32, 32)).shape),
        }))
        """,
        pythonpath=tmp_path,
    )
    broken = [w for w in result["warnings"] if "vitzoo-broken-fake" in w]
    assert len(broken) == 1, result["warnings"]
    assert broken[0].startswith("RuntimeWarning") and "frobnicate" in broken[0] and "vitzoo_broken_fake" in broken[0]
    assert "vitzoo-broken-fake" in result["failed"] and "ImportError" in result["failed"]["vitzoo-broken-fake"]
    assert result["logits"] == [1, 5]  # the built-ins work
    assert "convstem" in result["components"]["stem"] and "sincos_2d" in result["components"]["pos_embed"]


def test_an_installed_plugin_with_a_misspelled_hook_is_an_error_at_load_time(tmp_path, monkeypatch):
    dist_info = tmp_path / "vitzoo_misspelled_fake-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vitzoo-misspelled-fake\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[vitzoo]\nvitzoo-misspelled-fake = vitzoo_misspelled_fake\n")
    module = tmp_path / "vitzoo_misspelled_fake.py"
    source = textwrap.dedent(
        """
        import vitzoo
        from torch import nn

        @vitzoo.hookimpl
        def HOOK():
            return {"fake_pool": nn.Identity}
        """
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # where importlib.metadata finds the entry point
    try:
        module.write_text(source.replace("HOOK", "vitzoo_pool"))
        with pytest.raises(PluginError) as err:
            registry.Registry(autoload=True)
        message = str(err.value)
        assert "plugin 'vitzoo-misspelled-fake'" in message
        assert "'vitzoo_pool' is not a vitzoo hook. Did you mean 'vitzoo_pools'?" in message
        # with the name the message suggests, the same package loads and its pool is there
        sys.modules.pop("vitzoo_misspelled_fake", None)
        module.write_text(source.replace("HOOK", "vitzoo_pools"))
        fixed = registry.Registry(autoload=True)
        assert "fake_pool" in fixed.names("pool") and "gap" in fixed.names("pool")
        assert "convstem" in fixed.names("stem")
    finally:
        sys.modules.pop("vitzoo_misspelled_fake", None)


class SecondSincos:
    @vitzoo.hookimpl
    def vitzoo_pos_embeds(self):
        return {"sincos_2d": nn.Identity}


class SecondConvstem:
    @vitzoo.hookimpl
    def vitzoo_stems(self):
        return {"convstem": nn.Identity}


@pytest.mark.parametrize(
    "plugin, name, dist", [(SecondSincos(), "sincos_2d", "vitzoo-sincos"), (SecondConvstem(), "convstem", "vitzoo-convstem")]
)
def test_two_plugins_registering_one_name_is_an_error_naming_both(plugin_registry, plugin, name, dist):
    registered = get_registry().register(plugin, name="test-duplicate-plugin")
    try:
        with pytest.raises(PluginError) as err:
            vitzoo.list_components()
        message = str(err.value)
        assert f"{name!r}" in message and f"{dist!r}" in message and "'test-duplicate-plugin'" in message
        with pytest.raises(PluginError):
            vitzoo.create("vit_ti16", **TINY)
    finally:
        get_registry().unregister(registered)
    assert name in sum(vitzoo.list_components().values(), [])


# ---------------------------------------------------------------------------------------- sincos_2d
def sincos(plugin_registry, config: ViTConfig, grid, num_prefix_tokens: int = 1) -> nn.Module:
    return plugin_registry.get("pos_embed", "sincos_2d")(config, grid, num_prefix_tokens)


def test_sincos_is_a_buffer_not_a_parameter(plugin_registry):
    model = vitzoo.create("vit_ti16", **TINY, pos_embed="sincos_2d")
    pos_embed = model.encoder.pos_embed
    assert list(pos_embed.parameters()) == []
    buffers = dict(pos_embed.named_buffers())
    assert len(buffers) == 1 and not next(iter(buffers.values())).requires_grad
    assert not any(p is b for p in model.parameters() for b in buffers.values())
    assert vitzoo.count_params(model) == vitzoo.count_params(vitzoo.create("vit_ti16", **TINY, pos_embed="none"))
    assert model.no_weight_decay() == {"cls_token"}
    # a function of the grid, not state: nothing to save
    assert not any(key.startswith("encoder.pos_embed") for key in model.state_dict())


def test_sincos_equals_the_formula_computed_independently(plugin_registry):
    config = tiny_config(embed_dim=8, num_heads=2, img_size=(8, 12), patch_size=4)
    for prefix in (1, 0):
        module = sincos(plugin_registry, config, (2, 3), prefix)
        added = module(torch.zeros(1, prefix + 6, 8), (2, 3))[0].double()
        torch.testing.assert_close(added, sincos_reference((2, 3), 8, prefix), atol=1e-6, rtol=0)
    # a value worked by hand: patch (y=1, x=2), second frequency 1/100: sin(2/100) in column 5
    assert added[1 * 3 + 2, 5].item() == pytest.approx(math.sin(0.02), abs=1e-7)
    assert added[1 * 3 + 2, 2].item() == pytest.approx(math.cos(1.0), abs=1e-7)


def test_sincos_is_deterministic(plugin_registry):
    config = tiny_config()
    torch.manual_seed(1)
    a = sincos(plugin_registry, config, (4, 4))
    torch.manual_seed(2)
    b = sincos(plugin_registry, config, (4, 4))
    assert torch.equal(a.embedding, b.embedding)
    x = torch.randn(2, 17, 32)
    assert torch.equal(a(x, (4, 4)), b(x, (4, 4)))
    torch.testing.assert_close(a(x, (4, 4)) - x, sincos_reference((4, 4), 32, 1).float().expand(2, -1, -1))


def test_sincos_works_for_any_grid_and_resamples_in_place(plugin_registry):
    config = tiny_config()
    module = sincos(plugin_registry, config, (4, 4))
    before = module.embedding.clone()
    out = module(torch.zeros(1, 1 + 3 * 5, 32), (3, 5))
    torch.testing.assert_close(out[0].double(), sincos_reference((3, 5), 32, 1), atol=1e-6, rtol=0)
    assert torch.equal(module.embedding, before)  # forward on another grid changes nothing
    module.resample((3, 5))
    assert module.embedding.shape == (1, 16, 32) and list(module.parameters()) == []
    torch.testing.assert_close(module.embedding[0].double(), sincos_reference((3, 5), 32, 1), atol=1e-6, rtol=0)

    model = vitzoo.create("vit_ti16", **TINY, pos_embed="sincos_2d", dynamic_img_size=True)
    assert model(torch.randn(1, 3, 48, 64)).shape == (1, 5)
    model.set_img_size(48)
    assert model.encoder.pos_embed.grid == (6, 6) and model(torch.randn(1, 3, 48, 48)).shape == (1, 5)


@pytest.mark.parametrize("mode", ["input", "every_layer", "every_layer_shared"])
def test_sincos_supports_the_three_injection_modes(plugin_registry, mode):
    model = vitzoo.create("vit_ti16", **TINY, pos_embed="sincos_2d", pos_embed_mode=mode, pool="gap")
    modules = model.encoder.position_embeddings()
    assert len(modules) == (TINY["depth"] if mode == "every_layer" else 1)
    assert all(torch.equal(m.embedding, modules[0].embedding) for m in modules)
    assert all(m.num_prefix_tokens == 0 for m in modules)  # gap: no class token
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 5)


def test_sincos_every_layer_equals_every_layer_shared(plugin_registry):
    x = torch.randn(2, 3, 32, 32)
    outputs = []
    for mode in ("every_layer", "every_layer_shared"):
        torch.manual_seed(0)
        outputs.append(vitzoo.create("vit_ti16", **TINY, pos_embed="sincos_2d", pos_embed_mode=mode).forward_features(x))
    torch.testing.assert_close(outputs[0], outputs[1])


def test_sincos_class_token_gets_a_zero_embedding(plugin_registry):
    module = sincos(plugin_registry, tiny_config(), (2, 2), num_prefix_tokens=1)
    x = torch.randn(1, 5, 32)
    assert torch.equal(module(x, (2, 2))[:, 0], x[:, 0])


def test_sincos_rejects_an_embed_dim_not_divisible_by_4(plugin_registry):
    with pytest.raises(ConfigError, match=r"sincos_2d.*embed_dim=30 is not divisible by 4"):
        vitzoo.create("vit_ti16", **{**TINY, "embed_dim": 30}, pos_embed="sincos_2d")


def test_a_model_with_both_plugins_saves_and_loads(plugin_registry, tmp_path):
    model = vitzoo.create("vit_ti16", **TINY, stem="convstem", pos_embed="sincos_2d").eval()
    model.save_pretrained(tmp_path)
    loaded = vitzoo.from_pretrained(tmp_path).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x))
    larger = vitzoo.from_pretrained(tmp_path, img_size=48)  # the table is recomputed for the new grid
    assert larger.grid == (6, 6) and larger.encoder.pos_embed.embedding.shape == (1, 37, 32)
    assert larger(torch.randn(1, 3, 48, 48)).shape == (1, 5)


# ---------------------------------------------------------------------------------------- convstem
@pytest.mark.parametrize("patch_size", [12, 14, 1])
def test_convstem_rejects_a_patch_size_that_is_not_a_power_of_two(plugin_registry, patch_size):
    with pytest.raises(ConfigError) as err:
        vitzoo.create("vit_s16", stem="convstem", patch_size=patch_size, img_size=48)
    message = str(err.value)
    assert "convstem" in message and "power of two" in message and f"patch_size={patch_size}" in message


def test_convstem_message_suggests_valid_patch_sizes(plugin_registry):
    with pytest.raises(ConfigError, match=r"got patch_size=12; use patch_size=8 or patch_size=16"):
        vitzoo.create("vit_s16", stem="convstem", patch_size=12)


@pytest.mark.parametrize(
    "embed_dim, patch_size, channels",
    [(384, 16, [48, 96, 192, 384]), (192, 16, [24, 48, 96, 192]), (384, 32, [24, 48, 96, 192, 384]), (32, 2, [32])],
)
def test_convstem_is_log2_p_stride_2_convs_doubling_to_d_then_a_1x1_conv(plugin_registry, embed_dim, patch_size, channels):
    config = tiny_config(embed_dim=embed_dim, patch_size=patch_size, img_size=patch_size * 2)
    stem = plugin_registry.get("stem", "convstem")(config)
    assert stem.stride == (patch_size, patch_size)
    convs = [m for m in stem.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == channels + [embed_dim]
    assert all(c.kernel_size == (3, 3) and c.stride == (2, 2) for c in convs[:-1])
    assert convs[-1].kernel_size == (1, 1) and convs[-1].stride == (1, 1)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in stem.modules()) == len(channels)
    assert sum(isinstance(m, nn.ReLU) for m in stem.modules()) == len(channels)
    assert stem(torch.randn(2, 3, patch_size * 2, patch_size * 3)).shape == (2, 2 * 3, embed_dim)


def test_convstem_tokens_are_row_major(plugin_registry):
    """A pixel at the centre of patch (r, c) is seen by token r * w + c alone (receptive field +-7 px)."""
    stem = plugin_registry.get("stem", "convstem")(tiny_config(img_size=(32, 64))).eval()
    base = torch.randn(1, 3, 32, 64)
    with torch.no_grad():
        reference = stem(base)
        assert reference.shape == (1, 4 * 8, 32)
        for r, c in [(1, 6), (3, 2), (0, 7)]:
            x = base.clone()
            x[0, :, 8 * r, 8 * c] += 10.0
            changed = ((stem(x) - reference)[0].abs().amax(dim=-1) > 1e-4).nonzero().flatten().tolist()
            assert changed == [r * 8 + c]


def test_convstem_model_grid_matches_the_patch_stem(plugin_registry):
    model = vitzoo.create("vit_ti16", **TINY, stem="convstem")
    assert model.grid == vitzoo.create("vit_ti16", **TINY).grid == (4, 4)
    assert model.forward_features(torch.randn(2, 3, 32, 32)).shape == (2, 17, 32)
