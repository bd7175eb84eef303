"""Deprecated name of `vitzoo.analysis` (the paper's analyses of trained models)."""

from vitzoo.deprecated import renamed

__getattr__ = renamed("vitzoo.inspect", "vitzoo.analysis", "it shadowed the standard library's inspect")
