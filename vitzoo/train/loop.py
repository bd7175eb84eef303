"""`fit(TrainConfig)`: the training loop, top to bottom.

1. check everything cheap (data, run directory, batch arithmetic) before any work;
2. build data, model, optimizer, schedule; resume from the last checkpoint if asked;
3. loop: accumulate gradients over micro-batches, agree across processes on the loss, clip, step; read
   the steps' losses (on the device until then) when logging, evaluating or checkpointing, and stop on a
   non-finite one; log, evaluate, checkpoint; SIGINT / SIGTERM end the loop with a checkpoint;
4. evaluate, save the model (save_pretrained) and summary.json.

The global batch is `batch_size` whatever the number of processes: each optimizer step consumes one
global batch of the epoch's permutation, split into `world_size` equal shares, each share into
micro-batches (gradient accumulation). One process with accumulation and N processes compute the
same mean gradient, up to float rounding.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler

import vitzoo
from vitzoo import data as datasets
from vitzoo.config import SHAPE_OPTIONS, ConfigError, shape_differences
from vitzoo.evaluate import (
    classification_sums,
    eval_loader,
    extract_features,
    fewshot_linear_accuracy,
    metrics_from_sums,
)
from vitzoo.io import write_text
from vitzoo.precision import autocast, sum_dtype
from vitzoo.train import distributed, state
from vitzoo.train.config import RESUMABLE_CHANGES, TrainConfig
from vitzoo.train.schedule import Schedule
from vitzoo.weights.files import CONFIG_NAME, read_config, save_pretrained


# steps whose loss and gradient norm may wait on the device before they are read (and checked)
MAX_UNREAD_STEPS = 100


class TrainingDiverged(RuntimeError):
    """The loss (or gradient norm) became NaN or infinite. `inputs` is True when the normalised images
    themselves were not finite: the data or its mean/std, not the optimisation, is at fault."""

    def __init__(self, message: str, inputs: bool = False) -> None:
        super().__init__(message)
        self.inputs = inputs


def loss_fn(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Cross-entropy in float32; `targets` are class indices or (MixUp / CutMix) probabilities."""
    return F.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)


