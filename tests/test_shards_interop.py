"""Shards between vitzoo and the WebDataset world: the `webdataset` package and timm's reader read
vitzoo's shards; vitzoo reads shards other tools wrote in the standard layout; and the rehearsal's
run on its folder's shards equals the run on the folder, to the last bit."""

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch

from benchmarks.rehearsal_data import FolderSpec, image_folder, image_shards
from vitzoo import data

SPEC = FolderSpec(classes=4, train_per_class=6, val_per_class=3)  # 24 and 12 images, 5 a shard


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """A small rehearsal folder in ImageNet's layout (.JPEG files) and its shards."""
    root = tmp_path_factory.mktemp("interop") / "imagenet"
    return image_folder(root, SPEC), image_shards(root, SPEC, samples_per_shard=5)


def test_webdataset_reads_vitzoos_shards(rehearsal):
    wds = pytest.importorskip("webdataset")
    folder, shards = rehearsal
    for split, files in (("train", "train-{000000..000004}.tar"),
                         ("test", "val-{000000..000002}.tar")):
        listed = data.load_split(str(folder), split)
        samples = list(wds.WebDataset(str(shards / files), shardshuffle=False))
        assert len(samples) == len(listed)
        keys = [s["__key__"] for s in samples]
        assert keys == sorted(set(keys))
        for i, sample in enumerate(samples):
            assert set(sample) >= {"jpg", "cls"} and "jpeg" not in sample  # .JPEG read as .jpg
            assert sample["jpg"] == Path(listed.paths[i]).read_bytes()
            assert int(sample["cls"]) == int(listed.targets[i])
            assert keys[i].endswith(Path(listed.paths[i]).stem)


def test_timms_webdataset_reader_lists_the_same_splits_and_counts(rehearsal):
    pytest.importorskip("webdataset")
    from timm.data.readers.reader_wds import ReaderWds

    folder, shards = rehearsal
    info = json.loads((shards / "_info.json").read_text())
    for split, count in (("train", 24), ("val", 12)):
        reader = ReaderWds(str(shards), split=split)
        assert reader.num_samples == count == sum(reader.split_info.shard_lengths)
        assert list(reader.split_info.filenames) == info["splits"][split]["filenames"]
    read = list(ReaderWds(str(shards), split="val"))  # in order: not for training, no shuffling
    assert [label for _, label in read] == data.load_split(str(folder), "test").targets.tolist()
    assert [image.size for image, _ in read] == [(SPEC.side, SPEC.side)] * 12


def _png(image: torch.Tensor) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(buffer, "PNG")
    return buffer.getvalue()


def test_shards_other_tools_wrote_in_the_standard_layout_read_too(tmp_path):
    """Written by webdataset's TarWriter (.png/.cls/.json members) and by tarfile in GNU's format
    (a directory member, a name past ustar's 100 characters, a metadata member), with a timm-style
    info file that names no classes and calls its validation split `validation`."""
    wds = pytest.importorskip("webdataset")
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 8 + i, 10), generator=g, dtype=torch.uint8)
              for i in range(7)]
    labels = [3, 1, 0, 2, 1, 3, 0]
    with wds.TarWriter(str(tmp_path / "in-train-0.tar")) as sink:
        for i in range(4):
            sink.write({"__key__": f"s{i:04d}", "png": _png(images[i]), "cls": labels[i],
                        "json": {"id": i}})
    deep = "d" * 120
    with tarfile.open(tmp_path / "in-train-1.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        folder = tarfile.TarInfo(deep)
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, payload in [("__meta__", b"{}")] + [
                (f"{deep}/s{i}.{suffix}", content) for i in (4, 5) for suffix, content in (
                    ("txt", b"a note"), ("png", _png(images[i])),
                    ("cls", f"{labels[i]}\n".encode()))]:
            member = tarfile.TarInfo(name)
            member.size = len(payload)
            tar.addfile(member, io.BytesIO(payload))
    with wds.TarWriter(str(tmp_path / "in-validation-0.tar")) as sink:
        sink.write({"__key__": "v0", "png": _png(images[6]), "cls": labels[6]})
    splits = (("train", ["in-train-0.tar", "in-train-1.tar"], [4, 2]),
              ("validation", ["in-validation-0.tar"], [1]))
    (tmp_path / "info.json").write_text(json.dumps({"name": "other", "splits": {
        s: {"name": s, "num_samples": sum(n), "filenames": f, "shard_lengths": n}
        for s, f, n in splits}}))
    for name in (str(tmp_path), str(tmp_path / "in-train-{0..1}.tar")):
        data.check_data(name)
        train, test = data.load_split(name, "train"), data.load_split(name, "test")
        assert train.targets.tolist() == labels[:6] and test.targets.tolist() == labels[6:]
        assert train.classes == ["0", "1", "2", "3"]
        assert data.data_info(name, train).num_classes == 4
        assert all(torch.equal(train[i][0], images[i]) for i in range(6))
        assert torch.equal(test[0][0], images[6])


@pytest.mark.slow
def test_the_rehearsal_run_on_shards_equals_the_run_on_its_folder(tmp_path):
    """One rehearsal run (the head ablation's first: two gloo processes, a loader worker decoding
    JPEGs) on the folder and on its shards: the same final loss, test accuracy and curve."""
    from benchmarks.ablations import ABLATIONS
    from benchmarks.runner import assign, execute
    from benchmarks.scales import get_scale
    from benchmarks.suite import ResultStore, Run
    from benchmarks.training import measure

    folder = image_folder(tmp_path / "imagenet")
    shards = image_shards(tmp_path / "imagenet")
    run = ABLATIONS["head"].runs(get_scale("rehearsal", str(folder)))[0]
    metrics = {}
    for name, source in (("folder", folder), ("shards", shards)):
        train = {**run.config["train"], "data": str(source)}
        on = Run(run.ablation, run.label, {**run.config, "train": train}, run.seed, run.group)
        record = execute([on], measure, ResultStore(tmp_path / name),
                         assign("cpu", processes_per_run=2), quiet=True)[0]
        assert record["world_size"] == 2 and record["config"]["train"]["num_workers"] >= 1
        metrics[name] = record["metrics"]
    for key in ("final_loss", "test_acc", "curve", "fewshot_5"):
        assert metrics["shards"][key] == metrics["folder"][key], key
    assert 0 < metrics["shards"]["final_loss"] < 10
