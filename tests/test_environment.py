"""The VITZOO_ environment variables: a value that means nothing is refused naming the variable, a
good one reads as meant, and every variable the source reads is in the table below."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


def read_autoload():
    from vitzoo import registry

    calls = []
    original = registry.Registry._load_entry_points
    registry.Registry._load_entry_points = lambda self: calls.append(1)
    try:
        registry.Registry()
    finally:
        registry.Registry._load_entry_points = original
    return bool(calls)


def read_cache():
    from vitzoo.io import cache_dir

    return cache_dir()


ENVIRONMENT = {
    "VITZOO_DISABLE_PLUGIN_AUTOLOAD": ("maybe", read_autoload, ("0", lambda value: value is True)),
    "VITZOO_CACHE": ("  ", read_cache,
                     ("", lambda value: value == Path.home() / ".cache" / "vitzoo")),
}


@pytest.mark.parametrize("name", sorted(ENVIRONMENT))
def test_an_environment_variable_that_means_nothing_is_refused_naming_it(name, monkeypatch):
    """A value that means nothing raises an error that names the variable; a good one reads as
    meant."""
    bad, read, (good, holds) = ENVIRONMENT[name]
    monkeypatch.setenv(name, bad)
    with pytest.raises((ValueError, RuntimeError), match=rf"{name}={bad!r}"):
        read()
    monkeypatch.setenv(name, good)
    assert holds(read())


def test_every_environment_variable_of_the_source_is_tried_above():
    import re

    root = Path(__file__).resolve().parents[1]
    read = set()
    for path in [*root.glob("vitzoo/**/*.py"), *root.glob("benchmarks/**/*.py")]:
        source = path.read_text(encoding="utf-8")
        read |= set(re.findall(r"""environ(?:\.get\(|\[)\s*["'](VITZOO_[A-Z_]+)""", source))
        read |= set(re.findall(r"""env_\w+\(\s*["'](VITZOO_[A-Z_]+)""", source))
        read |= {m for m in re.findall(r"""^[A-Z_]+ = ["'](VITZOO_[A-Z_]+)["']""", source, re.M)}
    # VITZOO_COMMIT: any text is a commit
    assert read - {"VITZOO_COMMIT"} == set(ENVIRONMENT), read ^ set(ENVIRONMENT)
