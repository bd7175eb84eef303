"""Every error vitzoo raises on purpose, in one leaf module: each names the problem and the fix."""

from __future__ import annotations


class ConfigError(ValueError):
    """An option (of a model or a training run) is unknown, mistyped or inconsistent."""


class PluginError(RuntimeError):
    """Plugins disagree (two provide the same name) or a plugin broke its contract."""


class CheckpointError(ValueError):
    """Weights that do not fit the model: every missing, unexpected and mis-shaped tensor listed."""


class DataError(ValueError):
    """A dataset that is missing, malformed or unknown, found before any work starts."""


class HubError(RuntimeError):
    """Talking to the Hub failed. `not_cached`: a download failed with no copy in the cache."""

    def __init__(self, message: str, not_cached: bool = False) -> None:
        super().__init__(message)
        self.not_cached = not_cached


class DiskFull(OSError):
    """A write found its disk (or quota) full; errno is ENOSPC, so it is caught as any OSError."""


class TrainingDiverged(RuntimeError):
    """The loss (or gradient norm) became NaN or infinite at `step`; `inputs`: the normalised images
    themselves were not finite (the data or its mean/std is at fault, not the optimisation)."""

    def __init__(self, message: str, inputs: bool = False, step: int | None = None) -> None:
        super().__init__(message)
        self.inputs, self.step = inputs, step


__all__ = ["ConfigError", "PluginError", "CheckpointError", "DataError", "DiskFull", "HubError",
           "TrainingDiverged"]
