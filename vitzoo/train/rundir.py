"""The run directory (--out) before a run starts: a new run only in an empty or new directory, a
resumed one only with the settings it was started with. The first rule is every command's that fills
a directory (`check_new_directory`: `vitzoo convert` and `vitzoo pull DIR` too)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vitzoo.errors import ConfigError
from vitzoo.train import state
from vitzoo.train.config import RESUMABLE_CHANGES, TrainConfig
from vitzoo.weights.layout import CONFIG_NAME


def _diverged_before_a_checkpoint(run: Path) -> bool:
    try:
        status = json.loads((run / "summary.json").read_text(encoding="utf-8")).get("status")
        return status == "diverged" and not (run / "checkpoints" / state.LATEST).exists()
    except (OSError, ValueError, AttributeError):
        return False


def _describe(directory: Path, entries: list[str], source: str | None, source_name: str) -> str:
    """What a directory holds, in words: the source being read, a run, a saved model, files."""
    if source and os.path.exists(source) and (directory.resolve() == Path(source).resolve()
                                              or directory.resolve() in Path(source).resolve().parents):
        return f"{source_name} {source} (writing there would overwrite what is read)"
    if "train_config.json" in entries or "checkpoints" in entries:
        if _diverged_before_a_checkpoint(directory):
            return ("a run that diverged before its first checkpoint (summary.json), so nothing in it can be "
                    "resumed: remove it to start again there")
        return "a run"
    if CONFIG_NAME in entries:
        return "a saved model (config.json, written by save_pretrained or another program)"
    return "files of its own (" + ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "") + ")"


def check_new_directory(directory: Path, option: str, *, writer: str, source: str | None = None,
                        source_name: str = "the source", run_hint: str = "") -> None:
    """The one rule for a directory a command fills (`train --out`, `convert`'s destination, `pull`'s
    directory): it does not exist or is empty. Anything already there (a saved model, the source being
    read, a run, a user's README) would be overwritten or mixed in. `writer` says who needs it ("a new
    run needs"); `run_hint` is added when the directory holds a run."""
    # "choose another --out", but "choose another directory" for "the directory", "the destination"
    another = f"choose another {option if option.startswith('-') else 'directory'}"
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{option} {directory} is a file, not a directory; {another}")
    entries = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    if entries:
        held = _describe(directory, entries, source, source_name)
        raise ValueError(f"{option} {directory} already holds {held}{run_hint if held == 'a run' else ''}; {writer} "
                         f"an empty or new directory: {another}")


def _check_new_run_dir(run: Path, pretrained: str | None) -> None:
    """A new run writes only into a directory that does not exist or is empty."""
    check_new_directory(run, "--out", writer="a new run needs", source=pretrained, source_name="the --pretrained source",
                        run_hint="; pass --resume to continue it")


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


def finished_summary(cfg: TrainConfig) -> dict | None:
    """The summary of the run that `cfg` resumes, when that run is finished: its last checkpoint is the
    step summary.json reports as finished, so nothing is left to train or evaluate. A resume of it is a
    no-op that says so (the run's files are left as they are). None for anything else, and for a resume
    with other settings, which `prepare_run_dir` refuses as always."""
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
        print(f"{run} is finished (step {summary['step']}, summary.json): nothing to resume, nothing changed")
    return summary


__all__ = ["check_new_directory", "finished_summary", "prepare_run_dir"]
