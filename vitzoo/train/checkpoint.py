"""Deprecated name of `vitzoo.train.state` (training checkpoints and random states)."""

from vitzoo.deprecated import renamed

__getattr__ = renamed("vitzoo.train.checkpoint", "vitzoo.train.state", "not to be mistaken for vitzoo.weights.checkpoint")