class GlobalBatchSampler(Sampler):
    """Micro-batches of keys (epoch, index) for one process.

    Epoch e's order is a permutation seeded by (seed, e), cut into global batches of `global_batch`
    (an incomplete last batch is dropped). Process `rank` takes the rank-th of `world_size` equal
    contiguous shares of each global batch, in micro-batches of `micro_batch`. The global batches do
    not depend on the world size, and `start_step` skips the steps already done (resume).
    """

    def __init__(self, size: int, global_batch: int, micro_batch: int, rank: int, world_size: int, seed: int,
                 epoch: int, start_step: int = 0) -> None:
        self.size, self.global_batch, self.micro_batch = size, global_batch, micro_batch
        self.rank, self.world_size, self.seed, self.epoch, self.start_step = rank, world_size, seed, epoch, start_step
        self.steps = size // global_batch

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Continue with this epoch's order from `start_step` (one loader, its workers kept, serves every epoch)."""
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        return (self.steps - self.start_step) * (self.global_batch // self.world_size // self.micro_batch)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=g).tolist()
        share = self.global_batch // self.world_size
        for step in range(self.start_step, self.steps):
            start = step * self.global_batch + self.rank * share
            mine = order[start : start + share]
            for i in range(0, share, self.micro_batch):
                yield [(self.epoch, index) for index in mine[i : i + self.micro_batch]]


# ---------------------------------------------------------------------------- building
def model_options(cfg: TrainConfig, info: datasets.DataInfo, base: vitzoo.ViTConfig) -> dict[str, Any]:
    """Options for vitzoo.create / from_pretrained: the user's, plus what the dataset decides.

    The classes always come from the dataset. A model trained from scratch takes the dataset's
    channels and normalisation (recorded in its config); a pretrained one keeps its own.
    """
    options = dict(cfg.model_options)
    if options.get("num_classes", info.num_classes) != info.num_classes:
        raise ConfigError(f"num_classes={options['num_classes']} but {cfg.data} has {info.num_classes} classes")
    options["num_classes"] = info.num_classes
    if not cfg.pretrained:
        in_chans = options.setdefault("in_chans", info.in_chans)
        for key in ("mean", "std"):
            value = getattr(info, key)
            options.setdefault(key, tuple(value) * in_chans if len(value) == 1 else tuple(value))
    return options


def base_config(cfg: TrainConfig) -> vitzoo.ViTConfig:
    """The model's config before the dataset's options (for its resolution and channels)."""
    if cfg.pretrained and os.path.isdir(cfg.pretrained):
        config = read_config(Path(cfg.pretrained) / CONFIG_NAME)
        differ = []
        if cfg.model in vitzoo.list_models():  # the named model with the shape options given with it
            named = vitzoo.get_config(cfg.model, **{k: v for k, v in cfg.model_options.items() if k in SHAPE_OPTIONS})
            differ = shape_differences(config, named)
        if differ:  # the saved model decides; the name is then only a label, which may surprise
            warnings.warn(f"--pretrained {cfg.pretrained} holds another model than {cfg.model}: {', '.join(differ)}; "
                          "training the saved model", stacklevel=2)
    else:
        config = vitzoo.get_config(cfg.model)
    options = {k: v for k, v in cfg.model_options.items() if k not in ("num_classes",)}
    return config.replace(**options) if options else config


def build_model(cfg: TrainConfig, options: dict[str, Any]) -> vitzoo.VisionTransformer:
    if cfg.pretrained:
        if not os.path.exists(cfg.pretrained):
            raise FileNotFoundError(f"--pretrained {cfg.pretrained}: no such file or directory")
        if os.path.isdir(cfg.pretrained):
            model = vitzoo.from_pretrained(cfg.pretrained, **options)  # new img_size: pos-embed resampled
        else:
            model = vitzoo.create(cfg.model, pretrained=cfg.pretrained, **options)
    else:
        model = vitzoo.create(cfg.model, **options)
    if cfg.reset_head:
        model.reset_classifier(options["num_classes"], head="linear")  # zero-initialised
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """Weight decay on matrices only: not on biases, norms, the class token or position embeddings."""
    skip = model.no_weight_decay()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # the fused kernels update every parameter in one pass over memory (CUDA and CPU have them); the
    # default for-loop over parameters re-reads the optimizer state several times per step
    fused = {"fused": True} if device.type in ("cuda", "cpu") else {}
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **fused)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **fused)


def native_bf16(device: torch.device) -> bool:
    """Whether the GPU computes in bfloat16 natively: T4s and V100s only emulate it, slowly."""
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported(including_emulation=False)


def has_running_statistics(model: torch.nn.Module) -> bool:
    """Whether the model has buffers that training changes (BatchNorm's running statistics), which DDP
    must broadcast from rank 0 every forward pass. vitzoo's own buffers are constant (the relative
    position index, made from the grid alike on every rank): broadcasting them would only cost time."""
    return any(getattr(m, "running_mean", None) is not None for m in model.modules())


