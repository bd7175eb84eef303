"""Datasets: Fashion-MNIST's idx files, synthetic data, image folders, reproducible augmentation,
the global-batch sampler, normalisation, batch mixing."""

import gzip

import pytest
import torch

from vitzoo import data
from vitzoo.data import folders
from vitzoo.errors import DataError
from vitzoo.train import GlobalBatchSampler


@pytest.mark.skipif(not all((folders.SYSTEM_FASHION_MNIST / f"{n}.gz").is_file()
                            for n in folders.FASHION_FILES), reason="dataset-fashion-mnist missing")
def test_fashion_mnist_from_the_debian_package():
    folders._tensor_split.cache_clear()  # read the files in this test
    train, test = (data.load_split("fashion-mnist", split) for split in ("train", "test"))
    assert len(train) == 60_000 and len(test) == 10_000
    image, label = train[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.uint8 and 0 <= label < 10
    assert sorted(train.targets.unique().tolist()) == list(range(10))
    info = data.data_info("fashion-mnist", train)
    assert info.num_classes == 10 and info.in_chans == 1 and info.mean == (0.2860,)
    pixels = train.images.float() / 255  # the recorded statistics are the training set's
    assert abs(pixels.mean().item() - 0.2860) < 1e-3 and abs(pixels.std().item() - 0.3530) < 1e-3


def write_fashion(folder, images, labels=bytes(range(6))):
    folder.mkdir()
    for prefix in ("train", "t10k"):
        count = len(labels).to_bytes(4, "big")
        header = (2051).to_bytes(4, "big") + count + (28).to_bytes(4, "big") * 2
        (folder / f"{prefix}-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(header + images.numpy().tobytes()))
        (folder / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(
            gzip.compress((2049).to_bytes(4, "big") + count + labels))


def test_fashion_mnist_from_a_data_dir_and_a_truncated_file_refused(tmp_path):
    images = torch.randint(0, 255, (6, 28, 28), dtype=torch.uint8)
    write_fashion(tmp_path / "fm", images)
    train = data.load_split("fashion-mnist", "train", tmp_path / "fm")
    assert torch.equal(train.images[:, 0], images) and train.targets.tolist() == list(range(6))
    other = torch.randint(0, 255, (6, 28, 28), dtype=torch.uint8)  # another folder: its own
    write_fashion(tmp_path / "fm2", other)
    assert torch.equal(data.load_split("fashion-mnist", "train", tmp_path / "fm2").images[:, 0],
                       other)
    write_fashion(tmp_path / "short", images[:5], bytes(range(6)))  # counts 6, holds 5
    with pytest.raises(DataError, match="truncated or not an idx file.*--download"):
        data.load_split("fashion-mnist", "train", tmp_path / "short")


def test_missing_and_malformed_data_are_named(tmp_path):
    with pytest.raises(DataError, match="none lacks train-images-idx3-ubyte.gz.*--download"):
        data.check_data("fashion-mnist", tmp_path / "none")
    (tmp_path / "folder" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "folder" / "val" / "cat").mkdir(parents=True)
    with pytest.raises(DataError, match="cat holds no images"):
        data.check_data(str(tmp_path / "folder"))


def test_an_image_folder_is_read_with_its_classes_each_file_once(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for c, color in (("a", 0), ("b", 255)):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (40, 30), (color,) * 3).save(tmp_path / split / c / f"{i}.png")
    (tmp_path / "train" / "b" / "loop").symlink_to(tmp_path / "train")  # a link to an ancestor
    (tmp_path / "train" / "b" / "self").symlink_to(tmp_path / "train" / "b")
    data.check_data(str(tmp_path))
    train = data.load_split(str(tmp_path), "train")
    assert len(train) == 6 and data.data_info(str(tmp_path), train).num_classes == 2
    image, label = data.Transformed(train, data.build_transform((16, 16), None))[4]
    assert image.shape == (3, 16, 16) and image.dtype == torch.uint8 and label == 1


def test_synthetic_is_deterministic_and_learnable():
    a, b, test = (data.load_split("synthetic", split, img_size=(28, 28), in_chans=3, seed=1)
                  for split in ("train", "train", "test"))
    assert torch.equal(a[5][0], b[5][0]) and not torch.equal(a[5][0], test[5][0])
    assert a[5][0].shape == (3, 28, 28) and a[5][1] == 5 and a[15][1] == 5
    x, y = torch.stack([a[i][0] for i in range(40)]).float().flatten(1), a.targets[:40]
    d = torch.cdist(x, x)  # same class: closer than different classes
    assert d[y[:, None] == y[None, :]].mean() < d[y[:, None] != y[None, :]].mean()


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
    assert any(not torch.equal(ds[(e, 7)][0], first) for e in range(3, 8))  # other epochs


def test_the_classes_kept_are_renumbered_in_their_given_order():
    base = data.load_split("synthetic", "train", img_size=(8, 8))
    kept = data.keep_classes(base, (7, 2), "synthetic")
    assert len(kept) == 2_000 and set(kept.targets.tolist()) == {0, 1}
    assert [kept[i][1] for i in range(4)] == [1, 0, 1, 0] and torch.equal(kept[0][0], base[2][0])
    with pytest.raises(DataError, match="classes 0-9, not 10"):
        data.keep_classes(base, (10,), "synthetic")


def test_sampler_global_batches_do_not_depend_on_world_size():
    def global_batches(world, micro, start=0):
        per_rank = [list(GlobalBatchSampler(100, 16, micro, r, world, seed=0, epoch=1,
                                            start_step=start)) for r in range(world)]
        accum = 16 // world // micro
        return [sorted(k for r in range(world) for mb in per_rank[r][s * accum:(s + 1) * accum]
                       for k in mb) for s in range(len(per_rank[0]) // accum)]

    one = global_batches(1, 16)
    assert len(one) == 6  # 100 // 16, the incomplete last batch dropped
    assert global_batches(2, 8) == one and global_batches(4, 2) == one
    assert global_batches(1, 4) == one and global_batches(2, 4, start=2) == one[2:]
    assert all(epoch == 1 for batch in one for epoch, _ in batch)
    assert len({i for batch in one for _, i in batch}) == 96
    other_epoch = list(GlobalBatchSampler(100, 16, 16, 0, 1, seed=0, epoch=2))
    assert sorted(k[1] for k in other_epoch[0]) != sorted(k[1] for k in one[0])


def test_normalize_gray_to_rgb():
    images = torch.full((2, 1, 4, 4), 255, dtype=torch.uint8)
    x = data.Normalizer((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 3, images.device)(images)
    assert x.shape == (2, 3, 4, 4) and torch.allclose(x, torch.ones_like(x))


def test_mixup_cutmix_give_soft_labels():
    mixer = data.batch_mixer(data.Augment(mixup=0.2, cutmix=1.0), num_classes=10)
    _, y = mixer(torch.randn(8, 3, 8, 8), torch.arange(8))
    assert y.shape == (8, 10) and torch.allclose(y.sum(1), torch.ones(8))
    assert data.batch_mixer(data.Augment(), 10) is None
