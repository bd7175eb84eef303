"""Old module names kept working after a rename: every name still resolves, with a DeprecationWarning
that says where it lives now."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable


def renamed(old: str, new: str, why: str) -> Callable[[str], Any]:
    """The module `__getattr__` of the old module `old`, answering with the names of module `new`."""

    def __getattr__(name: str) -> Any:
        value = getattr(importlib.import_module(new), name)  # an unknown name fails as it would have
        warnings.warn(f"{old} is renamed {new}: use {new}.{name} ({why})", DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
