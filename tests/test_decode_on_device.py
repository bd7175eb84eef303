"""Image files decoded on the training device (`--decode device`): the workers read bytes and draw
each sample's crop and flip, the device decodes and applies them. On the CPU as the device it gives
the worker path's images to the bit, and a run trains the same; on CUDA it is close."""

import json
import pickle
from pathlib import Path

import pytest
import torch

import vitzoo
from vitzoo import data
from vitzoo.data.transforms import (EncodedSamples, collate_encoded, decode_batch, decode_jpegs,
                                    decode_rgb, device_ops, holds_files, jpeg_size, read_bytes)
from vitzoo.errors import ConfigError
from vitzoo.train import TrainConfig, Trainer, fit
from vitzoo.train.distributed import Env
from vitzoo.train.inputs import resolve_decode

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CROP_AND_FLIP = data.Augment(random_resized_crop=0.08, hflip=True)
TINY = dict(embed_dim=16, depth=1, num_heads=2, mlp_dim=32, img_size=16, patch_size=8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """An ImageFolder of 3 classes: JPEGs of several sizes (baseline, progressive, gray) and one
    PNG a class."""
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    g = torch.Generator().manual_seed(0)
    for split, count in (("train", 8), ("val", 3)):
        for c in range(3):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(count):
                smooth = torch.nn.functional.interpolate(
                    torch.rand(1, 3, 6, 8, generator=g), size=(40 + 6 * i, 56 - 3 * i),
                    mode="bilinear")[0]
                image = (smooth * 200 + torch.rand(smooth.shape, generator=g) * 55).to(torch.uint8)
                pixels = Image.fromarray(image.permute(1, 2, 0).numpy())
                if i == 0:
                    pixels.save(root / split / f"c{c}" / f"{i}.png")
                else:
                    (pixels.convert("L") if i == 3 else pixels).save(
                        root / split / f"c{c}" / f"{i}.jpg", quality=90, progressive=i == 2)
    return root


def test_a_jpegs_size_is_read_from_its_header_and_anything_else_is_none(folder):
    from PIL import Image

    for path in sorted(folder.glob("train/*/*")):
        size = jpeg_size(read_bytes(path))
        with Image.open(path) as image:
            assert size == (None if path.suffix == ".png" else image.size[::-1]), path
    whole = read_bytes(next(folder.glob("train/c0/1.jpg")))
    assert jpeg_size(whole[:20]) is None and jpeg_size(torch.zeros(0, dtype=torch.uint8)) is None


@pytest.mark.parametrize("augment", [CROP_AND_FLIP, data.Augment(hflip=True), None],
                         ids=["crop+flip", "flip", "evaluation"])
def test_on_the_cpu_the_device_path_gives_the_worker_paths_images_to_the_bit(folder, augment):
    """Through a subset and a class selection (labels renumbered), JPEGs, a progressive and a gray
    one, and PNGs (decoded in the worker), for training keys (epoch, index) and plain indices."""
    raw = data.load_split(str(folder), "train")
    raw = data.subset(data.keep_classes(raw, (2, 0), "folder"), 12, seed=1)
    worker = data.Transformed(raw, data.build_transform((24, 24), augment), seed=7)
    ops = device_ops(worker.transform)
    encoded = EncodedSamples(worker, ops)
    epochs = ([(3, i) for i in range(len(raw))], [(4, i) for i in range(len(raw))])
    for keys in epochs if augment else [list(range(len(raw)))]:
        batch = collate_encoded([encoded[k] for k in keys])
        images, labels = decode_batch(batch, ops, torch.device("cpu"))
        assert torch.equal(images, torch.stack([worker[k][0] for k in keys]))
        assert torch.equal(labels, torch.tensor([worker[k][1] for k in keys]))
        pngs = sum(jpeg_size(raw.encoded(i)[0]) is None for i in range(len(raw)))
        assert 0 < pngs == int((batch[2][:, -1] < 0).sum())  # PNGs: decoded in the worker
    if augment is CROP_AND_FLIP:  # the draws change with the epoch, as the worker path's do
        assert not torch.equal(collate_encoded([encoded[(3, i)] for i in range(4)])[2],
                               collate_encoded([encoded[(4, i)] for i in range(4)])[2])


def test_the_encoded_images_are_seen_through_subsets_and_class_selections(folder):
    raw = data.load_split(str(folder), "train")
    picked = data.subset(data.keep_classes(raw, (1, 2), "folder"), 10, seed=0)
    assert holds_files(picked)
    for i in range(len(picked)):
        assert picked.encoded(i)[1] == int(picked.targets[i])
        index = picked.dataset.indices[picked.indices[i]]
        assert torch.equal(picked.encoded(i)[0], raw.encoded(index)[0])
    assert not holds_files(data.subset(data.load_split("synthetic", "train", img_size=(8, 8)), 9))


def test_augmentations_the_device_does_not_apply_stay_in_the_workers():
    size = (16, 16)
    assert device_ops(data.build_transform(size, CROP_AND_FLIP)) is not None
    for augment in (data.Augment(crop_padding=2), data.Augment(randaugment=9),
                    data.Augment(hflip=True, randaugment=5)):
        assert device_ops(data.build_transform(size, augment)) is None


def test_a_jpeg_the_batched_decoder_refuses_is_decoded_alone(folder, monkeypatch):
    """One image the batched call cannot decode costs that image, not the batch: each is decoded
    alone, and one the decoder refuses outright goes to the CPU's decoder (PIL if need be)."""
    import torchvision.io

    encoded = [read_bytes(p) for p in sorted(folder.glob("train/c1/*.jpg"))]
    real = torchvision.io.decode_jpeg

    def refusing(data, *args, **kwargs):
        if isinstance(data, list) or data is encoded[1]:
            raise RuntimeError("nvjpeg refuses this one")
        return real(data, *args, **kwargs)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", refusing)
    images = decode_jpegs(encoded, torch.device("cpu"))
    assert all(torch.equal(image, decode_rgb(data)) for image, data in zip(images, encoded))


def test_decode_auto_is_the_device_on_cuda_for_image_files_and_workers_otherwise(folder):
    files = data.load_split(str(folder), "train")
    tensors = data.load_split("synthetic", "train", img_size=(8, 8))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_decode("auto", cuda, files) == "device"
    assert resolve_decode("auto", cpu, files) == "workers"
    assert resolve_decode("auto", cuda, tensors) == "workers"
    assert resolve_decode("workers", cuda, files) == "workers"
    assert resolve_decode("device", cpu, files) == "device"
    with pytest.raises(ConfigError, match="decode=workers"):
        resolve_decode("device", cpu, tensors, "synthetic")


def test_decode_is_one_of_auto_workers_or_device():
    with pytest.raises(ConfigError, match="decode='gpu' is not one of auto, workers, device"):
        TrainConfig(decode="gpu")


def test_a_short_run_trains_the_same_whether_workers_or_the_device_decode(folder, tmp_path):
    """Losses, validation, test and few-shot scores, and the weights: the same on the CPU."""
    summaries = {decode: fit(TrainConfig(
        model="vit_ti16", model_options=TINY, data=str(folder), batch_size=6, micro_batch=3,
        steps=4, lr=1e-3, warmup=1, log_every=1, checkpoint_every=0, random_resized_crop=0.08,
        hflip=True, val_size=3, eval_every=2, fewshot=(1,), precision="fp32", device="cpu",
        quiet=True, tensorboard=False, out=str(tmp_path / decode), decode=decode))
        for decode in ("workers", "device")}
    lines = {d: [json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text()
                 .splitlines()] for d in summaries}
    timings = ("images_per_s", "train_seconds")
    assert lines["device"] == [{**a, **{k: b[k] for k in timings if k in b}}
                               for a, b in zip(lines["workers"], lines["device"])]
    for key in ("final_loss", "test_top1", "test_loss", "val_top1", "fewshot"):
        assert summaries["device"][key] == summaries["workers"][key], key
    weights = [vitzoo.from_pretrained(tmp_path / d).state_dict() for d in summaries]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_run_with_loader_workers_decodes_on_the_device_from_their_bytes(folder, tmp_path):
    """Workers started as in training (persistent, forked) hand over bytes and draws."""
    config = TrainConfig(model="vit_ti16", model_options=TINY, data=str(folder), batch_size=6,
                         steps=2, random_resized_crop=0.5, hflip=True, num_workers=2,
                         decode="device", device="cpu", quiet=True, tensorboard=False)
    trainer = Trainer(config.resolved(), Env(0, 1, 0, torch.device("cpu")))
    assert trainer.inputs.train_on_device and "decoded on cpu" in trainer.inputs.describe()
    images, labels = next(trainer.inputs.micro_batches(0, trainer.steps_per_epoch))
    assert images.shape == (6, 3, 16, 16) and images.dtype == torch.uint8 and labels.shape == (6,)
    keys = next(iter(trainer.inputs.sampler))
    assert torch.equal(images, torch.stack([trainer.inputs.train_set[k][0] for k in keys]))


@CUDA
def test_on_cuda_the_device_path_is_close_to_the_workers_images(folder):
    """nvJPEG and the float resize round otherwise than libjpeg-turbo and the uint8 resize."""
    raw = data.load_split(str(folder), "train")
    worker = data.Transformed(raw, data.build_transform((24, 24), CROP_AND_FLIP), seed=7)
    ops = device_ops(worker.transform)
    keys = [(0, i) for i in range(len(raw))]
    batch = collate_encoded([EncodedSamples(worker, ops)[k] for k in keys])
    images, _ = decode_batch(batch, ops, torch.device("cuda"))
    expected = torch.stack([worker[k][0] for k in keys])
    assert images.device.type == "cuda"
    difference = (images.cpu().float() - expected.float()).abs()
    assert difference.mean() < 2.0 and difference.max() <= 64, (difference.mean(), difference.max())


def test_the_workers_datasets_pickle_for_workers_started_by_a_fork_server(folder):
    worker = data.Transformed(data.load_split(str(folder), "train"),
                              data.build_transform((24, 24), CROP_AND_FLIP), seed=7)
    samples = EncodedSamples(worker, device_ops(worker.transform))
    copied = pickle.loads(pickle.dumps(samples))
    assert torch.equal(copied[(2, 5)][0], samples[(2, 5)][0])
    assert copied[(2, 5)][2] == samples[(2, 5)][2]
