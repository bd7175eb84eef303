"""`vitzoo shard` and `--data` on shards: an ImageFolder written as WebDataset tar shards holds its
files byte for byte, in its order, with its classes; reading them gives the folder's dataset; a
stopped run resumes; hostile or wrong input and a crowded OUT are refused, naming the fix."""

import io
import json
import os
import pickle
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from vitzoo import data
from vitzoo.cli import main
from vitzoo.data import sharding, shards
from vitzoo.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A folder of 3 classes (.jpg, .JPEG, a gray image, a name with dots) and its shards, three
    samples a shard."""
    from PIL import Image

    root = tmp_path_factory.mktemp("shards")
    g = torch.Generator().manual_seed(0)
    for split, count in (("train", 4), ("val", 2)):
        for name in ("cat", "dog", "emu"):
            (root / "images" / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = torch.randint(0, 256, (12 + i, 16, 3), generator=g, dtype=torch.uint8)
                file = [f"{name}_{i}.jpg", f"{name}_{i}.JPEG", f"{name}.{i}.v2.png",
                        f"{name}.png"][i]
                Image.fromarray(pixels[..., 0].numpy() if i == 1 else pixels.numpy()).save(
                    root / "images" / split / name / file, "PNG" if i > 1 else "JPEG")
    info = sharding.write_shards(root / "images", root / "out", samples_per_shard=3,
                                 progress=False)
    return root / "images", root / "out", info


def members(shard: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(shard) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def write_tar(path: Path, samples: list[tuple[str, bytes]], **options) -> Path:
    with tarfile.open(path, "w", **options) as tar:
        for name, payload in samples:
            member = tarfile.TarInfo(name)
            member.size = len(payload)
            tar.addfile(member, io.BytesIO(payload))
    return path


def test_the_shards_hold_the_folders_files_byte_for_byte_in_its_order(written):
    folder, out, info = written
    assert info == json.loads((out / "_info.json").read_text())
    assert info["classes"] == ["cat", "dog", "emu"]
    for split, count in (("train", 12), ("val", 6)):
        listed = data.load_split(str(folder), split)  # the folder as training lists it
        entry = info["splits"][split]
        assert entry["num_samples"] == count == len(listed)
        assert entry["filenames"] == [f"{split}-{n:06d}.tar" for n in range(count // 3)]
        assert entry["shard_lengths"] == [3] * (count // 3)
        found = [item for name in entry["filenames"] for item in members(out / name)]
        keys = [name.split(".")[0] for name, _ in found[0::2]]
        assert keys == [name.split(".")[0] for name, _ in found[1::2]] == sorted(set(keys))
        for i, ((name, content), (_, label), path) in enumerate(zip(found[0::2], found[1::2],
                                                                    listed.paths)):
            assert content == Path(path).read_bytes() and int(label) == int(listed.targets[i])
            assert name.endswith({".JPEG": ".jpg"}.get(Path(path).suffix, Path(path).suffix))
            assert keys[i].startswith(f"{i:08d}_") and "." not in keys[i]


def test_a_shard_closes_before_the_size_it_is_given(tmp_path, written):
    info = sharding.write_shards(written[0], tmp_path / "out", shard_mb=0.02, progress=False)
    lengths = info["splits"]["train"]["shard_lengths"]
    assert len(lengths) > 1 and sum(lengths) == 12
    for name, length in zip(info["splits"]["train"]["filenames"], lengths):
        assert (tmp_path / "out" / name).stat().st_size <= 20_000 or length == 1


@pytest.mark.parametrize("form", ["folder", "pattern"])
def test_the_shards_are_the_folders_dataset(written, form):
    folder, out, _ = written
    name = str(out) if form == "folder" else str(out / "train-{000000..000003}.tar")
    data.check_data(name)
    for split in ("train", "test"):
        original, sharded = data.load_split(str(folder), split), data.load_split(name, split)
        assert sharded.classes == original.classes
        assert torch.equal(sharded.targets, original.targets)
        for i in range(len(original)):
            assert torch.equal(sharded.encoded(i)[0], original.encoded(i)[0])
            assert torch.equal(sharded[i][0], original[i][0]) and sharded[i][1] == original[i][1]
    assert data.data_info(name, data.load_split(name, "train")).classes == ("cat", "dog", "emu")
    assert shards.split_sizes(name) == (12, 6)


def test_each_process_reads_the_shards_through_its_own_descriptors(written, monkeypatch):
    train = shards.load_shards(str(written[1]), "train")
    expected = [train.encoded(i)[0] for i in range(len(train))]
    copy = pickle.loads(pickle.dumps(train))  # as a worker started by a fork server receives it
    assert not copy._files and torch.equal(copy.encoded(5)[0], expected[5])
    monkeypatch.setattr(shards, "open_files_allowed", lambda: 2)  # at most two open at once
    with ThreadPoolExecutor(4) as pool:  # threads closing and opening under each other's reads
        for _ in range(10):
            order = torch.randperm(len(copy)).tolist()
            got = pool.map(lambda i: copy.encoded(i)[0], order)
            assert all(torch.equal(a, expected[i]) for i, a in zip(order, got))
    alone = pickle.loads(pickle.dumps(train))  # a loader worker reads in one thread
    assert all(torch.equal(alone.encoded(i)[0], expected[i]) and len(alone._files) <= 2
               for i in torch.randperm(len(alone)).tolist())
    loader = torch.utils.data.DataLoader(train, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    assert all(torch.equal(image, train[i][0]) for i, (image, _) in enumerate(loader))


def test_the_index_is_made_once_and_again_when_the_shard_changes(tmp_path, monkeypatch,
                                                                   data_cache):
    images = [os.urandom(100_000) for _ in range(3)]
    shard = write_tar(tmp_path / "train-0.tar", [
        (f"{key}{suffix}", payload) for key, image, label in zip("abc", images, (2, 0, 1))
        for suffix, payload in ((".jpg", image), (".cls", str(label).encode()))])
    index = shards.load_index(shard)
    assert index.labels.tolist() == [2, 0, 1] and index.sizes.tolist() == [100_000] * 3
    assert [shard.read_bytes()[o:o + 100_000] for o in index.offsets] == images
    read, real = [], shards.read_headers
    monkeypatch.setattr(shards, "read_headers", lambda shard: read.append(shard) or real(shard))
    assert (shards.load_index(shard).offsets == index.offsets).all() and not read
    os.utime(shard, ns=(1, 1))  # the shard changed: indexed again
    shards.load_index(shard)
    assert read == [shard]


def test_braces_expand_as_webdatasets_patterns_do_within_bounds():
    expand = shards.expand_braces
    assert expand("a/t-{000..002}.tar") == ["a/t-000.tar", "a/t-001.tar", "a/t-002.tar"]
    assert expand("{x,y}-{8..9}.tar") == ["x-8.tar", "x-9.tar", "y-8.tar", "y-9.tar"]
    for pattern in ("t-{9..1}.tar", "t-{000000..999999999999}.tar", "{0..999}-{0..999}.tar"):
        with pytest.raises(DataError, match="backwards or is too long|names over"):
            expand(pattern)


def test_a_pattern_without_an_info_file_finds_its_validation_split_by_name(tmp_path, written):
    for shard in written[1].glob("*.tar"):  # the shards alone, as another tool would leave them
        (tmp_path / shard.name).write_bytes(shard.read_bytes())
    pattern = str(tmp_path / "train-{000000..000003}.tar")
    assert [p.name for p in shards.locate(pattern)[1]] == ["val-000000.tar", "val-000001.tar"]
    train = data.load_split(pattern, "train")
    assert train.classes == ["0", "1", "2"]
    assert torch.equal(train.targets, shards.load_shards(str(written[1]), "train").targets)
    with pytest.raises(DataError, match="not there"):
        data.check_data(str(tmp_path / "train-{000000..000009}.tar"))
    for shard in tmp_path.glob("val-*"):
        shard.unlink()
    with pytest.raises(DataError, match="no validation shards.*val-"):
        data.check_data(pattern)


def test_shards_that_are_compressed_truncated_or_mislabelled_are_refused(tmp_path):
    import gzip

    (tmp_path / "c.tar").write_bytes(gzip.compress(b"\0" * 10240))
    cases = {"c.tar": "not an uncompressed tar",
             "nocls.tar": "no .cls member", "huge.tar": "not a class index",
             "cut.tar": "truncated"}
    write_tar(tmp_path / "nocls.tar", [("a.jpg", b"abc")])
    write_tar(tmp_path / "huge.tar", [("a.jpg", b"abc"), ("a.cls", b"10000000000000000000000")])
    whole = write_tar(tmp_path / "whole.tar",
                      [(f"{k}.{s}", b"1") for k in "ab" for s in ("jpg", "cls")])
    (tmp_path / "cut.tar").write_bytes(whole.read_bytes()[:2048])  # a sample's end, no more
    for name, message in cases.items():
        with pytest.raises(DataError, match=message):
            shards.read_headers(tmp_path / name)


def test_an_info_file_naming_files_outside_its_folder_is_refused(tmp_path, written):
    outside = tmp_path / "elsewhere.tar"
    outside.write_bytes((written[1] / "train-000000.tar").read_bytes())
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "linked.tar").symlink_to(outside)
    for names in (["../elsewhere.tar"], [str(outside)], ["linked.tar"]):
        info = {"splits": {"train": {"filenames": names}, "val": {"filenames": names}}}
        (tmp_path / "shards" / "_info.json").write_text(json.dumps(info))
        with pytest.raises(DataError, match="names a file outside"):
            data.check_data(str(tmp_path / "shards"))


def test_the_command_writes_the_shards_and_a_second_run_changes_nothing(tmp_path, written,
                                                                        capsys):
    folder, out = written[0], tmp_path / "out"
    assert main(["shard", str(folder), str(out), "--samples-per-shard", "3", "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "3 classes; train: 12 images in 4 shard(s), val: 6 images in 2 shard(s)" in said
    assert all((out / f).read_bytes() == (written[1] / f).read_bytes()
               for f in ("train-000001.tar", "val-000001.tar"))
    times = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert main(["shard", str(folder), str(out), "--samples-per-shard", "3", "--quiet"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == times


def test_an_interrupted_run_keeps_its_complete_shards_and_finishes(tmp_path, written,
                                                                   monkeypatch):
    folder, reference, _ = written
    reads, real = [], sharding._read

    def stops_at_the_eighth(path):
        reads.append(path)
        if len(reads) == 8:
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(sharding, "_read", stops_at_the_eighth)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        sharding.write_shards(folder, out, samples_per_shard=3, threads=1, progress=False)
    assert sorted(p.name for p in out.glob("*.tar")) == ["train-000000.tar", "train-000001.tar"]
    assert not (out / "_info.json").exists()
    (out / ".train-000002.tar.0123456789ab.tmp").write_bytes(b"left by a killed run")
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tar")}
    monkeypatch.setattr(sharding, "_read", real)
    sharding.write_shards(folder, out, samples_per_shard=3, threads=1, progress=False)
    assert {name: (out / name).stat().st_mtime_ns for name in kept} == kept  # not written again
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    assert all((out / p.name).read_bytes() == p.read_bytes() for p in reference.glob("*.tar"))


def test_wrong_input_and_a_crowded_out_are_refused_naming_the_fix(tmp_path, written, capsys):
    def refused(*argv: str) -> str:
        assert main(["shard", *argv, "--quiet"]) == 2
        return capsys.readouterr().err

    assert "no such folder" in refused(str(tmp_path / "none"), str(tmp_path / "o"))
    (tmp_path / "flat" / "cat").mkdir(parents=True)
    assert "has no train/ subdirectory" in refused(str(tmp_path / "flat"), str(tmp_path / "o"))
    for split in ("train", "val"):
        (tmp_path / "flat" / split / "cat").mkdir(parents=True)
    empty = refused(str(tmp_path / "flat"), str(tmp_path / "o"))
    assert "holds no images" in empty
    assert "has no train/ subdirectory" in refused(str(written[1]), str(tmp_path / "o"))
    inside = refused(str(written[0]), str(written[0] / "train" / "out"))
    assert "inside the folder being sharded" in inside
    with pytest.raises(ConfigError, match="samples_per_shard must be > 0"):
        sharding.write_shards(written[0], tmp_path / "o", samples_per_shard=0)
    assert not (tmp_path / "o").exists()
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert "not vitzoo's shards (notes.txt)" in refused(str(written[0]), str(out))
    assert main(["shard", str(written[0]), str(out), "--quiet", "--overwrite"]) == 0
    assert "--overwrite" in refused(str(written[0]), str(out), "--samples-per-shard", "5")
    assert main(["shard", str(written[0]), str(out), "--quiet", "--samples-per-shard", "5",
                 "--overwrite"]) == 0
    assert sorted(p.name for p in out.glob("*.tar")) == [
        "train-000000.tar", "train-000001.tar", "train-000002.tar", "val-000000.tar",
        "val-000001.tar"]
    assert (out / "notes.txt").read_text() == "mine"


def test_the_help_says_what_the_command_does(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["shard", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith("usage: vitzoo shard")
    for words in ("--shard-size-mb", "--samples-per-shard", "--overwrite", "--threads",
                  "_info.json", "resumes", "timm", "--data OUT"):
        assert words in out, words


def test_the_benchmarks_count_the_images_of_shards(written):
    from benchmarks.training import dataset_images

    out = written[1]
    assert dataset_images({"data": str(out)}) == (12, 6)
    assert dataset_images({"data": str(out / "train-{000000..000001}.tar")}) == (6, 6)
    assert dataset_images({"data": "/no/such/train-{000..009}.tar"}) == (1_281_167, 50_000)
