"""Training checkpoints that survive crashes.

    RUN/checkpoints/step_00001000/config.json, model.safetensors   the model (save_pretrained)
    RUN/checkpoints/step_00001000/state.pt                          optimizer, schedule, scaler, RNGs, step
    RUN/checkpoints/latest                                          "step_00001000": the commit point

Every file is written atomically (vitzoo.io), and `latest` is rewritten only once a checkpoint is
complete, so a crash at any moment leaves the previous checkpoint intact and pointed to. A
half-written checkpoint directory is removed.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from vitzoo.io import atomic_path, write_text
from vitzoo.weights.files import WEIGHTS_NAME, save_pretrained

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


def _own_cuda_state(saved: Any, device: torch.device) -> torch.Tensor | None:
    """This GPU's state: checkpoints before one-GPU states held a list of every visible GPU's."""
    if isinstance(saved, (list, tuple)):
        index = device.index or 0
        return saved[index] if index < len(saved) else None
    return saved


def set_rng_state(state: dict[str, Any], device: torch.device | str | None = None) -> None:
    """Restore `rng_state(device)`; a device state saved on another kind of device is left alone."""
    torch.set_rng_state(state["torch"])
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda" and state.get("cuda") is not None:
        own = _own_cuda_state(state["cuda"], device)
        if own is not None:
            torch.cuda.set_rng_state(own, device)
    if device is not None and device.type == "mps" and state.get("mps") is not None:
        torch.mps.set_rng_state(state["mps"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def latest(directory: str | Path) -> Path | None:
    """The last complete checkpoint under RUN/checkpoints, or None."""
    pointer = Path(directory) / LATEST
    if not pointer.is_file():
        return None
    path = Path(directory) / pointer.read_text(encoding="utf-8").strip()
    return path if (path / STATE_NAME).is_file() else None


def save(directory: str | Path, step: int, model: torch.nn.Module, state: dict[str, Any], keep: int = 1) -> Path:
    """Write checkpoint `step` (model + training state), then point `latest` at it; keep the newest `keep`."""
    directory = Path(directory)
    path = directory / f"step_{step:08d}"
    if path.exists() and latest(directory) != path:
        shutil.rmtree(path)  # left over by a crash
    try:
        save_pretrained(model, path)
        with atomic_path(path / STATE_NAME) as tmp:
            torch.save(state, tmp)
    except BaseException:
        if latest(directory) != path:
            shutil.rmtree(path, ignore_errors=True)
        raise
    write_text(directory / LATEST, path.name + "\n")
    old = sorted(p for p in directory.glob("step_*") if p.is_dir() and p != path)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return path


def load(path: str | Path, model: torch.nn.Module, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Load the weights of checkpoint `path` into `model`; return its training state."""
    path = Path(path)
    weights = load_file(str(path / WEIGHTS_NAME), device=str(map_location))
    model.load_state_dict(weights, strict=True)
    return torch.load(path / STATE_NAME, map_location="cpu", weights_only=True)


__all__ = ["LATEST", "latest", "load", "rng_state", "save", "set_rng_state"]
