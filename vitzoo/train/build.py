"""What a run is built from, by its TrainConfig: the data splits (validation held out, limits applied),
the model (named, or pretrained, with the dataset's classes, channels and normalisation), the
optimizer (weight decay on matrices only) and the numeric precision (the autocast dtype).

`Trainer` calls these in its set-up; each is a function of the config (and the dataset's facts, the
model or the device), so that a test or a script builds what a run would, without running it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch.utils.data import Dataset

import vitzoo
from vitzoo import data as datasets
from vitzoo import precision
from vitzoo.errors import ConfigError
from vitzoo.registry import shape_differences
from vitzoo.train import distributed
from vitzoo.train.config import TrainConfig
from vitzoo.train.groups import parameter_groups
from vitzoo.weights.layout import HUB_PREFIX


def pretrained_kind(source: str) -> str:
    """What `--pretrained` names: "directory" (save_pretrained's), "file" (weights of any format), "hub"
    (hf-hub:ORG/NAME[@REV]) or "tag" (MODEL.TAG[@REV], `vitzoo list --pretrained`); an error otherwise."""
    if os.path.isdir(source):
        return "directory"
    if os.path.isfile(source):
        return "file"
    if source.startswith(HUB_PREFIX):
        return "hub"
    if source.split("@")[0] in vitzoo.list_pretrained():
        return "tag"
    raise FileNotFoundError(f"--pretrained {source}: no such file or directory, and no pretrained tag of that name "
                            f"(MODEL.TAG: `vitzoo list --pretrained`; a Hub repo: {HUB_PREFIX}ORG/NAME)")


def resolve_model(cfg: TrainConfig) -> vitzoo.Resolved:
    """The model a run trains, worked out once: the named model with the user's options, or the weights
    `--pretrained` names (a tag's or a Hub repo's downloaded once) with them; nothing is built yet."""
    options = {k: v for k, v in cfg.model_options.items() if k != "num_classes"}  # the dataset decides them
    kind = pretrained_kind(cfg.pretrained) if cfg.pretrained else None
    if kind in ("directory", "hub"):
        resolved = vitzoo.resolve_source(cfg.pretrained, **options)
        if kind == "directory" and cfg.model in vitzoo.list_models():  # the name is then only a label
            named = vitzoo.get_config(cfg.model, **options)
            differ = shape_differences(resolved.config, named)
            if differ:
                warnings.warn(f"--pretrained {cfg.pretrained} holds another model than {cfg.model}: {', '.join(differ)}; "
                              "training the saved model", stacklevel=2)
        return resolved
    if kind == "tag":
        return vitzoo.resolve(cfg.pretrained, pretrained=True, **options)
    return vitzoo.resolve(cfg.model, pretrained=cfg.pretrained or None, **options)


def dataset_config(cfg: TrainConfig, info: datasets.DataInfo, resolved: vitzoo.Resolved) -> vitzoo.ViTConfig:
    """The resolved model's config with what the dataset decides: the classes always; a model trained
    from scratch also takes the dataset's channels and normalisation (recorded in its config) unless
    the user set them, a pretrained one keeps its own."""
    given, base = cfg.model_options, resolved.config
    if given.get("num_classes", info.num_classes) != info.num_classes:
        raise ConfigError(f"num_classes={given['num_classes']} but {cfg.data} has {info.num_classes} classes")
    changes: dict[str, Any] = {"num_classes": info.num_classes}
    if not cfg.pretrained:
        in_chans = given.get("in_chans", info.in_chans)
        changes["in_chans"] = in_chans
        for key in ("mean", "std"):
            value = getattr(info, key)
            changes[key] = given.get(key, tuple(value) * in_chans if len(value) == 1 else tuple(value))
    return base.replace(**changes)


def check_data(cfg: TrainConfig, env: distributed.Env) -> None:
    """A DataError unless the dataset can be read, before any work. With `download`, the first process
    fetches what is missing while the others wait (one download into a shared folder), then all check it."""
    if cfg.download and env.is_main:
        datasets.check_data(cfg.data, cfg.data_dir, download=True)
    if cfg.download:
        distributed.barrier(env)
    datasets.check_data(cfg.data, cfg.data_dir)


def load_splits(cfg: TrainConfig, base: vitzoo.ViTConfig) -> tuple[Dataset, Dataset | None, Dataset, datasets.DataInfo]:
    """The raw train, validation (or None) and test splits, cut to their limits, and the dataset's info."""
    train_raw = datasets.load_split(cfg.data, "train", cfg.data_dir, img_size=base.img_size, in_chans=base.in_chans, seed=cfg.seed)
    test_raw = datasets.load_split(cfg.data, "test", cfg.data_dir, img_size=base.img_size, in_chans=base.in_chans, seed=cfg.seed)
    info = datasets.data_info(cfg.data, train_raw, base.in_chans)
    if cfg.classes is not None:  # before the validation split and the limits: they count the kept images
        train_raw, test_raw, info = (*(datasets.keep_classes(s, cfg.classes, cfg.data) for s in (train_raw, test_raw)),
                                     datasets.classes_kept(info, cfg.classes))
    if cfg.val_size and len(train_raw) - cfg.val_size < cfg.batch_size:
        raise ConfigError(f"val_size={cfg.val_size} leaves {max(0, len(train_raw) - cfg.val_size)} of the {len(train_raw)} "
                          f"training images, fewer than one batch ({cfg.batch_size}); lower --val-size or --batch-size")
    # held out before train_limit, so that the training subsets of one seed are nested and never validate
    train_raw, val_raw = datasets.split_validation(train_raw, cfg.val_size)
    train_raw = datasets.subset(train_raw, cfg.train_limit, cfg.seed)
    if val_raw is not None and cfg.train_limit and cfg.train_limit > len(train_raw):
        warnings.warn(f"train_limit={cfg.train_limit} is more than the {len(train_raw)} training images left beside the "
                      f"validation split (val_size={cfg.val_size}): training on all {len(train_raw)}", stacklevel=3)
    return train_raw, val_raw, datasets.subset(test_raw, cfg.test_limit, cfg.seed), info


def build_model(cfg: TrainConfig, resolved: vitzoo.Resolved, config: vitzoo.ViTConfig,
                labels: tuple[str, ...] | None = None) -> vitzoo.VisionTransformer:
    """The model to train: `resolved` (`resolve_model`) built with `config` (`dataset_config`); `labels`:
    the dataset's class names, saved with it (predict prints them)."""
    model = resolved.build(config)
    if cfg.reset_head:
        model.reset_classifier(config.num_classes, head="linear")  # zero-initialised
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if cfg.store_attention_probabilities:
        model.set_attention_probabilities_stored(True)
    if labels is not None:
        model.labels = list(labels)
    return model


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """Weight decay on matrices only: not on biases, norms, the class token or position embeddings; with
    `layer_decay`, a group per depth whose "lr_scale" the loop multiplies into the rate
    (vitzoo.train.groups: timm's groups of the same model)."""
    groups = parameter_groups(model, cfg.weight_decay, cfg.layer_decay)
    # the fused kernels update every parameter in one pass over memory (CUDA and CPU have them); the
    # default for-loop over parameters re-reads the optimizer state several times per step
    fused = {"fused": True} if device.type in ("cuda", "cpu") else {}
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **fused)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **fused)


