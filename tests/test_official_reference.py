"""vitzoo against the flax re-implementation of the official ViT (``tests/official_reference.py``).

The reference is checked on its own first: official parameter counts, exact official ``.npz`` key
sets and shapes, the TF ``'SAME'`` padding asymmetry, and a from-scratch numpy forward pass (token,
gap, pre-logits and hybrid models) that must match the flax model. Then vitzoo is run against it:
each reference checkpoint is read by vitzoo's official ``.npz`` loader alone (the model inferred
from the weights), and vitzoo's logits must equal the reference's to 1e-5.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import vitzoo

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import flax.linen as nn  # noqa: E402

from official_reference import (  # noqa: E402
    StdConv,
    make_checkpoint,
    official_logits,
    official_param_count,
)

# ----------------------------------------------------------------------------------------------
# Configurations
# ----------------------------------------------------------------------------------------------

TI = dict(hidden_size=192, num_layers=12, mlp_dim=768, num_heads=3)
S = dict(hidden_size=384, num_layers=12, mlp_dim=1536, num_heads=6)
B = dict(hidden_size=768, num_layers=12, mlp_dim=3072, num_heads=12)

# Tiny models for the numeric runs (32 px images).
TINY = dict(num_classes=10, patch_size=8, hidden_size=64, num_layers=2, mlp_dim=128,
            num_heads=4)
TINY_HYBRID = dict(num_classes=7, patch_size=1, hidden_size=64, num_layers=1, mlp_dim=96,
                   num_heads=2, resnet_layers=(1, 1))
IMG = 32


@pytest.mark.parametrize(
    "fields, expected",
    [
        (dict(patch_size=16, **TI), 5_717_416),
        (dict(patch_size=16, **B), 86_567_656),
        (dict(patch_size=32, **B), 88_224_232),
        (dict(patch_size=1, resnet_layers=(3, 4, 9), **B), 98_659_112),
        (dict(patch_size=1, resnet_layers=(2, 2, 2, 2), **S), 36_431_912),
    ],
    ids=["Ti/16", "B/16", "B/32", "R50+B/16", "R26+S/32"],
)
def test_official_param_counts(fields: dict, expected: int) -> None:
    assert official_param_count(224, **fields) == expected


# ----------------------------------------------------------------------------------------------
# Official key sets, written out from the checkpoint description (independently of the module)
# ----------------------------------------------------------------------------------------------


def expected_shapes(*, img_size: int, num_classes: int, patch_size: int, hidden_size: int,
                    num_layers: int, mlp_dim: int, num_heads: int, classifier: str = "token",
                    representation_size: int | None = None,
                    resnet_layers: tuple[int, ...] | None = None, resnet_width: int = 1,
                    in_chans: int = 3, groupnorm_4d: bool = False) -> dict[str, tuple]:
    """Official npz key -> shape, for a model of the given configuration."""
    D, H = hidden_size, num_heads
    shapes: dict[str, tuple] = {}

    def gn(prefix: str, c: int) -> None:
        shape = (1, 1, 1, c) if groupnorm_4d else (c,)
        shapes[f"{prefix}/scale"] = shape
        shapes[f"{prefix}/bias"] = shape

    channels, size = in_chans, img_size
    if resnet_layers is not None:
        width = 64 * resnet_width
        shapes["conv_root/kernel"] = (7, 7, in_chans, width)
        gn("gn_root", width)
        channels, size = width, math.ceil(math.ceil(img_size / 2) / 2)
        for s, units in enumerate(resnet_layers):
            f = width * 2**s
            for u in range(units):
                p = f"block{s + 1}/unit{u + 1}"
                stride = 2 if (s > 0 and u == 0) else 1
                if channels != 4 * f or stride != 1:
                    shapes[f"{p}/conv_proj/kernel"] = (1, 1, channels, 4 * f)
                    gn(f"{p}/gn_proj", 4 * f)
                shapes[f"{p}/conv1/kernel"] = (1, 1, channels, f)
                gn(f"{p}/gn1", f)
                shapes[f"{p}/conv2/kernel"] = (3, 3, f, f)
                gn(f"{p}/gn2", f)
                shapes[f"{p}/conv3/kernel"] = (1, 1, f, 4 * f)
                gn(f"{p}/gn3", 4 * f)
                channels, size = 4 * f, math.ceil(size / stride)

    shapes["embedding/kernel"] = (patch_size, patch_size, channels, D)
    shapes["embedding/bias"] = (D,)
    num_tokens = (size // patch_size) ** 2
    if classifier == "token":
        shapes["cls"] = (1, 1, D)
        num_tokens += 1
    shapes["Transformer/posembed_input/pos_embedding"] = (1, num_tokens, D)
    for i in range(num_layers):
        p = f"Transformer/encoderblock_{i}"
        for ln in ("LayerNorm_0", "LayerNorm_2"):
            shapes[f"{p}/{ln}/scale"] = (D,)
            shapes[f"{p}/{ln}/bias"] = (D,)
        for name in ("query", "key", "value"):
            shapes[f"{p}/MultiHeadDotProductAttention_1/{name}/kernel"] = (D, H, D // H)
            shapes[f"{p}/MultiHeadDotProductAttention_1/{name}/bias"] = (H, D // H)
        shapes[f"{p}/MultiHeadDotProductAttention_1/out/kernel"] = (H, D // H, D)
        shapes[f"{p}/MultiHeadDotProductAttention_1/out/bias"] = (D,)
        shapes[f"{p}/MlpBlock_3/Dense_0/kernel"] = (D, mlp_dim)
        shapes[f"{p}/MlpBlock_3/Dense_0/bias"] = (mlp_dim,)
        shapes[f"{p}/MlpBlock_3/Dense_1/kernel"] = (mlp_dim, D)
        shapes[f"{p}/MlpBlock_3/Dense_1/bias"] = (D,)
    shapes["Transformer/encoder_norm/scale"] = (D,)
    shapes["Transformer/encoder_norm/bias"] = (D,)
    head_in = D
    if representation_size is not None:
        shapes["pre_logits/kernel"] = (D, representation_size)
        shapes["pre_logits/bias"] = (representation_size,)
        head_in = representation_size
    shapes["head/kernel"] = (head_in, num_classes)
    shapes["head/bias"] = (num_classes,)
    return shapes


CHECKPOINT_CASES = {
    "token": dict(TINY),
    "gap": dict(TINY, classifier="gap"),
    "pre_logits": dict(TINY, representation_size=48),
    "hybrid": dict(TINY_HYBRID),
    "hybrid_gap_4d": dict(TINY_HYBRID, classifier="gap", groupnorm_4d=True),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict, dict]]:
    """case -> (npz path, returned flat dict, model fields)."""
    out = {}
    root = tmp_path_factory.mktemp("official_ckpt")
    for i, (case, fields) in enumerate(CHECKPOINT_CASES.items()):
        fields = dict(fields)
        gn4d = fields.pop("groupnorm_4d", False)
        path = root / f"{case}.npz"
        flat = make_checkpoint(path, img_size=IMG, seed=i, groupnorm_4d=gn4d, **fields)
        out[case] = (path, flat, fields)
    return out


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_checkpoint_has_exact_official_keys(checkpoints, case: str) -> None:
    path, flat, fields = checkpoints[case]
    gn4d = CHECKPOINT_CASES[case].get("groupnorm_4d", False)
    expected = expected_shapes(img_size=IMG, groupnorm_4d=gn4d, **fields)
    with np.load(path) as npz:
        stored = {k: npz[k] for k in npz.files}
    assert set(stored) == set(expected)
    assert set(flat) == set(expected)
    for key, shape in expected.items():
        assert stored[key].shape == shape, key
        assert stored[key].dtype == np.float32, key
        np.testing.assert_array_equal(stored[key], flat[key])
    if fields.get("classifier", "token") == "gap":
        assert "cls" not in stored
        assert stored["Transformer/posembed_input/pos_embedding"].shape[1] == 16
    else:
        assert stored["Transformer/posembed_input/pos_embedding"].shape[1] == 17


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_checkpoint_params_are_perturbed(checkpoints, case: str) -> None:
    """Zero-initialised parameters (cls, head, gn3 scale, LN biases) must not stay zero."""
    _, flat, _ = checkpoints[case]
    for key, value in flat.items():
        assert np.std(value) > 1e-3 or value.size == 1, key
    assert np.abs(flat["head/kernel"]).mean() > 1e-2
    if "cls" in flat:
        assert np.abs(flat["cls"]).mean() > 1e-2
    for key in flat:
        if key.endswith("gn3/scale"):
            assert np.abs(flat[key]).mean() > 1e-2


def test_make_checkpoint_is_deterministic(checkpoints, tmp_path: Path) -> None:
    _, first, fields = checkpoints["token"]  # written with seed 0
    again = make_checkpoint(tmp_path / "again.npz", img_size=IMG, seed=0, **fields)
    other = make_checkpoint(tmp_path / "other.npz", img_size=IMG, seed=1, **fields)
    assert set(again) == set(first)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert not np.array_equal(first["head/kernel"], other["head/kernel"])


# ----------------------------------------------------------------------------------------------
# TF 'SAME' padding asymmetry
# ----------------------------------------------------------------------------------------------


def np_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: tuple[int, int]) -> np.ndarray:
    """NHWC x HWIO convolution with explicit (before, after) padding on both spatial axes."""
    kh, kw = w.shape[:2]
    x = np.pad(x, ((0, 0), pad, pad, (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
    win = win[:, ::stride, ::stride]  # (N, Ho, Wo, Cin, kh, kw)
    return np.einsum("nhwcij,ijco->nhwo", win, w, optimize=True)


def np_max_pool(x: np.ndarray, k: int, stride: int, pad: tuple[int, int]) -> np.ndarray:
    x = np.pad(x, ((0, 0), pad, pad, (0, 0)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(1, 2))
    return win[:, ::stride, ::stride].max(axis=(-2, -1))


def same_pad(size: int, k: int, stride: int) -> tuple[int, int]:
    """TF 'SAME': output ceil(size / stride); the odd pad pixel goes after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


