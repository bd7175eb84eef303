"""Each part of a model owns its options: a component declares them (its `Options` dataclass), the
config carries them beside the part's name (`stem_options`, ...), and config.json and the CLI carry
them too; a training run works out its model once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import vitzoo
from vitzoo.cli import build_parser
from vitzoo.commands.train import config_from_args
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError

pytest.importorskip("vitzoo_convstem", reason="the example plugin is installed by ./run.sh setup")

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
SMALL = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=32, num_classes=3)


# --------------------------------------------------------------------- a plugin declares options
def test_a_plugin_stem_declares_an_option_that_changes_what_it_builds():
    plain = vitzoo.create("vit_s16", stem="convstem", **SMALL)
    deeper = vitzoo.create("vit_s16", stem="convstem", stem_options={"extra_layers": 1}, **SMALL)
    strides = [[m.stride[0] for m in model.stem.convs if isinstance(m, torch.nn.Conv2d)]
               for model in (plain, deeper)]
    assert strides == [[2, 2, 2, 2], [2, 2, 1, 2, 2]]  # a stride-1 layer, as the larger stems
    assert plain.config.stem_options == {"extra_layers": 0}  # resolved: the default written out
    assert deeper(torch.randn(2, 3, 32, 32)).shape == (2, 3)  # the same token grid


def test_a_components_options_are_checked_by_it_with_the_fix_named():
    for stem, options, message in [
        ("convstem", {"extra_layer": 1},
         "unknown stem 'convstem' option 'extra_layer'. Did you mean 'extra_layers'"),
        ("convstem", {"extra_layers": -1}, "extra_layers must be >= 0"),
        ("convstem", {"extra_layers": 3}, "use extra_layers <= 2"),
        ("patch", {"extra_layers": 1}, "stem='patch' has no options of its own"),
    ]:
        with pytest.raises(ConfigError, match=message):
            vitzoo.create("vit_s16", stem=stem, stem_options=options, **SMALL)


def test_the_option_travels_through_config_json(tmp_path):
    model = vitzoo.create("vit_s16", stem="convstem",
                          stem_options={"extra_layers": 2}, **SMALL).eval()
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["model"]["stem_options"] == {"extra_layers": 2}
    x = torch.randn(2, 3, 32, 32)
    again = vitzoo.from_pretrained(tmp_path / "saved").eval()
    assert again.config == model.config
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)


def test_the_cli_has_a_flag_per_component_option_and_help_lists_them(capsys):
    args = build_parser().parse_args(["train", "vit_s16", "--stem", "convstem",
                                      "--stem.extra-layers", "1",
                                      "--head", "mlp", "--head.representation-size", "16"])
    options = config_from_args(args).model_options
    assert options == {"stem": "convstem", "head": "mlp", "stem_options": {"extra_layers": 1},
                       "head_options": {"representation_size": 16}}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    shown = capsys.readouterr().out
    for said in ("stem 'convstem' options (with --stem convstem", "--stem.extra-layers",
                 "--stem.layers", "--head.representation-size"):
        assert said in shown


# ------------------------------------------------------------------ the paper's parts own theirs
def test_the_hybrids_resnet_and_the_mlp_heads_width_are_their_parts_options():
    """Given with the part they belong to, changed one by one; a new part starts from its
    defaults."""
    config = vitzoo.get_config("vit_b16_hybrid", head="mlp",
                               head_options={"representation_size": 768})
    assert config.stem_options == {"layers": [3, 4, 9], "width": 1, "numerics": "official"}
    assert config.head_options == {"representation_size": 768}
    assert config.replace(stem_options={"numerics": "timm"}).stem_options["layers"] == [3, 4, 9]
    assert config.replace(stem="patch", patch_size=16).stem_options == {}


# -------------------------------------------------------------------- committed records and tags
def committed_model_configs() -> list[dict]:
    configs = {}
    for path in sorted(RESULTS.rglob("*.json")):
        document = json.loads(path.read_text())
        runs = document.get("runs", []) if isinstance(document, dict) else []
        for record in [entry.get("record", entry) for entry in runs]:  # an archive's hold one
            if "model_config" in record:
                configs[json.dumps(record["model_config"], sort_keys=True)] = record
    return list(configs.values())


def test_every_committed_model_config_loads_and_builds_the_model_it_measured():
    """The model_config of every committed run, archived ones too, loads and builds a model with
    exactly the parameter count the run recorded; a hybrid's ResNet is its stem's options."""
    records = committed_model_configs()
    assert len(records) > 20
    for record in records:
        written = record["model_config"]
        with torch.device("meta"):
            model = vitzoo.VisionTransformer(ViTConfig.from_dict(written))
        assert vitzoo.count_params(model) == record["params"], record["key"]
        if written["stem"] == "resnet":
            assert model.config.stem_options == written["stem_options"], record["key"]


# ---------------------------------------------------------------- a run works its model out once
def test_a_training_run_resolves_its_model_once_and_builds_no_model_on_meta(tmp_path, monkeypatch):
    from vitzoo.train import TrainConfig, Trainer, distributed

    source = vitzoo.create("vit_ti16", **{**SMALL, "num_classes": 4})
    source.save_pretrained(tmp_path / "pre")
    builds: list[str] = []
    init = vitzoo.VisionTransformer.__init__

    def counted(self, config):
        init(self, config)
        builds.append(str(next(self.parameters()).device))

    monkeypatch.setattr(vitzoo.VisionTransformer, "__init__", counted)
    cfg = TrainConfig(model="vit_ti16", pretrained=str(tmp_path / "pre"), data="synthetic",
                      train_limit=64, test_limit=32, batch_size=16, steps=1, quiet=True,
                      tensorboard=False, device="cpu", checkpoint_every=0).resolved()
    with pytest.warns(UserWarning, match="holds another model than"):  # a label then
        trainer = Trainer(cfg, distributed.setup("cpu"))
    assert builds == ["cpu"]  # one model, the one trained: none on the meta device
    assert trainer.model.config.num_classes == 10 and trainer.model.config.embed_dim == 32
