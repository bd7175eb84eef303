"""Deprecated name of `vitzoo.train.state` (training checkpoints and random states), renamed so that
it is not mistaken for `vitzoo.weights.checkpoint` (reading model weights). Every name still works
here, with a DeprecationWarning."""

import warnings as _warnings

from vitzoo.train import state as _state


def __getattr__(name: str):
    value = getattr(_state, name)  # an unknown name fails as it would have
    _warnings.warn(f"vitzoo.train.checkpoint is renamed vitzoo.train.state: use vitzoo.train.state.{name}",
                   DeprecationWarning, stacklevel=2)
    return value
