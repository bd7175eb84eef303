"""The floor plan of the package, read from its code: no import circle, no module too long.

The import graph is derived with `ast` from every module of `vitzoo/`: module-level and function-level
imports alike (a deferred import that climbs back up is still a circle in the design), `import a.b`,
`from a import b` (an edge to the submodule `a.b` when there is one, else to `a`) and relative
imports. Only imports under `if TYPE_CHECKING:` are left out: type checkers read them, nothing runs
them. Layered so, from the ground up: leaves (errors, options, config, tags, io, ...); the types a
plugin provides (hookspecs, weights.formats, weights.converted); the built-in parts (layers, the
zoo, the built-in weight formats); the registry; the model, the weights and the Hub; the lookups
(catalog, pretrained, the package's face); training, the commands and the benchmarks on top.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "vitzoo"
LINE_LIMIT = 500


def module_names(package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own, for its __init__.py)."""
    modules = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    """The modules of the package that one module imports, at any depth of its code."""

    def __init__(self, name: str, is_package: bool, modules: dict[str, Path], type_checking: bool) -> None:
        self.name, self.modules, self.type_checking = name, modules, type_checking
        self.package = name if is_package else name.rpartition(".")[0]
        self.found: set[str] = set()

    def _known(self, dotted: str) -> str | None:
        """The module `dotted` names, or the package it is an attribute of."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in self.modules:
                return candidate
        return None

    def _add(self, dotted: str) -> None:
        target = self._known(dotted)
        if target is not None and target != self.name:
            self.found.add(target)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test) and not self.type_checking:
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:
            submodule = f"{module}.{alias.name}"
            self._add(submodule if submodule in self.modules else module)


def import_graph(type_checking: bool = False, package: str = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of the package it imports."""
    modules = module_names(package)
    graph = {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py", modules, type_checking)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        graph[name] = visitor.found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a -> b -> ... -> a) through each group of modules that import each other (Tarjan's
    strongly connected components, then a shortest way back round within each)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    found = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:  # breadth first: the shortest way from start back to start
            node = queue.pop(0)
            for target in sorted(graph[node] & group):
                if target == start:
                    found.append(paths[node] + [start])
                    queue = []
                    break
                if target not in paths:
                    paths[target] = paths[node] + [target]
                    queue.append(target)
    return found


def test_the_package_has_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles in vitzoo/ (outside `if TYPE_CHECKING:`), one through each group of " \
        "modules that import each other:\n" + "\n".join(" -> ".join(circle) for circle in found)


def test_the_benchmarks_have_no_import_circle_either():
    """spec -> plan -> launchers -> execute, the results store and the machine's record below them all."""
    graph = import_graph(package="benchmarks")
    assert "benchmarks.launchers.slurm" in graph["benchmarks.execute"]
    found = circles(graph)
    assert not found, "\n".join(" -> ".join(circle) for circle in found)


def test_no_circle_runs_through_the_model_module_even_counting_type_only_imports():
    through_model = [circle for circle in circles(import_graph(type_checking=True)) if "vitzoo.model" in circle]
    assert not through_model, "\n".join(" -> ".join(circle) for circle in through_model)


def test_the_graph_is_read_from_the_code():
    """The reader sees what the rules above are about: an import inside a function, a relative import,
    a submodule named in `from a import b`; and it leaves type-only imports out."""
    graph = import_graph()
    assert {"vitzoo.model", "vitzoo.registry"} <= set(graph)
    assert "vitzoo.registry" in graph["vitzoo.model"]
    assert "vitzoo.checkpoints.publish" in graph["vitzoo.commands.weights"]  # inside run_push
    assert {"vitzoo.hub.cache", "vitzoo.hub.settings"} <= graph["vitzoo.hub.transport"]  # from vitzoo.hub import ...
    assert "vitzoo.testing.hubserver.server" in graph["vitzoo.testing.hubserver"]  # from .server import ...
    assert "vitzoo.config" not in graph["vitzoo.hookspecs"]  # under if TYPE_CHECKING
    assert "vitzoo.config" in import_graph(type_checking=True)["vitzoo.hookspecs"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_takes_the_name_of_a_standard_library_module():
    """A module named like one of the standard library's (vitzoo/inspect.py was) shadows it for any
    script run from inside its folder. One compiled in or frozen (builtins, io) cannot be shadowed; one
    read from a file can, and no vitzoo module may take its name."""
    names = {name.rpartition(".")[2] for name in module_names()}
    clashes = names & set(sys.stdlib_module_names)
    shadowable = {name for name in clashes
                  if (spec := importlib.util.find_spec(name)) is not None and spec.origin not in ("built-in", "frozen")}
    assert not shadowable, shadowable


def test_no_module_is_longer_than_the_limit():
    """Short modules with one job each: none of vitzoo/ over 500 lines."""
    long = {str(path.relative_to(ROOT)): lines for path in module_names().values()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > LINE_LIMIT}
    assert len(module_names()) > 50 and not long, f"modules over {LINE_LIMIT} lines: {long}"