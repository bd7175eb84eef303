"""Training state that survives crashes, and the run directory it lives in.

    RUN/checkpoints/step_00001000/config.json, model.safetensors   the model (save_pretrained)
    RUN/checkpoints/step_00001000/model_ema.safetensors            with --model-ema
    RUN/checkpoints/step_00001000/state.pt                         optimizer, schedule, RNGs, step
    RUN/checkpoints/latest                                         "step_00001000": the commit point

Every file is written atomically (vitzoo.io) and `latest` only once a checkpoint is complete, so a
crash at any moment leaves the previous checkpoint intact and pointed to; a full disk is said as
such. The weights go straight from the device to the host (`host_copy`, `OnHost`). A new run needs
an empty or new directory (`check_new_directory`, every command's rule), a resumed one the settings
it was started with.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from vitzoo.weights.native import save_pretrained, save_state_dict
from vitzoo.errors import CheckpointError, ConfigError, DiskFull
from vitzoo.io import atomic_path, free_bytes, out_of_space, write_text
from vitzoo.train.config import RESUMABLE_CHANGES, TrainConfig
from vitzoo.train.optim import EMA_WEIGHTS_NAME
from vitzoo.weights.files import read_failed
from vitzoo.weights.layout import CONFIG_NAME, WEIGHTS_NAME

LATEST = "latest"
STATE_NAME = "state.pt"


# ---------------------------------------------------------------------------- random states
def rng_state(device: torch.device | str | None = None) -> dict[str, Any]:
    """The random states a process restores on resume: torch's, Python's, NumPy's and its
    device's (on CUDA this process's own GPU only, so that another number of GPUs can resume)."""
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


# ---------------------------------------------------------------------------- weights to the host
def host_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict copied straight to the host (nothing allocated on the device); a copy on the
    CPU too, never a view of a live parameter (training goes on, and keep_best keeps these)."""
    return {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}


class OnHost:
    """`model` as `save_pretrained` reads it, its state dict a `host_copy`: the copy save_pretrained
    makes of each tensor is then made on the host, not beside the weights on the GPU."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:  # what the instance lacks: the model's
        if name == "_model":
            raise AttributeError(name)
        return getattr(self._model, name)

    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        return host_copy(self._model)


def save_ema(ema: torch.nn.Module, path: Path) -> None:
    save_state_dict(host_copy(ema), path / EMA_WEIGHTS_NAME, metadata={"format": "pt"})


# ---------------------------------------------------------------------------- checkpoints
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
    """The complete checkpoints in the order to try them: `latest`'s, then the others newest
    first. A damaged pointer is warned about and the newest complete checkpoint leads; empty when
    the run committed none; a CheckpointError when it committed one and none is complete."""
    directory = Path(directory)
    pointed = latest(directory)
    found = sorted((p for p in directory.glob("step_*") if p.is_dir() and _complete(p)),
                   reverse=True)
    if (directory / LATEST).exists() and pointed is None:
        named = _pointed(directory)
        what = (f"names {named.name!r}, which is not a complete checkpoint" if named
                else "cannot be read")
        if not found:
            raise CheckpointError(
                f"cannot resume: {directory / LATEST} {what}, and {directory} holds no complete "
                f"checkpoint (config.json, model.safetensors, {STATE_NAME}); restore it, or start "
                "a new run with another --out")
        warnings.warn(f"{directory / LATEST} {what}: resuming from the newest complete checkpoint, "
                      f"{found[0].name}")
    return ([pointed] if pointed else []) + [p for p in found if p != pointed]


def load_first(paths: list[Path], model: torch.nn.Module, map_location: torch.device | str = "cpu",
               ema: torch.nn.Module | None = None) -> tuple[Path, dict[str, Any]]:
    """Load the first of `paths` that reads (`load`); a damaged one is said, the next tried."""
    problems = []
    for i, path in enumerate(paths):
        try:
            return path, load(path, model, map_location, ema)
        except CheckpointError as exc:
            problems.append(str(exc))
            if i + 1 < len(paths):
                warnings.warn(f"{exc}: resuming from the previous checkpoint, {paths[i + 1].name}")
    raise CheckpointError("cannot resume, no checkpoint reads: " + "; ".join(problems)
                          + ". Restore the files, or start a new run with another --out")


def _torch_save(state: dict[str, Any], tmp: Path, final: Path) -> None:
    """torch.save, its C++ writer's failures ("unexpected pos" on a full disk) said as an OSError
    naming the file and the space left on its disk."""
    try:
        torch.save(state, tmp)
    except RuntimeError as exc:
        free, first_line = shutil.disk_usage(tmp.parent).free, str(exc).splitlines()[0]
        full = " (a full disk is the usual cause)" if free < 64 * 2**20 else ""
        raise OSError(errno.ENOSPC if full else errno.EIO,
                      f"cannot write {final}: torch.save failed ({first_line[:200]}); "
                      f"the disk holding it has {free / 2**20:.1f} MiB free{full}. Free some space "
                      "and resume the run: the previous checkpoint is intact") from exc


def tensor_bytes(tree: Any) -> int:
    """The bytes of every tensor in a (nested) state: about what a checkpoint of it takes."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def disk_full(run: Path, where: Path, what: str, needed: int, kept: Path | None) -> DiskFull:
    """The error of a write that found the disk full: which file, the space it needs and has,
    what is kept, and how to finish (`vitzoo train --resume RUN` once space is free)."""
    have = (f"the last good checkpoint, {kept.name}, is kept in {kept.parent} and the run "
            "resumes from it" if kept
            else "no earlier checkpoint was written, so the run resumes from its start")
    free = free_bytes(where)
    return DiskFull(errno.ENOSPC, f"the disk is full: {what} could not be written to {where} "
                    f"(it needs about {needed / 1e6:.1f} MB; {free / 1e6:.1f} MB are free there). "
                    f"Nothing half-written is left; {have}. Free some space and run "
                    f"`vitzoo train --resume {run}` to finish")