def has_running_statistics(model: torch.nn.Module) -> bool:
    """Whether the model has buffers that training changes (BatchNorm's running statistics), which DDP
    must broadcast from rank 0 every forward pass. vitzoo's own buffers are constant (the relative
    position index, made from the grid alike on every rank): broadcasting them would only cost time."""
    return any(getattr(m, "running_mean", None) is not None for m in model.modules())


def resumed_precision(saved: str | None, resolved: torch.dtype | None, device: torch.device,
                      say=lambda message: None) -> torch.dtype | None:
    """The precision a resumed run computes in: the one its checkpoint was written in (`saved`, a fixed
    --precision value; None for checkpoints written before it was stored), whatever this device would
    choose now (`resolved`). A run requeued from an H100 (bf16) onto a V100 (fp16) otherwise changes its
    numbers mid-run and finds no loss scaler state to resume; fp16 where CUDA is missing cannot go on."""
    if saved is None or precision.FIXED[saved] == resolved:
        return resolved
    if saved == "fp16" and device.type != "cuda":
        raise ConfigError(f"the checkpoint was trained in fp16, which needs CUDA, and this run is on {device}: resume it "
                          "on a GPU, or start a new run")
    now = precision.flag(resolved)
    slow = " (emulated on this GPU: slower)" if saved == "bf16" and device.type == "cuda" and precision.gpu_half(device) != torch.bfloat16 else ""
    say(f"resuming in {saved}, the precision the checkpoint was trained in, not {now}, which {device} would choose{slow}")
    return precision.FIXED[saved]


__all__ = ["build_model", "build_optimizer", "check_data", "dataset_config", "has_running_statistics", "load_splits",
           "resolve_model", "resumed_precision"]
