"""`--download`: the named datasets fetched through torchvision's own classes from a loopback
mirror (tiny archives made here, their MD5s set on the class), verified and loaded; missing,
corrupt and unreachable files named with the folder to put them in; near-miss names."""

import functools
import gzip
import hashlib
import http.server
import io
import pickle
import socket
import tarfile
import threading

import numpy as np
import pytest
import torch
import torchvision.datasets as tvd

from vitzoo import data
from vitzoo.cli import main
from vitzoo.data import folders
from vitzoo.errors import DataError


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def mirror(tmp_path, monkeypatch, data_cache):
    """(folder, URL) of a loopback HTTP server; a clean cache, no Debian package."""
    files = tmp_path / "mirror"
    files.mkdir()
    monkeypatch.setattr(folders, "SYSTEM_FASHION_MNIST", tmp_path / "no-debian-package")
    folders._tensor_split.cache_clear()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(files)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    yield files, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    folders._tensor_split.cache_clear()


def serve_fashion(files, url, monkeypatch, train=12, test=6):
    rng = np.random.default_rng(0)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (train, 28, 28)),
              "train-labels-idx1-ubyte": np.arange(train) % 10,
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (test, 28, 28)),
              "t10k-labels-idx1-ubyte": np.arange(test) % 10}
    for name, array in arrays.items():
        magic = 2051 if array.ndim == 3 else 2049
        header = b"".join(n.to_bytes(4, "big") for n in (magic, *array.shape))
        (files / f"{name}.gz").write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))
    monkeypatch.setattr(tvd.FashionMNIST, "mirrors", [url])
    monkeypatch.setattr(tvd.FashionMNIST, "resources",
                        [(f"{n}.gz", md5(files / f"{n}.gz")) for n in arrays])
    return arrays


