import os

import pytest
import torch

# Plugins installed in the environment are part of the tests in tests/test_plugins.py; elsewhere the
# suite sees whatever is installed, like a user would.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
# `--precision auto` and `vitzoo.inference` measure the CPU's fastest precision: the suite computes in float32
# on every machine instead (tests/test_fastest.py measures, with this unset); subprocesses inherit it
os.environ["VITZOO_CPU_PRECISION"] = "float32"
# ... and `vitzoo.inference.for_inference`'s compile="auto" stays eager without measuring, so that tests do not
# wait for compilations they are not about (tests/test_fastest.py measures, with this unset)
os.environ["VITZOO_COMPILE"] = "0"

TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=8, num_classes=5)


@pytest.fixture
def tiny():
    """Options of a tiny ViT that builds and runs in milliseconds."""
    return dict(TINY)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def hermetic_hub(monkeypatch, tmp_path):
    """A Hugging Face environment of the test's own (tests/hub_testing.py): the cache in tmp_path, no
    stray token, LFS uploads. Returns tmp_path."""
    from hub_testing import hermetic_hub_environment  # imported by the tests that use the Hub only

    hermetic_hub_environment(monkeypatch, tmp_path)
    return tmp_path


@pytest.fixture
def hub_server(hermetic_hub, monkeypatch):
    """The loopback Hub (vitzoo.testing.hubserver) in tmp_path/hub, taking TOKEN, as HF_ENDPOINT (vitzoo
    hands the current HF_ENDPOINT to huggingface_hub)."""
    from hub_testing import TOKEN
    from vitzoo.testing.hubserver import HubServer

    with HubServer(hermetic_hub / "hub", token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


@pytest.fixture
def one_second(monkeypatch):
    """Hub waits of one second (VITZOO_HUB_TIMEOUT), for tests of a server that does not answer."""
    monkeypatch.setenv("VITZOO_HUB_TIMEOUT", "1")
