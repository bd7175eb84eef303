"""ONNX export (issue 35 item 14): `vitzoo export MODEL OUT.onnx` and `vitzoo.export_onnx` through torch's
dynamo exporter, the batch dynamic, checked here by onnxruntime against PyTorch's logits (1e-4) at two
batch sizes; bad destinations and models refused before any tracing."""

import numpy as np
import pytest
import torch

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import ExportError

onnxruntime = pytest.importorskip("onnxruntime")

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)


def random_weights(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)  # the zero-initialised head would hide a wrong graph
    return model.eval()


def agrees_with_pytorch(model, path, batches=(1, 4)):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in batches:
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            expected = model(x)
        expected = expected if isinstance(expected, list) else [expected]
        got = session.run(None, {"images": x.numpy()})
        assert len(got) == len(expected)
        for theirs, ours in zip(got, expected):
            assert theirs.shape == tuple(ours.shape)
            np.testing.assert_allclose(theirs, ours.numpy(), atol=1e-4, rtol=0)


@pytest.mark.slow  # tracing and translating: 5-20 s on a busy 2-core machine
def test_vitzoo_export_writes_an_onnx_file_onnxruntime_agrees_with(tmp_path, capsys):
    model = random_weights(vitzoo.create("vit_ti16", **TINY))
    model.save_pretrained(tmp_path / "saved")
    assert main(["export", str(tmp_path / "saved"), str(tmp_path / "out" / "vit.onnx")]) == 0
    assert "dynamic batch; onnxruntime agrees" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["vit.onnx"]  # nothing left beside it
    agrees_with_pytorch(model, tmp_path / "out" / "vit.onnx")


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    {"pos_embed": "relative"},
    {"stem": "resnet", "stem_options": {"layers": (1,)}, "patch_size": 1, "pool": "gap", "pos_embed": "learned_2d"},
])
def test_export_onnx_of_the_relative_embedding_and_the_hybrid(tmp_path, options):
    model = random_weights(vitzoo.create("vit_ti16", **{**TINY, **options}))
    vitzoo.export_onnx(model, tmp_path / "m.onnx", check=False)
    agrees_with_pytorch(model, tmp_path / "m.onnx")


@pytest.mark.slow
def test_a_features_only_model_exports_its_maps_with_the_weights_beside(tmp_path):
    model = random_weights(vitzoo.create("vit_ti16", features_only=True, out_indices=2, **{**TINY, "depth": 3}))
    vitzoo.export_onnx(model, tmp_path / "f.onnx", external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.onnx", "f.onnx.data"]
    agrees_with_pytorch(model, tmp_path / "f.onnx")


def test_bad_destinations_and_models_are_refused_before_any_tracing(tmp_path, capsys):
    model = vitzoo.create("vit_ti16", **TINY)
    existing = tmp_path / "old.onnx"
    existing.write_text("mine")
    with pytest.raises(FileExistsError, match="pass force=True"):
        vitzoo.export_onnx(model, existing)
    assert existing.read_text() == "mine"
    with pytest.raises(IsADirectoryError, match="name the .onnx file"):
        vitzoo.export_onnx(model, tmp_path)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OSError, match="a_file"):  # its folder cannot be made
        vitzoo.export_onnx(model, tmp_path / "a_file" / "m.onnx")
    with pytest.raises(ExportError, match="exports a vitzoo model"):
        vitzoo.export_onnx(torch.nn.Linear(2, 2), tmp_path / "l.onnx")
    with pytest.raises(ExportError, match="float32.*model.float()"):
        vitzoo.export_onnx(vitzoo.create("vit_ti16", **TINY).to(torch.bfloat16), tmp_path / "b.onnx")
    for argv, said in [
        (["export", "vit_ti16", str(existing), "--no-weights"], "exists; choose another path or pass force=True (--force)"),
        (["export", "no_such_model", str(tmp_path / "n.onnx"), "--no-weights"], "no_such_model"),
        (["export", str(tmp_path / "missing_dir"), str(tmp_path / "n.onnx")], "missing_dir"),
        (["export", str(tmp_path), str(tmp_path / "n.onnx"), "--no-weights"], "--no-weights builds a named model"),
        (["export", "vit_ti16", str(tmp_path / "n.onnx"), "--batch-size", "0"], "--batch-size must be at least 1"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("vitzoo export: error:") and said in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "old.onnx"]  # nothing written, nothing left


def test_export_help_names_every_argument(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = capsys.readouterr().out
    for flag in ("MODEL", "OUT.onnx", "--no-weights", "--img-size", "--batch-size", "--opset", "--external-data",
                 "--no-check", "--force"):
        assert flag in out
