"""ONNX export: `vitzoo export MODEL OUT.onnx` and `vitzoo.export_onnx`, the batch dynamic, checked
here by onnxruntime against PyTorch's outputs (1e-4) at two batch sizes; bad destinations and
models refused before any tracing."""

import numpy as np
import pytest
import torch
from conftest import TINY

import vitzoo
from vitzoo.cli import main

onnxruntime = pytest.importorskip("onnxruntime")


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
            np.testing.assert_allclose(theirs, ours.numpy(), atol=1e-4, rtol=0)


@pytest.mark.slow  # tracing and translating: 5-20 s on a busy 2-core machine
def test_vitzoo_export_writes_an_onnx_file_onnxruntime_agrees_with(tmp_path, capsys):
    model = random_weights(vitzoo.create("vit_ti16", **TINY))
    model.save_pretrained(tmp_path / "saved")
    assert main(["export", str(tmp_path / "saved"), str(tmp_path / "out" / "vit.onnx")]) == 0
    assert "dynamic batch; onnxruntime agrees" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["vit.onnx"]  # nothing beside it
    agrees_with_pytorch(model, tmp_path / "out" / "vit.onnx")


@pytest.mark.slow
def test_export_onnx_of_the_hybrid_with_the_relative_embedding(tmp_path):
    hybrid = dict(stem="resnet", stem_options={"layers": (1,)}, patch_size=1, pos_embed="relative")
    model = random_weights(vitzoo.create("vit_ti16", **{**TINY, **hybrid}))
    vitzoo.export_onnx(model, tmp_path / "m.onnx", check=False)
    agrees_with_pytorch(model, tmp_path / "m.onnx")


@pytest.mark.slow
def test_a_features_only_model_exports_its_maps_with_the_weights_beside(tmp_path):
    model = random_weights(vitzoo.create("vit_ti16", features_only=True, out_indices=2,
                                         **{**TINY, "depth": 3}))
    vitzoo.export_onnx(model, tmp_path / "f.onnx", external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.onnx", "f.onnx.data"]
    agrees_with_pytorch(model, tmp_path / "f.onnx")


def test_bad_destinations_and_models_are_refused_before_any_tracing(tmp_path, capsys):
    model = vitzoo.create("vit_ti16", **TINY)
    (existing := tmp_path / "old.onnx").write_text("mine")
    for path, model_, error, message in [
        (existing, model, FileExistsError, "pass force=True"),
        (tmp_path / "l.onnx", torch.nn.Linear(2, 2), TypeError, "exports a vitzoo model"),
        (tmp_path / "b.onnx", vitzoo.create("vit_ti16", **TINY).bfloat16(), ValueError,
         "float32.*model.float()"),
    ]:
        with pytest.raises(error, match=message):
            vitzoo.export_onnx(model_, path)
    for argv, said in [
        (["vit_ti16", str(existing), "--no-weights"], "exists; choose another path or pass "
                                                      "force=True (--force)"),
        (["no_such_model", str(tmp_path / "n.onnx"), "--no-weights"], "no_such_model"),
        ([str(tmp_path), str(tmp_path / "n.onnx"), "--no-weights"], "--no-weights builds a named"),
        (["vit_ti16", str(tmp_path / "n.onnx"), "--batch-size", "0"], "--batch-size must be at "
                                                                      "least 1"),
    ]:
        assert main(["export", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("vitzoo export: error:") and said in err, (argv, err)
    assert existing.read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["old.onnx"]  # nothing left