def serve_cifar10(files, url, monkeypatch, per_batch=4):
    """cifar-10-python.tar.gz: five training batches and a test batch of `per_batch` images."""
    folder = files / "build" / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(names):
        (folder / name).write_bytes(pickle.dumps({
            "data": rng.integers(0, 256, (per_batch, 3072)).astype(np.uint8),
            "labels": [(i + j) % 10 for j in range(per_batch)]}))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": list("abcdefghij")}))
    with tarfile.open(files / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    for attribute, value in (
            ("url", url + "cifar-10-python.tar.gz"),
            ("tgz_md5", md5(files / "cifar-10-python.tar.gz")),
            ("train_list", [[n, md5(folder / n)] for n in names[:5]]),
            ("test_list", [["test_batch", md5(folder / "test_batch")]]),
            ("meta", {"filename": "batches.meta", "key": "label_names",
                      "md5": md5(folder / "batches.meta")})):
        monkeypatch.setattr(tvd.CIFAR10, attribute, value)


def test_fashion_mnist_downloads_into_the_cache_and_loads(mirror, monkeypatch, tmp_path):
    arrays = serve_fashion(*mirror, monkeypatch)
    with pytest.raises(DataError, match="--download") as missing:
        data.check_data("fashion-mnist")
    assert "lacks train-images-idx3-ubyte.gz" in str(missing.value)
    assert str(tmp_path / "cache" / "datasets") in str(missing.value)
    train = data.load_split("fashion-mnist", "train", download=True)
    test = data.load_split("fashion-mnist", "test")  # there now: no download needed
    raw = tmp_path / "cache" / "datasets" / "FashionMNIST" / "raw"
    assert (raw / "train-images-idx3-ubyte").is_file() and len(train) == 12 and len(test) == 6
    assert train[3][0].shape == (1, 28, 28) and train[3][1] == 3
    assert torch.equal(train.images[:, 0],
                       torch.from_numpy(arrays["train-images-idx3-ubyte"].astype(np.uint8)))
    assert data.data_info("fashion-mnist", train).num_classes == 10


def test_cifar10_downloads_verifies_and_loads_and_names_corrupt_files(mirror, monkeypatch,
                                                                    tmp_path):
    files, url = mirror
    serve_cifar10(files, url, monkeypatch)
    root = tmp_path / "root"
    with pytest.raises(DataError, match="cifar10 in .*not found.*--download") as missing:
        data.check_data("cifar10", root)
    assert f"CIFAR10's archives in {root} first" in str(missing.value)
    train = data.load_split("cifar10", "train", root, download=True)
    test = data.load_split("cifar10", "test", root)
    assert (root / "cifar-10-batches-py" / "test_batch").is_file()
    assert len(train) == 20 and len(test) == 4 and test.targets.tolist() == [5, 6, 7, 8]
    assert train[0][0].shape == (3, 32, 32) and train[0][0].dtype == torch.uint8
    assert data.data_info("cifar10", train).in_chans == 3
    folders._tensor_split.cache_clear()  # a batch file damaged after extraction: named
    (root / "cifar-10-batches-py" / "data_batch_2").write_bytes(b"garbage")
    with pytest.raises(DataError, match=f"cifar10 in {root}: .*corrupted.*--download"):
        data.load_split("cifar10", "train", root)
    monkeypatch.setattr(tvd.CIFAR10, "tgz_md5", "0" * 32)  # a download that fails its checksum
    with pytest.raises(DataError, match="cifar10 in .*corrupted.*--download"):
        data.check_data("cifar10", tmp_path / "other", download=True)


def test_offline_the_error_names_the_files_and_the_folder(mirror, monkeypatch, tmp_path):
    files, url = mirror
    serve_fashion(files, url, monkeypatch)
    for f in files.glob("*.gz"):  # the mirror answers 404: as good as offline
        f.unlink()
    root = tmp_path / "root"
    with pytest.raises(DataError) as error:
        data.check_data("fashion-mnist", root, download=True)
    assert str(error.value).startswith(f"fashion-mnist in {root}: Error downloading train-images")
    assert f"archives in {root / 'FashionMNIST' / 'raw'} first" in str(error.value)
    with socket.socket() as s:  # nothing listening at all
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setattr(tvd.CIFAR10, "url", f"http://127.0.0.1:{closed}/cifar-10-python.tar.gz")
    with pytest.raises(DataError, match="cifar10 in .*refused.*offline, put .*CIFAR10's archives"):
        data.check_data("cifar10", root, download=True)
    # the archive put by hand where the error says: --download verifies and extracts it
    serve_cifar10(files, url, monkeypatch)
    (root / "cifar-10-python.tar.gz").write_bytes((files / "cifar-10-python.tar.gz").read_bytes())
    (files / "cifar-10-python.tar.gz").unlink()
    assert len(data.load_split("cifar10", "test", root, download=True)) == 4


def test_near_misses_are_named_and_the_transfer_datasets_say_where_to_put_them(tmp_path,
                                                                              data_cache):
    for wrong, right in [("fashion_mnist", "fashion-mnist"), ("cifar-10", "cifar10"),
                         ("oxford_pets", "oxford-pets"), ("flowers-102", "flowers102")]:
        with pytest.raises(DataError, match=f"unknown dataset '{wrong}'.*Did you mean '{right}'"):
            data.check_data(wrong)
    with pytest.raises(DataError) as pets:
        data.check_data("oxford-pets")
    pets_folder = tmp_path / "cache" / "datasets" / "oxford-iiit-pet"
    assert "oxford-pets in " in str(pets.value) and "not found" in str(pets.value)
    assert f"OxfordIIITPet's archives in {pets_folder} first" in str(pets.value)
    with pytest.raises(DataError, match="flowers102 in .*--download.*Flowers102's archives"):
        data.check_data("flowers102")


def tar_gz(path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


def test_oxford_pets_and_flowers102_download_and_load(mirror, monkeypatch, tmp_path):
    from PIL import Image
    from scipy.io import savemat

    files, url = mirror
    images = []
    for i in range(6):
        buffer = io.BytesIO()
        Image.new("RGB", (20 + i, 16), (10 * i, 0, 0)).save(buffer, format="JPEG")
        images.append(buffer.getvalue())
    ids = ["Abyssinian_1", "Abyssinian_2", "beagle_1", "beagle_2", "Abyssinian_3", "beagle_3"]
    tar_gz(files / "images.tar.gz", {f"images/{i}.jpg": jpeg for i, jpeg in zip(ids, images)})
    lines = [f"{i} {1 if i.startswith('A') else 2} 1 1\n" for i in ids]
    tar_gz(files / "annotations.tar.gz", {"annotations/trainval.txt": "".join(lines[:4]).encode(),
                                          "annotations/test.txt": "".join(lines[4:]).encode()})
    monkeypatch.setattr(tvd.OxfordIIITPet, "_RESOURCES", tuple(
        (url + n, md5(files / n)) for n in ("images.tar.gz", "annotations.tar.gz")))
    train = data.load_split("oxford-pets", "train", download=True)
    assert len(train) == 4 and len(data.load_split("oxford-pets", "test")) == 2
    assert train.targets.tolist() == [0, 0, 1, 1] and train[2][1] == 1
    assert train[2][0].shape == (3, 16, 22) and train[2][0].dtype == torch.uint8
    assert data.data_info("oxford-pets", train).classes == ("Abyssinian", "Beagle")
    # Flowers-102: vitzoo's "train" is torchvision's train + val
    tar_gz(files / "102flowers.tgz", {f"jpg/image_{k:05d}.jpg": j for k, j in enumerate(images, 1)})
    savemat(files / "imagelabels.mat", {"labels": np.array([[1, 2, 3, 1, 2, 3]])})
    savemat(files / "setid.mat", {"trnid": np.array([[1, 2]]), "valid": np.array([[3, 4]]),
                                  "tstid": np.array([[5, 6]])})
    monkeypatch.setattr(tvd.Flowers102, "_download_url_prefix", url)
    monkeypatch.setattr(tvd.Flowers102, "_file_dict", {k: (n, md5(files / n)) for k, n in (
        ("image", "102flowers.tgz"), ("label", "imagelabels.mat"), ("setid", "setid.mat"))})
    train = data.load_split("flowers102", "train", tmp_path / "fl", download=True)
    assert len(train) == 4 and len(data.load_split("flowers102", "test", tmp_path / "fl")) == 2
    assert train.targets.tolist() == [0, 1, 2, 0] and train[2][0].shape == (3, 16, 22)
    assert len(data.data_info("flowers102", train).classes) == 102


def test_the_cli_downloads_with_download_and_suggests_names(mirror, monkeypatch, tmp_path, capsys):
    serve_cifar10(*mirror, monkeypatch, per_batch=8)
    tiny = ["vit_ti16", "--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--mlp-dim", "32",
            "--img-size", "32", "--patch-size", "8", "--batch-size", "8", "--steps", "2",
            "--quiet", "--no-tensorboard", "--device", "cpu"]
    cifar = ["--data", "cifar10", "--data-dir", str(tmp_path / "root")]
    assert main(["train", *tiny, *cifar, "--out", str(tmp_path / "a")]) == 2
    assert "run with --download" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert main(["train", *tiny, *cifar, "--download", "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "summary.json").is_file()
    assert main(["train", *tiny, "--data", "fashion_mnist", "--out", str(tmp_path / "c")]) == 2
    assert "Did you mean 'fashion-mnist'?" in capsys.readouterr().err


def test_only_the_first_process_downloads(mirror, monkeypatch, tmp_path):
    """Under torchrun rank 0 fetches the files while the others wait: two processes writing one
    archive would corrupt it."""
    from vitzoo.train.inputs import check_data
    from vitzoo.train.config import TrainConfig
    from vitzoo.train.distributed import Env

    serve_cifar10(*mirror, monkeypatch)
    cfg = TrainConfig(data="cifar10", data_dir=str(tmp_path / "root"), download=True)
    with pytest.raises(DataError, match="cifar10 in .*--download"):
        check_data(cfg, Env(rank=1, world_size=1, local_rank=1, device=torch.device("cpu")))
    assert not (tmp_path / "root" / "cifar-10-python.tar.gz").exists()
    check_data(cfg, Env(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
    assert (tmp_path / "root" / "cifar-10-batches-py" / "data_batch_1").is_file()
