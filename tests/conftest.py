import os

import pytest
import torch

# Plugins installed in the environment are part of the tests in tests/test_plugins.py; elsewhere the
# suite sees whatever is installed, like a user would.
# Under pytest-xdist (`./run.sh test` runs one worker per core) each worker computes in its share of the
# cores: more threads than cores only spin against each other.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // WORKERS)))

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
    stray token, no Xet uploads. Returns tmp_path."""
    from hub_testing import hermetic_hub_environment  # imported by the tests that use the Hub only

    hermetic_hub_environment(monkeypatch, tmp_path)
    return tmp_path


@pytest.fixture
def hub_server(hermetic_hub, monkeypatch):
    """The loopback Hub (tests/hubserver) in tmp_path/hub, taking TOKEN, as HF_ENDPOINT (vitzoo hands
    the current HF_ENDPOINT to huggingface_hub)."""
    from hub_testing import TOKEN
    from hubserver import HubServer

    with HubServer(hermetic_hub / "hub", token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


@pytest.fixture
def one_second(monkeypatch):
    """Hub waits of one second (HF_HUB_DOWNLOAD_TIMEOUT, HF_HUB_ETAG_TIMEOUT), for tests of a server
    that does not answer."""
    from huggingface_hub import constants

    for name in ("HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_ETAG_TIMEOUT"):
        monkeypatch.setenv(name, "1")
        monkeypatch.setattr(constants, name, 1)


# The modules whose fixtures train for minutes, longest first. With `--dist loadfile` a module runs whole on
# one worker, and workers take modules in collection order: started first, these overlap the many short
# modules instead of running alone at the end. Only the order changes.
LONGEST_FIRST = ("test_paper_scale.py", "test_benchmarks.py", "test_cluster_launcher.py", "test_transfer.py",
                 "test_loader_workers.py", "test_inference.py", "test_hub_both_ways.py", "test_export_onnx.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture
def data_cache(tmp_path, monkeypatch):
    """vitzoo's cache (VITZOO_CACHE) in tmp_path/cache: downloaded datasets, shard indexes."""
    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def plugin():
    """Registers plugin objects in-process for one test, as installed ones would be."""
    from vitzoo.registry import get_registry

    names = []
    yield lambda obj: names.append(get_registry().register(obj, name=f"test-plugin-{len(names)}"))
    for name in names:
        get_registry().unregister(name)
