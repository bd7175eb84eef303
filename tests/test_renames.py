"""Modules renamed so that their names say what they are still answer under their old names, with a
DeprecationWarning that says where the name lives now."""

import importlib
import warnings

import pytest


@pytest.mark.parametrize("old, new, name", [
    ("vitzoo.models", "vitzoo.zoo", "MODELS"),
    ("vitzoo.inspect", "vitzoo.analysis", "mean_attention_distance"),
])
def test_an_old_module_name_answers_with_the_new_modules_object_and_warns(old, new, name):
    with pytest.warns(DeprecationWarning, match=rf"{old} is renamed {new}: use {new}\.{name}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


def test_an_unknown_name_under_an_old_module_name_fails_as_before():
    with pytest.raises(AttributeError), warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning is given for a name that does not exist
        importlib.import_module("vitzoo.models").no_such_name  # noqa: B018


def test_no_vitzoo_module_can_shadow_a_standard_library_module():
    """vitzoo/inspect.py shadowed `inspect` for anything run from inside the package's folder. A
    standard-library module that is compiled in or frozen (builtins, io) cannot be shadowed; one read
    from a file can, and no vitzoo module may take its name but the deprecated shim, which imports
    nothing but vitzoo.deprecated."""
    import importlib.util
    import sys
    from pathlib import Path

    import vitzoo

    package = Path(vitzoo.__file__).parent
    clashes = {p.stem for p in package.glob("*.py")} & set(sys.stdlib_module_names)
    shadowable = {name for name in clashes if importlib.util.find_spec(name).origin not in ("built-in", "frozen")}
    assert shadowable == {"inspect"}, shadowable
    assert "import" not in (package / "inspect.py").read_text().replace("from vitzoo.deprecated import renamed", "")
