"""Every error vitzoo raises on purpose, in one leaf module (it imports nothing of vitzoo): each
names the problem and what to do about it. Catch them from here, or from `vitzoo` itself."""

from __future__ import annotations


class ConfigError(ValueError):
    """An option (of a model or a training run) is unknown, mistyped or inconsistent."""


class PluginError(RuntimeError):
    """Plugins disagree (two provide the same name) or a plugin broke its contract."""


class InputError(ValueError):
    """An input tensor that the model cannot take, with what to do about it."""


class CheckpointError(ValueError):
    """Weights that do not fit the model: every missing, unexpected and mis-shaped tensor listed."""


class DataError(ValueError):
    """A dataset that is missing, malformed or unknown, found before any work starts."""


class HubError(RuntimeError):
    """Talking to the Hub failed; the message names the cause and what to do. `not_cached`: a
    download failed with no copy in the cache to fall back on (offline, unreachable, timed out)."""

    def __init__(self, message: str, not_cached: bool = False) -> None:
        super().__init__(message)
        self.not_cached = not_cached


class ExportError(RuntimeError):
    """A model that a graph format cannot hold (TorchScript, an ONNX export that failed or disagrees
    with PyTorch), or an export that cannot be written: the message says why and what works."""


class DiskFull(OSError):
    """A write found its disk (or quota) full. The message names the file, the space it needs and
    what is kept; errno is ENOSPC, so it is caught as any OSError is."""


class TrainingDiverged(RuntimeError):
    """The loss (or gradient norm) became NaN or infinite. `inputs` is True when the normalised
    images themselves were not finite: the data or its mean/std, not the optimisation, is at fault.
    `step`: the step it happened at, numbered as the metrics number steps."""

    def __init__(self, message: str, inputs: bool = False, step: int | None = None) -> None:
        super().__init__(message)
        self.inputs = inputs
        self.step = step


__all__ = ["ConfigError", "PluginError", "InputError", "CheckpointError", "DataError", "DiskFull",
           "HubError", "TrainingDiverged"]
