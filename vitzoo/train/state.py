"""Training state that survives crashes: checkpoints (the model, optimizer, schedule, scaler, step) and
the random states a resumed run restores.

    RUN/checkpoints/step_00001000/config.json, model.safetensors   the model (save_pretrained)
    RUN/checkpoints/step_00001000/model_ema.safetensors            with --model-ema: the weights' moving average
    RUN/checkpoints/step_00001000/state.pt                          optimizer, schedule, scaler, RNGs, step
    RUN/checkpoints/latest                                          "step_00001000": the commit point

Every file is written atomically (vitzoo.io), and `latest` is rewritten only once a checkpoint is
complete, so a crash at any moment leaves the previous checkpoint intact and pointed to. A
half-written checkpoint directory is removed. The weights go straight from the device to the host
(`host_copy`, `OnHost`): nothing of the model's size is allocated on the GPU to save it.
"""

from __future__ import annotations

import errno
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from vitzoo.checkpoints.native import save_pretrained, save_state_dict
from vitzoo.errors import CheckpointError, DiskFull
from vitzoo.io import atomic_path, free_bytes, out_of_space, write_text
from vitzoo.train.ema import EMA_WEIGHTS_NAME
from vitzoo.weights.converted import read_failed
from vitzoo.weights.layout import CONFIG_NAME, WEIGHTS_NAME

LATEST = "latest"
STATE_NAME = "state.pt"


