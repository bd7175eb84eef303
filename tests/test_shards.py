"""`vitzoo shard` and `--data` on shards: an ImageFolder written as WebDataset tar shards holds the folder's
files byte for byte, in its order, with its classes; reading them gives the folder's dataset; a
stopped run resumes; wrong input and a crowded OUT are refused, naming the fix."""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from vitzoo import data
from vitzoo.cli import main
from vitzoo.data import sharding, shards
from vitzoo.data.shards import ShardImages, expand_braces, load_shards, locate, split_sizes
from vitzoo.errors import ConfigError, DataError


def small_folder(root: Path) -> Path:
    """3 classes of tiny images in the formats and names a folder has: .jpg, .JPEG, .png, a grey image, a
    name with dots (WebDataset's key ends at the first dot)."""
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split, count in (("train", 4), ("val", 2)):
        for c, name in enumerate(("cat", "dog", "emu")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = torch.randint(0, 256, (12 + i, 16, 3), generator=g, dtype=torch.uint8).numpy()
                image = Image.fromarray(pixels[..., 0] if i == 1 else pixels)
                file = folder / [f"{name}_{i}.jpg", f"{name}_{i}.JPEG", f"{name}.{i}.v2.png", f"{name}_{i}.png"][i]
                image.save(file, "PNG" if file.suffix == ".png" else "JPEG")
    return root


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A small folder and its shards, three samples a shard (several shards per split)."""
    root = tmp_path_factory.mktemp("shards")
    folder = small_folder(root / "images")
    info = sharding.write_shards(folder, root / "out", samples_per_shard=3, progress=False)
    return folder, root / "out", info


def members(shard: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(shard) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


# ---------------------------------------------------------------------------- what is written
def test_the_shards_hold_the_folders_files_byte_for_byte_in_its_order(written):
    folder, out, info = written
    assert info == json.loads((out / "_info.json").read_text())
    assert info["classes"] == ["cat", "dog", "emu"]
    for split, count in (("train", 12), ("val", 6)):
        listed = data.load_split(str(folder), split)  # the folder as training lists it
        entry = info["splits"][split]
        assert entry["name"] == split and entry["num_samples"] == count == len(listed)
        assert entry["filenames"] == [f"{split}-{n:06d}.tar" for n in range(count // 3)] and entry["shard_lengths"] == [3] * (count // 3)
        found = [item for name in entry["filenames"] for item in members(out / name)]
        images, classes = found[0::2], found[1::2]
        keys = [name.split(".")[0] for name, _ in images]
        assert keys == [name.split(".")[0] for name, _ in classes] and keys == sorted(set(keys))  # unique, sorted
        for i, ((name, content), (_, label), path) in enumerate(zip(images, classes, listed.paths)):
            assert content == Path(path).read_bytes()  # not re-encoded
            assert int(label) == int(listed.targets[i])
            assert name.endswith({".JPEG": ".jpg"}.get(Path(path).suffix, Path(path).suffix))
            assert keys[i].startswith(f"{i:08d}_") and "." not in keys[i]
    assert any(name.endswith("_cat_2_v2.png") for name, _ in members(out / "train-000000.tar"))


def test_a_shard_closes_before_the_size_it_is_given(tmp_path, written):
    folder = written[0]
    info = sharding.write_shards(folder, tmp_path / "out", shard_mb=0.02, progress=False)
    lengths = info["splits"]["train"]["shard_lengths"]
    assert len(lengths) > 1 and sum(lengths) == 12
    for name, length in zip(info["splits"]["train"]["filenames"], lengths):
        assert (tmp_path / "out" / name).stat().st_size <= 20_000 or length == 1


def test_the_writers_index_is_the_one_read_from_the_headers(written):
    out = written[1]
    for shard in sorted(out.glob("*.tar")):
        saved, read = shards.load_index(shard), shards.read_headers(shard)
        for name in ("offsets", "sizes", "labels"):
            assert np.array_equal(getattr(saved, name), getattr(read, name)), (shard, name)


# ---------------------------------------------------------------------------- reading
@pytest.mark.parametrize("form", ["folder", "pattern"])
def test_the_shards_are_the_folders_dataset(written, form):
    folder, out, _ = written
    name = str(out) if form == "folder" else str(out / "train-{000000..000003}.tar")
    data.check_data(name)
    for split in ("train", "test"):
        original, sharded = data.load_split(str(folder), split), data.load_split(name, split)
        assert isinstance(sharded, ShardImages) and sharded.classes == original.classes
        assert torch.equal(sharded.targets, original.targets)
        for i in range(len(original)):
            assert torch.equal(sharded.encoded(i)[0], original.encoded(i)[0])
            image, label = sharded[i]
            assert torch.equal(image, original[i][0]) and label == original[i][1] and image.shape[0] == 3
    info = data.data_info(name, data.load_split(name, "train"))
    assert info.num_classes == 3 and info.classes == ("cat", "dog", "emu")
    assert split_sizes(name) == (12, 6)


def test_each_process_opens_the_shards_itself(written):
    out = written[1]
    train = load_shards(str(out), "train")
    assert not train._files  # nothing opened before the first read
    expected = [train.encoded(i)[0] for i in range(len(train))]
    assert len(train._files) == 4
    copy = pickle.loads(pickle.dumps(train))  # as a worker started by spawn or a fork server receives it
    assert not copy._files and torch.equal(copy.encoded(5)[0], expected[5])
    train._pid = -1  # as a forked worker finds it: the descriptors are another process's, closed and opened anew
    assert torch.equal(train.encoded(4)[0], expected[4]) and list(train._files) == [1] and train._pid == os.getpid()
    train._limit = 2  # at most this many open at once: the least recently read closed first
    for i in range(len(train)):
        assert torch.equal(train.encoded(i)[0], expected[i])
        assert len(train._files) <= 2
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:  # threads closing and opening descriptors under each other's reads
        for _ in range(20):
            order = torch.randperm(len(train)).tolist()
            assert all(torch.equal(got, expected[i]) for i, (got, _) in zip(order, pool.map(train.encoded, order)))
    loader = torch.utils.data.DataLoader(train, batch_size=None, num_workers=2,
                                         collate_fn=lambda sample: sample,
                                         multiprocessing_context="fork" if hasattr(os, "fork") else None)
    assert all(torch.equal(image, train[i][0]) for i, (image, _) in enumerate(loader))
    with pytest.raises(IndexError):
        train.encoded(len(train))


def write_tar(path: Path, members: list[tuple[str, bytes]], **options) -> Path:
    with tarfile.open(path, "w", **options) as tar:
        for name, payload in members:
            member = tarfile.TarInfo(name)
            member.size = len(payload)
            tar.addfile(member, io.BytesIO(payload))
    return path


def test_the_index_is_made_once_beside_the_shard_or_else_in_the_cache(tmp_path, monkeypatch,
                                                                      data_cache):
    (tmp_path / "ro").mkdir()
    images = [os.urandom(100_000) for _ in range(3)]  # ImageNet-sized JPEGs: the indexer skips them
    shard = write_tar(tmp_path / "ro" / "train-000000.tar",
                      [(f"{key}{suffix}", payload) for key, image, label in zip("abc", images, (2, 0, 1))
                       for suffix, payload in ((".jpg", image), (".cls", str(label).encode()))])
    requested = []

    class Counting(io.FileIO):  # what the indexer asks to read of the shard
        def read(self, size=-1):
            got = super().read(size)
            requested.append(len(got))
            return got

    monkeypatch.setattr(shards, "open", lambda path, mode, **kw: Counting(path, "r") if mode == "rb" else open(path, mode),
                        raising=False)
    real = shards.atomic_path

    def read_only(path):  # a folder of shared data this user cannot write (root writes anywhere: simulated)
        if Path(path).parent == shard.parent:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(shards, "atomic_path", read_only)
    index = shards.load_index(shard)
    assert not shards.index_files(shard)[0].exists() and len(list((data_cache / "shard-index").iterdir())) == 1
    assert sum(requested) < 0.05 * shard.stat().st_size  # the headers and .cls texts, not the images
    assert index.labels.tolist() == [2, 0, 1] and index.sizes.tolist() == [100_000] * 3
    assert [shard.read_bytes()[o:o + 100_000] for o in index.offsets] == images
    requested.clear()
    assert np.array_equal(shards.load_index(shard).offsets, index.offsets) and not requested  # the cached index
    os.utime(shard, ns=(1, 1))  # the shard changed (its time): indexed again, now beside it
    monkeypatch.setattr(shards, "atomic_path", real)
    shards.load_index(shard)
    assert requested and shards.index_files(shard)[0].is_file()


def test_braces_expand_as_webdatasets_patterns_do():
    assert expand_braces("a/train-{000..002}.tar") == ["a/train-000.tar", "a/train-001.tar", "a/train-002.tar"]
    assert expand_braces("{x,y}-{8..10}.tar") == ["x-8.tar", "x-9.tar", "x-10.tar", "y-8.tar", "y-9.tar", "y-10.tar"]
    assert expand_braces("one.tar") == ["one.tar"]
    with pytest.raises(DataError, match="backwards"):
        expand_braces("train-{9..1}.tar")
    with pytest.raises(DataError, match="neither a range"):
        expand_braces("train-{9}.tar")


def test_a_pattern_without_an_info_file_finds_its_validation_split_by_name(tmp_path, written):
    out = written[1]
    for shard in out.glob("*.tar"):  # the shards alone, as another tool would leave them
        (tmp_path / shard.name).write_bytes(shard.read_bytes())
    splits = locate(str(tmp_path / "train-{000000..000003}.tar"))
    assert [p.name for p in splits.test] == ["val-000000.tar", "val-000001.tar"] and splits.classes is None
    train = data.load_split(str(tmp_path / "train-{000000..000003}.tar"), "train")
    assert train.classes == ["0", "1", "2"] and torch.equal(train.targets, load_shards(str(out), "train").targets)
    for shard in tmp_path.glob("val-*"):
        shard.unlink()
    with pytest.raises(DataError, match="no validation shards.*val-"):
        data.check_data(str(tmp_path / "train-{000000..000003}.tar"))
    with pytest.raises(DataError, match="not there"):
        data.check_data(str(tmp_path / "train-{000000..000009}.tar"))


def test_shards_that_cannot_be_read_at_random_are_refused(tmp_path):
    import gzip

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "train-0.tar").write_bytes(gzip.compress(b"\0" * 10240))
    with pytest.raises(DataError, match="not an uncompressed tar"):
        shards.read_headers(tmp_path / "c" / "train-0.tar")
    write_tar(tmp_path / "nocls.tar", [("a.jpg", b"abc")])
    with pytest.raises(DataError, match="no .cls member"):
        shards.read_headers(tmp_path / "nocls.tar")


# ---------------------------------------------------------------------------- the command
def test_the_command_writes_the_shards_and_a_second_run_changes_nothing(tmp_path, written, capsys):
    folder = written[0]
    assert main(["shard", str(folder), str(tmp_path / "out"), "--samples-per-shard", "3", "--quiet"]) == 0
    assert "3 classes; train: 12 images in 4 shard(s), val: 6 images in 2 shard(s)" in capsys.readouterr().out
    assert all((tmp_path / "out" / f).read_bytes() == (written[1] / f).read_bytes() for f in ("train-000001.tar", "val-000001.tar"))
    times = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    assert main(["shard", str(folder), str(tmp_path / "out"), "--samples-per-shard", "3", "--quiet"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == times
    # the default size, then the same size written otherwise: the same shards, kept
    assert main(["shard", str(folder), str(tmp_path / "one"), "--quiet"]) == 0
    times = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "one").iterdir()}
    assert main(["shard", str(folder), str(tmp_path / "one"), "--quiet", "--shard-size-mb", "1e3"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "one").iterdir()} == times


def test_an_interrupted_run_keeps_its_complete_shards_and_finishes(tmp_path, written, monkeypatch):
    folder, reference, _ = written
    reads = []
    real = sharding._read_file

    def stops_at_the_eighth(path):
        reads.append(path)
        if len(reads) == 8:
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(sharding, "_read_file", stops_at_the_eighth)
    with pytest.raises(KeyboardInterrupt):
        sharding.write_shards(folder, tmp_path / "out", samples_per_shard=3, threads=1, progress=False)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("*.tar")) == ["train-000000.tar", "train-000001.tar"]
    assert not (out / "_info.json").exists() and (out / ".vitzoo-shard-plan.json").is_file()
    (out / ".train-000002.tar.0123456789ab.tmp").write_bytes(b"left by a killed run")
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tar")}
    monkeypatch.setattr(sharding, "_read_file", real)
    sharding.write_shards(folder, out, samples_per_shard=3, threads=1, progress=False)
    assert {name: (out / name).stat().st_mtime_ns for name in kept} == kept  # kept, not written again
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())  # no leftovers
    assert all((out / p.name).read_bytes() == p.read_bytes() for p in reference.glob("*.tar"))


def test_wrong_input_is_refused_naming_the_fix(tmp_path, written, capsys):
    def refused(*argv: str) -> str:
        assert main(["shard", *argv, "--quiet"]) == 2
        return capsys.readouterr().err

    assert "no such folder; give the ImageFolder tree" in refused(str(tmp_path / "none"), str(tmp_path / "o"))
    (tmp_path / "flat" / "cat").mkdir(parents=True)
    assert "has no train/ subdirectory" in refused(str(tmp_path / "flat"), str(tmp_path / "o"))
    (tmp_path / "flat" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "flat" / "val" / "cat").mkdir(parents=True)
    empty = refused(str(tmp_path / "flat"), str(tmp_path / "o"))
    assert "class folder" in empty and "holds no images" in empty and "add its images, or remove the folder" in empty
    assert "holds shards already" in refused(str(written[1]), str(tmp_path / "o"))
    assert "inside the folder being sharded" in refused(str(written[0]), str(written[0] / "train" / "out"))
    with pytest.raises(ConfigError, match="samples_per_shard must be > 0"):
        sharding.write_shards(written[0], tmp_path / "o", samples_per_shard=0)
    assert not (tmp_path / "o").exists()


def test_an_out_holding_other_files_is_refused_unless_overwrite(tmp_path, written, capsys):
    folder, out = written[0], tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["shard", str(folder), str(out), "--quiet"]) == 2
    assert "not vitzoo's shards (notes.txt)" in capsys.readouterr().err and list(out.iterdir()) == [out / "notes.txt"]
    assert main(["shard", str(folder), str(out), "--quiet", "--overwrite"]) == 0
    assert (out / "train-000000.tar").is_file() and (out / "notes.txt").read_text() == "mine"
    # shards of another size there: refused, then replaced (the earlier ones removed, the notes kept)
    assert main(["shard", str(folder), str(out), "--quiet", "--samples-per-shard", "5"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["shard", str(folder), str(out), "--quiet", "--samples-per-shard", "5", "--overwrite"]) == 0
    assert sorted(p.name for p in out.glob("*.tar")) == ["train-000000.tar", "train-000001.tar", "train-000002.tar",
                                                         "val-000000.tar", "val-000001.tar"]
    assert (out / "notes.txt").read_text() == "mine"


def test_the_help_says_what_the_command_does(capsys):
    with pytest.raises(SystemExit) as exit_info:  # tests/test_cli.py runs it as a command, with every other's
        main(["shard", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith("usage: vitzoo shard")
    for words in ("--shard-size-mb", "--samples-per-shard", "--overwrite", "--threads", "_info.json", "resumes",
                  "timm", "--data OUT"):
        assert words in out, words


def test_the_benchmarks_count_the_images_of_shards(written):
    from benchmarks.training import dataset_images

    out = written[1]
    assert dataset_images({"data": str(out)}) == (12, 6)
    assert dataset_images({"data": str(out / "train-{000000..000001}.tar")}) == (6, 6)
    assert dataset_images({"data": "/no/such/train-{000..009}.tar"}) == (1_281_167, 50_000)  # a dry run elsewhere
