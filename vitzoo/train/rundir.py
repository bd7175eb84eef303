"""The run directory (--out) before a run starts: a new run only in an empty or new directory, a
resumed one only with the settings it was started with."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vitzoo.errors import ConfigError
from vitzoo.train import state
from vitzoo.train.config import RESUMABLE_CHANGES, TrainConfig
from vitzoo.weights.layout import CONFIG_NAME


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


__all__ = ["prepare_run_dir"]