def rng_state(device: torch.device | str | None = None) -> dict[str, Any]:
    """The random states a process restores on resume: torch's, Python's, NumPy's, and its training
    device's. On CUDA only this process's own GPU (not every visible one), so that a machine with
    another number of GPUs can resume the run; MPS has one generator."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    if device is not None and device.type == "mps":
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | str | None = None) -> None:
    """Restore `rng_state(device)`; a device state saved on another kind of device is left alone."""
    torch.set_rng_state(state["torch"])
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
    if device is not None and device.type == "mps" and state.get("mps") is not None:
        torch.mps.set_rng_state(state["mps"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def host_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict copied straight to the host: one device-to-host copy per tensor, nothing
    allocated on the device. A copy on the CPU too, never a view of a live parameter (training goes
    on, and keep_best keeps these)."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}


class OnHost:
    """`model` as `save_pretrained` reads it, its state dict a `host_copy`: the copy save_pretrained
    makes of each tensor (to unshare them for safetensors) is then made on the host, not beside the
    weights on the GPU (a ViT-L's 1.2 GB at every checkpoint). Everything else is the model's."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:  # what the instance lacks: the model's
        if name == "_model":
            raise AttributeError(name)
        return getattr(self._model, name)

    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        return host_copy(self._model)


def _complete(path: Path) -> bool:
    return all((path / name).is_file() for name in (STATE_NAME, WEIGHTS_NAME, CONFIG_NAME))


def _pointed(directory: Path) -> Path | None:
    """The checkpoint the `latest` pointer names, if the pointer is there and readable."""
    try:
        name = (directory / LATEST).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return directory / name if name else None


def latest(directory: str | Path) -> Path | None:
    """The last complete checkpoint under RUN/checkpoints, or None."""
    path = _pointed(Path(directory))
    return path if path is not None and path.parent == Path(directory) and _complete(path) else None


def to_resume(directory: str | Path) -> list[Path]:
    """The complete checkpoints to resume from, in the order to try them: the one `latest` points to,
    then the others newest first. A damaged pointer is said and the newest complete checkpoint leads
    instead (a warning, shown under --quiet too); no checkpoint is ever deleted for it. Empty when the run committed none (it starts from
    step 0); a CheckpointError when it committed one and none is left complete."""
    directory = Path(directory)
    pointed = latest(directory)
    found = sorted((p for p in directory.glob("step_*") if p.is_dir() and _complete(p)), reverse=True)
    if (directory / LATEST).exists() and pointed is None:
        named = _pointed(directory)
        what = f"names {named.name!r}, which is not a complete checkpoint" if named else "cannot be read"
        if not found:
            raise CheckpointError(
                f"cannot resume: {directory / LATEST} {what}, and {directory} holds no complete checkpoint "
                f"(config.json, model.safetensors, {STATE_NAME}); restore it, or start a new run with another --out"
            )
        warnings.warn(f"{directory / LATEST} {what}: resuming from the newest complete checkpoint, {found[0].name}")
    return ([pointed] if pointed else []) + [p for p in found if p != pointed]


def load_first(paths: list[Path], model: torch.nn.Module, map_location: torch.device | str = "cpu",
               ema: torch.nn.Module | None = None) -> tuple[Path, dict[str, Any]]:
    """Load the first of `paths` that reads (see `load`); a damaged one is named (a warning) and the next tried."""
    problems = []
    for path in paths:
        try:
            return path, load(path, model, map_location, ema)
        except CheckpointError as exc:
            problems.append(str(exc))
            if path != paths[-1]:
                warnings.warn(f"{exc}: resuming from the previous checkpoint, {paths[paths.index(path) + 1].name}")
    raise CheckpointError("cannot resume, no checkpoint reads: " + "; ".join(problems)
                          + ". Restore the files, or start a new run with another --out")


def _torch_save(state: dict[str, Any], tmp: Path, final: Path) -> None:
    """torch.save, its C++ writer's failures (a full disk is "[enforce fail at inline_container.cc:...]
    unexpected pos") said as what they are: an OSError naming the file and the space left on its disk."""
    try:
        torch.save(state, tmp)
    except RuntimeError as exc:
        free = shutil.disk_usage(tmp.parent).free
        full = " (a full disk is the usual cause)" if free < 64 * 2**20 else ""
        raise OSError(errno.ENOSPC if full else errno.EIO, f"cannot write {final}: torch.save failed ({str(exc).splitlines()[0][:200]}); the disk holding "
                      f"it has {free / 2**20:.1f} MiB free{full}. Free some space and resume the run: the previous "
                      "checkpoint is intact") from exc


def tensor_bytes(tree: Any) -> int:
    """The bytes of every tensor in a (nested) state: about what a checkpoint of it takes on disk."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def disk_full(run: Path, where: Path, what: str, needed: int, kept: Path | None) -> DiskFull:
    """The error for a write of the run in `run` that found its disk full: which file, how much space it
    needs and has, what is kept, and how to finish (`vitzoo train --resume RUN` once space is free)."""
    free = free_bytes(where)
    have = (f"the last good checkpoint, {kept.name}, is kept in {kept.parent} and the run resumes from it" if kept
            else "no earlier checkpoint was written, so the run resumes from its start")
    return DiskFull(errno.ENOSPC, f"the disk is full: {what} could not be written to {where} (it needs about "
                                  f"{needed / 1e6:.1f} MB; {free / 1e6:.1f} MB are free there). Nothing half-written is "
                                  f"left; {have}. Free some space and run `vitzoo train --resume {run}` to finish")


def save(directory: str | Path, step: int, model: torch.nn.Module, state: dict[str, Any], keep: int = 1,
         ema: torch.nn.Module | None = None) -> Path:
    """Write checkpoint `step` (model, `ema`'s weights where given, training state), then point `latest`
    at it; keep the newest `keep`."""
    directory = Path(directory)
    path = directory / f"step_{step:08d}"
    for stale in directory.glob(".step_*.tmp"):  # staging left by a killed save (vitzoo.io.staged_directory)
        shutil.rmtree(stale, ignore_errors=True)
    if path.exists() and latest(directory) != path:
        shutil.rmtree(path)  # left over by a crash
    try:
        save_pretrained(OnHost(model), path)
        if ema is not None:  # before state.pt, which completes the checkpoint
            save_state_dict(host_copy(ema), path / EMA_WEIGHTS_NAME, metadata={"format": "pt"})
        with atomic_path(path / STATE_NAME) as tmp:
            _torch_save(state, tmp, path / STATE_NAME)
    except BaseException as exc:
        if latest(directory) != path:
            shutil.rmtree(path, ignore_errors=True)
        if out_of_space(exc):
            raise disk_full(directory.parent, path, f"checkpoint {path.name} ({WEIGHTS_NAME} and {STATE_NAME})",
                            tensor_bytes(model.state_dict()) + tensor_bytes(state), latest(directory)) from exc
        raise
    write_text(directory / LATEST, path.name + "\n")
    old = sorted(p for p in directory.glob("step_*") if p.is_dir() and p != path)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return path


def load(path: str | Path, model: torch.nn.Module, map_location: torch.device | str = "cpu",
         ema: torch.nn.Module | None = None) -> dict[str, Any]:
    """Load the weights of checkpoint `path` into `model` (and its moving average into `ema`, where
    given); return its training state. A file that does not read (truncated, damaged, missing) is a
    CheckpointError naming it; `model` and `ema` are unchanged then."""
    path = Path(path)
    try:
        # mapped, not read: the ranks of a node share one copy of the optimizer's state in the page cache
        state = torch.load(path / STATE_NAME, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises several types for a truncated or foreign file
        raise read_failed(path / STATE_NAME, exc) from exc
    try:
        weights = load_file(str(path / WEIGHTS_NAME), device=str(map_location))
    except Exception as exc:  # safetensors raises its own error types
        raise read_failed(path / WEIGHTS_NAME, exc) from exc
    if ema is not None:
        try:
            averaged = load_file(str(path / EMA_WEIGHTS_NAME), device=str(map_location))
        except Exception as exc:
            raise read_failed(path / EMA_WEIGHTS_NAME, exc) from exc
    model.load_state_dict(weights, strict=True)
    if ema is not None:
        ema.load_state_dict(averaged, strict=True)
    return state


__all__ = ["LATEST", "OnHost", "host_copy", "latest", "load", "load_first", "rng_state", "save", "set_rng_state",
           "to_resume"]
