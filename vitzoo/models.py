"""Deprecated name of `vitzoo.zoo` (the named models of the paper)."""

from vitzoo.deprecated import renamed

__getattr__ = renamed("vitzoo.models", "vitzoo.zoo", "not to be mistaken for vitzoo.model")
