"""save_pretrained: the files, the model card, atomic writes; loading vitzoo's own files."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import vitzoo
from vitzoo.errors import CheckpointError
from vitzoo.checkpoints import native
from vitzoo.checkpoints.sources import read_checkpoint


@pytest.fixture
def model(tiny):
    torch.manual_seed(0)
    m = vitzoo.create("vit_b16", **tiny)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
    return m.eval()


def test_save_pretrained_writes_config_weights_and_model_card(model, tmp_path):
    model.save_pretrained(tmp_path / "out", card={"dataset": "cifar10", "metrics": {"accuracy": 0.9876},
                                                  "repo_id": "alice/tiny", "license": "mit", "tags": ["cifar"]})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    document = json.loads((tmp_path / "out" / "config.json").read_text())
    assert document["format"] == "vitzoo" and document["format_version"] == 1  # vitzoo's own names: every vitzoo reads them (2 marks timm's or transformers')
    assert document["vitzoo_version"] == vitzoo.__version__ and document["model"] == model.config.to_dict()
    card = (tmp_path / "out" / "README.md").read_text()
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    for needle in ("library_name: vitzoo", "license: mit", "- cifar", "- cifar10", "model-index", "value: 0.9876"):
        assert needle in front
    assert "| width (D) | 32 |" in body and 'vitzoo.from_pretrained("hf-hub:alice/tiny")' in body
    assert "| cifar10 | accuracy | 0.9876 |" in body
    loaded = vitzoo.from_pretrained(tmp_path / "out")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_model_card_without_metrics_has_no_model_index(model, tmp_path):
    model.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert "library_name: vitzoo" in card and "model-index" not in card and "license: apache-2.0" in card


def test_a_crash_mid_save_leaves_no_half_written_file(model, tmp_path, monkeypatch):
    model.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)  # part of the file, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(native, "save_file", crash)
    with torch.no_grad():
        model.head.fc.bias.add_(1)
    with pytest.raises(KeyboardInterrupt):
        model.save_pretrained(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary file left either
    with pytest.raises(KeyboardInterrupt):
        model.save_pretrained(tmp_path / "fresh")
    assert not (tmp_path / "fresh" / "model.safetensors").exists() and not (tmp_path / "fresh" / "config.json").exists()


def test_a_bare_vitzoo_safetensors_file_infers_its_model(model, tmp_path):
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    loaded = vitzoo.from_pretrained(tmp_path / "w.safetensors", num_heads=2)
    assert loaded.config.embed_dim == 32 and loaded.config.img_size == (32, 32) and loaded.config.num_classes == 5
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    assert read_checkpoint(tmp_path / "w.safetensors").format == "vitzoo"


def test_unknown_file_type_and_missing_path(tmp_path):
    (tmp_path / "w.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="unknown file type"):
        vitzoo.from_pretrained(tmp_path / "w.txt")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        vitzoo.from_pretrained(tmp_path / "nothing.safetensors")
    (tmp_path / "d").mkdir()
    with pytest.raises(CheckpointError, match="no weights file"):
        vitzoo.from_pretrained(tmp_path / "d")


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a name inside a module, not a module
        return False


def _vitzoo_imports(module: str) -> set[str]:
    """The vitzoo modules `module` imports, anywhere in its code, and the packages they are in (whose
    __init__ runs first); vitzoo's own __init__ left out, since importing any part runs it anyway."""
    import ast
    import importlib.util

    tree = ast.parse(open(importlib.util.find_spec(module).origin).read())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)
                      if parts[0] == "vitzoo" and _is_module(".".join(parts[:i]))}
    return found


def test_saving_and_pushing_never_import_the_model():
    """model.save_pretrained / push_to_hub use vitzoo.checkpoints.native and vitzoo.checkpoints.publish, which import no
    module that imports vitzoo.model (directly or through others): there is no import circle to dodge."""
    seen, todo = set(), ["vitzoo.checkpoints.native", "vitzoo.checkpoints.publish"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += sorted(_vitzoo_imports(module) - seen)
    assert "vitzoo.model" not in seen and "vitzoo.pretrained" not in seen
    assert {"vitzoo.checkpoints.native", "vitzoo.weights.layout", "vitzoo.weights.hub"} <= seen  # the walk did walk
