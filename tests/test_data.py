"""Datasets: Fashion-MNIST from the Debian package, synthetic data, ImageFolder, reproducible
augmentation, the global-batch sampler, normalisation."""

import gzip

import pytest
import torch

from vitzoo import data
from vitzoo.data import folders
from vitzoo.errors import DataError
from vitzoo.train import GlobalBatchSampler

HAVE_FASHION = all((data.SYSTEM_FASHION_MNIST / f"{n}.gz").is_file() for n in data.FASHION_FILES)


@pytest.mark.skipif(not HAVE_FASHION, reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_from_the_debian_package():
    folders._tensor_split.cache_clear()  # read the files in this test, not from an earlier one
    train = data.load_split("fashion-mnist", "train")
    test = data.load_split("fashion-mnist", "test")
    assert len(train) == 60_000 and len(test) == 10_000
    image, label = train[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.uint8 and 0 <= label < 10
    assert sorted(train.targets.unique().tolist()) == list(range(10))
    info = data.data_info("fashion-mnist", train)
    assert info.num_classes == 10 and info.in_chans == 1 and info.mean == (0.2860,)
    # the recorded statistics are the training set's
    pixels = train.images.float() / 255
    assert abs(pixels.mean().item() - 0.2860) < 1e-3 and abs(pixels.std().item() - 0.3530) < 1e-3


def write_fashion_files(source, images):
    source.mkdir()
    for prefix, n in (("train", 6), ("t10k", 6)):
        header = (2051).to_bytes(4, "big") + n.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
        (source / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + images.numpy().tobytes()))
        labels = (2049).to_bytes(4, "big") + n.to_bytes(4, "big") + bytes([0, 1, 2, 3, 4, 5])
        (source / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))


def test_fashion_mnist_from_a_data_dir(tmp_path):
    images = torch.randint(0, 255, (6, 28, 28), dtype=torch.uint8)
    write_fashion_files(tmp_path / "fm", images)
    train = data.load_split("fashion-mnist", "train", tmp_path / "fm")
    assert len(train) == 6 and torch.equal(train.images[:, 0], images) and train.targets.tolist() == [0, 1, 2, 3, 4, 5]
    # another folder is read as itself, not served from the first one's images
    other = torch.randint(0, 255, (6, 28, 28), dtype=torch.uint8)
    write_fashion_files(tmp_path / "fm2", other)
    assert torch.equal(data.load_split("fashion-mnist", "train", tmp_path / "fm2").images[:, 0], other)


def test_missing_and_malformed_data(tmp_path):
    with pytest.raises(DataError, match="not a directory"):
        data.check_data("fashion-mnist", tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="incomplete"):
        data.check_data("fashion-mnist", tmp_path / "empty")
    with pytest.raises(DataError, match="cifar-10-batches-py"):
        data.check_data("cifar10", tmp_path / "empty")
    folder = tmp_path / "folder"
    (folder / "train" / "cat").mkdir(parents=True)
    (folder / "val" / "cat").mkdir(parents=True)
    with pytest.raises(DataError, match="holds no images"):
        data.check_data(str(folder), None)


def test_an_image_folder_is_read_with_its_classes(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for c, color in (("a", 0), ("b", 255)):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (40, 30), (color, color, color)).save(tmp_path / split / c / f"{i}.png")
    data.check_data(str(tmp_path))
    train = data.load_split(str(tmp_path), "train")
    assert len(train) == 6 and data.data_info(str(tmp_path), train).num_classes == 2
    ds = data.Transformed(train, data.build_transform((16, 16), None))
    image, label = ds[4]
    assert image.shape == (3, 16, 16) and image.dtype == torch.uint8 and label == 1


def test_synthetic_is_deterministic_and_learnable():
    a = data.load_split("synthetic", "train", img_size=(28, 28), in_chans=3, seed=1)
    b = data.load_split("synthetic", "train", img_size=(28, 28), in_chans=3, seed=1)
    test = data.load_split("synthetic", "test", img_size=(28, 28), in_chans=3, seed=1)
    assert torch.equal(a[5][0], b[5][0]) and not torch.equal(a[5][0], test[5][0])
    assert a[5][0].shape == (3, 28, 28) and a[5][1] == 5 and a[15][1] == 5
    # same class: closer than different classes
    x = torch.stack([a[i][0] for i in range(40)]).float().flatten(1)
    y = a.targets[:40]
    d = torch.cdist(x, x)
    same = d[y[:, None] == y[None, :]].mean()
    other = d[y[:, None] != y[None, :]].mean()
    assert same < other


def test_augmentation_depends_only_on_seed_epoch_and_index():
    base = data.load_split("synthetic", "train", img_size=(28, 28), in_chans=1)
    augment = data.Augment(random_resized_crop=0.3, hflip=True, randaugment=9, crop_padding=2)
    ds = data.Transformed(base, data.build_transform((28, 28), augment), seed=3)
    torch.manual_seed(0)
    first = ds[(2, 7)][0]
    state = torch.get_rng_state()
    torch.manual_seed(123)  # another global state does not matter
    assert torch.equal(ds[(2, 7)][0], first)
    torch.manual_seed(0)
    ds[(2, 7)]
    assert torch.equal(torch.get_rng_state(), state)  # and the global RNG is left as it was
    assert any(not torch.equal(ds[(e, 7)][0], first) for e in range(3, 8))  # other epochs: other crops


def test_sampler_global_batches_do_not_depend_on_world_size():
    def global_batches(world, micro, start=0):
        per_rank = [list(GlobalBatchSampler(100, 16, micro, r, world, seed=0, epoch=1, start_step=start)) for r in range(world)]
        accum = 16 // world // micro
        steps = len(per_rank[0]) // accum
        return [sorted(k for r in range(world) for mb in per_rank[r][s * accum:(s + 1) * accum] for k in mb)
                for s in range(steps)]

    one = global_batches(1, 16)
    assert len(one) == 6  # 100 // 16, the incomplete last batch dropped
    assert global_batches(2, 8) == one and global_batches(4, 2) == one and global_batches(1, 4) == one
    assert global_batches(2, 4, start=2) == one[2:]
    assert all(epoch == 1 for batch in one for epoch, _ in batch)
    assert len({i for batch in one for _, i in batch}) == 96
    other_epoch = list(GlobalBatchSampler(100, 16, 16, 0, 1, seed=0, epoch=2))
    assert sorted(k[1] for k in other_epoch[0]) != sorted(k[1] for k in one[0])


def test_normalize_gray_to_rgb():
    images = torch.full((2, 1, 4, 4), 255, dtype=torch.uint8)
    x = data.normalize(images, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), in_chans=3)
    assert x.shape == (2, 3, 4, 4) and torch.allclose(x, torch.ones_like(x))


def test_mixup_cutmix_give_soft_labels():
    mixer = data.batch_mixer(data.Augment(mixup=0.2, cutmix=1.0), num_classes=10)
    _, y = mixer(torch.randn(8, 3, 8, 8), torch.arange(8))
    assert y.shape == (8, 10) and torch.allclose(y.sum(1), torch.ones(8))
    assert data.batch_mixer(data.Augment(), 10) is None