def resolve_precision(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for float32. `auto`: bf16 on a GPU that has it natively, else
    fp16 (with the loss scaler) on CUDA; fp32 elsewhere."""
    precision = cfg.precision
    if precision == "auto":
        precision = ("bf16" if native_bf16(device) else "fp16") if device.type == "cuda" else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("--precision fp16 needs CUDA (use bf16 or fp32)")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


# ---------------------------------------------------------------------------- the run directory
def _describe(run: Path, entries: list[str], pretrained: str | None) -> str:
    """What an --out directory holds, in words: a run, a saved model, the --pretrained source, files."""
    if pretrained and os.path.exists(pretrained) and (run.resolve() == Path(pretrained).resolve()
                                                      or run.resolve() in Path(pretrained).resolve().parents):
        return f"the --pretrained source {pretrained} (training would overwrite the weights it starts from)"
    if "train_config.json" in entries or "checkpoints" in entries:
        return "a run; pass --resume to continue it"
    if CONFIG_NAME in entries:
        return "a saved model (config.json, written by save_pretrained or another program)"
    return "files of its own (" + ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "") + ")"


def _check_new_run_dir(run: Path, pretrained: str | None) -> None:
    """A new run writes only into a directory that does not exist or is empty: anything already there
    (a saved model, the --pretrained weights, another run) would be overwritten or mixed in."""
    if run.exists() and not run.is_dir():
        raise ValueError(f"--out {run} is a file, not a directory; choose another --out")
    entries = sorted(p.name for p in run.iterdir()) if run.is_dir() else []
    if entries:
        raise ValueError(f"--out {run} already holds {_describe(run, entries, pretrained)}; a new run needs "
                         "an empty or new directory: choose another --out")


def prepare_run_dir(cfg: TrainConfig, run: Path | None) -> list[Path]:
    """Check the run directory; return the checkpoints to resume from, in the order to try them."""
    if run is None:
        return []
    saved = run / "train_config.json"
    if not cfg.resume:
        _check_new_run_dir(run, cfg.pretrained)
        return []
    if not saved.exists():
        raise FileNotFoundError(f"cannot resume: {saved} does not exist")
    before = json.loads(json.dumps(TrainConfig.from_json(saved.read_text(encoding="utf-8")).resolved().to_dict()))
    now = json.loads(json.dumps(cfg.to_dict()))
    changed = sorted(k for k in now if k not in RESUMABLE_CHANGES and before.get(k) != now[k])
    if changed:
        detail = ", ".join(f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in changed)
        raise ConfigError(f"cannot resume {run} with different settings ({detail})")
    return state.to_resume(run / "checkpoints")


def gather_rng(env: distributed.Env) -> list[dict]:
    mine = state.rng_state(env.device)
    if not env.distributed:
        return [mine]
    states: list = [None] * env.world_size
    torch.distributed.all_gather_object(states, mine)
    return states


def _json_line(line: str) -> dict | None:
    """A metrics line, or None for a blank one or the half-written last line of a killed run."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


class Metrics:
    """metrics.jsonl (and TensorBoard when installed), written by rank 0."""

    def __init__(self, run: Path | None, enabled: bool, resume_step: int, tensorboard: bool) -> None:
        self.file = None
        self.tb = None
        if run is None or not enabled:
            return
        path = run / "metrics.jsonl"
        if path.exists():  # keep what the resumed checkpoint had seen; drop lines of the lost steps
            kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                    if (record := _json_line(line)) is not None and record.get("step", 0) <= resume_step]
            write_text(path, "".join(line + "\n" for line in kept))
        self.file = open(path, "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run / "tensorboard"))
            except ImportError:
                self.tb = None

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


@contextlib.contextmanager
def stop_signals(flag: dict):
    """SIGINT / SIGTERM set flag["signal"]; the loop then checkpoints and returns. A second signal
    stops at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if flag.get("signal"):
            raise KeyboardInterrupt
        flag["signal"] = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ---------------------------------------------------------------------------- fit
def fit(config: TrainConfig) -> dict[str, Any]:
    """Train as `config` says; return the summary (also written to RUN/summary.json)."""
    return fit_model(config)[1]


def fit_model(config: TrainConfig) -> tuple[vitzoo.VisionTransformer, dict[str, Any]]:
    """`fit`, also returning the trained model (on its device, in eval mode)."""
    cfg = config.resolved()
    return _fit(cfg, distributed.setup(cfg.device))


def _fit(cfg: TrainConfig, env: distributed.Env) -> tuple[vitzoo.VisionTransformer, dict[str, Any]]:
    wall_start = time.perf_counter()
    verbose = env.is_main and not cfg.quiet

    def say(message: str) -> None:
        if verbose:
            print(message, file=sys.stderr, flush=True)

    # -- 1. cheap checks, before any work
    datasets.check_data(cfg.data, cfg.data_dir)
    run = Path(cfg.out) if cfg.out else None
    resume_points = prepare_run_dir(cfg, run)
    distributed.barrier(env)  # every rank has checked the run directory before rank 0 writes to it
    micro = cfg.micro_batch or cfg.batch_size // env.world_size
    if micro < 1 or cfg.batch_size % (env.world_size * micro):
        raise ConfigError(f"batch_size={cfg.batch_size} is not a multiple of world_size={env.world_size} x "
                         f"micro_batch={micro}")
    accum = cfg.batch_size // (env.world_size * micro)
    device = env.device
    amp_dtype = resolve_precision(cfg, device)
    exact = sum_dtype(device)  # of the loss and clock reductions
    base = base_config(cfg)

    # -- 2. data, model, optimizer, schedule
    train_raw = datasets.load_split(cfg.data, "train", cfg.data_dir, img_size=base.img_size, in_chans=base.in_chans, seed=cfg.seed)
    test_raw = datasets.load_split(cfg.data, "test", cfg.data_dir, img_size=base.img_size, in_chans=base.in_chans, seed=cfg.seed)
    info = datasets.data_info(cfg.data, train_raw, base.in_chans)
    if cfg.val_size and len(train_raw) - cfg.val_size < cfg.batch_size:
        raise ConfigError(f"val_size={cfg.val_size} leaves {max(0, len(train_raw) - cfg.val_size)} of the {len(train_raw)} "
                         f"training images, fewer than one batch ({cfg.batch_size}); lower --val-size or --batch-size")
    # held out before train_limit, so that the training subsets of one seed are nested and never validate
    train_raw, val_raw = datasets.split_validation(train_raw, cfg.val_size)
    train_raw = datasets.subset(train_raw, cfg.train_limit, cfg.seed)
    if val_raw is not None and cfg.train_limit and cfg.train_limit > len(train_raw):
        warnings.warn(f"train_limit={cfg.train_limit} is more than the {len(train_raw)} training images left beside the "
                      f"validation split (val_size={cfg.val_size}): training on all {len(train_raw)}", stacklevel=2)
    test_raw = datasets.subset(test_raw, cfg.test_limit, cfg.seed)

    torch.manual_seed(cfg.seed)  # the same initial weights on every process
    options = model_options(cfg, info, base)
    model = build_model(cfg, options).to(device)
    img_size = model.config.img_size
    augment = datasets.Augment(cfg.random_resized_crop, cfg.crop_padding, cfg.hflip, cfg.randaugment, cfg.mixup, cfg.cutmix)
    train_set = datasets.Transformed(train_raw, datasets.build_transform(img_size, augment), cfg.seed)
    train_eval_set = datasets.Transformed(train_raw, datasets.build_transform(img_size, None))
    test_set = datasets.Transformed(test_raw, datasets.build_transform(img_size, None))
    val_set = datasets.Transformed(val_raw, datasets.build_transform(img_size, None)) if val_raw is not None else None
    mixer = datasets.batch_mixer(augment, info.num_classes)

    steps_per_epoch = len(train_set) // cfg.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size={cfg.batch_size} is larger than the training set ({len(train_set)} images)")
    total_steps = None
    if cfg.steps is not None:
        total_steps = cfg.steps
    elif cfg.epochs is not None:
        total_steps = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    budget_s = cfg.time_budget_min * 60 if cfg.time_budget_min is not None else None
    warmup = cfg.warmup if cfg.warmup is not None else cfg.recipe_warmup(total_steps)
    schedule = Schedule(cfg.schedule, warmup, total_steps=total_steps, budget_s=budget_s)

    optimizer = build_optimizer(cfg, model, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    step, train_seconds, images_seen = 0, 0.0, 0
    resume_from = None
    if resume_points:
        resume_from, saved = state.load_first(resume_points, model, device)
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        scaler.load_state_dict(saved["scaler"])
        step, train_seconds, images_seen = saved["step"], saved["train_seconds"], saved["images_seen"]
        rngs = saved["rng"]
        if len(rngs) == env.world_size:
            state.set_rng_state(rngs[env.rank], device)
        else:  # another world size: a fresh stream per process
            torch.manual_seed(cfg.seed + 1 + env.rank + 7919 * step)
        say(f"resuming {run} at step {step} from {resume_from.name}")
    else:
        torch.manual_seed(cfg.seed + 1 + env.rank)  # dropout / drop-path / mixing differ across processes
    if run is not None and env.is_main:
        run.mkdir(parents=True, exist_ok=True)
        write_text(run / "train_config.json", cfg.to_json())

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    raw_model = model
    if env.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                                          broadcast_buffers=has_running_statistics(raw_model))
    if cfg.compile:
        model = torch.compile(model)

    # the loaders are made once, their workers kept between epochs and evaluations (persistent_workers)
    pin, persistent = device.type == "cuda", cfg.num_workers > 0
    sampler = GlobalBatchSampler(len(train_set), cfg.batch_size, micro, env.rank, env.world_size, cfg.seed, 0)
    train_loader = DataLoader(train_set, batch_sampler=sampler, num_workers=cfg.num_workers, pin_memory=pin,
                              persistent_workers=persistent, generator=torch.Generator().manual_seed(cfg.seed))
    eval_batch = max(micro, 256)
    eval_loaders: dict[int, DataLoader] = {}

    def micro_batches(start_step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch, start = divmod(start_step, steps_per_epoch)
        while True:
            sampler.set_epoch(epoch, start)
            yield from train_loader
            epoch, start = epoch + 1, 0

    def evaluate(dataset=test_set) -> dict[str, float]:
        indices = range(env.rank, len(dataset), env.world_size)
        if id(dataset) not in eval_loaders:
            eval_loaders[id(dataset)] = eval_loader(dataset, indices, batch_size=eval_batch, num_workers=cfg.num_workers,
                                                    pin_memory=pin, persistent=persistent)
        sums = classification_sums(raw_model, dataset, indices=indices, batch_size=eval_batch, num_workers=cfg.num_workers,
                                   autocast_dtype=amp_dtype, loader=eval_loaders[id(dataset)])
        return metrics_from_sums(distributed.all_reduce(sums, env))

    def fewshot_features(dataset, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Features of `indices` (None: all of `dataset`): each rank extracts every world_size-th image,
        every rank gets all of them, in order."""
        indices = list(range(len(dataset))) if indices is None else list(indices)
        mine = indices[env.rank :: env.world_size]
        # a rank with no image of its own passes one through anyway, to learn the features' width
        features, labels = extract_features(raw_model, dataset, mine or indices[:1], batch_size=eval_batch,
                                            num_workers=cfg.num_workers)
        features, labels = features[: len(mine)], labels[: len(mine)]
        return (distributed.gather_strided(features, len(indices), env), distributed.gather_strided(labels, len(indices), env))

    # keep_best: the best validation point so far (weights on the CPU); checkpointed, so it survives a resume
    best: dict[str, Any] = {"step": None, "val_top1": None, "weights": None}
    if cfg.keep_best and resume_from is not None:
        best.update(saved["best"])

    def consider_best(result: dict[str, float]) -> None:
        # only a strictly better top-1 replaces the best (ties: the earliest); every rank compares the same
        # all-reduced sums, so all ranks agree
        if cfg.keep_best and (best["step"] is None or result["top1"] > best["val_top1"]):
            best.update(step=step, val_top1=result["top1"],
                        weights={k: v.detach().to("cpu", copy=True) for k, v in raw_model.state_dict().items()})

    def save_checkpoint() -> None:
        rng = gather_rng(env)
        if env.is_main and run is not None:
            saving = {"step": step, "epoch": step // steps_per_epoch, "batch_in_epoch": step % steps_per_epoch,
                     "train_seconds": train_seconds, "images_seen": images_seen, "world_size": env.world_size,
                     "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                     "scaler": scaler.state_dict(), "rng": rng}
            if cfg.keep_best:
                saving["best"] = dict(best)
            state.save(run / "checkpoints", step, raw_model, saving, cfg.keep_checkpoints)
        distributed.barrier(env)

    def finished() -> bool:
        if total_steps is not None:
            return step >= total_steps
        return train_seconds >= budget_s

    say(f"training {cfg.model} ({vitzoo.count_params(raw_model):,} parameters) on {cfg.data}: "
        f"{len(train_set)} images, batch {cfg.batch_size} = {env.world_size} process(es) x {accum} x {micro}, "
        + (f"{total_steps} steps" if total_steps else f"{cfg.time_budget_min} min") + f", {device}, recipe {cfg.recipe}")

    # -- 3. the loop
    metrics = Metrics(run, env.is_main, step, cfg.tensorboard)
    from tqdm import tqdm

    bar = tqdm(total=total_steps or int(budget_s), initial=step if total_steps else int(train_seconds),
               unit="step" if total_steps else "s", disable=True if not verbose else None, dynamic_ncols=True, leave=False)
    flag: dict[str, Any] = {}
    status, last_checkpoint = "finished", step if resume_from is not None else None
    last_eval: dict[str, float] = {}
    loss_value, grad_norm = None, None
    # each step's (step, mean loss, gradient norm), kept on the device until read: reading a number
    # makes the host wait for the device, so it is done when the numbers are needed, not every step
    unread: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # + non-finite inputs

    def read_steps() -> None:
        """Read the unread steps' losses and gradient norms (one wait for the device); stop at the
        first non-finite one, blaming the data when its normalised images were not finite. Before
        anything is logged, evaluated or saved."""
        nonlocal loss_value, grad_norm
        if not unread:
            return
        values = torch.stack([torch.stack([loss.to(exact), norm.to(exact), bad.to(exact)])
                              for _, loss, norm, bad in unread]).tolist()
        steps = [s for s, *_ in unread]
        unread.clear()
        for s, (loss, norm, bad_inputs) in zip(steps, values):
            if not math.isfinite(loss) and bad_inputs:
                config = raw_model.config
                raise TrainingDiverged(f"the loss is {loss} at step {s} because the normalised images hold NaN or "
                                       f"infinite values (mean {list(config.mean)}, std {list(config.std)})", inputs=True)
            if not math.isfinite(loss):
                raise TrainingDiverged(f"the loss is {loss} at step {s}")
            if not math.isfinite(norm) and not scaler.is_enabled():  # (the scaler skips steps of inf gradients)
                raise TrainingDiverged(f"the gradient norm is {norm} at step {s} (loss {loss:.4g})")
        loss_value, grad_norm = values[-1][:2]

    log_images, log_time = 0, time.perf_counter()
    batches = micro_batches(step)
    normalize = datasets.Normalizer(raw_model.config.mean, raw_model.config.std, raw_model.config.in_chans, device)
    model.train()
    try:
        with stop_signals(flag):
            while not finished():
                lr = cfg.lr * schedule.factor(step, train_seconds)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                t0 = time.perf_counter()
                loss_sum = torch.zeros((), device=device)
                bad_inputs = torch.zeros((), device=device)
                for i in range(accum):
                    images, labels = next(batches)
                    x = normalize(images.to(device, non_blocking=True))
                    y = labels.to(device, non_blocking=True)
                    bad_inputs += (~torch.isfinite(x)).sum()  # no sync: read with the loss below
                    if mixer is not None:
                        x, y = mixer(x, y)
                    sync = i == accum - 1 or not env.distributed
                    with contextlib.nullcontext() if sync else model.no_sync():
                        with autocast(device, amp_dtype):
                            loss = loss_fn(model(x), y, cfg.label_smoothing)
                        scaler.scale(loss / accum).backward()
                    loss_sum += loss.detach()
                # the global batch's mean loss and its count of non-finite normalised inputs, all-reduced on
                # the device (read with the loss, in read_steps)
                shared = distributed.all_reduce(torch.stack([(loss_sum / accum).to(exact), bad_inputs.to(exact)]), env)
                mean_loss, inputs_bad = shared[0] / env.world_size, shared[1]
                scaler.unscale_(optimizer)
                norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.clip_grad or float("inf"))
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                unread.append((step, mean_loss.detach(), norm.detach(), inputs_bad.detach()))
                step += 1
                images_seen += cfg.batch_size
                log_images += cfg.batch_size
                # the step's time and whether any process was asked to stop, agreed across processes on
                # the host (the time budget must end every process at once). Without waiting for the
                # device, a step's time is the host's; the device's queue is bounded, so the two agree
                # over a run
                step_time, stop_requested = distributed.host_max([time.perf_counter() - t0, float(bool(flag.get("signal")))], env)
                train_seconds += step_time
                bar.update(1 if total_steps else int(train_seconds) - bar.n)
                logging = step % cfg.log_every == 0 or finished()
                evaluating = bool(cfg.eval_every) and step % cfg.eval_every == 0 and not finished()
                stop = stop_requested > 0 or (cfg.stop_at is not None and step >= cfg.stop_at)
                checkpointing = bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0 or stop
                if logging or evaluating or checkpointing or len(unread) >= MAX_UNREAD_STEPS:
                    read_steps()
                if logging:
                    now = time.perf_counter()
                    record = {"step": step, "epoch": round(step / steps_per_epoch, 4), "loss": loss_value, "lr": lr,
                              "grad_norm": grad_norm, "images_per_s": log_images / max(now - log_time, 1e-9),
                              "train_seconds": round(train_seconds, 3)}
                    metrics.write(record)
                    bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}")
                    log_images, log_time = 0, now
                if evaluating and val_set is not None:
                    last_eval = evaluate(val_set)  # never the test set: it must not choose anything
                    metrics.write({"step": step, "val_top1": last_eval["top1"], "val_top5": last_eval["top5"],
                                   "val_loss": last_eval["loss"]})
                    consider_best(last_eval)
                    log_time = time.perf_counter()
                elif evaluating:
                    last_eval = evaluate()
                    metrics.write({"step": step, "eval_top1": last_eval["top1"], "eval_top5": last_eval["top5"],
                                   "eval_loss": last_eval["loss"]})
                    log_time = time.perf_counter()
                if checkpointing:
                    save_checkpoint()
                    last_checkpoint = step
                    log_time = time.perf_counter()
                if stop:
                    status = "interrupted" if stop_requested > 0 else "stopped"
                    break
    except TrainingDiverged as exc:
        where = (f"the last good checkpoint (step {last_checkpoint}) is in {run / 'checkpoints'}"
                 if last_checkpoint is not None and run is not None else "no checkpoint was written")
        if env.is_main and run is not None:
            write_text(run / "summary.json", json.dumps({"status": "diverged", "step": step, "error": str(exc)}, indent=2) + "\n")
        advice = ("Check the images and the model's mean and std (--mean, --std)" if exc.inputs
                  else "Lower the learning rate (--lr) or check the data")
        raise TrainingDiverged(f"training stopped: {exc}; {where}. {advice}", inputs=exc.inputs) from None
    finally:
        bar.close()
        metrics.close()

    # -- 4. the end: checkpoint, evaluate, save
    if status == "finished":
        if run is not None and last_checkpoint != step:
            save_checkpoint()
        val_final = evaluate(val_set) if val_set is not None else {}
        consider_best(val_final)  # the last step is an evaluation point too
        if cfg.keep_best and best["step"] != step:
            raw_model.load_state_dict(best["weights"])  # test, few-shot and the saved model: the best weights
        final = evaluate()
        metrics_record = {"step": step, "eval_top1": final["top1"], "eval_top5": final["top5"], "eval_loss": final["loss"]}
        if val_set is not None:  # the test set is measured once, reported in summary.json only
            metrics_record = {"step": step, "val_top1": val_final["top1"], "val_top5": val_final["top5"],
                              "val_loss": val_final["loss"]}
    else:
        final = last_eval if val_set is None else {}  # a validation score is no test accuracy
        val_final = {}
        metrics_record = None
    if metrics_record is not None and run is not None and env.is_main:
        with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(metrics_record) + "\n")
    fewshot, fewshot_error = {}, None
    if cfg.fewshot and status == "finished":  # every rank extracts a share of the features
        try:
            fewshot = fewshot_linear_accuracy(raw_model, train_eval_set, test_set, cfg.fewshot, draws=5, seed=cfg.seed,
                                              features=fewshot_features)
        except Exception as exc:  # raised once the trained model and summary.json are written
            fewshot_error = exc
    raw_model.eval()
    summary = {
        "status": status,
        "signal": signal.Signals(flag["signal"]).name if flag.get("signal") else None,
        "step": step,
        "total_steps": total_steps,
        "epochs": step / steps_per_epoch,
        "final_loss": loss_value,
        "test_top1": final.get("top1"),
        "test_top5": final.get("top5"),
        "test_loss": final.get("loss"),
        "fewshot": {str(k): v for k, v in fewshot.items()},
        "train_seconds": train_seconds,
        "wall_seconds": time.perf_counter() - wall_start,
        "images_per_s": images_seen / train_seconds if train_seconds else None,
        "images_seen": images_seen,
        "params": vitzoo.count_params(raw_model),
        "world_size": env.world_size,
        "device": str(device),
        "precision": str(amp_dtype or torch.float32).replace("torch.", ""),
        "torch": torch.__version__,
        "model_config": raw_model.config.to_dict(),
        "train_config": cfg.to_dict(),
        "run_dir": str(run) if run else None,
    }
    if val_set is not None:  # validation scores of the final weights (None for a run that did not finish)
        summary.update(train_images=len(train_set), val_images=len(val_set), val_top1=val_final.get("top1"), val_top5=val_final.get("top5"),
                       val_loss=val_final.get("loss"))
    if cfg.keep_best:
        summary.update(best_step=best["step"], best_val_top1=best["val_top1"])
    if fewshot_error is not None:
        summary["fewshot_error"] = f"{type(fewshot_error).__name__}: {fewshot_error}"
    if env.is_main and run is not None:
        if status == "finished" or not (run / CONFIG_NAME).exists():
            card = {"dataset": cfg.data, "metrics": {"accuracy": final["top1"], "top5_accuracy": final["top5"]}} if final else None
            save_pretrained(raw_model, run, extra={"data": cfg.data}, card=card)
        write_text(run / "summary.json", json.dumps(summary, indent=2) + "\n")
    distributed.barrier(env)
    if fewshot_error is not None:
        fewshot_error.add_note(f"few-shot evaluation failed after training; the trained model and summary.json "
                               f"are saved{f' in {run}' if run else ''}")
        raise fewshot_error
    if cfg.keep_best and status == "finished":
        say(f"best validation top-1 {best['val_top1']:.4f} at step {best['step']}: the weights evaluated and saved")
    if status == "finished":
        say(f"done: {step} steps in {train_seconds:.0f} s, test top-1 {final['top1']:.4f}" + (f" -> {run}" if run else ""))
    else:
        say(f"{status} at step {step}; checkpoint saved, continue with --resume" + (f" (vitzoo train --resume {run})" if run else ""))
    return raw_model, summary


__all__ = ["GlobalBatchSampler", "TrainingDiverged", "fit", "fit_model", "loss_fn"]
