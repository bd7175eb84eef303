"""Training state that survives crashes, and the run directory it lives in.

    RUN/checkpoints/step_00001000/config.json, model.safetensors   the model (save_pretrained)
    RUN/checkpoints/step_00001000/model_ema.safetensors            with --model-ema
    RUN/checkpoints/step_00001000/state.pt                         optimizer, schedule, RNGs, step
    RUN/checkpoints/latest                                         "step_00001000": the commit point

Every file is written atomically and `latest` once a checkpoint is complete, so a crash at any
moment leaves the previous checkpoint whole and pointed to; a full disk is said as such. A new run
needs an empty or new directory, a resumed one the settings it was started with.
"""

from __future__ import annotations

import errno
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from vitzoo.errors import CheckpointError, ConfigError, DiskFull
from vitzoo.io import atomic_path, out_of_space, write_text
from vitzoo.train.config import RESUMABLE, TrainConfig
from vitzoo.train.optim import EMA_WEIGHTS_NAME
from vitzoo.weights.files import read_failed
from vitzoo.weights.layout import WEIGHTS_NAME
from vitzoo.weights.native import save_pretrained, save_state_dict

LATEST = "latest"
STATE_NAME = "state.pt"


def rng_state(device: torch.device) -> dict[str, Any]:
    """torch's, Python's, NumPy's and the device's random states (on CUDA this process's GPU's
    only, so that another number of GPUs can resume)."""
    kind, keys, *rest = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), *rest]}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    if device.type == "mps":
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore `rng_state`; a device's state saved on another kind of device is left alone."""
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    if device.type == "mps" and "mps" in state:
        torch.mps.set_rng_state(state["mps"])
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))


def host_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict copied to the host, never a view of a live parameter (training goes on)."""
    return {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}


def save_model(model: torch.nn.Module, ema: torch.nn.Module | None, path: Path, **kwargs) -> None:
    """save_pretrained's files in `path`, and the moving average's weights beside them."""
    save_pretrained(model, path, **kwargs)
    if ema is not None:
        save_state_dict(ema.state_dict(), path / EMA_WEIGHTS_NAME, metadata={"format": "pt"})


def disk_full(run: Path, where: Path, what: str, needed: int, kept: Path | None) -> DiskFull:
    """A full disk's error: the file, the space it needs and has, what is kept, how to finish."""
    have = (f"the last good checkpoint, {kept.name}, is kept in {kept.parent}" if kept
            else "no earlier checkpoint was written, so the run resumes from its start")
    free = shutil.disk_usage(run).free
    return DiskFull(errno.ENOSPC, f"the disk is full: {what} could not be written to {where} (it "
                    f"needs about {needed / 1e6:.1f} MB; {free / 1e6:.1f} MB are free there); "
                    f"{have}. Free some space and run `vitzoo train --resume {run}`")


def tensor_bytes(tree: Any) -> int:
    """The bytes of every tensor in a nested state: about what a checkpoint of it takes."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, list) else ()
    return sum(tensor_bytes(v) for v in items)


def save(directory: Path, step: int, model: torch.nn.Module, state: dict[str, Any],
         keep: int = 1, ema: torch.nn.Module | None = None) -> Path:
    """Write checkpoint `step` (model, EMA, training state), then point `latest` at it; keep the
    newest `keep`."""
    path = directory / f"step_{step:08d}"
    for stale in [*directory.glob(".step_*.tmp"), *([path] if latest(directory) != path else [])]:
        shutil.rmtree(stale, ignore_errors=True)  # what a killed save left
    try:
        save_model(model, ema, path)
        with atomic_path(path / STATE_NAME) as tmp:  # last: it completes the checkpoint
            torch.save(state, tmp)
    except BaseException as exc:
        if latest(directory) != path:
            shutil.rmtree(path, ignore_errors=True)
        # torch.save's C++ writer says "unexpected pos" on a full disk
        full = isinstance(exc, RuntimeError) and shutil.disk_usage(directory.parent).free < 2**26
        if out_of_space(exc) or full:
            needed = tensor_bytes(model.state_dict()) + tensor_bytes(state)
            raise disk_full(directory.parent, path, f"checkpoint {path.name} ({WEIGHTS_NAME} and "
                            f"{STATE_NAME})", needed, latest(directory)) from exc
        raise
    write_text(directory / LATEST, path.name + "\n")
    old = sorted(p for p in directory.glob("step_*") if p.is_dir() and p != path)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return path


def latest(directory: Path) -> Path | None:
    """The checkpoint `latest` names (never one outside `directory`); None before the first."""
    pointer = directory / LATEST
    if not pointer.exists():
        return None
    path = directory / pointer.read_text(encoding="utf-8").strip()
    if path.parent != directory:
        raise CheckpointError(f"{pointer} names {path}, which is not a checkpoint of {directory}")
    return path


def load(path: Path, model: torch.nn.Module, device: torch.device,
         ema: torch.nn.Module | None = None) -> dict[str, Any]:
    """Checkpoint `path`'s weights into `model` (and `ema`), its training state returned; a file
    that does not read is a CheckpointError, and nothing has changed then."""

    def read(name: str, reader):
        try:
            return reader(path / name)
        except Exception as exc:  # torch and safetensors raise several types for a damaged file
            raise read_failed(path / name, exc) from exc

    # mapped, not read: the ranks of a node share one copy of the optimizer's state
    state = read(STATE_NAME, lambda p: torch.load(p, map_location="cpu", weights_only=True,
                                                  mmap=True))
    weights = read(WEIGHTS_NAME, lambda p: load_file(p, device=str(device)))
    averaged = read(EMA_WEIGHTS_NAME, lambda p: load_file(p, device=str(device))) if ema else None
    model.load_state_dict(weights)
    if ema is not None:
        ema.load_state_dict(averaged)
    return state


# ---------------------------------------------------------------------------- the run directory
def check_new_directory(directory: Path, option: str, *, writer: str, run_hint: str = "") -> None:
    """A directory a command fills (`train --out`, `convert`, `pull`) is new or empty. `writer`
    says who needs it; `run_hint` is added when it holds a run."""
    another = f"choose another {option if option.startswith('-') else 'directory'}"
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{option} {directory} is a file, not a directory; {another}")
    entries = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    if entries:
        held = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        hint = run_hint if "train_config.json" in entries else ""
        raise ValueError(f"{option} {directory} already holds {held}{hint}; {writer} an empty or "
                         f"new directory: {another}")


def prepare_run_dir(cfg: TrainConfig) -> Path | None:
    """The run directory, checked: new or empty for a new run; for a resumed one, its settings."""
    if cfg.out is None:
        return None
    run = Path(cfg.out)
    if not cfg.resume:
        check_new_directory(run, "--out", writer="a new run needs",
                            run_hint=" (a run: pass --resume to continue it)")
        return run
    saved = run / "train_config.json"
    if not saved.exists():
        raise FileNotFoundError(f"cannot resume: {saved} does not exist")
    before = TrainConfig.from_json(saved.read_text(encoding="utf-8")).resolved().to_dict()
    before, now = json.loads(json.dumps(before)), json.loads(json.dumps(cfg.to_dict()))
    changed = sorted(k for k in now if k not in RESUMABLE and before.get(k) != now[k])
    if changed:
        detail = ", ".join(f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in changed)
        raise ConfigError(f"cannot resume {run} with different settings ({detail})")
    return run
