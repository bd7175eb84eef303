"""vitzoo's environment variables, read one way: empty is unset (as `VAR= command` means in a
shell); a value that means nothing is refused, naming the variable."""

from __future__ import annotations

import os
from pathlib import Path

from vitzoo.errors import ConfigError

FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
         "off": False}


def _value(name: str) -> str | None:
    text = os.environ.get(name)
    if text and not text.strip():
        raise ConfigError(f"{name}={text!r} is blank: give it a value, or unset it")
    return text or None


def env_flag(name: str) -> bool:
    """A yes/no variable: 1, true, yes, on or 0, false, no, off; False when unset."""
    text = _value(name)
    if text is not None and text.strip().lower() not in FLAGS:
        raise ConfigError(f"{name}={text!r} means nothing here: use one of {', '.join(FLAGS)}, "
                          "or unset it")
    return text is not None and FLAGS[text.strip().lower()]


def env_path(name: str, default: Path) -> Path:
    """A folder's path; `default` when unset."""
    text = _value(name)
    return default if text is None else Path(text)
