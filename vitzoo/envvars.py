"""vitzoo's environment variables, read one way: a value that means nothing is refused, naming the
variable and the values it takes, never silently ignored. An empty value is the same as unset, as
`VAR= command` means in a shell; a blank one is refused. tests/test_environment.py holds every
`VITZOO_*` variable of the source to these readers (or a check of its own).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from vitzoo.errors import ConfigError

T = TypeVar("T")
FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
         "off": False}


def _text(name: str, environ: Mapping[str, str]) -> str | None:
    """The variable's value, None when unset or empty; a ConfigError when it is blank."""
    text = environ.get(name)
    if not text:
        return None
    if not text.strip():
        raise ConfigError(f"{name}={text!r} is blank: give it a value, or unset it")
    return text.strip()


def env_choice(name: str, choices: Mapping[str, T],
               environ: Mapping[str, str] = os.environ) -> T | None:
    """What the value (case-insensitive) stands for in `choices`, None when unset or empty."""
    text = _text(name, environ)
    if text is None:
        return None
    if text.lower() not in choices:
        raise ConfigError(f"{name}={text!r} means nothing here: use one of {', '.join(choices)}, "
                          "or unset it")
    return choices[text.lower()]


def env_flag(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """A yes/no variable: 1, true, yes, on or 0, false, no, off; False when unset or empty."""
    return bool(env_choice(name, FLAGS, environ))


def env_path(name: str, default: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """A folder's path, `default` when unset or empty (never the current directory of Path(""))."""
    text = _text(name, environ)
    return default if text is None else Path(environ[name])


__all__ = ["FLAGS", "env_choice", "env_flag", "env_path"]
