"""The input pipeline measured: `python -m benchmarks loader`, and gpu-check's loader step on the
CPU."""

import json
from pathlib import Path

import pytest
import torch

from benchmarks import loader
from benchmarks.loader import PhotoSpec, photo_folder


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return photo_folder(tmp_path_factory.mktemp("photos"), PhotoSpec(6, 2, width=120, height=90))


def test_the_drawn_jpegs_are_photo_sized_for_their_pixels(photos):
    """A full-size image comes out near ImageNet's ~110 KB."""
    from PIL import Image

    assert len(list(photos.glob("train/*/*.JPEG"))) == 6
    big = next(photo_folder(photos.parent / "one", PhotoSpec(1, 1)).glob("train/*/*.JPEG"))
    with Image.open(big) as image:
        assert image.size == (500, 375) and image.format == "JPEG"
    assert 70_000 < big.stat().st_size < 160_000


def test_gpu_check_s_loader_step_times_the_device_and_the_worker_path_on_any_device(photos):
    rates = loader.device_rates(photos, torch.device("cpu"), 1, 3, passes=2, sides=(32,))
    assert set(rates["32px"]) == {"device_decode", "device_path", "worker_path"}
    assert min(rates["32px"].values()) > 0


@pytest.mark.slow
def test_the_loader_benchmark_writes_its_record_and_its_table(tmp_path):
    """`--quick`: a few files, one pass."""
    loader.main(out=tmp_path / "out", work=tmp_path / "work", quick=True)
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(p["scale"], p["img_size"]) for p in written["pipelines"]] == [
        ("gpu", 128), ("paper", 224), ("rehearsal", 32)]
    assert all(v > 0 for p in written["pipelines"] for v in p["images_per_s"].values())
    assert written["environment"]["threads"] == 1
    assert "| gpu | 128 | 64 |" in (tmp_path / "out" / "README.md").read_text()
