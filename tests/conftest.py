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