def save(directory: str | Path, step: int, model: torch.nn.Module, state: dict[str, Any],
         keep: int = 1, ema: torch.nn.Module | None = None) -> Path:
    """Write checkpoint `step` (model, `ema`'s weights, training state), then point `latest` at
    it; keep the newest `keep`."""
    directory = Path(directory)
    path = directory / f"step_{step:08d}"
    for stale in directory.glob(".step_*.tmp"):  # staging left by a killed save
        shutil.rmtree(stale, ignore_errors=True)
    if path.exists() and latest(directory) != path:
        shutil.rmtree(path)  # left over by a crash
    try:
        save_pretrained(OnHost(model), path)
        if ema is not None:  # before state.pt, which completes the checkpoint
            save_ema(ema, path)
        with atomic_path(path / STATE_NAME) as tmp:
            _torch_save(state, tmp, path / STATE_NAME)
    except BaseException as exc:
        if latest(directory) != path:
            shutil.rmtree(path, ignore_errors=True)
        if out_of_space(exc):
            what = f"checkpoint {path.name} ({WEIGHTS_NAME} and {STATE_NAME})"
            needed = tensor_bytes(model.state_dict()) + tensor_bytes(state)
            raise disk_full(directory.parent, path, what, needed, latest(directory)) from exc
        raise
    write_text(directory / LATEST, path.name + "\n")
    old = sorted(p for p in directory.glob("step_*") if p.is_dir() and p != path)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return path


def _read(path: Path, read):
    try:
        return read(path)
    except Exception as exc:  # torch and safetensors raise several types for a damaged file
        raise read_failed(path, exc) from exc


def load(path: str | Path, model: torch.nn.Module, map_location: torch.device | str = "cpu",
         ema: torch.nn.Module | None = None) -> dict[str, Any]:
    """Load checkpoint `path`'s weights into `model` (and `ema`); return its training state. A file
    that does not read is a CheckpointError naming it, and `model` and `ema` are unchanged then."""
    path = Path(path)
    # mapped, not read: the ranks of a node share one copy of the optimizer's state
    state = _read(path / STATE_NAME, lambda p: torch.load(p, map_location="cpu", weights_only=True,
                                                          mmap=True))
    def weights_of(p: Path) -> dict[str, torch.Tensor]:
        return load_file(str(p), device=str(map_location))

    weights = _read(path / WEIGHTS_NAME, weights_of)
    if ema is not None:
        averaged = _read(path / EMA_WEIGHTS_NAME, weights_of)
    model.load_state_dict(weights, strict=True)
    if ema is not None:
        ema.load_state_dict(averaged, strict=True)
    return state


