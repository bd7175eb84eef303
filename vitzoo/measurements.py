"""Speeds measured on this machine and kept for the next process, never trusted blindly.

A choice made from a timing (which precision a CPU computes fastest, whether compiling pays) is kept
in $VITZOO_CACHE so that the next process need not measure again. A timing on a shared machine can be
wrong by any factor (another process took the CPU during one of its halves: a 2-layer model once
measured a 46x compile gain that was 1.06x), so:

- a measurement is repeated, and kept only where its repeats agree (`spread` at most `MAX_SPREAD`);
- the caller also refuses what is implausible (a compile gain beyond what the model's FLOPs allow);
- a kept choice is checked when it is used, and measured again where it turns out slower.

The entries are keyed by what they hold for (`measured_on`: the CPU's model, instruction sets and
threads, or the GPU; torch's version; plus the caller's own fields).
"""

from __future__ import annotations

import json
import statistics
from typing import Any, Callable

import torch

from vitzoo.io import cache_dir, write_text
from vitzoo.machine import cpu_flags, cpu_model

MAX_SPREAD = 0.15  # (largest - smallest) / median of a measurement's repeats, for it to be kept


def spread(values: list[float]) -> float:
    """How far a measurement's repeats disagree: (largest - smallest) / median (0: they agree)."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else float("inf")


def measured_on(device: torch.device) -> dict[str, Any]:
    """What a speed measured on `device` holds for: the CPU's model, instruction sets and threads (or the
    GPU's name), and torch's version. Part of the key of every remembered measurement."""
    if device.type == "cpu":
        where = {"cpu": cpu_model(), "flags": cpu_flags(), "threads": torch.get_num_threads()}
    else:
        where = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type}
    return {**where, "torch": torch.__version__}


def _entries(cache_name: str) -> dict[str, Any]:
    try:
        cached = json.loads((cache_dir() / cache_name).read_text())
    except (OSError, ValueError):  # none yet, or unreadable: measured again and written anew
        return {}
    return cached if isinstance(cached, dict) else {}


def read(cache_name: str, key: str, valid: Callable[[Any], bool]) -> Any:
    """The entry kept under `key` in $VITZOO_CACHE/`cache_name`, or None where there is none or it is not
    `valid` (written by an older vitzoo, or damaged)."""
    value = _entries(cache_name).get(key)
    return value if value is not None and valid(value) else None


def store(cache_name: str, key: str, value: Any) -> None:
    """Keep `value` under `key` (None: forget the entry); a read-only cache keeps nothing, silently (the
    choice still holds for this process, and is measured again next time)."""
    cached = _entries(cache_name)
    if value is None:
        if key not in cached:
            return
        cached.pop(key)
    else:
        cached[key] = value
    try:
        write_text(cache_dir() / cache_name, json.dumps(cached, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass


def remembered(cache_name: str, key: str, measure: Callable[[], Any], valid: Callable[[Any], bool],
               trusted: Callable[[Any], bool] = lambda value: True,
               still_holds: Callable[[Any], bool] = lambda value: True) -> Any:
    """What `measure()` gives, kept under `key` in $VITZOO_CACHE/`cache_name` where it is `trusted` (its
    repeats agree, it is plausible); a kept entry is returned where it `still_holds` (checked at use),
    measured again otherwise. An entry that is not `valid` is measured again."""
    value = read(cache_name, key, valid)
    if value is not None and still_holds(value):
        return value
    value = measure()
    store(cache_name, key, value if trusted(value) else None)  # an untrusted one also drops the old entry
    return value


__all__ = ["MAX_SPREAD", "measured_on", "read", "remembered", "spread", "store"]