def np_standardize(w: np.ndarray) -> np.ndarray:
    w = w - w.mean(axis=(0, 1, 2), keepdims=True)
    return w / (w.std(axis=(0, 1, 2), keepdims=True) + 1e-5)


def test_same_padding_of_root_conv_is_asymmetric() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32, 32, 3))
    w = rng.standard_normal((7, 7, 3, 64))
    assert same_pad(32, 7, 2) == (2, 3)
    conv = StdConv(64, (7, 7), (2, 2), padding="SAME", use_bias=False)
    with jax.enable_x64(True):
        y = np.asarray(conv.apply({"params": {"kernel": jnp.asarray(w)}}, jnp.asarray(x)))
    ws = np_standardize(w)
    assert y.shape == (2, 16, 16, 64)
    np.testing.assert_allclose(y, np_conv(x, ws, 2, (2, 3)), rtol=1e-10, atol=1e-10)
    symmetric = np_conv(x, ws, 2, (3, 3))[:, :16, :16]
    assert np.abs(y - symmetric).max() > 1.0


def test_same_padding_of_max_pool_and_strided_conv2_is_asymmetric() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 16, 16, 32))
    assert same_pad(16, 3, 2) == (0, 1)
    with jax.enable_x64(True):
        pooled = np.asarray(nn.max_pool(jnp.asarray(x), (3, 3), strides=(2, 2), padding="SAME"))
        w = rng.standard_normal((3, 3, 32, 32))
        conv = StdConv(32, (3, 3), (2, 2), padding="SAME", use_bias=False)
        y = np.asarray(conv.apply({"params": {"kernel": jnp.asarray(w)}}, jnp.asarray(x)))
    np.testing.assert_array_equal(pooled, np_max_pool(x, 3, 2, (0, 1)))
    assert not np.allclose(pooled, np_max_pool(x, 3, 2, (1, 1))[:, :8, :8])
    ws = np_standardize(w)
    np.testing.assert_allclose(y, np_conv(x, ws, 2, (0, 1)), rtol=1e-10, atol=1e-10)
    assert not np.allclose(y, np_conv(x, ws, 2, (1, 1))[:, :8, :8], atol=1e-3)