# ---------------------------------------------------------------------------- the run directory
def _diverged_before_a_checkpoint(run: Path) -> bool:
    try:
        status = json.loads((run / "summary.json").read_text(encoding="utf-8")).get("status")
        return status == "diverged" and not (run / "checkpoints" / LATEST).exists()
    except (OSError, ValueError, AttributeError):
        return False


def _describe(directory: Path, entries: list[str], source: str | None, source_name: str) -> str:
    """What a directory holds, in words: the source being read, a run, a saved model, files."""
    here, read = directory.resolve(), Path(source).resolve() if source else None
    if source and os.path.exists(source) and (here == read or here in read.parents):
        return f"{source_name} {source} (writing there would overwrite what is read)"
    if "train_config.json" in entries or "checkpoints" in entries:
        if _diverged_before_a_checkpoint(directory):
            return ("a run that diverged before its first checkpoint (summary.json), so nothing in "
                    "it can be resumed: remove it to start again there")
        return "a run"
    if CONFIG_NAME in entries:
        return "a saved model (config.json, written by save_pretrained or another program)"
    return f"files of its own ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''})"


def check_new_directory(directory: Path, option: str, *, writer: str, source: str | None = None,
                        source_name: str = "the source", run_hint: str = "") -> None:
    """The rule for a directory a command fills (`train --out`, `convert`, `pull`): it does not
    exist or is empty. `writer` says who needs it; `run_hint` is added when it holds a run."""
    another = f"choose another {option if option.startswith('-') else 'directory'}"
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{option} {directory} is a file, not a directory; {another}")
    entries = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    if entries:
        held = _describe(directory, entries, source, source_name)
        raise ValueError(f"{option} {directory} already holds {held}"
                         f"{run_hint if held == 'a run' else ''}; {writer} an empty or new "
                         f"directory: {another}")


def prepare_run_dir(cfg: TrainConfig, run: Path | None) -> list[Path]:
    """Check the run directory; return the checkpoints to resume from, in the order to try them."""
    if run is None:
        return []
    saved = run / "train_config.json"
    if not cfg.resume:
        check_new_directory(run, "--out", writer="a new run needs", source=cfg.pretrained,
                            source_name="the --pretrained source",
                            run_hint="; pass --resume to continue it")
        return []
    if not saved.exists():
        raise FileNotFoundError(f"cannot resume: {saved} does not exist")
    before = TrainConfig.from_json(saved.read_text(encoding="utf-8")).resolved().to_dict()
    before, now = json.loads(json.dumps(before)), json.loads(json.dumps(cfg.to_dict()))
    changed = sorted(k for k in now if k not in RESUMABLE_CHANGES and before.get(k) != now[k])
    if changed:
        detail = ", ".join(f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in changed)
        raise ConfigError(f"cannot resume {run} with different settings ({detail})")
    return to_resume(run / "checkpoints")


def finished_summary(cfg: TrainConfig) -> dict | None:
    """The summary of the run `cfg` resumes when that run is finished (its last checkpoint is the
    step summary.json reports): the resume is then a no-op that says so. None otherwise."""
    if not (cfg.resume and cfg.out):
        return None
    run = Path(cfg.out)
    checkpoints = prepare_run_dir(cfg.resolved(), run)
    try:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(summary, dict) and summary.get("status") == "finished" and checkpoints
            and checkpoints[0].name == f"step_{summary.get('step', -1):08d}"):
        return None
    if not cfg.quiet and os.environ.get("RANK", "0") == "0":
        print(f"{run} is finished (step {summary['step']}, summary.json): nothing to resume, "
              "nothing changed")
    return summary
