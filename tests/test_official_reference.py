"""vitzoo against the flax re-implementation of the official ViT (tests/official_reference.py).

The reference has the official parameter counts and writes the official .npz keys and shapes;
vitzoo reads each of its checkpoints through its official loader alone (the model inferred from
the weights) and must give its logits to 1e-5: ViT and hybrid, token and gap pooling, pre-logits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from official_reference import make_checkpoint, official_logits, official_param_count

import vitzoo

B = dict(hidden_size=768, num_layers=12, mlp_dim=3072, num_heads=12)
TINY = dict(num_classes=10, patch_size=8, hidden_size=64, num_layers=2, mlp_dim=128, num_heads=4)
TINY_HYBRID = dict(num_classes=7, patch_size=1, hidden_size=64, num_layers=1, mlp_dim=96,
                   num_heads=2, resnet_layers=(1, 1))
CASES = {"token": TINY, "gap": dict(TINY, classifier="gap"),
         "pre_logits": dict(TINY, representation_size=48), "hybrid": TINY_HYBRID,
         "hybrid_gap_4d": dict(TINY_HYBRID, classifier="gap", groupnorm_4d=True)}
IMG = 32


@pytest.mark.parametrize("fields, expected", [
    (dict(patch_size=16, hidden_size=192, num_layers=12, mlp_dim=768, num_heads=3), 5_717_416),
    (dict(patch_size=16, **B), 86_567_656),
    (dict(patch_size=32, **B), 88_224_232),
    (dict(patch_size=1, resnet_layers=(3, 4, 9), **B), 98_659_112),
    (dict(patch_size=1, resnet_layers=(2, 2, 2, 2), hidden_size=384, num_layers=12,
          mlp_dim=1536, num_heads=6), 36_431_912),
], ids=["Ti/16", "B/16", "B/32", "R50+B/16", "R26+S/32"])
def test_the_reference_has_the_official_parameter_counts(fields, expected):
    assert official_param_count(224, **fields) == expected


def official_shapes(num_classes, patch_size, hidden_size, num_layers, mlp_dim, num_heads,
                    classifier="token", representation_size=None, resnet_layers=None,
                    groupnorm_4d=False) -> dict[str, tuple]:
    """The official .npz keys and shapes of a model, written out from the checkpoint layout."""
    d, h, size, channels, shapes = hidden_size, num_heads, IMG, 3, {}
    norm = (lambda c: (1, 1, 1, c)) if groupnorm_4d else (lambda c: (c,))

    def conv(name, shape, gn):  # a kernel, and the GroupNorm after it
        shapes.update({f"{name}/kernel": shape, f"{gn}/scale": norm(shape[-1]),
                       f"{gn}/bias": norm(shape[-1])})

    if resnet_layers is not None:
        conv("conv_root", (7, 7, 3, 64), "gn_root")
        channels, size = 64, math.ceil(IMG / 4)
        for s, units in enumerate(resnet_layers):
            f = 64 * 2**s
            for u in range(units):
                p, stride = f"block{s + 1}/unit{u + 1}", 2 if s > 0 and u == 0 else 1
                if channels != 4 * f or stride != 1:
                    conv(f"{p}/conv_proj", (1, 1, channels, 4 * f), f"{p}/gn_proj")
                for i, shape in enumerate([(1, 1, channels, f), (3, 3, f, f), (1, 1, f, 4 * f)]):
                    conv(f"{p}/conv{i + 1}", shape, f"{p}/gn{i + 1}")
                channels, size = 4 * f, math.ceil(size / stride)
    tokens = (size // patch_size) ** 2 + (classifier == "token")
    t, head_in = "Transformer", representation_size or d
    shapes |= {"embedding/kernel": (patch_size, patch_size, channels, d), "embedding/bias": (d,),
               f"{t}/posembed_input/pos_embedding": (1, tokens, d), "head/bias": (num_classes,),
               f"{t}/encoder_norm/scale": (d,), f"{t}/encoder_norm/bias": (d,),
               "head/kernel": (head_in, num_classes)}
    shapes |= {"cls": (1, 1, d)} if classifier == "token" else {}
    if representation_size is not None:
        shapes |= {"pre_logits/kernel": (d, head_in), "pre_logits/bias": (head_in,)}
    for i in range(num_layers):
        p, att, mlp = f"{t}/encoderblock_{i}", "MultiHeadDotProductAttention_1", "MlpBlock_3"
        shapes |= {f"{p}/LayerNorm_{n}/{k}": (d,) for n in (0, 2) for k in ("scale", "bias")}
        shapes |= {f"{p}/{att}/{n}/kernel": (d, h, d // h) for n in ("query", "key", "value")}
        shapes |= {f"{p}/{att}/{n}/bias": (h, d // h) for n in ("query", "key", "value")}
        shapes |= {f"{p}/{att}/out/kernel": (h, d // h, d), f"{p}/{att}/out/bias": (d,),
                   f"{p}/{mlp}/Dense_0/kernel": (d, mlp_dim), f"{p}/{mlp}/Dense_0/bias": (mlp_dim,),
                   f"{p}/{mlp}/Dense_1/kernel": (mlp_dim, d), f"{p}/{mlp}/Dense_1/bias": (d,)}
    return shapes


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """case -> (npz path, the flat parameters written, the model's fields)."""
    root, out = tmp_path_factory.mktemp("official"), {}
    for seed, (case, fields) in enumerate(CASES.items()):
        fields = dict(fields)
        gn4d = fields.pop("groupnorm_4d", False)
        flat = make_checkpoint(root / f"{case}.npz", img_size=IMG, seed=seed, groupnorm_4d=gn4d,
                               **fields)
        out[case] = (root / f"{case}.npz", flat, fields)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_the_reference_writes_the_official_keys_and_shapes(checkpoints, case):
    path, flat, fields = checkpoints[case]
    with np.load(path) as npz:
        stored = {k: npz[k].shape for k in npz.files}
    expected = official_shapes(**fields, groupnorm_4d=CASES[case].get("groupnorm_4d", False))
    assert stored == expected
    assert all(np.std(v) > 1e-3 for v in flat.values())  # no parameter left at its zero init


@pytest.mark.parametrize("case", list(CASES))
def test_vitzoo_loaded_from_the_reference_checkpoint_gives_the_reference_logits(checkpoints,
                                                                                 case):
    path, flat, fields = checkpoints[case]
    model = vitzoo.from_pretrained(path).eval()  # everything inferred from the checkpoint
    config = model.config
    assert (config.img_size, config.patch_size, config.num_classes) == (
        (IMG, IMG), fields["patch_size"], fields["num_classes"])
    assert (config.embed_dim, config.depth, config.mlp_dim, config.num_heads) == (
        fields["hidden_size"], fields["num_layers"], fields["mlp_dim"], fields["num_heads"])
    assert config.pool == fields.get("classifier", "token")
    assert config.head_options.get("representation_size") == fields.get("representation_size")
    if "resnet_layers" in fields:
        assert config.stem == "resnet"
        assert tuple(config.stem_options["layers"]) == fields["resnet_layers"]
    images = np.random.default_rng(123).standard_normal((2, 3, IMG, IMG)).astype(np.float32)
    expected = official_logits(flat, images, **fields)
    assert np.std(expected) > 0.1  # logits with signal
    with torch.no_grad():
        actual = model(torch.from_numpy(images)).double().numpy()
    # both run in float32 and agree to ~1e-6; exact instead of tanh GELU would be caught
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)
