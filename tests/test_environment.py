"""The VITZOO_ environment variables: a value that means nothing is refused naming the variable,
a good one reads as meant, and every variable the source reads is tried here."""

import re
from pathlib import Path

import pytest

from vitzoo import registry
from vitzoo.io import cache_dir


def autoloads() -> bool:
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry.importlib.metadata, "entry_points",
                      lambda group: calls.append(group) or [])
        registry.Registry()
    return bool(calls)


ENVIRONMENT = {  # a value that means nothing, the reader, a good value and what it means
    "VITZOO_DISABLE_PLUGIN_AUTOLOAD": ("maybe", autoloads, "0", True),
    "VITZOO_CACHE": ("  ", cache_dir, "", Path.home() / ".cache" / "vitzoo"),
}


@pytest.mark.parametrize("name", sorted(ENVIRONMENT))
def test_a_value_that_means_nothing_is_refused_naming_the_variable(name, monkeypatch):
    bad, read, good, meant = ENVIRONMENT[name]
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=rf"{name}={bad!r}"):
        read()
    monkeypatch.setenv(name, good)
    assert read() == meant


def test_every_environment_variable_of_the_source_is_tried_above():
    root, read = Path(__file__).resolve().parents[1], set()
    for path in [*root.glob("vitzoo/**/*.py"), *root.glob("benchmarks/**/*.py")]:
        source = path.read_text(encoding="utf-8")
        read |= set(re.findall(r"""(?:environ(?:\.get\(|\[)|env_\w+\()\s*["'](VITZOO_\w+)""",
                               source))
        read |= set(re.findall(r"""^[A-Z_]+ = ["'](VITZOO_[A-Z_]+)["']""", source, re.M))
    assert read == set(ENVIRONMENT)