# ----------------------------------------------------------------------------------------------
# A from-scratch numpy forward pass of the official model, compared with the flax one
# ----------------------------------------------------------------------------------------------


def np_layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-6) * scale + bias


def np_group_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    n, h, w, c = x.shape
    g = x.reshape(n, h, w, 32, c // 32)
    mu = g.mean(axis=(1, 2, 4), keepdims=True)
    var = g.var(axis=(1, 2, 4), keepdims=True)
    g = (g - mu) / np.sqrt(var + 1e-6)
    return g.reshape(n, h, w, c) * scale.reshape(-1) + bias.reshape(-1)


def np_gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def np_same_conv(x: np.ndarray, w: np.ndarray, stride: int, symmetric: bool) -> np.ndarray:
    k = w.shape[0]
    pad = ((k - 1) // 2,) * 2 if symmetric else same_pad(x.shape[1], k, stride)
    out = -(-x.shape[1] // stride)
    return np_conv(x, np_standardize(w), stride, pad)[:, :out, :out]


def np_official_forward(p: dict, images_nchw: np.ndarray, *, patch_size: int, num_heads: int,
                        num_layers: int, classifier: str = "token",
                        representation_size: int | None = None,
                        resnet_layers: tuple[int, ...] | None = None,
                        symmetric_padding: bool = False, **_: object) -> np.ndarray:
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = np.asarray(images_nchw, np.float64).transpose(0, 2, 3, 1)

    if resnet_layers is not None:
        x = np_same_conv(x, p["conv_root/kernel"], 2, symmetric_padding)
        x = np.maximum(np_group_norm(x, p["gn_root/scale"], p["gn_root/bias"]), 0)
        pad = (1, 1) if symmetric_padding else same_pad(x.shape[1], 3, 2)
        out = -(-x.shape[1] // 2)
        x = np_max_pool(x, 3, 2, pad)[:, :out, :out]
        for s, units in enumerate(resnet_layers):
            for u in range(units):
                pre = f"block{s + 1}/unit{u + 1}"
                stride = 2 if (s > 0 and u == 0) else 1
                residual = x
                if f"{pre}/conv_proj/kernel" in p:
                    residual = np_conv(x, np_standardize(p[f"{pre}/conv_proj/kernel"]),
                                       stride, (0, 0))
                    residual = np_group_norm(residual, p[f"{pre}/gn_proj/scale"],
                                             p[f"{pre}/gn_proj/bias"])
                y = np_conv(x, np_standardize(p[f"{pre}/conv1/kernel"]), 1, (0, 0))
                y = np.maximum(np_group_norm(y, p[f"{pre}/gn1/scale"], p[f"{pre}/gn1/bias"]), 0)
                y = np_same_conv(y, p[f"{pre}/conv2/kernel"], stride, symmetric_padding)
                y = np.maximum(np_group_norm(y, p[f"{pre}/gn2/scale"], p[f"{pre}/gn2/bias"]), 0)
                y = np_conv(y, np_standardize(p[f"{pre}/conv3/kernel"]), 1, (0, 0))
                y = np_group_norm(y, p[f"{pre}/gn3/scale"], p[f"{pre}/gn3/bias"])
                x = np.maximum(residual + y, 0)

    x = np_conv(x, p["embedding/kernel"], patch_size, (0, 0)) + p["embedding/bias"]
    n, h, w, d = x.shape
    x = x.reshape(n, h * w, d)
    if classifier == "token":
        x = np.concatenate([np.broadcast_to(p["cls"], (n, 1, d)), x], axis=1)
    x = x + p["Transformer/posembed_input/pos_embedding"]

    hd = d // num_heads
    for i in range(num_layers):
        pre = f"Transformer/encoderblock_{i}"
        att = f"{pre}/MultiHeadDotProductAttention_1"
        y = np_layer_norm(x, p[f"{pre}/LayerNorm_0/scale"], p[f"{pre}/LayerNorm_0/bias"])
        # Converted to torch-style (D, D) matrices on purpose, as a converter would do.
        qkv = [y @ p[f"{att}/{t}/kernel"].reshape(d, d) + p[f"{att}/{t}/bias"].reshape(d)
               for t in ("query", "key", "value")]
        q, k, v = (t.reshape(n, -1, num_heads, hd).transpose(0, 2, 1, 3) for t in qkv)
        logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        attn = np.exp(logits - logits.max(-1, keepdims=True))
        attn /= attn.sum(-1, keepdims=True)
        o = (attn @ v).transpose(0, 2, 1, 3).reshape(n, -1, d)
        x = x + o @ p[f"{att}/out/kernel"].reshape(d, d) + p[f"{att}/out/bias"]
        y = np_layer_norm(x, p[f"{pre}/LayerNorm_2/scale"], p[f"{pre}/LayerNorm_2/bias"])
        y = np_gelu_tanh(y @ p[f"{pre}/MlpBlock_3/Dense_0/kernel"]
                         + p[f"{pre}/MlpBlock_3/Dense_0/bias"])
        x = x + y @ p[f"{pre}/MlpBlock_3/Dense_1/kernel"] + p[f"{pre}/MlpBlock_3/Dense_1/bias"]
    x = np_layer_norm(x, p["Transformer/encoder_norm/scale"], p["Transformer/encoder_norm/bias"])

    x = x[:, 0] if classifier == "token" else x.mean(axis=1)
    if representation_size is not None:
        x = np.tanh(x @ p["pre_logits/kernel"] + p["pre_logits/bias"])
    return x @ p["head/kernel"] + p["head/bias"]


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(123).standard_normal((2, 3, IMG, IMG)).astype(np.float32)


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_flax_model_matches_numpy_forward(checkpoints, images: np.ndarray, case: str) -> None:
    path, _, fields = checkpoints[case]
    with np.load(path) as npz:
        params = {k: npz[k] for k in npz.files}
    expected = np_official_forward(params, images, **fields)

    got64 = official_logits(params, images, float64=True, **fields)
    assert got64.dtype == np.float64
    assert got64.shape == (2, fields["num_classes"])
    np.testing.assert_allclose(got64, expected, rtol=1e-8, atol=1e-8)

    got32 = official_logits(params, images, **fields)
    assert got32.dtype == np.float64
    np.testing.assert_allclose(got32, expected, rtol=1e-4, atol=1e-4)

    # The logits carry real signal: they differ across classes and across images.
    assert np.std(expected) > 0.1
    assert np.abs(expected[0] - expected[1]).max() > 1e-2

    if fields.get("resnet_layers") is not None:
        symmetric = np_official_forward(params, images, symmetric_padding=True, **fields)
        assert np.abs(symmetric - expected).max() > 1e-2


def test_groupnorm_4d_and_flat_params_give_same_logits(checkpoints, images: np.ndarray) -> None:
    _, flat, fields = checkpoints["hybrid"]
    flat_4d = {k: (v.reshape(1, 1, 1, -1) if "/gn" in f"/{k}" else v) for k, v in flat.items()}
    assert flat_4d["gn_root/scale"].shape == (1, 1, 1, 64)
    a = official_logits(flat, images, **fields)
    b = official_logits(flat_4d, images, **fields)
    np.testing.assert_array_equal(a, b)


def test_token_logits_depend_on_cls(checkpoints, images: np.ndarray) -> None:
    _, flat, fields = checkpoints["token"]
    # (A constant shift of cls would be invisible: every pre-LN and encoder_norm removes it.)
    noise = np.random.default_rng(0).standard_normal(flat["cls"].shape).astype(np.float32)
    changed = dict(flat, cls=flat["cls"] + 0.5 * noise)
    a = official_logits(flat, images, **fields)
    b = official_logits(changed, images, **fields)
    assert np.abs(a - b).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# vitzoo against the reference: the same weights, the same logits
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_vitzoo_loaded_from_the_reference_checkpoint_gives_the_reference_logits(
        checkpoints, images: np.ndarray, case: str) -> None:
    """ViT and hybrid, token and gap pooling, with and without pre-logits: vitzoo reads the
    reference's .npz through its official-checkpoint loader and must reproduce its logits."""
    path, flat, fields = checkpoints[case]
    model = vitzoo.from_pretrained(path).eval()  # everything inferred from the checkpoint

    # the model vitzoo inferred is the reference's model
    config = model.config
    assert config.img_size == (IMG, IMG) and config.patch_size == fields["patch_size"]
    assert (config.embed_dim, config.depth, config.mlp_dim, config.num_heads) == (
        fields["hidden_size"], fields["num_layers"], fields["mlp_dim"], fields["num_heads"])
    assert config.num_classes == fields["num_classes"]
    assert config.pool == fields.get("classifier", "token")
    assert config.head_options.get("representation_size") == fields.get("representation_size")  # the MLP head's own
    hybrid = fields.get("resnet_layers") is not None
    assert config.stem == ("resnet" if hybrid else "patch")
    if hybrid:  # the ResNet's blocks per stage are the stem's own option
        assert tuple(config.stem_options["layers"]) == tuple(fields["resnet_layers"])

    expected = official_logits(flat, images, **fields)
    with torch.no_grad():
        actual = model(torch.from_numpy(images)).double().numpy()
    assert actual.shape == expected.shape == (len(images), fields["num_classes"])
    # Both run in float32 and agree to ~1e-6 here; 1e-5 leaves a 10x margin and still catches exact
    # instead of tanh GELU, whose effect on the gap models' small logits is below 1e-4.
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)
